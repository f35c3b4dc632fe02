"""Properties of quantize_int, stochastic_prune, the thresholds and log_moments on generated tensors: every
float dtype, values from subnormals to the dtype's largest (and NaN/Inf where the op lets them through),
contiguous or not."""

from fractions import Fraction

import pytest
import torch
from helpers import kernel_property, same_bits
from hypothesis import given, settings
from hypothesis import strategies as st

from gradcomp import (
    gaussian_threshold,
    laplace_threshold,
    log_moments,
    lognormal_threshold,
    quantize_int,
    stochastic_prune,
    topk_threshold,
)
from gradcomp._backend import KERNEL_DTYPES, compute_layout

DTYPES = [torch.float16, torch.bfloat16, torch.float32, torch.float64]
# derandomized: the same examples every run (no example database is kept)
PROPERTY = settings(max_examples=40, deadline=None, database=None, derandomize=True)
# kernel_device is a constant string, so sharing it between generated inputs is safe
KERNEL_PROPERTY = kernel_property(15)
SEEDS = st.integers(0, 2**40)


@st.composite
def tensors(draw, dtypes=DTYPES, specials: bool = False, max_side: int = 6) -> torch.Tensor:
    """A (rows, columns) tensor of one dtype, finite values over its whole range (plus NaN/+-Inf if
    `specials`), as a transposed view half of the time."""
    dtype = draw(st.sampled_from(dtypes))
    rows, columns = draw(st.integers(1, max_side)), draw(st.integers(1, max_side))
    largest = torch.finfo(dtype).max
    element = st.floats(-largest, largest, allow_nan=False)
    if specials:
        element = element | st.sampled_from([float("nan"), float("inf"), float("-inf")])
    values = draw(st.lists(element, min_size=rows * columns, max_size=rows * columns))
    x = torch.tensor(values, dtype=torch.float64).to(dtype)  # values within the dtype's range round into it
    if draw(st.booleans()):
        return x.reshape(columns, rows).t()
    return x.reshape(rows, columns)


def _groups(x: torch.Tensor, scheme: str) -> torch.Tensor:
    rows = x.reshape(x.shape[0], -1)
    return rows.reshape(1, -1) if scheme == "ptq" else rows


def _assert_like(out: torch.Tensor, x: torch.Tensor) -> None:
    assert out.dtype == x.dtype and out.shape == x.shape and out.layout == x.layout
    assert out.device == x.device and not out.requires_grad


@PROPERTY
@given(
    x=tensors(), bits=st.integers(1, 16), scheme=st.sampled_from(["ptq", "psq"]), seed=st.integers(0, 2**40)
)
def test_quantize_int_lands_on_its_groups_grid_within_their_range(x, bits, scheme, seed):
    out = quantize_int(x, bits, scheme, seed=seed)
    _assert_like(out, x)
    assert same_bits(out, quantize_int(x.contiguous(), bits, scheme, seed=seed))
    levels = 2**bits - 1
    compute_eps = torch.finfo(compute_layout(x.dtype).float_dtype).eps
    info = torch.finfo(x.dtype)
    for group, group_out in zip(_groups(x, scheme), _groups(out, scheme), strict=True):
        low, high = group.min(), group.max()
        assert torch.isfinite(group_out).all()
        assert ((group_out >= low) & (group_out <= high)).all()
        # exact rationals: the nearest grid point low + q (high - low) / levels, up to the rounding of the
        # compute dtype and of x's dtype
        low_q, high_q = Fraction(low.item()), Fraction(high.item())
        magnitude = max(abs(low_q), abs(high_q))
        tolerance = magnitude * Fraction(8 * compute_eps + info.eps) + Fraction(
            info.smallest_normal * info.eps
        )
        for value in map(Fraction, group_out.tolist()):
            if high_q == low_q:
                assert value == low_q
                continue
            q = round((value - low_q) * levels / (high_q - low_q))
            assert abs(value - (low_q + q * (high_q - low_q) / levels)) <= tolerance


@PROPERTY
@given(x=tensors(specials=True), bits=st.integers(1, 8), scheme=st.sampled_from(["ptq", "psq", "bhq"]))
def test_quantize_int_keeps_dtype_shape_bits_and_poisons_only_non_finite_groups(x, bits, scheme):
    out = quantize_int(x, bits, scheme, seed=11)
    _assert_like(out, x)
    assert same_bits(out, quantize_int(x, bits, scheme, seed=11))
    group_is_finite = torch.isfinite(_groups(x, scheme)).all(1)
    if scheme == "bhq":
        group_is_finite = group_is_finite.all().expand(x.shape[0])
    for finite, group_out in zip(
        group_is_finite, _groups(out, scheme if scheme != "bhq" else "psq"), strict=True
    ):
        assert (torch.isfinite(group_out) if finite else torch.isnan(group_out)).all()


@st.composite
def prune_cases(draw, dtypes=DTYPES) -> tuple[torch.Tensor, float]:
    """x with NaN/Inf among its values, and alpha: 0 or the magnitude of one of x's finite values, where
    that is a threshold x's compute dtype resolves."""
    x = draw(tensors(dtypes=dtypes, specials=True))
    magnitudes = [abs(v) for v in x.flatten().tolist() if abs(v) < float("inf")]
    smallest = 2.0**24 / torch.finfo(compute_layout(x.dtype).float_dtype).max
    usable = [m for m in magnitudes if m >= smallest]
    alpha = draw(st.sampled_from(usable)) if usable and draw(st.booleans()) else 0.0
    return x, alpha


@PROPERTY
@given(case=prune_cases(), seed=SEEDS)
def test_prune_gives_zero_or_signed_alpha_below_alpha_and_keeps_the_rest(case, seed):
    x, alpha = case
    out = stochastic_prune(x, alpha, seed=seed)
    _assert_like(out, x)
    assert same_bits(out, stochastic_prune(x.contiguous(), alpha, seed=seed))
    below = x.abs() < alpha
    assert same_bits(out[~below], x[~below])  # NaN, +-Inf and |x| >= alpha bit for bit
    promoted = out[below]
    assert torch.all((promoted == 0) | (promoted.abs() == alpha))
    nonzero = promoted != 0
    assert torch.all(promoted[nonzero].sign() == x[below][nonzero].sign())


@PROPERTY
@given(
    x=tensors(specials=True),
    alpha=st.floats(0, 1e300) | st.sampled_from([float("inf"), 1e-40, 1e-305, 65504.0, 3.4e38, 3.5e38]),
)
def test_a_tensor_alpha_acts_as_the_number_it_rounds_to_within_the_resolvable_range(x, alpha):
    """Above x's largest finite value a tensor alpha acts as that value; below 2^24 / (largest compute
    value) as 0."""
    largest = torch.finfo(x.dtype).max
    smallest = 2.0**24 / torch.finfo(compute_layout(x.dtype).float_dtype).max
    rounded = torch.tensor(min(alpha, largest), dtype=torch.float64).to(x.dtype).item()
    number = rounded if rounded >= smallest else 0.0
    expected = stochastic_prune(x, number, seed=2)
    assert same_bits(stochastic_prune(x, torch.tensor(alpha, dtype=torch.float64), seed=2), expected)


@PROPERTY
@given(x=tensors(specials=True), sparsity=st.floats(0, 0.99))
def test_thresholds_are_finite_non_negative_scalars_of_the_compute_dtype(x, sparsity):
    for estimator in (lognormal_threshold, gaussian_threshold, laplace_threshold, topk_threshold):
        alpha = estimator(x, sparsity)
        assert alpha.shape == () and alpha.dtype == compute_layout(x.dtype).float_dtype
        assert torch.isfinite(alpha) and alpha >= 0 and not alpha.requires_grad


@PROPERTY
@given(x=tensors(specials=True))
def test_log_moments_count_every_element_once_and_sum_the_logs(x):
    moments = log_moments(x)
    assert moments.dtype == torch.float64 and moments.shape == (4,)
    values = x.double().flatten()
    finite_nonzero = torch.isfinite(values) & (values != 0)
    assert moments[0] == finite_nonzero.sum() and moments[3] == (values == 0).sum()
    logs = values[finite_nonzero].abs().log()
    expected = torch.stack([logs.sum(), (logs * logs).sum()])
    torch.testing.assert_close(moments[1:3], expected, rtol=1e-5, atol=1e-5 * len(logs))


@KERNEL_PROPERTY
@given(x=tensors(dtypes=list(KERNEL_DTYPES), specials=True, max_side=4), bits=st.integers(1, 16))
def test_quantize_int_backends_agree_bit_for_bit(kernel_device, x, bits):
    for scheme in ("ptq", "psq", "bhq"):
        expected = quantize_int(x, bits, scheme, seed=7, backend="torch")
        got = quantize_int(x.to(kernel_device), bits, scheme, seed=7, backend="triton").cpu()
        finite = torch.isfinite(expected)
        assert torch.equal(finite, torch.isfinite(got)) and torch.equal(
            torch.isnan(expected), torch.isnan(got)
        )
        assert same_bits(got[finite], expected[finite]), scheme


@KERNEL_PROPERTY
@given(case=prune_cases(dtypes=list(KERNEL_DTYPES)))
def test_prune_and_log_moments_backends_agree(kernel_device, case):
    x, alpha = case
    expected = stochastic_prune(x, alpha, seed=5, backend="torch")
    got = stochastic_prune(x.to(kernel_device), alpha, seed=5, backend="triton")
    assert same_bits(got.cpu(), expected)
    moments = log_moments(x.to(kernel_device), backend="triton").cpu()
    reference = log_moments(x, backend="torch")
    assert torch.equal(moments[[0, 3]], reference[[0, 3]])
    torch.testing.assert_close(moments, reference, rtol=1e-5, atol=1e-4)


@pytest.mark.parametrize("dtype", DTYPES)
def test_generated_tensors_reach_the_dtype_extremes(dtype):
    """The strategy above does produce the groups the properties are about (subnormal and huge values)."""
    info = torch.finfo(dtype)
    seen = []

    @settings(max_examples=60, deadline=None, database=None, derandomize=True)
    @given(x=tensors(dtypes=[dtype]))
    def collect(x):
        seen.append(x.abs().max().item())

    collect()
    assert min(seen) < info.smallest_normal and max(seen) > info.max / 4
