"""The datasets gradcomp trains on: every fact about each one, in one registry that imports no torch.

`gradcomp.training.data` reads these facts to load and normalise the images; the training config checks names
and takes each dataset's training defaults from here; parsing the workflow (which must not import torch) sizes
training jobs from the split sizes; reports name the data by `title`.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any


@dataclass(frozen=True)
class Dataset:
    """One dataset. `storage` says how `gradcomp.training.data` reads it: "idx" (the MNIST file format, from
    `system_dir` unless a data_dir is given), "cifar" (torchvision's python batches under data_dir),
    "image-folder" (data_dir/train and data_dir/val, one subfolder per class, streamed) or "generated"
    (synthetic images made in memory). mean / std: per channel, of the training images scaled to [0, 1]."""

    title: str
    classes: int
    channels: int
    image_size: int
    train_size: int
    test_size: int
    mean: tuple[float, ...]
    std: tuple[float, ...]
    storage: str
    defaults: dict[str, Any] = field(default_factory=dict)  # training keys that suit it (TrainConfig)
    system_dir: Path | None = None  # where a system package installs it, read when no data_dir is given

    def __post_init__(self) -> None:
        if not len(self.mean) == len(self.std) == self.channels:
            raise ValueError(f"{self.title}: mean and std need one value per channel ({self.channels})")

    def training_images(self, subset_per_class: int | None) -> int:
        """How many training images a run reads: the first `subset_per_class` of every class, or all."""
        if subset_per_class is None:
            return self.train_size
        return min(self.train_size, subset_per_class * self.classes)


DATASETS: dict[str, Dataset] = {
    "fashion-mnist": Dataset(
        title="Fashion-MNIST",
        classes=10,
        channels=1,
        image_size=28,
        train_size=60_000,
        test_size=10_000,
        mean=(0.2860,),
        std=(0.3530,),
        storage="idx",
        defaults={"model": "resnet18", "batch_size": 128, "lr": 0.05, "epochs": 1},
        system_dir=Path("/usr/share/datasets/fashion-mnist"),  # Debian package dataset-fashion-mnist
    ),
    "cifar10": Dataset(
        title="CIFAR-10",
        classes=10,
        channels=3,
        image_size=32,
        train_size=50_000,
        test_size=10_000,
        mean=(0.4914, 0.4822, 0.4465),
        std=(0.2470, 0.2435, 0.2616),
        storage="cifar",
        defaults={"model": "resnet18", "stem": "3x3", "batch_size": 128, "lr": 0.1, "epochs": 200},
    ),
    "cifar100": Dataset(
        title="CIFAR-100",
        classes=100,
        channels=3,
        image_size=32,
        train_size=50_000,
        test_size=10_000,
        mean=(0.5071, 0.4865, 0.4409),
        std=(0.2673, 0.2564, 0.2762),
        storage="cifar",
        defaults={"model": "resnet18", "stem": "3x3", "batch_size": 128, "lr": 0.1, "epochs": 200},
    ),
    "imagenet": Dataset(
        title="ImageNet",
        classes=1000,
        channels=3,
        image_size=224,  # random-resized (training) or centre (test) crops
        train_size=1_281_167,
        test_size=50_000,
        mean=(0.485, 0.456, 0.406),
        std=(0.229, 0.224, 0.225),
        storage="image-folder",
        defaults={"model": "resnet18", "batch_size": 256, "lr": 0.1, "epochs": 90, "weight_decay": 1e-4},
    ),
    "synthetic": Dataset(  # learnable random images for tests and dry runs
        title="synthetic images",
        classes=10,
        channels=3,
        image_size=16,
        train_size=640,
        test_size=640,
        mean=(0.5, 0.5, 0.5),
        std=(0.25, 0.25, 0.25),
        storage="generated",
        defaults={"model": "resnet10t", "batch_size": 32, "lr": 0.05, "epochs": 2},
    ),
}


def lookup(name: str) -> Dataset:
    """The registry's entry, or a ValueError naming the known datasets."""
    if name not in DATASETS:
        raise ValueError(f"unknown dataset {name!r}; choose from {', '.join(DATASETS)}")
    return DATASETS[name]
