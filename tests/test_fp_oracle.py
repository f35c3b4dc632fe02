"""quantize_fp against the ml_dtypes casts, code for code, for every format the two share.

The probes of a format are its grid values, the midpoints between neighbours (ties) and the input dtype's
floats next to them, values beyond the range (the overflow tie and its neighbours, 2 max, the dtype's
largest float), values below the smallest one, and +-0; each in every input dtype that holds it exactly.
The oracle casts x.numpy() (float16 and bfloat16 through float32, exactly) to the ml_dtypes type and back.
Where quantize_fp documents another semantic, the expectation is adjusted here, and the test says why.
"""

import dataclasses
import math

import ml_dtypes
import numpy as np
import pytest
import torch
from helpers import kernel_can_hold, ml_dtype, ml_dtypes_version

from gradcomp import quantize_fp
from gradcomp.formats import DTYPE_FORMATS, E8M0FNU

DTYPES = [torch.float32, torch.float64, torch.float16, torch.bfloat16]
KERNEL_DTYPES = [torch.float32, torch.float16, torch.bfloat16]


def _probes(fmt, dtype: torch.dtype) -> torch.Tensor:
    """Both signs of every probe magnitude that `dtype` holds exactly (see the module docstring)."""
    grid = fmt.positive_values()
    ulp_top = 2.0 ** (fmt.emax - fmt.man_bits)  # above max_value: the next value with an unbounded exponent
    above = grid.new_tensor([grid[-1] + ulp_top])
    lower = torch.cat([grid.new_zeros(1 if fmt.zero else 0), grid])
    ties = torch.cat([(lower[:-1] + lower[1:]) / 2, (grid[-1:] + above) / 2, grid[:1] / 2])
    extremes = grid.new_tensor([0.0, grid[0] / 4, grid[-1] + ulp_top, 2 * grid[-1], torch.finfo(dtype).max])
    magnitudes = torch.cat([grid, extremes, ties]).to(dtype)
    magnitudes = magnitudes[magnitudes.double() == torch.cat([grid, extremes, ties])]
    inf = torch.full_like(magnitudes, math.inf)
    magnitudes = torch.cat([magnitudes, torch.nextafter(magnitudes, inf), torch.nextafter(magnitudes, -inf)])
    magnitudes = magnitudes[torch.isfinite(magnitudes) & (magnitudes >= 0)]
    return torch.cat([magnitudes, -magnitudes])


def _oracle(x: torch.Tensor, dtype_name: str) -> torch.Tensor:
    """The ml_dtypes cast of x and back, in x's dtype."""
    array = x.numpy() if x.dtype in (torch.float32, torch.float64) else x.float().numpy()
    with np.errstate(over="ignore"):  # grid values beyond float16, e.g. e8m0fnu's, become Inf as they should
        decoded = array.astype(ml_dtype(dtype_name)).astype(np.float64)
    return torch.from_numpy(decoded).to(x.dtype)


def _expected(x: torch.Tensor, dtype_name: str, fmt) -> torch.Tensor:
    """The oracle with the documented differences of quantize_fp."""
    expected = _oracle(x, dtype_name)
    if fmt == E8M0FNU and ml_dtypes_version() < (0, 7) and (x.double().abs() < 2.0**-126).any():
        pytest.skip(
            "ml_dtypes before 0.7 flushes float32 subnormal inputs to float8_e8m0fnu; quantize_fp rounds "
            "them exactly, as ml_dtypes 0.7 does (test_e8m0fnu_rounds_float32_subnormal_inputs_exactly)"
        )
    if fmt == E8M0FNU:
        # quantize_fp rounds ties to the even code for every format (an even exponent field here), where the
        # ml_dtypes cast rounds e8m0fnu's ties up; it gives a zero (+-0) the nearest value 2^-127, not NaN
        magnitude = x.double().abs()
        exponent = torch.floor(torch.log2(magnitude))
        tie = (x > 0) & (magnitude == 1.5 * 2.0**exponent) & (magnitude > fmt.min_normal)  # between codes
        even = 2.0 ** (exponent + (exponent + fmt.bias) % 2)  # the even field of the two neighbours
        even = torch.where(even > fmt.max_value, math.nan, even)
        expected = torch.where(tie, even.to(x.dtype), expected)
        expected = torch.where(x == 0, fmt.min_subnormal, expected).to(x.dtype)
    return expected


def _assert_same(got: torch.Tensor, expected: torch.Tensor, x: torch.Tensor) -> None:
    """Bit for bit (-0 included), NaN for NaN (its sign and payload are not the point)."""
    nan = torch.isnan(expected)
    assert torch.equal(torch.isnan(got), nan), x[torch.isnan(got) != nan][:8].tolist()
    same = got[~nan].double().view(torch.int64) == expected[~nan].double().view(torch.int64)
    assert same.all(), list(zip(x[~nan][~same][:8].tolist(), got[~nan][~same][:8].tolist(), strict=True))


def _check(dtype_name: str, dtype: torch.dtype, backend: str, device: str = "cpu", saturate: bool = False):
    fmt = DTYPE_FORMATS[dtype_name]
    x = _probes(fmt, dtype)
    expected = _expected(x, dtype_name, fmt)
    if saturate:  # the "satfinite" conversion: finite values beyond the range give +-max_value
        fmt = dataclasses.replace(fmt, overflow="saturate")
        beyond = ~torch.isfinite(expected) & (x.double().abs() > fmt.max_value) & ((x > 0) | fmt.signed)
        expected = torch.where(beyond, torch.copysign(torch.tensor(fmt.max_value), x).to(dtype), expected)
    if backend == "triton":
        keep = kernel_can_hold(x) & kernel_can_hold(expected)
        x, expected = x[keep], expected[keep]
    got = quantize_fp(x.to(device), fmt, backend=backend).cpu()
    assert got.dtype == dtype
    _assert_same(got, expected, x)


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("dtype_name", list(DTYPE_FORMATS))
def test_nearest_rounding_matches_ml_dtypes(dtype_name, dtype):
    _check(dtype_name, dtype, "torch")


@pytest.mark.parametrize("dtype", KERNEL_DTYPES, ids=str)
@pytest.mark.parametrize("dtype_name", list(DTYPE_FORMATS))
def test_kernel_matches_ml_dtypes(kernel_device, dtype_name, dtype):
    _check(dtype_name, dtype, "triton", kernel_device)


@pytest.mark.parametrize("backend", ["torch", "triton"])
@pytest.mark.parametrize("dtype_name", ["float8_e4m3fn", "float8_e4m3fnuz", "float8_e5m2", "float8_e8m0fnu"])
def test_saturating_variants_clamp_where_the_cast_overflows(request, dtype_name, backend):
    device = request.getfixturevalue("kernel_device") if backend == "triton" else "cpu"
    _check(dtype_name, torch.float32, backend, device, saturate=True)


@pytest.mark.parametrize("backend", ["torch", "triton"])
@pytest.mark.parametrize("dtype_name", list(DTYPE_FORMATS))
def test_non_finite_inputs_pass_through(request, dtype_name, backend):
    # a cast gives the format's NaN, Inf or max (float4_e2m1fn even turns NaN into -0); quantize_fp keeps them
    device = request.getfixturevalue("kernel_device") if backend == "triton" else "cpu"
    x = torch.tensor([math.nan, math.inf, -math.inf, 1.0])
    got = quantize_fp(x.to(device), DTYPE_FORMATS[dtype_name], backend=backend).cpu()
    assert math.isnan(got[0]) and got[1] == math.inf and got[2] == -math.inf and got[3] == 1.0


@pytest.mark.parametrize("backend", ["torch", "triton"])
def test_e8m0fnu_rounds_float32_subnormal_inputs_exactly(request, backend):
    """Decided semantics: a float32 subnormal input is rounded as the number it is (to 2^-127, the smallest
    code, or to 2^-126; ties to the even exponent field, where the ml_dtypes cast rounds up), as ml_dtypes 0.7
    does; ml_dtypes 0.6 flushed such inputs first and gave NaN (no zero in the format)."""
    if ml_dtypes_version() < (0, 7):
        pytest.skip(f"the oracle needs ml_dtypes 0.7 or newer, found {ml_dtypes.__version__}")
    device = request.getfixturevalue("kernel_device") if backend == "triton" else "cpu"
    bits = torch.cat(
        [torch.arange(1, 1 << 12), torch.arange(1 << 21, 1 << 23, 997), torch.tensor([(1 << 23) - 1])]
    )
    x = bits.int().view(torch.float32)  # float32 subnormals, tiny ones and those next to 2^-127 and 2^-126
    x = torch.cat([x, -x])
    got = quantize_fp(x.to(device), E8M0FNU, backend=backend).cpu()
    _assert_same(got, _expected(x, "float8_e8m0fnu", E8M0FNU), x)
