"""Training-step overhead of gradient compression, measured side by side in one run.

ResNet18 (timm, in_chans=1) on Fashion-MNIST-sized batches (batch 128, 28x28; the real images when the
Debian package is installed), SGD. Each arm has its own copy of the same initial model; arms run
interleaved, a few steps at a time, and the median step time of each is compared with the uncompressed
arm. Compression acts on each policy's default layers (convolution outputs for prune and fp, plus the
classifier for int); the probe is off.

    python benchmarks/train_overhead.py [--rounds 6] [--steps 4] [--batch-size 128]
"""

from __future__ import annotations

import argparse
import copy
import statistics
import time

import torch
from torch import nn

from gradcomp.analysis.tables import to_markdown
from gradcomp.attach import Schedule, attach
from gradcomp.data import FASHION_MNIST_SYSTEM_DIR, load_split
from gradcomp.models import create_model

ARMS = {
    "uncompressed": None,
    "prune 0.85, statistics every step": ("prune:sparsity=0.85", "step"),
    "prune 0.85, statistics every 10 steps": ("prune:sparsity=0.85", 10),
    "fp e4m1 per-layer optimal scale, every step": ("fp:format=e4m1", "step"),
    "int 5-bit psq (two streams)": ("int:bits=5,scheme=psq", "step"),
}


def batches(batch_size: int):
    if FASHION_MNIST_SYSTEM_DIR.exists():
        data = load_split("fashion-mnist", None, True, subset_per_class=batch_size)
        source = "Fashion-MNIST"
    else:
        data = load_split("synthetic", None, True)
        source = "synthetic"
    return list(data.batches(batch_size, shuffle=True, drop_last=True)), source


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--rounds", type=int, default=6)
    parser.add_argument("--steps", type=int, default=4, help="steps per arm per round")
    parser.add_argument("--batch-size", type=int, default=128)
    parser.add_argument("--model", default="resnet18")
    args = parser.parse_args()

    data, source = batches(args.batch_size)
    torch.manual_seed(0)
    base = create_model(args.model, num_classes=10, in_chans=data[0][0].shape[1])
    arms = {}
    for name, spec in ARMS.items():
        model = copy.deepcopy(base)
        handle = attach(model, spec[0], schedule=Schedule(refresh=spec[1])) if spec else None
        optimizer = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
        arms[name] = (model, handle, optimizer, [])

    def step(model, handle, optimizer, index: int) -> float:
        images, labels = data[index % len(data)]
        start = time.perf_counter()
        if handle is not None:
            handle.begin_step(index)
        loss = nn.functional.cross_entropy(model(images), labels)
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()
        return time.perf_counter() - start

    for model, handle, optimizer, _ in arms.values():  # warm-up
        for index in range(2):
            step(model, handle, optimizer, index)
    counter = 0
    for _ in range(args.rounds):
        for model, handle, optimizer, times in arms.values():
            for _ in range(args.steps):
                times.append(step(model, handle, optimizer, counter))
                counter += 1

    baseline = statistics.median(arms["uncompressed"][3])
    rows = []
    for name, (_, _, _, times) in arms.items():
        median = statistics.median(times)
        rows.append(
            {
                "arm": name,
                "ms/step": round(median * 1e3, 1),
                "vs uncompressed": round(median / baseline, 3),
            }
        )
    print(
        f"{args.model}, batch {args.batch_size}, {source} 28x28, {torch.get_num_threads()} CPU threads, "
        f"{args.rounds * args.steps} timed steps per arm"
    )
    print(to_markdown(rows))


if __name__ == "__main__":
    main()
