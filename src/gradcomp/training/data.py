"""Loading the datasets of the registry (`gradcomp.training.datasets`, which holds what each one is):
Fashion-MNIST (offline, the default), CIFAR-10/100 and ImageNet from user paths, synthetic images.

Small datasets are held in memory as uint8 tensors and batched here: the order of each epoch and every
augmentation draw come from generators seeded by (seed, epoch, batch), so a run resumed in the middle of an
epoch sees exactly the batches an uninterrupted run would. ImageNet streams from an ImageFolder with the same
batching interface.

Several training processes share each batch: with `shard=(rank, world_size)` a process gets the positions
rank, rank + world_size, ... of every batch of the epoch's order, so the processes see disjoint parts whose
union is the single-process batch (augmented alike, since the draws are made for the whole batch).
"""

from __future__ import annotations

import dataclasses
import functools
import gzip
import struct
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
from torch import Tensor

from gradcomp.training.datasets import DATASETS, Dataset, lookup

FASHION_MNIST = DATASETS["fashion-mnist"]
FASHION_MNIST_SYSTEM_DIR = FASHION_MNIST.system_dir  # the Debian package's folder


class DatasetNotFound(FileNotFoundError):
    """A dataset is missing; the message says where it was looked for and how to get it."""


def first_per_class(labels: Tensor, num_classes: int, count: int) -> Tensor:
    """Sorted indices of the first `count` examples of every class (a deterministic subset)."""
    chosen = [torch.nonzero(labels == c).flatten()[:count] for c in range(num_classes)]
    return torch.cat(chosen).sort().values


class _Split:
    """What the training loop needs from a split besides `batches`: its length and epoch bookkeeping."""

    def __len__(self) -> int:
        raise NotImplementedError

    def steps_per_epoch(self, batch_size: int, drop_last: bool) -> int:
        return len(self) // batch_size if drop_last else -(-len(self) // batch_size)

    def epoch_order(self, shuffle: bool, seed: int, epoch: int) -> Tensor:
        """Positions in visiting order: a permutation that depends only on (seed, epoch) when shuffling."""
        n = len(self)
        return torch.randperm(n, generator=_generator(seed, epoch)) if shuffle else torch.arange(n)


@dataclass
class ImageSet(_Split):
    """Images (uint8, N x C x H x W) and labels (int64) of one split, held in memory."""

    images: Tensor
    labels: Tensor
    num_classes: int
    mean: tuple[float, ...]
    std: tuple[float, ...]
    augment: bool = False  # random crop (padding 4) and horizontal flip when training
    source: Path | None = None  # the data_dir read (None: generated images)

    def __len__(self) -> int:
        return self.labels.numel()

    @property
    def in_chans(self) -> int:
        return self.images.shape[1]

    @property
    def image_size(self) -> int:
        return self.images.shape[-1]

    def subset_per_class(self, count: int | None) -> ImageSet:
        """The first `count` images of every class (deterministic), or everything when count is None."""
        if count is None:
            return self
        keep = first_per_class(self.labels, self.num_classes, count)
        return dataclasses.replace(self, images=self.images[keep], labels=self.labels[keep])

    def batches(
        self,
        batch_size: int,
        shuffle: bool,
        seed: int = 0,
        epoch: int = 0,
        start: int = 0,
        drop_last: bool = False,
        shard: tuple[int, int] = (0, 1),
    ) -> Iterator[tuple[Tensor, Tensor]]:
        """Normalised float batches (this process's `shard` of each); with shuffle, the epoch's order and
        augmentations depend only on (seed, epoch), and `start` skips batches without changing the rest."""
        order = self.epoch_order(shuffle, seed, epoch)
        count = self.steps_per_epoch(batch_size, drop_last)
        mean = torch.tensor(self.mean).view(1, -1, 1, 1)
        std = torch.tensor(self.std).view(1, -1, 1, 1)
        mine = slice(shard[0], None, shard[1])
        for index in range(start, count):
            chosen = order[index * batch_size : (index + 1) * batch_size]
            images = self.images[chosen[mine]].float().div_(255)
            if self.augment and shuffle:
                images = _crop_and_flip(images, _generator(seed, epoch, index + 1), len(chosen), mine)
            yield (images - mean) / std, self.labels[chosen[mine]]


def _generator(*keys: int) -> torch.Generator:
    seed = 0
    for key in keys:
        seed = (seed * 1_000_003 + key + 1) % (2**63)
    return torch.Generator().manual_seed(seed)


def _crop_and_flip(
    images: Tensor, generator: torch.Generator, drawn: int, positions: slice, padding: int = 4
) -> Tensor:
    """Random crops and flips drawn for a batch of `drawn` images; `images` are those at `positions`."""
    n, _, h, w = images.shape
    padded = torch.nn.functional.pad(images, (padding,) * 4)
    dy = torch.randint(0, 2 * padding + 1, (drawn,), generator=generator)[positions]
    dx = torch.randint(0, 2 * padding + 1, (drawn,), generator=generator)[positions]
    rows = (dy[:, None] + torch.arange(h))[:, None, :, None]
    cols = (dx[:, None] + torch.arange(w))[:, None, None, :]
    cropped = padded[
        torch.arange(n)[:, None, None, None], torch.arange(images.shape[1])[None, :, None, None], rows, cols
    ]
    flip = torch.rand(drawn, generator=generator)[positions] < 0.5
    cropped[flip] = cropped[flip].flip(-1)
    return cropped


# --- readers ------------------------------------------------------------------------------------------------
def read_idx(path: Path) -> np.ndarray:
    """An IDX file (the MNIST format), gzipped or not, as a numpy array."""
    opener = gzip.open if path.suffix == ".gz" else open
    with opener(path, "rb") as handle:
        data = handle.read()
    _, dtype_code, dims = struct.unpack(">HBB", data[:4])
    if dtype_code != 0x08:
        raise ValueError(f"{path}: only unsigned-byte IDX files are supported")
    shape = struct.unpack(f">{dims}I", data[4 : 4 + 4 * dims])
    return np.frombuffer(data, dtype=np.uint8, offset=4 + 4 * dims).reshape(shape)


def _find_idx(directory: Path, stem: str) -> Path | None:
    for candidate in (directory / f"{stem}.gz", directory / stem, directory / "FashionMNIST" / "raw" / stem):
        if candidate.exists():
            return candidate
    return None


def load_fashion_mnist(data_dir: Path | None, train: bool) -> ImageSet:
    """From `data_dir` when given (its IDX files, else torchvision's download into it), else from the Debian
    package's files, else torchvision's download into ~/.cache/gradcomp. A given `data_dir` is never passed
    over for another folder: the run's config.yaml records the folder read (`ImageSet.source`)."""
    prefix = "train" if train else "t10k"
    if data_dir is not None and not Path(data_dir).is_dir():
        raise DatasetNotFound(f"--data-dir {data_dir} is not a folder (Fashion-MNIST's IDX files go there)")
    local = Path(data_dir) if data_dir is not None else FASHION_MNIST_SYSTEM_DIR
    images = _find_idx(local, f"{prefix}-images-idx3-ubyte")
    labels = _find_idx(local, f"{prefix}-labels-idx1-ubyte")
    if images and labels:
        return _in_memory(
            FASHION_MNIST,
            torch.from_numpy(read_idx(images).copy()).unsqueeze(1),
            torch.from_numpy(read_idx(labels).astype(np.int64)),
            source=local,
        )
    root = Path(data_dir) if data_dir is not None else Path.home() / ".cache" / "gradcomp"
    try:
        from torchvision.datasets import FashionMNIST

        dataset = FashionMNIST(str(root), train=train, download=True)
    except Exception as error:
        cause = f"{type(error).__name__}: {' '.join(str(error).split())}"
        if data_dir is not None:
            raise DatasetNotFound(
                f"Fashion-MNIST not found in --data-dir {local} and the download into it failed ({cause}). "
                f"Put the four IDX files ({prefix}-images-idx3-ubyte[.gz], ...) there, or leave --data-dir "
                f"out to read the Debian package's files ({FASHION_MNIST_SYSTEM_DIR})."
            ) from error
        raise DatasetNotFound(
            f"Fashion-MNIST not found in {local} and the download into {root} failed ({cause}). Install it "
            "with `apt-get install dataset-fashion-mnist` (Debian/Ubuntu) or put the four IDX files in "
            "--data-dir."
        ) from error
    return _in_memory(FASHION_MNIST, dataset.data.unsqueeze(1), dataset.targets.long(), source=root)


def _in_memory(info: Dataset, images: Tensor, labels: Tensor, **options) -> ImageSet:
    """An in-memory split of a registry dataset, normalised with its mean and std."""
    if images.shape[1:] != (info.channels, info.image_size, info.image_size):
        raise ValueError(
            f"{info.title}: images of shape {tuple(images.shape[1:])}, expected "
            f"{(info.channels, info.image_size, info.image_size)}"
        )
    return ImageSet(images, labels, info.classes, info.mean, info.std, **options)


def load_cifar(info: Dataset, data_dir: Path | None, train: bool) -> ImageSet:
    """CIFAR-10 or CIFAR-100 (torchvision's python batches under data_dir); never downloaded."""
    from torchvision.datasets import CIFAR10, CIFAR100

    cls, folder, url = (
        (CIFAR10, "cifar-10-batches-py", "cifar-10-python.tar.gz")
        if info.classes == 10
        else (CIFAR100, "cifar-100-python", "cifar-100-python.tar.gz")
    )
    if data_dir is None:
        raise DatasetNotFound(f"{info.title} needs --data-dir (a folder holding {folder}/)")
    try:
        dataset = cls(str(data_dir), train=train, download=False)
    except RuntimeError as error:
        raise DatasetNotFound(
            f"{info.title} not found: expected {Path(data_dir) / folder}/. Download {url} from "
            f"https://www.cs.toronto.edu/~kriz/cifar.html and extract it into {data_dir}."
        ) from error
    images = torch.from_numpy(dataset.data).permute(0, 3, 1, 2).contiguous()
    return _in_memory(info, images, torch.tensor(dataset.targets), augment=train, source=Path(data_dir))


SYNTHETIC = DATASETS["synthetic"]


def make_synthetic(
    train: bool,
    num_classes: int = SYNTHETIC.classes,
    image_size: int = SYNTHETIC.image_size,
    channels: int = SYNTHETIC.channels,
    per_class: int = SYNTHETIC.train_size // SYNTHETIC.classes,
    seed: int = 0,
) -> ImageSet:
    """Learnable random images: a smooth random prototype per class plus noise (tests and dry runs); the
    defaults make the registry's `synthetic` dataset."""
    generator = torch.Generator().manual_seed(seed)
    coarse = torch.rand(num_classes, channels, 4, 4, generator=generator)
    prototypes = torch.nn.functional.interpolate(
        coarse, size=image_size, mode="bilinear", align_corners=False
    )
    noise_generator = torch.Generator().manual_seed(seed + (1 if train else 2))
    labels = torch.arange(num_classes).repeat_interleave(per_class)
    noise = 0.25 * torch.randn(labels.numel(), channels, image_size, image_size, generator=noise_generator)
    images = ((prototypes[labels] + noise).clamp(0, 1) * 255).round().to(torch.uint8)
    mean, std = (values[:1] * channels for values in (SYNTHETIC.mean, SYNTHETIC.std))  # alike in each channel
    return ImageSet(images, labels, num_classes, mean, std)


class ImageFolderSet(_Split):
    """A streamed ImageFolder split (ImageNet) with the same batching interface as `ImageSet`.

    The order of an epoch depends only on (seed, epoch); augmentations run in DataLoader workers seeded from
    (seed, epoch, start, rank), so a resumed epoch sees the same images in the same order, differently
    augmented.
    """

    def __init__(
        self, info: Dataset, folder: Path, train: bool, workers: int, subset_per_class: int | None
    ) -> None:
        from torchvision import datasets, transforms

        size = info.image_size
        if train:
            augment = [transforms.RandomResizedCrop(size), transforms.RandomHorizontalFlip()]
        else:  # the usual centre crop of 224 from 256
            augment = [transforms.Resize(size * 8 // 7), transforms.CenterCrop(size)]
        normalise = transforms.Normalize(info.mean, info.std)
        pipeline = transforms.Compose([*augment, transforms.ToTensor(), normalise])
        self.dataset = datasets.ImageFolder(str(folder), pipeline)
        self.num_classes = len(self.dataset.classes)
        self.in_chans, self.image_size, self.workers = info.channels, size, workers
        self.source = folder.parent  # the data_dir read
        targets = torch.tensor(self.dataset.targets)
        self.indices = torch.arange(targets.numel())
        if subset_per_class is not None:
            self.indices = first_per_class(targets, self.num_classes, subset_per_class)

    def __len__(self) -> int:
        return self.indices.numel()

    def batches(
        self,
        batch_size: int,
        shuffle: bool,
        seed: int = 0,
        epoch: int = 0,
        start: int = 0,
        drop_last: bool = False,
        shard: tuple[int, int] = (0, 1),
    ) -> Iterator[tuple[Tensor, Tensor]]:
        order = self.indices[self.epoch_order(shuffle, seed, epoch)]
        rank, world_size = shard
        batches = [
            order[index * batch_size : (index + 1) * batch_size][rank::world_size].tolist()
            for index in range(start, self.steps_per_epoch(batch_size, drop_last))
        ]
        loader = torch.utils.data.DataLoader(
            self.dataset,
            batch_sampler=batches,
            num_workers=self.workers,
            generator=_generator(seed, epoch, start, rank),
        )
        yield from loader


def load_image_folder(
    info: Dataset, data_dir: Path | None, train: bool, subset_per_class: int | None, workers: int
) -> ImageFolderSet:
    if data_dir is None:
        raise DatasetNotFound(
            f"{info.title} needs --data-dir (a folder with train/ and val/ class subfolders)"
        )
    folder = data_dir / ("train" if train else "val")
    if not folder.is_dir():
        raise DatasetNotFound(
            f"{info.title} split not found: expected {folder}/ with one subfolder per class"
        )
    return ImageFolderSet(info, folder, train, workers, subset_per_class)


# how each kind of storage (gradcomp.training.datasets.Dataset.storage) is read into memory
_READERS: dict[str, Callable[[Dataset, Path | None, bool], ImageSet]] = {
    "idx": lambda info, data_dir, train: load_fashion_mnist(data_dir, train),
    "cifar": load_cifar,
    "generated": lambda info, data_dir, train: make_synthetic(train),
}


@functools.lru_cache(maxsize=4)
def _read(name: str, data_dir: Path | None, train: bool) -> ImageSet:
    """A whole in-memory split, read once per process: a process that trains several seeds or runs reads the
    files once (the split is never modified; batches are new tensors)."""
    info = DATASETS[name]
    return _READERS[info.storage](info, data_dir, train)


def load_split(
    name: str, data_dir: str | Path | None, train: bool, subset_per_class: int | None = None, workers: int = 4
) -> ImageSet | ImageFolderSet:
    """One split of a dataset of the registry (gradcomp.training.datasets): in memory, or streamed from an
    image folder (ImageNet). A missing dataset raises DatasetNotFound saying where it was looked for and how
    to get it."""
    info = lookup(name)
    data_dir = Path(data_dir) if data_dir else None
    if info.storage == "image-folder":
        return load_image_folder(info, data_dir, train, subset_per_class, workers)
    return _read(name, data_dir, train).subset_per_class(subset_per_class)
