import math

import pytest
import torch
from helpers import lognormal_gradient, same_bits

from gradcomp import E5M2, FPFormat, quantize_fp

SMALL_FORMATS = [  # every format of at most 8 bits, saturating and IEEE-like, with and without subnormals
    FPFormat(e, m, subnormals=sub, overflow=overflow)
    for e in range(1, 8)
    for m in range(0, 8 - e)
    for overflow in ("saturate", "inf")
    for sub in (True, False)
    if not (overflow == "inf" and e < 2)
]
KERNEL_FORMATS = [
    FPFormat(4, 3),
    FPFormat(5, 2, overflow="inf"),
    FPFormat(3, 0),
    FPFormat(4, 1, subnormals=False),
    FPFormat(1, 2),
    FPFormat(8, 7, overflow="inf"),
    FPFormat(2, 5, bias=9),
]


def _codes(fmt: FPFormat) -> torch.Tensor:
    """(values, code index) of the non-negative grid; the code index is the sign-less bit pattern."""
    values = fmt.values()
    return values[values >= 0]


@pytest.mark.parametrize("fmt", SMALL_FORMATS, ids=str)
@pytest.mark.parametrize("rounding", ["nearest", "stochastic"])
def test_every_value_round_trips(fmt, rounding):
    values = fmt.values().float()
    assert torch.equal(quantize_fp(values, fmt, rounding=rounding, seed=0), values)


@pytest.mark.parametrize("fmt", SMALL_FORMATS, ids=str)
def test_nearest_rounding_and_ties_to_even_code(fmt):
    grid = _codes(fmt).float()
    lo, hi = grid[:-1], grid[1:]
    mid = (lo + hi) / 2  # exact in float32: neighbours differ by far fewer than 24 bits
    # the code of a grid value: positions in the non-negative grid, shifted by the codes that are unused
    # when subnormals are off (mantissa fields 1..2^M-1 of the zero exponent field)
    index = torch.arange(grid.numel())
    if not fmt.subnormals:
        index[1:] += 2**fmt.man_bits - 1
    even_is_lower = index[:-1] % 2 == 0
    expected_tie = torch.where(even_is_lower, lo, hi)
    assert torch.equal(quantize_fp(mid, fmt), expected_tie)
    below = torch.nextafter(mid, lo)
    above = torch.nextafter(mid, hi)
    assert torch.equal(quantize_fp(below, fmt), lo)
    assert torch.equal(quantize_fp(above, fmt), hi)
    assert torch.equal(quantize_fp(-mid, fmt), -expected_tie)


@pytest.mark.parametrize("fmt", [f for f in SMALL_FORMATS if f.man_bits > 0][::5], ids=str)
def test_stochastic_rounding_is_unbiased_and_stays_between_neighbours(fmt):
    grid = _codes(fmt).float()
    pick = torch.linspace(0, grid.numel() - 2, 6).long()
    lo, hi = grid[pick], grid[pick + 1]
    fraction = torch.tensor([0.1, 0.25, 0.5, 0.7, 0.9, 0.37])
    x = lo + fraction * (hi - lo)
    draws = 20000
    out = quantize_fp(x.repeat(draws, 1), fmt, rounding="stochastic", seed=123)
    assert torch.all((out == lo) | (out == hi))
    p_up = (out == hi).double().mean(0)
    p_true = ((x - lo) / (hi - lo)).double()
    bound = 5 * torch.sqrt(p_true * (1 - p_true) / draws) + 1e-3
    assert torch.all((p_up - p_true).abs() < bound)


def test_stochastic_rounding_unbiased_below_the_subnormals():
    fmt = FPFormat(4, 2)
    x = torch.full((100000,), fmt.min_subnormal / 1000)  # P(round up) = 1e-3, resolved with 24 random bits
    out = quantize_fp(x, fmt, rounding="stochastic", seed=9)
    assert set(out.unique().tolist()) <= {0.0, fmt.min_subnormal}
    hits = (out > 0).sum().item()
    assert abs(hits - 100) < 5 * math.sqrt(100)


def test_matches_torch_float8_e5m2_cast():
    x = lognormal_gradient(20000, sigma=4.0, mu=0.0)
    x[5:10] = torch.tensor([57344.0, 61440.0, 61439.0, 1e6, -1e6])  # max, the tie to Inf, just below it
    ours = quantize_fp(x, E5M2)
    reference = x.to(torch.float8_e5m2).float()
    assert same_bits(ours[~x.isnan()], reference[~x.isnan()])


def test_matches_torch_float8_e4m3fn_inside_its_range():
    x = lognormal_gradient(20000, sigma=3.0, mu=0.0, specials=False)
    x = x[x.abs() < 464]  # e4m3fn stops at 448, our saturating E4M3 continues with 480
    assert same_bits(quantize_fp(x, FPFormat(4, 3)), x.to(torch.float8_e4m3fn).float())


def test_overflow_saturates_or_gives_inf():
    sat, ieee = FPFormat(4, 1), FPFormat(4, 1, overflow="inf")  # max 384 / 192
    x = torch.tensor([383.0, 400.0, 447.9, 448.0, 1e30, -1e30])
    assert quantize_fp(x, sat).tolist() == [384.0, 384.0, 384.0, 384.0, 384.0, -384.0]
    x = torch.tensor([191.0, 200.0, 223.9, 224.0, 1e30, -1e30])  # 224 is max + half an ulp: Inf, as IEEE
    assert quantize_fp(x, ieee).tolist() == [192.0, 192.0, 192.0, math.inf, math.inf, -math.inf]
    # a finite input whose scaled value overflows float32 still saturates / overflows
    assert quantize_fp(torch.tensor([3e38]), sat, scale=2.0**100).item() == 384.0 / 2.0**100
    assert quantize_fp(torch.tensor([3e38]), ieee, scale=2.0**100).item() == math.inf


@pytest.mark.parametrize("fmt", [FPFormat(4, 1), FPFormat(5, 2, overflow="inf")], ids=str)
@pytest.mark.parametrize("rounding", ["nearest", "stochastic"])
def test_non_finite_inputs_pass_through(fmt, rounding):
    x = torch.tensor([math.nan, math.inf, -math.inf, 0.0, -0.0])
    out = quantize_fp(x, fmt, rounding=rounding, seed=1)
    assert math.isnan(out[0]) and out[1] == math.inf and out[2] == -math.inf
    assert same_bits(out[3:], x[3:])  # signed zeros keep their sign


def test_scale_by_power_of_two_is_exact():
    x = lognormal_gradient(5000, sigma=2.0, mu=-10.0)
    fmt = FPFormat(4, 2)
    scaled = quantize_fp(x, fmt, scale=2.0**12)
    assert same_bits(scaled, quantize_fp(x * 2.0**12, fmt) / 2.0**12)
    assert same_bits(quantize_fp(x, fmt, scale=torch.tensor(2.0**12)), scaled)


@pytest.mark.parametrize("bad", [0.0, -1.0, math.inf, math.nan])
def test_bad_scale(bad):
    x = torch.ones(3)
    with pytest.raises(ValueError, match="scale"):
        quantize_fp(x, "e4m3", scale=bad)
    assert torch.isnan(quantize_fp(x, "e4m3", scale=torch.tensor(bad))).all()
    assert quantize_fp(torch.tensor([math.inf]), "e4m3", scale=torch.tensor(bad)).item() == math.inf


def test_bad_arguments():
    with pytest.raises(ValueError, match="rounding"):
        quantize_fp(torch.ones(2), "e4m3", rounding="up")
    with pytest.raises(TypeError, match="floating"):
        quantize_fp(torch.ones(2, dtype=torch.int32), "e4m3")
    with pytest.raises(ValueError, match="one-element"):
        quantize_fp(torch.ones(2), "e4m3", scale=torch.ones(2))


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16, torch.float64])
@pytest.mark.parametrize("rounding", ["nearest", "stochastic"])
def test_other_dtypes(dtype, rounding):
    x = lognormal_gradient((64, 33), sigma=2.0, mu=-2.0).to(dtype)
    fmt = FPFormat(4, 2)
    out = quantize_fp(x, fmt, rounding=rounding, seed=4, scale=4.0)
    assert out.dtype == dtype and out.shape == x.shape
    reference = quantize_fp(x.float(), fmt, rounding=rounding, seed=4, scale=4.0).to(dtype)
    if dtype != torch.float64 or rounding == "nearest":  # float64 draws its random bits at a finer position
        assert same_bits(out, reference)


def test_non_contiguous_empty_and_scalar_inputs():
    x = lognormal_gradient((40, 30), sigma=2.0)
    assert same_bits(
        quantize_fp(x.t(), "e4m2", rounding="stochastic", seed=2),
        quantize_fp(x.t().contiguous(), "e4m2", rounding="stochastic", seed=2),
    )
    assert quantize_fp(torch.empty(0, 5), "e4m2").shape == (0, 5)
    assert quantize_fp(torch.tensor(0.3), "e4m3").item() == 0.3125
    assert quantize_fp(torch.tensor([0.3]), "e4m3").tolist() == [0.3125]


def test_fresh_seed_each_call_and_repeatable_with_seed():
    x = lognormal_gradient(4096, sigma=1.0, mu=0.0, specials=False)
    a = quantize_fp(x, "e3m1", rounding="stochastic")
    b = quantize_fp(x, "e3m1", rounding="stochastic")
    assert not torch.equal(a, b)
    assert torch.equal(
        quantize_fp(x, "e3m1", rounding="stochastic", seed=5),
        quantize_fp(x, "e3m1", rounding="stochastic", seed=5),
    )


@pytest.mark.parametrize("fmt", KERNEL_FORMATS, ids=str)
@pytest.mark.parametrize("rounding", ["nearest", "stochastic"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16])
def test_triton_kernel_is_bit_exact(kernel_device, fmt, rounding, dtype):
    x = lognormal_gradient(3000, sigma=3.0, mu=-1.0).to(dtype)
    expected = quantize_fp(x, fmt, rounding=rounding, seed=77, scale=2.0**-3, backend="torch")
    got = quantize_fp(x.to(kernel_device), fmt, rounding=rounding, seed=77, scale=2.0**-3, backend="triton")
    assert same_bits(got.cpu(), expected)


def test_triton_result_does_not_depend_on_block_size(kernel_device):
    from gradcomp._backend import FLOAT32
    from gradcomp.kernels.fp_quant import quantize_fp_triton
    from gradcomp.ops.fp_quant import RoundingPlan

    x = lognormal_gradient(2500, sigma=2.0).to(kernel_device)
    plan = RoundingPlan.build(FPFormat(4, 1), FLOAT32)
    scale = torch.tensor(1.0, device=kernel_device)
    small = quantize_fp_triton(x, plan, scale, True, 3, block=256)
    large = quantize_fp_triton(x, plan, scale, True, 3, block=2048)
    assert same_bits(small, large)
