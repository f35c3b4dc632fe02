# TRITON_INTERPRET must be set before anything imports triton.language (torchvision and timm do; importing
# torch does not), so these lines come first. Unset, it becomes 0 where a CUDA device is visible (the Triton
# kernels are compiled and tested on it) and 1 elsewhere (they run on CPU tensors under the interpreter).
import os

import torch

os.environ.setdefault("TRITON_INTERPRET", "0" if torch.cuda.is_available() else "1")
# The torch implementation is the oracle, so the suite runs it eagerly; tests/test_compiled.py checks the
# compiled CPU path against it (and subprocesses, e.g. the pipeline's, inherit the setting).
os.environ.setdefault("GRADCOMP_COMPILE", "0")

import pytest

# Under pytest-xdist (`make test`), the workers share the cores: intra-op threads beyond a worker's share
# only contend (a 3-second test took 80 with two workers of two threads each on two cores).
if workers := int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "0")):
    torch.set_num_threads(max(1, (os.cpu_count() or 1) // workers))

from gradcomp._backend import interpreter_enabled

KERNEL_DEVICE = "cuda" if torch.cuda.is_available() and not interpreter_enabled() else "cpu"


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line(
        "markers",
        "cuda: the GPU subset (Triton kernels against the torch path, large tensors); `pytest -m cuda` runs "
        "it on CUDA when TRITON_INTERPRET is unset or 0, under the Triton interpreter otherwise",
    )


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:  # every test of the kernels belongs to the GPU subset
        if "kernel_device" in getattr(item, "fixturenames", ()):
            item.add_marker(pytest.mark.cuda)


@pytest.fixture
def kernel_device() -> str:
    """Where Triton kernels run in this session: CUDA, or the CPU under the Triton interpreter."""
    if KERNEL_DEVICE == "cpu" and not interpreter_enabled():
        pytest.skip("Triton kernels need CUDA or TRITON_INTERPRET=1")
    return KERNEL_DEVICE
