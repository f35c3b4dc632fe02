"""The normal distribution's functions of the threshold solver's kernel against scipy, over both tails."""

import numpy as np
import torch
import triton
import triton.language as tl
from scipy import special

from gradcomp.kernels.special import ndtr_and_log, ndtri_approximate


@triton.jit
def _evaluate(z_ptr, p_ptr, out_ptr, n):
    """One scalar per program, as the solver calls them."""
    i = tl.program_id(0)
    value, log_value = ndtr_and_log(tl.load(z_ptr + i))
    tl.store(out_ptr + i, value)
    tl.store(out_ptr + n + i, log_value)
    tl.store(out_ptr + 2 * n + i, ndtri_approximate(tl.load(p_ptr + i)))


def test_ndtr_log_ndtr_and_ndtri_match_scipy(kernel_device):
    z = torch.cat([torch.linspace(-40, 12, 200, dtype=torch.float64), torch.tensor([-2.8284, 2.8285, 0.0])])
    p = torch.tensor(np.concatenate([np.logspace(-12, np.log10(0.5), 100), 1 - np.logspace(-9, -0.31, 103)]))
    out = torch.empty(3 * len(z), dtype=torch.float64, device=kernel_device)
    _evaluate[(len(z),)](z.to(kernel_device), p.to(kernel_device), out, len(z))
    value, log_value, inverse = out.cpu().view(3, -1).numpy()
    z, p = z.numpy(), p.numpy()
    np.testing.assert_allclose(value, special.ndtr(z), rtol=1e-12, atol=1e-300)
    np.testing.assert_allclose(log_value, special.log_ndtr(z), rtol=1e-12, atol=1e-15)
    np.testing.assert_allclose(inverse, special.ndtri(p), rtol=0, atol=1e-9)
