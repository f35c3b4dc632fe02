import gzip
import struct

import numpy as np
import pytest
import torch

from gradcomp.training.data import (
    FASHION_MNIST_SYSTEM_DIR,
    DatasetNotFound,
    load_split,
    make_synthetic,
    read_idx,
)
from gradcomp.training.datasets import DATASETS


def test_synthetic_dataset_is_deterministic_and_balanced():
    a, b = make_synthetic(True), make_synthetic(True)
    assert torch.equal(a.images, b.images) and a.images.dtype == torch.uint8
    assert a.images.shape == (640, 3, 16, 16) and torch.bincount(a.labels).tolist() == [64] * 10
    assert not torch.equal(make_synthetic(False).images, a.images)  # test noise differs from train noise


def test_batches_are_deterministic_and_resumable():
    data = make_synthetic(True)
    data.augment = True
    full = list(data.batches(32, shuffle=True, seed=3, epoch=1, drop_last=True))
    again = list(data.batches(32, shuffle=True, seed=3, epoch=1, drop_last=True))
    resumed = list(data.batches(32, shuffle=True, seed=3, epoch=1, start=5, drop_last=True))
    assert len(full) == data.steps_per_epoch(32, drop_last=True) == 20
    assert all(torch.equal(x, y) for (x, _), (y, _) in zip(full, again, strict=True))
    assert all(torch.equal(x, y) for (x, _), (y, _) in zip(full[5:], resumed, strict=True))
    other_epoch = next(iter(data.batches(32, shuffle=True, seed=3, epoch=2)))
    assert not torch.equal(full[0][1], other_epoch[1])
    images, _ = full[0]
    assert images.dtype == torch.float32 and abs(float(images.mean())) < 1.0


def test_shards_of_a_batch_are_disjoint_and_make_up_the_batch():
    data = make_synthetic(True)
    data.augment = True
    options = {"shuffle": True, "seed": 3, "epoch": 1, "start": 2, "drop_last": True}
    whole = list(data.batches(30, **options))
    shards = [list(data.batches(30, **options, shard=(rank, 3))) for rank in range(3)]
    assert len(whole) == len(shards[0]) == 19
    for index, (images, labels) in enumerate(whole):
        parts = [shard[index] for shard in shards]
        assert all(part[1].numel() == 10 for part in parts)
        # rank r holds positions r, r + 3, ...: interleaving the shards gives back the batch, augmented alike
        assert torch.equal(torch.stack([part[0] for part in parts], 1).flatten(0, 1), images)
        assert torch.equal(torch.stack([part[1] for part in parts], 1).flatten(), labels)


def test_streamed_folder_shards(tmp_path):
    from PIL import Image

    from gradcomp.training.data import ImageFolderSet

    for label in range(2):
        (tmp_path / f"class{label}").mkdir()
        for index in range(5):
            Image.new("RGB", (8, 8), (label * 100 + index, 0, 0)).save(tmp_path / f"class{label}/{index}.png")
    data = ImageFolderSet(DATASETS["imagenet"], tmp_path, train=False, workers=0, subset_per_class=None)
    whole = [labels for _, labels in data.batches(4, shuffle=True, seed=1)]
    shards = [[labels for _, labels in data.batches(4, shuffle=True, seed=1, shard=(r, 2))] for r in range(2)]
    assert [labels.numel() for labels in whole] == [4, 4, 2]
    assert [labels.numel() for labels in shards[0]] == [2, 2, 1]
    for labels, first, second in zip(whole, *shards, strict=True):
        assert torch.equal(torch.stack([first, second], 1).flatten(), labels)


def test_subset_per_class():
    data = make_synthetic(True).subset_per_class(5)
    assert torch.bincount(data.labels).tolist() == [5] * 10


def test_read_idx(tmp_path):
    payload = np.arange(24, dtype=np.uint8).reshape(2, 3, 4)
    path = tmp_path / "x-idx3-ubyte.gz"
    with gzip.open(path, "wb") as handle:
        handle.write(struct.pack(">HBB", 0, 0x08, 3) + struct.pack(">3I", 2, 3, 4) + payload.tobytes())
    assert np.array_equal(read_idx(path), payload)


@pytest.mark.skipif(
    not FASHION_MNIST_SYSTEM_DIR.exists(), reason="Debian package dataset-fashion-mnist not installed"
)
def test_fashion_mnist_from_the_debian_package_matches_the_registry():
    info = DATASETS["fashion-mnist"]
    train = load_split("fashion-mnist", None, True)
    test = load_split("fashion-mnist", None, False, subset_per_class=10)
    assert train.images.shape == (info.train_size, info.channels, info.image_size, info.image_size)
    assert len(load_split("fashion-mnist", None, False)) == info.test_size
    assert torch.bincount(train.labels).tolist() == [info.train_size // info.classes] * info.classes
    assert len(test) == 10 * info.classes
    pixels = train.images.float() / 255
    assert pixels.mean().item() == pytest.approx(info.mean[0], abs=1e-4)
    assert pixels.std().item() == pytest.approx(info.std[0], abs=1e-4)
    assert load_split("fashion-mnist", None, True, 5).images.data_ptr() != train.images.data_ptr()
    assert load_split("fashion-mnist", None, True) is train  # the files are read once per process


def test_synthetic_matches_the_registry():
    info = DATASETS["synthetic"]
    train, test = load_split("synthetic", None, True), load_split("synthetic", None, False)
    assert (len(train), len(test)) == (info.train_size, info.test_size)
    assert (train.num_classes, train.in_chans, train.image_size) == (
        info.classes,
        info.channels,
        info.image_size,
    )


@pytest.mark.parametrize("name", ["cifar10", "cifar100", "imagenet"])
def test_missing_datasets_say_where_and_how(tmp_path, name):
    with pytest.raises(DatasetNotFound, match=str(tmp_path)):
        load_split(name, tmp_path, True)
    with pytest.raises(DatasetNotFound, match="data-dir"):
        load_split(name, None, True)


def test_unknown_dataset():
    with pytest.raises(ValueError, match="unknown dataset"):
        load_split("mnist-typo", None, True)
