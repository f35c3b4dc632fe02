#!/usr/bin/env bash
# GPU validation in one command, for a CUDA machine without network access; finishes within 8 minutes.
#   tests           the CUDA test subset (pytest -m cuda): the Triton kernels compiled for the GPU against the
#                   torch path, bit for bit where deterministic, statistically otherwise; a tensor of more
#                   than 2^31 elements when the GPU has the memory
#   ops             benchmarks/ops.py: per op the launches and syncs of a call, host and device time and the
#                   fraction of a device copy's bandwidth (2^24 and 2^28 elements); lognormal threshold + prune
#                   against the torch.topk threshold + prune; quantize_fp against torch's float8 cast
#   train_overhead  benchmarks/train_overhead.py: ResNet18 training-step time of each policy against the
#                   uncompressed step on CUDA, batch 256 of 224x224x3 synthetic images, with launches and
#                   syncs per step
#   torchrun        `gradcomp train` under torchrun (NCCL, one process per visible GPU), a few steps
# Each part has its own time limit and log ($OUT/<part>.log when OUT is set, else a temporary folder); the
# script ends with one table (part, result, seconds, log) and the benchmark tables, and fails if a part did.
#
#   scripts/gpu_check.sh            on the GPU machine (python: $PYTHON, else .venv/bin/python, else python3)
#   scripts/gpu_check.sh --dry-run  every part on the CPU at tiny sizes (tests: collected, not run); CI runs
#                                   it through tests/test_gpu_check.py
set -uo pipefail
cd "$(dirname "$0")/.."

case "${1:-}" in
    "") dry_run=false ;;
    --dry-run) dry_run=true ;;
    *) echo "usage: $0 [--dry-run]" >&2; exit 2 ;;
esac
if [[ -z "${PYTHON:-}" ]]; then
    if [[ -x .venv/bin/python ]]; then PYTHON=.venv/bin/python; else PYTHON=python3; fi
fi
export PYTHONPATH="$PWD/src${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1
logs="${OUT:-$(mktemp -d -t gpu_check.XXXXXX)}"
runs="$(mktemp -d -t gpu_check_runs.XXXXXX)"  # training output stays out of $OUT (checkpoints are large)
trap 'rm -rf "$runs"' EXIT
mkdir -p "$logs"

# the test files of the kernels, whose tests `pytest -m cuda` selects (the other modules need packages, such as
# snakemake, that a GPU machine without network may lack)
kernel_tests=(tests/test_rng.py tests/test_prune.py tests/test_fp_quant.py tests/test_int_quant.py
    tests/test_fp_oracle.py tests/test_launch_budget.py tests/test_special.py tests/test_large_tensors.py)
rows=()
failed=0
part() {  # part NAME LIMIT_SECONDS COMMAND...
    local name=$1 limit=$2 start=$SECONDS status result
    shift 2
    echo "== $name (limit ${limit} s): $*"
    timeout --kill-after=10 "$limit" "$@" >"$logs/$name.log" 2>&1
    status=$?
    case $status in
        0) result=ok ;;
        124 | 137) result="timed out"; failed=1 ;;
        *) result="failed ($status)"; failed=1 ;;
    esac
    rows+=("| $name | $result | $((SECONDS - start)) | $logs/$name.log |")
}

if $dry_run; then
    export TRITON_INTERPRET=1
    part tests 120 "$PYTHON" -m pytest -q -p no:cacheprovider -m cuda --collect-only "${kernel_tests[@]}"
    part ops 120 "$PYTHON" benchmarks/ops.py --quick --device cpu
    part train_overhead 120 "$PYTHON" benchmarks/train_overhead.py --quick --device cpu
    echo "test_subset_per_class: 1" >"$runs/tiny.yaml"
    part torchrun 120 "$PYTHON" -m torch.distributed.run --standalone --nproc_per_node=1 -m gradcomp train \
        --config "$runs/tiny.yaml" --dataset synthetic --model resnet10t --device cpu --batch-size 16 \
        --max-steps 1 --subset-per-class 2 --policy prune:sparsity=0.85 --out "$runs/torchrun" --no-progress
else
    export TRITON_INTERPRET=0  # compiled kernels
    gpus=$("$PYTHON" -c "import torch; print(torch.cuda.device_count())" 2>/dev/null || echo 0)
    if [[ "$gpus" -lt 1 ]]; then
        echo "no CUDA device visible to $PYTHON; use --dry-run on a machine without one" >&2
        exit 1
    fi
    part tests 180 "$PYTHON" -m pytest -q -p no:cacheprovider -m cuda -rs "${kernel_tests[@]}"
    part ops 90 "$PYTHON" benchmarks/ops.py --device cuda --record
    part train_overhead 120 "$PYTHON" benchmarks/train_overhead.py --device cuda --record --batch-size 256 \
        --image-size 224 --channels 3 --rounds 4 --steps 3
    part torchrun 60 "$PYTHON" -m torch.distributed.run --standalone --nproc_per_node="$gpus" -m gradcomp \
        train --dataset synthetic --model resnet18 --device cuda --batch-size $((64 * gpus)) --epochs 1 \
        --policy prune:sparsity=0.85 --out "$runs/torchrun" --no-progress
fi

{
    echo
    echo "| part | result | seconds | log |"
    echo "|---|---|---|---|"
    printf '%s\n' "${rows[@]}"
    echo
    tail -n 3 "$logs/tests.log"
    echo
    grep -h '^|\|^resnet\|^CUDA\|^torch ' "$logs/ops.log" "$logs/train_overhead.log"
    echo
    grep -h 'test accuracy' "$logs/torchrun.log"
} | tee "$logs/summary.md"
exit $failed
