import math

import numpy as np
import pytest
import torch
from helpers import lognormal_gradient, same_bits
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

from gradcomp import E2M1FN, E4M3FN, E4M3FNUZ, E5M2, E8M0FNU, FPFormat, parse_format, quantize_fp
from gradcomp._backend import interpreter_enabled

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
def test_bad_tensor_scales_give_nan_and_pass_non_finite_inputs(bad):
    """A tensor scale is not checked on the host (no sync): finite inputs come out NaN, Inf stays Inf (a
    number scale is refused: tests/test_bad_inputs.py)."""
    x = torch.ones(3)
    assert torch.isnan(quantize_fp(x, "e4m3", scale=torch.tensor(bad))).all()
    assert quantize_fp(torch.tensor([math.inf]), "e4m3", scale=torch.tensor(bad)).item() == math.inf


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
    from gradcomp.formats.rounding import RoundingPlan
    from gradcomp.kernels.fp_quant import quantize_fp_triton

    x = lognormal_gradient(2500, sigma=2.0).to(kernel_device)
    plan = RoundingPlan.build(FPFormat(4, 1), FLOAT32)
    scale = torch.tensor(1.0, device=kernel_device)
    small = quantize_fp_triton(x, plan, scale, scale, True, 3, block=256)
    large = quantize_fp_triton(x, plan, scale, scale, True, 3, block=2048)
    assert same_bits(small, large)


def _same_values(a: torch.Tensor, b: torch.Tensor) -> bool:
    """Bit for bit where not NaN, NaN where NaN (a NaN's sign and payload are not specified)."""
    nan = torch.isnan(b)
    return torch.equal(torch.isnan(a), nan) and same_bits(a[~nan], b[~nan])


# --- formats whose normals reach below float32's (bias above 127) ------------------------------------------
SMALL_NORMAL_FORMATS = [
    parse_format(name) for name in ("e5m2-b140", "e8m0-b130", "e4m3-inf-b135", "e3m0-nan-negzero-b140")
] + [FPFormat(2, 1, bias=140)]  # max_value 1.5 * 2^-137


@pytest.mark.parametrize("fmt", SMALL_NORMAL_FORMATS, ids=str)
@pytest.mark.parametrize("rounding", ["nearest", "stochastic"])
@pytest.mark.parametrize("backend", ["torch", "triton"])
def test_grid_values_below_float32_normals_stay_put(request, fmt, rounding, backend):
    device = request.getfixturevalue("kernel_device") if backend == "triton" else "cpu"
    values = fmt.values().float()  # all of them are float32 numbers, most of them subnormal
    got = quantize_fp(values.to(device), fmt, rounding=rounding, seed=3, backend=backend).cpu()
    assert torch.equal(got, values)
    # float16 holds none of them: it meets them through the scale (1/scale = 2^120 is a float32)
    in_half = (values.double() * 2.0**120).half()
    got = quantize_fp(in_half.to(device), fmt, scale=2.0**-120, rounding=rounding, seed=3, backend=backend)
    assert torch.equal(got.cpu(), in_half)


def test_reported_small_format_cases():
    values = parse_format("e5m2-b140").positive_values().float()
    assert torch.equal(quantize_fp(values, "e5m2-b140"), values)  # 48 of these went to 0
    assert quantize_fp(torch.tensor([2.0**-129, 2.0**-127]), "e8m0-b130").tolist() == [2.0**-129, 2.0**-127]


@pytest.mark.parametrize(
    "fmt",
    [FPFormat(8, 7, overflow="inf"), parse_format("e5m2-b140"), E8M0FNU, parse_format("e3m0-b148")],
    ids=str,
)
@pytest.mark.parametrize("backend", ["torch", "triton"])
def test_scaled_values_below_float32_normals_round_like_float64(request, fmt, backend):
    # x * 2^-127 falls below 2^-126, where float32 keeps fewer bits: rounding it there first would move ties
    device = request.getfixturevalue("kernel_device") if backend == "triton" else "cpu"
    x = lognormal_gradient(3000, sigma=4.0, mu=-3.0)
    expected = quantize_fp(x.double(), fmt, scale=2.0**-127).float()  # float64 holds x * scale exactly
    got = quantize_fp(x.to(device), fmt, scale=2.0**-127, backend=backend).cpu()
    assert _same_values(got, expected)


# --- scale ------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("bad", [1e39, 1e-39, 2.0**-128, 1e-50])
def test_scales_beyond_float32_are_numbers_like_others_for_float64_input(bad):
    """float64 input computes in float64 (float32 and float16 input refuse them: tests/test_bad_inputs.py)."""
    assert torch.isfinite(quantize_fp(torch.ones(3, dtype=torch.float64), "e4m3", scale=bad)).all()


@pytest.mark.parametrize("bad", [1e39, 1e-39, 2.0**-128])
@pytest.mark.parametrize("backend", ["torch", "triton"])
def test_tensor_scales_beyond_float32_give_nan(request, bad, backend):
    device = request.getfixturevalue("kernel_device") if backend == "triton" else "cpu"
    scale = torch.tensor(bad, dtype=torch.float64, device=device)  # not checked on the host: no sync
    out = quantize_fp(torch.ones(3, device=device), "e4m3", scale=scale, backend=backend)
    assert torch.isnan(out).all()


# --- overflow at the top tie (IEEE 754: round with an unbounded exponent, then overflow above max) ---------
@pytest.mark.parametrize("backend", ["torch", "triton"])
def test_exponent_only_formats_overflow_as_ieee_754(request, backend):
    device = request.getfixturevalue("kernel_device") if backend == "triton" else "cpu"

    def run(fmt: FPFormat, tie: float) -> list[float]:
        x = torch.tensor([tie, tie, tie, 2 * tie])
        x[1], x[2] = torch.nextafter(x[1], x.new_tensor(0.0)), torch.nextafter(x[2], x.new_tensor(math.inf))
        return quantize_fp(x.to(device), fmt, backend=backend).cpu().tolist()

    # exponent fields 1..6 are numbers, 2^3 = 8 the largest; the tie 12 goes to the even field 6, i.e. 8
    ieee = FPFormat(3, 0, overflow="inf")
    assert ieee.max_value == 8.0
    assert run(ieee, 12.0) == [8.0, 8.0, math.inf, math.inf]
    # every field a number, the top field 7 (odd): the tie goes to field 8, beyond the range
    odd_top = FPFormat(3, 0, bias=4, overflow="nan", reserved="neg_zero")
    assert odd_top.max_value == 8.0
    out = run(odd_top, 12.0)
    assert out[1] == 8.0 and all(math.isnan(v) for v in (out[0], out[2], out[3]))
    # M >= 1: max_value has an odd mantissa, the tie above it overflows (61440 in float8_e5m2)
    assert run(E5M2, 61440.0) == [math.inf, 57344.0, math.inf, math.inf]


# --- saturation stops at what x's dtype holds --------------------------------------------------------------
@pytest.mark.parametrize("backend", ["torch", "triton"])
@pytest.mark.parametrize("rounding", ["nearest", "stochastic"])
def test_float16_saturates_at_the_largest_grid_value_it_holds(request, backend, rounding):
    device = request.getfixturevalue("kernel_device") if backend == "triton" else "cpu"
    x = torch.tensor([57344.0, 60000.0, 61440.0, 65504.0, -65504.0, 1.0], dtype=torch.float16).repeat(100)
    for fmt, largest in ((FPFormat(5, 2), 57344.0), (FPFormat(5, 0), 32768.0)):  # max 114688 and 65536
        for scale in (1.0, 2.0**-4, torch.tensor(2.0**-4), 0.3):
            out = quantize_fp(
                x.to(device), fmt, scale=scale, rounding=rounding, seed=1, backend=backend
            ).cpu()
            assert torch.isfinite(out).all(), (fmt, scale)
            if not isinstance(scale, float) or math.log2(scale).is_integer():  # exact scaling: on the grid
                assert out.abs().max() == out[3] == -out[4] == largest, (fmt, scale)


@pytest.mark.parametrize("backend", ["torch", "triton"])
def test_float32_output_stays_finite_when_rounding_up_near_its_limit(request, backend):
    device = request.getfixturevalue("kernel_device") if backend == "triton" else "cpu"
    x = torch.tensor([3.4028234663852886e38, 3.3e38], device=device)  # x * 2^-112 rounds up to 65536
    out = quantize_fp(x, FPFormat(5, 2), scale=2.0**-112, backend=backend).cpu()
    assert out.tolist() == [57344.0 * 2.0**112] * 2


# --- properties ---------------------------------------------------------------------------------------------
PROPERTY_FORMATS = [
    E5M2,
    E4M3FN,
    E4M3FNUZ,
    E8M0FNU,
    E2M1FN,
    FPFormat(4, 1),
    FPFormat(3, 0),
    FPFormat(4, 2, subnormals=False),
    FPFormat(5, 2, bias=140),
    FPFormat(3, 2, overflow="nan", reserved="ieee"),
    FPFormat(4, 2, signed=False),
    FPFormat(3, 1, subnormals=False, zero=False, bias=-2),
]
PROPERTIES = settings(
    max_examples=50, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)


@st.composite
def _random_formats(draw: st.DrawFn) -> FPFormat:
    """Any valid format of at most 10 bits (wider grids make the neighbour search slow)."""
    exp_bits = draw(st.integers(1, 8))
    kwargs = {
        "bias": draw(st.none() | st.integers(-10, 150)),
        "subnormals": draw(st.booleans()),
        "overflow": draw(st.sampled_from(["saturate", "inf", "nan"])),
        "reserved": draw(st.none() | st.sampled_from(["none", "ieee", "all_ones", "neg_zero"])),
        "signed": draw(st.booleans()),
        "zero": draw(st.booleans()),
    }
    try:
        return FPFormat(exp_bits, draw(st.integers(0, 10 - exp_bits)), **kwargs)
    except ValueError:
        assume(False)


formats = st.sampled_from(PROPERTY_FORMATS) | _random_formats()
log2_scales = st.integers(-8, 8)


def _float32s(max_value: float = 3e38) -> st.SearchStrategy:
    bound = float(torch.tensor(max_value, dtype=torch.float32))  # hypothesis wants a float32 bound
    return st.lists(st.floats(-bound, bound, allow_subnormal=True, width=32), min_size=1, max_size=40)


def _neighbours(fmt: FPFormat, y: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """The grid values just below and above |y| (both the smallest value below a format's lowest one)."""
    grid = torch.cat([torch.zeros(1 if fmt.zero else 0, dtype=torch.float64), fmt.positive_values()])
    magnitude = y.abs()
    above = grid[torch.searchsorted(grid, magnitude).clamp(max=grid.numel() - 1)]
    below = grid[(torch.searchsorted(grid, magnitude, right=True) - 1).clamp(min=0)]
    return torch.minimum(below, above), above


def _in_float32(values: torch.Tensor, scale: float) -> torch.Tensor:
    """Whether the outputs values / scale are float32 numbers (else Inf, or rounded below float32's range)."""
    unscaled = values / scale
    return unscaled.float().double() == unscaled


@PROPERTIES
@given(fmt=formats, x=_float32s(), log2_scale=log2_scales, backend=st.sampled_from(["torch", "triton"]))
def test_property_nearest_is_on_the_grid_and_a_neighbour(kernel_device, fmt, x, log2_scale, backend):
    x = torch.tensor(x)
    scale = 2.0**log2_scale
    out = quantize_fp(
        x.to(kernel_device if backend == "triton" else "cpu"), fmt, scale=scale, backend=backend
    )
    y, q = x.double() * scale, out.cpu().double() * scale  # exact: powers of two
    beyond = y.abs() > fmt.max_value
    invalid = (y < 0) & (not fmt.signed)
    if fmt.overflow == "saturate":
        assert torch.isfinite(out[~invalid]).all()
    lo, hi = _neighbours(fmt, y)
    check = ~beyond & ~invalid & _in_float32(lo, scale) & _in_float32(hi, scale)
    y, q, lo, hi = y[check].abs(), q[check].abs(), lo[check], hi[check]
    assert torch.all((q == lo) | (q == hi))
    clear = (y - lo) != (hi - y)  # not a tie
    assert torch.equal(q[clear], torch.where(y - lo < hi - y, lo, hi)[clear])
    assert torch.isnan(out[invalid]).all()


@PROPERTIES
@given(fmt=formats, x=_float32s(), log2_scale=log2_scales)
def test_property_nearest_rounding_is_monotonic(fmt, x, log2_scale):
    x = torch.tensor(
        sorted(x if fmt.signed else map(abs, x), key=lambda v: (v, math.copysign(1, v)))
    )  # -0 < 0
    out = quantize_fp(x, fmt, scale=2.0**log2_scale)
    numbers = out[~torch.isnan(out)]  # overflow="nan" turns the largest into NaN
    assert torch.all(numbers[1:] >= numbers[:-1])


@PROPERTIES
@given(fmt=formats, data=st.data(), log2_scale=log2_scales, seed=st.integers(0, 2**31))
def test_property_stochastic_rounding_lands_on_a_neighbour(fmt, data, log2_scale, seed):
    scale = 2.0**log2_scale
    x = torch.tensor(data.draw(_float32s(min(fmt.max_value / scale, 3e38))))  # within the range
    if not fmt.signed:
        x = x.abs()
    q = quantize_fp(x, fmt, scale=scale, rounding="stochastic", seed=seed).double() * scale
    lo, hi = _neighbours(fmt, x.double() * scale)
    held = _in_float32(lo, scale) & _in_float32(hi, scale)
    assert torch.all(((q.abs() == lo) | (q.abs() == hi))[held])
    assert torch.all((q == 0) | (x == 0) | (torch.sign(q) == torch.sign(x.double())))


@PROPERTIES
@given(
    fmt=formats,
    rows=st.integers(1, 7),
    cols=st.integers(1, 9),
    dtype=st.sampled_from([torch.float16, torch.bfloat16, torch.float32, torch.float64]),
    rounding=st.sampled_from(["nearest", "stochastic"]),
    seed=st.integers(0, 2**31),
)
def test_property_dtype_shape_layout_and_seed(fmt, rows, cols, dtype, rounding, seed):
    x = lognormal_gradient((rows, cols), sigma=3.0, mu=-1.0, seed=seed % 1000).to(dtype)
    out = quantize_fp(x.t(), fmt, rounding=rounding, seed=seed)
    assert out.dtype == dtype and out.shape == (cols, rows)
    again = quantize_fp(x.t().contiguous(), fmt, rounding=rounding, seed=seed)
    assert _same_values(out, again)  # the layout does not matter, and a seed gives the same bits


CONVENTION_FORMATS = [  # (format, a scale that brings lognormal_gradient(mu=-1, sigma=3) to its range)
    (E4M3FN, 2.0**-3),
    (E4M3FNUZ, 2.0**-3),
    (E8M0FNU, 2.0**-3),
    (FPFormat(4, 2, signed=False), 2.0**-3),
    (FPFormat(5, 2), 2.0**-3),  # float16: saturation stops at 65504 / 8 rounded down to the grid
    (FPFormat(3, 2, bias=4, overflow="nan", reserved="neg_zero"), 2.0**-3),
    (parse_format("e5m2-b140"), 2.0**-120),
    (FPFormat(3, 1, subnormals=False, zero=False, bias=-2), 2.0**3),
]


@pytest.mark.parametrize(
    ("fmt", "scale"), CONVENTION_FORMATS, ids=[str(fmt) for fmt, _ in CONVENTION_FORMATS]
)
@pytest.mark.parametrize("rounding", ["nearest", "stochastic"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16])
def test_triton_kernel_agrees_on_every_convention(kernel_device, fmt, scale, rounding, dtype):
    x = lognormal_gradient(2000, sigma=3.0, mu=-1.0).to(dtype)
    for scale_arg in (scale, torch.tensor(scale)):
        expected = quantize_fp(x, fmt, rounding=rounding, seed=5, scale=scale_arg, backend="torch")
        device_scale = scale_arg.to(kernel_device) if isinstance(scale_arg, torch.Tensor) else scale_arg
        got = quantize_fp(
            x.to(kernel_device), fmt, rounding=rounding, seed=5, scale=device_scale, backend="triton"
        )
        assert _same_values(got.cpu(), expected)


@PROPERTIES
@given(
    fmt=formats,
    x=_float32s(),
    log2_scale=st.integers(-130, 127),
    odd_scale=st.booleans(),
    tensor_scale=st.booleans(),
    dtype=st.sampled_from([torch.float32, torch.float16, torch.bfloat16]),
    rounding=st.sampled_from(["nearest", "stochastic"]),
)
def test_property_backends_agree(kernel_device, fmt, x, log2_scale, odd_scale, tensor_scale, dtype, rounding):
    scale = 2.0**log2_scale * (1.3 if odd_scale else 1.0)
    float32_scale = np.float32(scale)
    assume(
        tensor_scale or (np.isfinite(float32_scale) and float32_scale > 0 and np.isfinite(1 / float32_scale))
    )
    x = torch.tensor(x).to(dtype)
    bfloat16_in_interpreter = dtype == torch.bfloat16 and interpreter_enabled()
    if bfloat16_in_interpreter:  # its bfloat16 stores round half up, and flush subnormals: exact outputs only
        assume(not odd_scale and fmt.man_bits <= 7)
    scale = torch.tensor(scale) if tensor_scale else scale
    expected = quantize_fp(x, fmt, scale=scale, rounding=rounding, seed=7, backend="torch")
    device_scale = scale.to(kernel_device) if tensor_scale else scale
    got = quantize_fp(
        x.to(kernel_device), fmt, scale=device_scale, rounding=rounding, seed=7, backend="triton"
    )
    keep = torch.ones_like(x, dtype=torch.bool)
    if bfloat16_in_interpreter:  # where neither x nor the result before the bfloat16 store is subnormal
        before_store = quantize_fp(x.float(), fmt, scale=scale, rounding=rounding, seed=7, backend="torch")
        keep = ((x.float().abs() >= 2.0**-126) | (x == 0)) & ~(before_store.abs() < 2.0**-126)
        keep |= before_store == 0
    assert _same_values(got.cpu()[keep], expected[keep])
