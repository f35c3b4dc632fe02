# TRITON_INTERPRET must be set before anything imports triton.language (torch, torchvision and timm may),
# so these lines come first. On a CUDA machine run with TRITON_INTERPRET=0 to test the compiled kernels.
import os

os.environ.setdefault("TRITON_INTERPRET", "1")

import pytest
import torch

from gradcomp._backend import interpreter_enabled

KERNEL_DEVICE = "cuda" if torch.cuda.is_available() and not interpreter_enabled() else "cpu"


@pytest.fixture
def kernel_device() -> str:
    """Where Triton kernels run in this session: CUDA, or the CPU under the Triton interpreter."""
    if KERNEL_DEVICE == "cpu" and not interpreter_enabled():
        pytest.skip("Triton kernels need CUDA or TRITON_INTERPRET=1")
    return KERNEL_DEVICE
