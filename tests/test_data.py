import gzip
import struct

import numpy as np
import pytest
import torch

from gradcomp.data import FASHION_MNIST_SYSTEM_DIR, DatasetNotFound, load_split, make_synthetic, read_idx


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
def test_fashion_mnist_from_the_debian_package():
    train = load_split("fashion-mnist", None, True)
    test = load_split("fashion-mnist", None, False, subset_per_class=10)
    assert train.images.shape == (60000, 1, 28, 28) and train.num_classes == 10
    assert torch.bincount(train.labels).tolist() == [6000] * 10
    assert len(test) == 100


@pytest.mark.parametrize("name", ["cifar10", "cifar100", "imagenet"])
def test_missing_datasets_say_where_and_how(tmp_path, name):
    with pytest.raises(DatasetNotFound, match=str(tmp_path)):
        load_split(name, tmp_path, True)
    with pytest.raises(DatasetNotFound, match="data-dir"):
        load_split(name, None, True)


def test_unknown_dataset():
    with pytest.raises(ValueError, match="unknown dataset"):
        load_split("mnist-typo", None, True)
