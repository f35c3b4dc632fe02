"""Two training processes on CPU (gloo), started as torchrun starts them (RANK, WORLD_SIZE, MASTER_* set)."""

import json
import math
import os
import signal
import time

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from helpers import free_ports, read_metrics

import gradcomp.training.train as train_module
from gradcomp.training.config import resolve_config
from gradcomp.training.train import TrainingInterrupted

WORLD_SIZE = 2
STOP_AT = 4  # rank 1 alone gets a SIGTERM during this step (the second epoch's first) of the second run
# 160 training images, global batch 48 (24 per rank): three steps per epoch; per-epoch compression
# statistics, so that resuming needs each rank's own statistics from the checkpoint
CONFIG = {
    "dataset": "synthetic",
    "model": "resnet10t",
    "batch_size": 48,
    "epochs": 2,
    "progress": False,
    "log_every": 1,
    "subset_per_class": 16,
    "test_subset_per_class": 8,
    "policy": "prune:sparsity=0.8",
    "refresh": "epoch",
    "reduce_statistics": True,
}


def _worker(rank: int, ports: list[int], folder: str) -> None:
    """One rank: an uninterrupted run, then a run stopped by a signal to rank 1 and resumed; after every step
    it compares its weights with the other rank's."""
    os.environ.update(RANK=str(rank), LOCAL_RANK=str(rank), WORLD_SIZE=str(WORLD_SIZE))
    os.environ["MASTER_ADDR"] = "127.0.0.1"
    torch.set_num_threads(1)
    same_weights, stop_at = [], {"step": None}
    step = train_module._train_step

    def step_and_compare(run, images, labels):
        loss = step(run, images, labels)
        flat = torch.cat([p.detach().flatten() for p in run.model.parameters()])
        copies = [torch.empty_like(flat) for _ in range(WORLD_SIZE)]
        dist.all_gather(copies, flat)
        same_weights.append(all(torch.equal(copies[0], copy) for copy in copies[1:]))
        if rank == 1 and run.progress.step == stop_at["step"]:
            os.kill(os.getpid(), signal.SIGTERM)
        return loss

    train_module._train_step = step_and_compare

    def run(name: str, port: int, **options) -> dict:
        os.environ["MASTER_PORT"] = str(port)
        return train_module.train(resolve_config(**CONFIG, out=os.path.join(folder, name), **options))

    results = {"reference": run("reference", ports[0])}
    stop_at["step"] = STOP_AT
    try:
        run("resumed", ports[1])
    except TrainingInterrupted as error:
        results["interrupted"] = str(error)
    stop_at["step"] = None
    results["resumed"] = run("resumed", ports[2], resume=True)
    results["same_weights"] = same_weights
    with open(os.path.join(folder, f"rank{rank}.json"), "w") as handle:
        json.dump(results, handle)


def _weights(run_dir):
    return torch.load(run_dir / "checkpoint.pt", weights_only=False)["model"]


def test_two_ranks_stay_identical_and_resume_exactly(tmp_path):
    processes = mp.spawn(_worker, args=(free_ports(3), str(tmp_path)), nprocs=WORLD_SIZE, join=False)
    deadline = time.monotonic() + 300
    while not processes.join(timeout=1):  # raises when a rank fails
        if time.monotonic() > deadline:
            for process in processes.processes:
                process.kill()
            pytest.fail("the ranks hung: a collective that not every rank reached")
    ranks = [json.loads((tmp_path / f"rank{r}.json").read_text()) for r in range(WORLD_SIZE)]
    for results in ranks:
        assert f"at step {STOP_AT}" in results["interrupted"]  # rank 0 stopped at the same step as rank 1
        assert results["same_weights"] == [True] * (6 + STOP_AT + 6 - STOP_AT)
    reference, other = ranks[0]["reference"], ranks[1]["reference"]
    assert reference["steps"] == 6 and reference["processes"] == WORLD_SIZE
    global_keys = ("final_test_accuracy", "best_test_accuracy", "steps", "skipped_steps", "gradient_sparsity")
    assert all(reference[key] == other[key] for key in global_keys)
    # each rank fits its own gradients: the reported per-layer sparsity is summed, the fits are rank 0's
    layers = reference["layers"]
    assert all(layers[name]["sparsity"] == other["layers"][name]["sparsity"] for name in layers)
    fits = [(layers[name]["mu"], other["layers"][name]["mu"]) for name in layers]
    assert any(math.isfinite(mine) and mine != theirs for mine, theirs in fits)
    # the interrupted and resumed run ends exactly where the uninterrupted one does: same seed, same ranks
    resumed = ranks[0]["resumed"]
    for key in (*global_keys, "epochs", "layers"):
        assert resumed[key] == reference[key], key
    assert read_metrics(tmp_path / "resumed", times=False) == read_metrics(
        tmp_path / "reference", times=False
    )
    assert [m["kind"] for m in read_metrics(tmp_path / "reference", times=False)].count(
        "epoch"
    ) == 2  # rank 0 alone logs
    final, expected = _weights(tmp_path / "resumed"), _weights(tmp_path / "reference")
    assert all(torch.equal(final[name], expected[name]) for name in expected)


def _guard_worker(rank: int, port: int, folder: str) -> None:
    """One rank of a DistributedDataParallel model whose ranks see different data: a run that only records
    each rank's noise ratios, then one with a guard between the two ranks' ratios of one layer."""
    import torch.nn as nn

    from gradcomp import CompressionConfig, attach

    os.environ.update(
        RANK=str(rank), WORLD_SIZE=str(WORLD_SIZE), MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port)
    )
    torch.set_num_threads(1)
    dist.init_process_group("gloo")

    def run(**keys):
        torch.manual_seed(0)
        model = nn.Sequential(
            nn.Conv2d(3, 8, 3, padding=1), nn.ReLU(), nn.Conv2d(8, 8, 3, padding=1), nn.Flatten(),
            nn.Linear(8 * 64, 10),
        )  # fmt: skip
        config = CompressionConfig("fp:format=e2m1", layer_types=("conv", "linear"), noise_every=1, **keys)
        handle = attach(model, config, seed=rank)
        net = nn.parallel.DistributedDataParallel(model)
        generator = torch.Generator().manual_seed(100 + rank)  # each rank its own shard
        for _ in range(2):  # step 1 begins with the guard's reading of step 0
            images = torch.randn(16, 3, 8, 8, generator=generator) * (1 + 3 * rank)
            net.zero_grad()
            nn.functional.cross_entropy(net(images), torch.arange(16) % 10).backward()
        return handle

    rows = run().noise_ratios()
    first = {row["layer"]: row["carried_ratio"] for row in rows if row["step"] == 0}
    extremes = {}
    for op in (dist.ReduceOp.MIN, dist.ReduceOp.MAX):
        values = torch.tensor(list(first.values()), dtype=torch.float64)
        dist.all_reduce(values, op=op)
        extremes[op] = dict(zip(first, values.tolist(), strict=True))
    smallest, largest = extremes[dist.ReduceOp.MIN], extremes[dist.ReduceOp.MAX]
    # a guard between the ranks' ratios of the layer where they differ most: alone, the ranks disagree
    layer = max(first, key=lambda name: largest[name] / smallest[name])
    guard = math.sqrt(largest[layer] * smallest[layer])
    handle = run(guard=guard, guard_patience=1)
    result = {
        "switched": handle.switch_report()["switched"],
        "expected": {name: 0 for name in first if smallest[name] < guard},
        "alone": {name: 0 for name in first if first[name] < guard},
        "summary": {name: layer.get("switched_at") for name, layer in handle.layer_summary().items()},
    }
    with open(os.path.join(folder, f"guard{rank}.json"), "w") as handle_file:
        json.dump(result, handle_file)
    dist.destroy_process_group()


def test_the_guard_decides_once_for_every_rank(tmp_path):
    """Under torch.distributed each layer's guard reads the smallest R of all ranks (one all-reduce per
    noise step): every rank switches the same layers (each rank's guard used to decide alone, so ranks
    compressed different layers and the summary reported rank 0's switches)."""
    processes = mp.spawn(_guard_worker, args=(free_ports(1)[0], str(tmp_path)), nprocs=WORLD_SIZE, join=False)
    deadline = time.monotonic() + 120
    while not processes.join(timeout=1):
        if time.monotonic() > deadline:
            for process in processes.processes:
                process.kill()
            pytest.fail("the ranks hung: a collective that not every rank reached")
    ranks = [json.loads((tmp_path / f"guard{r}.json").read_text()) for r in range(WORLD_SIZE)]
    assert ranks[0]["alone"] != ranks[1]["alone"]  # the test's guard splits the ranks
    for result in ranks:
        assert result["switched"] == result["expected"] == ranks[0]["switched"]
        assert {name: at for name, at in result["summary"].items() if at is not None} == result["switched"]
