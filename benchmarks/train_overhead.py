"""Training-step overhead of gradient compression, measured side by side in one run.

ResNet18 (timm), SGD. By default on the CPU with Fashion-MNIST-sized batches (batch 128, 28x28x1; the real
images when the Debian package is installed); `--image-size` / `--channels` switch to synthetic images of that
shape, e.g. the ImageNet-sized GPU check:

    python benchmarks/train_overhead.py --device cuda --batch-size 256 --image-size 224 --channels 3

Each arm has its own copy of the same initial model; arms run interleaved, a few steps at a time, and the
median step time of each is compared with the uncompressed arm (on CUDA each step is timed to its last
kernel; batches are on the device beforehand; on CUDA the table adds what one step launches and its host
syncs besides the timing's own). Compression acts on each policy's default layers
(convolution outputs for prune and fp, plus the classifier for int); the probe is off. On the CPU the
chunk functions run compiled (the default), and eagerly in the arm that says so (the script sets
GRADCOMP_COMPILE for each arm's steps).

    python benchmarks/train_overhead.py [--rounds 6] [--steps 4] [--batch-size 128] [--device cpu|cuda]
                                        [--image-size N] [--channels C] [--quick] [--launches]
                                        [--arms all|block] [--stem S] [--model-kwargs YAML]

The default configuration's model, for the block arms:

    python benchmarks/train_overhead.py --arms block --batch-size 64 --stem 3x3s2 \
        --model-kwargs '{channels: [16, 32, 64, 128]}' --channels-last
"""

from __future__ import annotations

import argparse
import copy
import os
import statistics
import time

import torch
import yaml
from records import save
from torch import nn

from gradcomp._backend import COMPILE_ENV, interpreter_enabled
from gradcomp.analysis.tables import to_markdown
from gradcomp.profiling import count_work
from gradcomp.training.attachment import attach
from gradcomp.training.config import CompressionConfig
from gradcomp.training.data import FASHION_MNIST_SYSTEM_DIR, load_split, make_synthetic
from gradcomp.training.models import create_model

ARMS = {  # name: (policy, statistics refresh, CPU chunk functions compiled)
    "uncompressed": None,
    "prune 0.85, statistics every step": ("prune:sparsity=0.85", "step", True),
    "prune 0.85, statistics every step, eager (GRADCOMP_COMPILE=0)": ("prune:sparsity=0.85", "step", False),
    "prune 0.85, statistics every 10 steps": ("prune:sparsity=0.85", 10, True),
    "fp e4m1 per-layer optimal scale, every step": ("fp:format=e4m1", "step", True),
    "int 5-bit psq (two streams)": ("int:bits=5,scheme=psq", "step", True),
}
# `--arms block`: the block policies (both gradient copies of every convolution and linear layer)
BLOCK_ARMS = {
    "uncompressed": None,
    "MXFP4 nearest": ("mxfp4", "step", True),
    "MXFP4 SR H32 (C1's arm)": ("mxfp4:rounding=stochastic,hadamard=32", "step", True),
    "NVFP4 nearest": ("nvfp4", "step", True),
    "nvidia_nvfp4 (TE cast, SR, H16 on dW)": ("nvidia_nvfp4", "step", True),
    "tetrajet_v2 (NVFP4 SR H16, outer 128)": ("tetrajet_v2", "step", True),
    "MXFP4 nearest, eager (GRADCOMP_COMPILE=0)": ("mxfp4", "step", False),
}


def batches(batch_size: int, image_size: int | None, channels: int | None, device: str):
    """A few training batches on `device`, and what they are."""
    if image_size is None and channels is None and FASHION_MNIST_SYSTEM_DIR.exists():
        data, source = load_split("fashion-mnist", None, True, subset_per_class=batch_size), "Fashion-MNIST"
    elif image_size is None and channels is None:
        data, source = load_split("synthetic", None, True), "synthetic"
    else:  # two batches of synthetic images of the requested shape
        per_class = -(-2 * batch_size // 10)
        data = make_synthetic(True, image_size=image_size or 32, channels=channels or 3, per_class=per_class)
        source = "synthetic"
    chosen = data.batches(batch_size, shuffle=True, drop_last=True)
    return [(images.to(device), labels.to(device)) for images, labels in chosen], source


def _launch_rows(arms: dict, step) -> list[dict]:
    """What one step of each arm launches (Triton kernels, torch operations, the model's included) and its
    syncs, and what compression adds to the uncompressed step per compressed layer."""
    works = {}
    for name, (model, handle, optimizer, compiled, _) in arms.items():
        with count_work() as works[name]:
            step(model, handle, optimizer, 3, compiled)
    plain = works["uncompressed"].total_launches
    rows = []
    for name, (_, handle, *_) in arms.items():
        work, layers = works[name], len(handle.layers) if handle is not None else 0
        rows.append(
            {
                "arm": name,
                "launches": work.total_launches,
                "Triton launches": sum(work.launches.values()),
                "syncs": sum(work.syncs.values()),
                "added per compressed layer": round((work.total_launches - plain) / max(layers, 1), 2),
            }
        )
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--rounds", type=int, default=6)
    parser.add_argument("--steps", type=int, default=4, help="steps per arm per round")
    parser.add_argument("--batch-size", type=int, default=128)
    parser.add_argument("--model", default="resnet18")
    parser.add_argument("--stem", default="model", help="the ResNet stem (the default config's: 3x3s2)")
    parser.add_argument(
        "--model-kwargs",
        default="{}",
        help="YAML mapping passed to timm (the default config's: '{channels: [16, 32, 64, 128]}')",
    )
    parser.add_argument("--arms", choices=("all", "block"), default="all", help="the policies to time")
    parser.add_argument(
        "--channels-last", action="store_true", help="NHWC tensors (the default config's `channels_last`)"
    )
    parser.add_argument("--device", choices=("cpu", "cuda"), default="cpu")
    parser.add_argument("--image-size", type=int, help="synthetic images of this size (default 32)")
    parser.add_argument("--channels", type=int, help="synthetic images with this many channels (default 3)")
    parser.add_argument("--quick", action="store_true", help="batch 8, 16x16 images, one timed step per arm")
    parser.add_argument(
        "--record", action="store_true", help="save the table to benchmarks/records/ (see records.py)"
    )
    parser.add_argument(
        "--launches",
        action="store_true",
        help="count each arm's launches and syncs of one step instead of timing (on CPU with "
        "TRITON_INTERPRET=1 through the Triton kernels: what the step launches on a GPU)",
    )
    args = parser.parse_args()
    if args.quick:
        args.rounds, args.steps, args.batch_size = 1, 1, 8
        args.image_size = args.image_size or 16
    cuda = args.device == "cuda"

    data, source = batches(args.batch_size, args.image_size, args.channels, args.device)
    torch.manual_seed(0)
    shape = "x".join(map(str, data[0][0].shape[1:][::-1]))
    kwargs = yaml.safe_load(args.model_kwargs) or {}
    base = create_model(args.model, num_classes=10, in_chans=data[0][0].shape[1], stem=args.stem, **kwargs)
    layout = torch.channels_last if args.channels_last else torch.preserve_format
    base = base.to(args.device, memory_format=layout)
    arms = {}
    for name, spec in (BLOCK_ARMS if args.arms == "block" else ARMS).items():
        if cuda and spec and not spec[2]:
            continue  # compiling concerns the CPU path only
        model = copy.deepcopy(base)
        backend = "triton" if args.launches and interpreter_enabled() else "auto"
        handle = attach(model, CompressionConfig(spec[0], refresh=spec[1]), backend=backend) if spec else None
        optimizer = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
        arms[name] = (model, handle, optimizer, spec[2] if spec else True, [])

    def step(model, handle, optimizer, index: int, compiled: bool = True) -> float:
        images, labels = data[index % len(data)]
        os.environ[COMPILE_ENV] = "1" if compiled else "0"
        if cuda:
            torch.cuda.synchronize()
        start = time.perf_counter()
        if handle is not None:
            handle.begin_step(index)
        loss = nn.functional.cross_entropy(model(images), labels)
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()
        if cuda:
            torch.cuda.synchronize()
        return time.perf_counter() - start

    warm_up = 3 if args.launches else 2  # past the refits of a new network's all-zero first gradients
    for model, handle, optimizer, compiled, _ in arms.values():  # warm-up (and kernel compilation)
        for index in range(warm_up):
            step(model, handle, optimizer, index, compiled)
    if args.launches:
        print(f"{args.model}, batch {args.batch_size}, {source} {shape}: one training step")
        print(to_markdown(_launch_rows(arms, step)))
        return
    counter = 0
    for _ in range(args.rounds):
        for model, handle, optimizer, compiled, times in arms.values():
            for _ in range(args.steps):
                times.append(step(model, handle, optimizer, counter, compiled))
                counter += 1

    baseline = statistics.median(arms["uncompressed"][-1])
    rows = []
    for name, (model, handle, optimizer, compiled, times) in arms.items():
        median = statistics.median(times)
        row = {"arm": name, "ms/step": round(median * 1e3, 1), "vs uncompressed": round(median / baseline, 3)}
        if cuda:  # what one step launches and where it waits for the device (the CPU path runs compiled)
            with count_work() as work:
                step(model, handle, optimizer, counter, compiled)
            row["launches/step"] = work.total_launches
            row["syncs/step"] = sum(work.syncs.values())
        rows.append(row)
    where = torch.cuda.get_device_name() if cuda else f"{torch.get_num_threads()} CPU threads"
    print(
        f"{args.model}, batch {args.batch_size}, {source} {shape}, {where}, "
        f"{args.rounds * args.steps} timed steps per arm"
    )
    print(to_markdown(rows))
    if args.record and not args.quick:
        settings = {
            key: value for key, value in vars(args).items() if key not in ("record", "quick", "launches")
        }
        benchmark = "train_overhead" + ("-block" if args.arms == "block" else "")
        print(save(benchmark, rows, settings | {"data": f"{source} {shape}"}, where if cuda else None))


if __name__ == "__main__":
    main()
