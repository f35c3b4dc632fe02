"""quantize_block, hadamard and the batched threshold at the edges of their range: values near float32's
largest (the transform's sums), float16's largest, subnormals, 0-d tensors, argument types, names that read
like torch's dtypes, and stochastic rounding unbiased under every rule it is allowed with; a property sweep
over all of it on both backends."""

import math

import numpy as np
import pytest
import torch
from helpers import kernel_can_hold, kernel_property, lognormal_gradient, same_bits
from hypothesis import given
from hypothesis import strategies as st

from gradcomp import hadamard, log_moments, lognormal_threshold_from_moments, nm_prune, quantize_block
from gradcomp.block_format import BlockFormat
from gradcomp.ops.hadamard import hadamard_inverse
from gradcomp.profiling import count_work

FLOAT32_MAX = torch.finfo(torch.float32).max
NVFP4 = {"element": "e2m1fn", "block_size": 16, "scale": "e4m3fn"}
SWEEP = kernel_property(40)


def _both(op, x: torch.Tensor, device: str, **options) -> torch.Tensor:
    """op on the torch path, asserted equal bit for bit to its kernel's result."""
    expected = op(x, backend="torch", **options)
    got = op(x.to(device), backend="triton", **options).cpu()
    assert same_bits(got, expected), options
    return expected


# --- the transform's range ----------------------------------------------------------------------------------
def test_hadamard_of_large_values_does_not_overflow_before_it_normalises(kernel_device):
    out = _both(hadamard, torch.full((32,), 2e37), kernel_device, block_size=32)
    assert out[0].item() == pytest.approx(2e37 * math.sqrt(32), rel=1e-6) and (out[1:] == 0).all()
    # a mix of +-3.4e38 and 1e38: every output whose exact value is a float32 is finite and right
    x = torch.tensor([3.4e38, -3.4e38, 1e38, -1e38, 3.4e38, 1e38, -1e38, 0.0] * 4)
    out = _both(hadamard, x, kernel_device, block_size=32, seed=3)
    exact = x.double() @ hadamard(torch.eye(32), 32, seed=3).double()  # row i: the transform of e_i
    representable = exact.abs() <= FLOAT32_MAX
    assert torch.allclose(out.double()[representable], exact[representable], rtol=1e-6)
    assert torch.isinf(out[~representable]).all() and not out.isnan().any()
    forward = _both(hadamard, x / 8, kernel_device, block_size=32, seed=3)
    back = _both(hadamard_inverse, forward, kernel_device, block_size=32, seed=3)
    assert torch.allclose(back.double(), x.double() / 8, rtol=1e-5, atol=1e31)


LARGE = [{"element": "e2m1fn", "hadamard": 32}, {**NVFP4, "hadamard": 16},
         {"element": "e4m3fn", "hadamard": 8, "rounding": "stochastic"},
         {**NVFP4, "hadamard": 16, "scale_rule": "reciprocal"}]  # fmt: skip


@pytest.mark.parametrize("options", LARGE)
def test_quantize_block_with_the_transform_near_float32s_largest(kernel_device, options):
    """MX and NVFP4 are exact under power-of-two scaling of the input, so a block near float32's largest
    value is quantized as 2^60 times that block divided by 2^60 (up to saturation at float32's largest)."""
    x = lognormal_gradient((8, 64), sigma=1.0, mu=0.0, specials=False)
    x = x / x.abs().amax() * 3.0e38
    out = _both(quantize_block, x, kernel_device, seed=2, **options)
    assert torch.isfinite(out).all()
    small = quantize_block(x * 2.0**-60, seed=2, **options).double() * 2.0**60
    assert torch.equal(out.double(), small.clamp(-FLOAT32_MAX, FLOAT32_MAX))


def test_float16_results_beyond_its_range_saturate(kernel_device):
    """65504 in MXFP4 under the ceil rule rounds to 4 * 2^14 = 65536, beyond float16: it saturates."""
    x = torch.full((2, 32), 65504.0, dtype=torch.float16)
    for options in ({"scale_rule": "ceil"}, {"rounding": "stochastic"}, NVFP4, {"hadamard": 32}):
        out = _both(quantize_block, x, kernel_device, **{"element": "e2m1fn", "seed": 1, **options})
        assert torch.isfinite(out).all() and (out.abs() <= 65504).all(), options


# --- stochastic rounding, unbiased wherever it is allowed ---------------------------------------------------
UNBIASED = [{"element": "e2m1fn"}, {"element": "e2m1fn", "hadamard": 32}, NVFP4, {**NVFP4, "hadamard": 16},
            {"element": "e4m3fn", "hadamard": 32}, {**NVFP4, "scale": "float8_e3m4"},
            {**NVFP4, "scale": "e5m3fnu"}, {**NVFP4, "outer": 128},
            {**NVFP4, "scale": "e5m3fnu", "outer": 128, "hadamard": 16}]  # fmt: skip


@pytest.mark.parametrize("options", UNBIASED)
def test_stochastic_rounding_is_unbiased_under_its_default_rule(options):
    """The projection of E[out] on x, sum(E[out] x) / sum(x^2), is 1 within 5 standard errors of its mean
    over 300 draws (with OCP's floor rule it was about 0.987 for MXFP4: far outside)."""
    x = torch.randn(64, 64, generator=torch.Generator().manual_seed(0))
    draws = torch.stack([quantize_block(x, rounding="stochastic", seed=s, **options) for s in range(300)])
    projection = (draws.double() * x.double()).sum((1, 2)) / x.double().square().sum()
    standard_error = projection.std() / math.sqrt(len(projection))
    assert abs(projection.mean().item() - 1) <= 5 * standard_error.item() + 1e-9


# Each block's largest (transformed) magnitude m: TE's encode scale s_enc = 2688 / m unclamped (1, 2e-33,
# 1e-35), then clamped to FLT_MAX (below 7.9e-36), with m just below v * 6 / FLT_MAX so that the block scale
# E4M3(m FLT_MAX / 6) is v and nothing saturates, the element factor clamped too where v <= 1 (m <= 1.8e-38),
# down to v = 2^-9, E4M3's smallest value (m = 3.4e-41, a float32 subnormal).
TINY_SCALES = [256.0, 16.0, 1.0, 2.0**-4, 2.0**-9]
TINY = [1.0, 2e-33, 1e-35] + [v * 6 / FLOAT32_MAX * (1 - 2.0**-20) for v in TINY_SCALES]
TINY_CASES = [(magnitude, "te") for magnitude in TINY] + [
    (magnitude, "four_over_six")
    for magnitude in TINY
    if magnitude < 1e-20  # biased above: see below
]


@pytest.mark.parametrize("hadamard", [0, 16])
@pytest.mark.parametrize(
    ("magnitude", "rule"), TINY_CASES, ids=lambda v: f"{v:.1e}" if isinstance(v, float) else v
)
def test_te_and_four_over_six_stay_unbiased_down_to_float32_subnormals(magnitude, rule, hadamard):
    """TE clamps its encode scale 2688 / amax to FLT_MAX below 7.9e-36 but dequantizes by amax / 2688: its
    values shrink there (E[out] = 0.12 x at 1e-36, under 0.001 x at 1e-38); gradcomp decodes such blocks by
    the reciprocal of the factor their elements were multiplied by (`gradcomp.block_format`). With every
    block's largest transformed magnitude m (so that no block scale rounds down and saturates its largest
    value), the projection of E[out] on x, sum(E[out] x) / sum(x^2), is 1 within 5 standard errors of its mean
    over 300 draws plus 1e-6 (float32 rounding; the transform's in float32 subnormals), at every m from 1 down
    to 3.4e-41: TE's regimes of the module. Four Over Six only below about 1e-20 (at 1, its choice between the
    candidates depends on the draw: biased), where its float32 squared errors underflow and every block takes
    its 6 candidate. Below 6 * 2^-138 (1.7e-41) the largest block's E4M3 scale underflows: all zero."""
    generator = torch.Generator().manual_seed(1)
    ratios = torch.rand(64, 16, generator=generator, dtype=torch.float64) * 2 - 1
    largest = (torch.arange(64), ratios.abs().argmax(1))
    ratios[largest] = ratios[largest].sign()
    y = (ratios * magnitude).float()  # what the format sees: each block's largest magnitude m exactly
    x = hadamard_inverse(y, hadamard, seed=5) if hadamard else y
    signs = {"signs": 5} if hadamard else {}
    options = {**NVFP4, "scale_rule": rule, "hadamard": hadamard, **signs, "backend": "torch"}
    draws = torch.stack([quantize_block(x, rounding="stochastic", seed=s, **options) for s in range(300)])
    projection = (draws.double() * x.double()).sum((1, 2)) / x.double().square().sum()
    standard_error = projection.std() / math.sqrt(len(projection))
    assert abs(projection.mean().item() - 1) <= 5 * standard_error.item() + 1e-6, projection.mean().item()


@pytest.mark.parametrize("rule", ["te", "four_over_six"])
def test_te_and_four_over_six_flush_a_tensor_whose_largest_block_scale_underflows(rule):
    """Where TE's cast (and Four Over Six's) stops being unbiased on tiny tensors: below 6 * 2^-138
    (1.7e-41) even the largest block's E4M3 scale E4M3(amax FLT_MAX / 6) is zero, and a block of zero scale
    decodes to zero (as in TE: the documented underflow of small blocks); just above, it is not (its
    elements, x FLT_MAX < 0.01, round up to 0.5 with that probability: 20 draws)."""
    limit = 6 * 2.0**-138
    for magnitude, zero in ((limit * 0.99, True), (1e-44, True), (limit * 1.2, False)):
        x = (torch.linspace(-1, 1, 64).reshape(4, 16).double() * magnitude).float()
        options = {**NVFP4, "scale_rule": rule, "rounding": "stochastic"}
        out = torch.stack([quantize_block(x, **options, seed=s) for s in range(20)])
        assert bool((out == 0).all()) == zero, magnitude


def test_the_floor_rule_is_refused_with_stochastic_rounding():
    with pytest.raises(ValueError, match="biased"):
        quantize_block(torch.ones(32), "e2m1fn", rounding="stochastic", scale_rule="floor")
    assert BlockFormat("e2m1fn", 16, "e4m3fn", "ceil").label == "NVFP4 ceil"


# --- arguments ----------------------------------------------------------------------------------------------
def test_zero_dimensional_tensors_are_one_element(kernel_device):
    x = torch.tensor(-3.3)
    out = _both(quantize_block, x, kernel_device, element="e2m1fn")
    assert out.shape == () and out.item() == -3.0
    assert nm_prune(torch.tensor(2.0), 1, 2, seed=0).item() == 2.0
    with pytest.raises(ValueError, match="multiple of 32"):
        hadamard(torch.tensor(1.0))


def test_axes_are_ints_numpy_ints_taken():
    x = lognormal_gradient((4, 32), specials=False)
    assert torch.equal(quantize_block(x, "e2m1fn", axis=np.int64(1)), quantize_block(x, "e2m1fn", axis=1))
    for op in (lambda: quantize_block(x, "e2m1fn", axis=1.0), lambda: hadamard(x, axis=1.0),
               lambda: nm_prune(x, axis=1.0, seed=0)):  # fmt: skip
        with pytest.raises(TypeError, match="axis must be an int"):
            op()


@pytest.mark.parametrize(("name", "dtype"), [("e5m2", "float8_e5m2"), ("E4M3", "float8_e4m3")])
def test_elements_that_read_like_torch_dtypes_are_refused(name, dtype):
    with pytest.raises(ValueError, match=dtype):
        quantize_block(torch.ones(32), name)


# --- the batched threshold on the device --------------------------------------------------------------------
def test_thresholds_from_moments_are_one_launch_and_the_fused_solve(kernel_device):
    tensors = [
        lognormal_gradient(4096, sigma=s, seed=i, specials=False) for i, s in enumerate((1.0, 2.0, 3.0))
    ]
    tensors[1][:3000] = 0.0
    moments = torch.stack([log_moments(t) for t in tensors])
    expected = lognormal_threshold_from_moments(moments, 4096, 0.8, backend="torch")
    moments = moments.to(kernel_device)
    got = lognormal_threshold_from_moments(moments, 4096, 0.8, backend="triton")
    torch.testing.assert_close(got.cpu(), expected, rtol=1e-6, atol=0)
    per_row = torch.full((3,), 4096, device=kernel_device)
    assert torch.equal(lognormal_threshold_from_moments(moments, per_row, 0.8, backend="triton"), got)
    with count_work() as work:
        lognormal_threshold_from_moments(moments, 4096, 0.8, backend="triton")
    assert work.total_launches == 1 and not work.syncs, str(work)


# --- the sweep ----------------------------------------------------------------------------------------------
@st.composite
def extreme_tensors(draw) -> torch.Tensor:
    """A (rows, 32 or 64) tensor of one kernel dtype whose magnitudes span its whole range: subnormals, the
    largest values, tiny tensors (every value near the smallest) and zeros."""
    dtype = draw(st.sampled_from([torch.float32, torch.float16, torch.bfloat16]))
    info = torch.finfo(dtype)
    low = math.floor(math.log2(info.smallest_normal)) - (10 if dtype == torch.float16 else 7)
    high = math.floor(math.log2(info.max))
    center = draw(st.integers(low, high))
    spread = draw(st.integers(0, 12))
    rows, columns = draw(st.integers(1, 3)), draw(st.sampled_from([32, 64]))
    seed = draw(st.integers(0, 2**31 - 1))
    generator = torch.Generator().manual_seed(seed)
    exponent = (center - spread * torch.rand(rows, columns, generator=generator, dtype=torch.float64)).clamp(
        low
    )
    mantissa = 1 + torch.rand(rows, columns, generator=generator, dtype=torch.float64)
    sign = torch.where(torch.rand(rows, columns, generator=generator) < 0.5, -1.0, 1.0).double()
    zero = torch.rand(rows, columns, generator=generator) < draw(st.sampled_from([0.0, 0.3]))
    values = torch.where(zero, 0.0, sign * mantissa * torch.exp2(exponent))
    x = values.clamp(-info.max, info.max).to(dtype)
    return torch.where(kernel_can_hold(x), x, 0.0)


BLOCK_OPTIONS = st.sampled_from(
    [
        {"element": "e2m1fn"},
        {"element": "e2m1fn", "scale_rule": "ceil"},
        {"element": "e4m3fn", "rounding": "stochastic"},
        {"element": "float8_e5m2", "hadamard": 32},
        {"element": "e3m2fn", "rounding": "stochastic", "hadamard": 16},
        NVFP4,
        {**NVFP4, "rounding": "stochastic", "hadamard": 16},
        {**NVFP4, "hadamard": 8, "scale_rule": "ceil"},
        {**NVFP4, "rounding": "stochastic", "scale_rule": "reciprocal"},
        {**NVFP4, "scale": "float8_e3m4", "hadamard": 16, "scale_rule": "reciprocal"},
        {**NVFP4, "rounding": "stochastic", "scale_rule": "te"},
        {**NVFP4, "scale_rule": "four_over_six"},
    ]
)


@SWEEP
@given(x=extreme_tensors(), options=BLOCK_OPTIONS, seed=st.integers(0, 2**40))
def test_sweep_quantize_block_is_finite_and_the_same_on_both_backends(kernel_device, x, options, seed):
    out = _both(quantize_block, x, kernel_device, seed=seed, **options)
    assert out.dtype == x.dtype and out.shape == x.shape
    assert torch.isfinite(out).all()
    assert ((out == 0) | (x != 0) | ("hadamard" in options)).all()  # zeros stay zeros without the transform


@SWEEP
@given(x=extreme_tensors(), size=st.sampled_from([2, 16, 32]), seed=st.none() | st.integers(0, 2**40))
def test_sweep_hadamard_is_the_same_on_both_backends_and_inf_only_beyond_the_range(
    kernel_device, x, size, seed
):
    out = _both(hadamard, x, kernel_device, block_size=size, seed=seed)
    assert not out.isnan().any()
    bound = x.double().abs().reshape(-1, size).amax(1) * math.sqrt(
        size
    )  # |H D v / sqrt(n)| <= sqrt(n) max|v|
    fits = (bound <= torch.finfo(x.dtype).max / 1.01).repeat_interleave(size).view(x.shape)
    assert torch.isfinite(out[fits]).all()


def test_the_torch_path_refuses_more_elements_than_its_random_counter_takes(monkeypatch):
    """Beyond 2^32 elements (after padding) the counter of the random bits would change its high word
    inside the one compiled call: a clear error instead (the limit lowered here to test it)."""
    from gradcomp.ops import block

    monkeypatch.setattr(block, "MAX_TORCH_ELEMENTS", 64)
    x = torch.ones(2, 24)  # 48 elements, padded to 64 along the last axis: accepted
    assert torch.equal(quantize_block(x, "e2m1fn", 32, backend="torch"), x)
    with pytest.raises(ValueError, match="at most 2\\^32 elements"):
        quantize_block(torch.ones(3, 24), "e2m1fn", 32, backend="torch")  # 96 after padding


@pytest.mark.parametrize("block_size", [32.0, True, [32]])
def test_formats_built_once_per_setting_still_refuse_bad_settings(block_size):
    """quantize_block builds each format once (a cache): a float or bool equal to a cached int, or an
    unhashable value, still gets BlockFormat's own error."""
    quantize_block(torch.ones(4), "e2m1fn", 32)  # 32 cached
    with pytest.raises(ValueError, match="block_size must be a power of two"):
        quantize_block(torch.ones(4), "e2m1fn", block_size)
