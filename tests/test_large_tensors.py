"""Tensors of more than 2^31 elements, where 32-bit element offsets would wrap (CUDA only: about 16 GiB)."""

import pytest
import torch

from gradcomp import log_moments, quantize_fp, stochastic_prune

NUMEL = 2**31 + 2**20 + 5  # float16: 4 GiB a tensor


@pytest.mark.cuda
def test_kernels_reach_every_element_of_a_tensor_beyond_2_31(kernel_device):
    if kernel_device != "cuda":
        pytest.skip("needs the compiled kernels on a CUDA device")
    if torch.cuda.mem_get_info()[0] < 5 * NUMEL * 2:  # the input, two results and some room
        pytest.skip("needs about 20 GiB of free GPU memory")
    generator = torch.Generator("cuda").manual_seed(0)
    x = torch.randn(NUMEL, device="cuda", dtype=torch.float16, generator=generator)
    moments = log_moments(x, backend="triton")
    assert int(moments[0] + moments[3]) == NUMEL  # each element counted once, as a non-zero or a zero
    ops = {
        "stochastic_prune": lambda backend: stochastic_prune(x, 0.5, seed=3, backend=backend),
        "quantize_fp": lambda backend: quantize_fp(x, "e4m3", rounding="stochastic", seed=3, backend=backend),
    }
    for name, op in ops.items():
        got = op("triton")
        expected = op("torch")  # chunked torch path on the GPU: the same random bits per element index
        assert torch.equal(got.view(torch.int16), expected.view(torch.int16)), name
        del got, expected
