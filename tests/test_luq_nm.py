"""LUQ and MVUE N:M (the lognormal paper's sequels): the ops on both backends bit for bit, their
unbiasedness at stated bounds, their patterns, the variance theory against Monte-Carlo, and the policies.

At the edges of the range: both ops at the limits of their dtypes (tiny tensors, subnormals, values near
the largest finite one). Both backends bit for bit, the N:M pattern, finiteness where the exact result is
representable, and unbiasedness: the mean of K independent draws within 5 standard errors of x, the
standard error from the exact variance of one draw."""

import math
from collections.abc import Callable

import pytest
import torch
from helpers import kernel_can_hold, kernel_property, lognormal_gradient, same_bits
from hypothesis import given
from hypothesis import strategies as st
from torch import Tensor, nn

from gradcomp import lognormal_threshold, nm_prune, parse_policy, quantize_luq, stochastic_prune
from gradcomp.ops.luq import luq_alpha
from gradcomp.ops.nm import keep_probabilities
from gradcomp.profiling import count_work
from gradcomp.rng import random_bits, uniform24
from gradcomp.theory.unbiased import luq_variance, nm_variance, prune_variance
from gradcomp.training.attachment import attach
from gradcomp.training.compress import GradientCopy, LayerStats, compress


# --- LUQ ----------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16])
@pytest.mark.parametrize("samples", [1, 3])
def test_luq_kernel_matches_the_torch_path_bit_for_bit(kernel_device, dtype, samples):
    x = lognormal_gradient((40, 257), sigma=2.5, mu=-8.0).to(dtype)
    x = torch.where(kernel_can_hold(x), x, 0.0)
    counters = [torch.zeros((), dtype=torch.int64, device=d) for d in ("cpu", kernel_device)]
    expected = quantize_luq(x, 4, samples, seed=7, backend="torch", count_zeros_into=counters[0])
    got = quantize_luq(
        x.to(kernel_device), 4, samples, seed=7, backend="triton", count_zeros_into=counters[1]
    )
    assert torch.equal(got.cpu().view(torch.int16 if dtype != torch.float32 else torch.int32),
                       expected.view(torch.int16 if dtype != torch.float32 else torch.int32))  # fmt: skip
    assert int(counters[0]) == int(counters[1]) == int((expected == 0).sum())


def test_luq_lands_on_its_levels_and_underflows_as_stochastic_prune():
    x = lognormal_gradient(50_000, sigma=3.0, specials=False)
    out = quantize_luq(x, bits=4, seed=3)
    alpha = float(luq_alpha(x, 4))
    assert alpha == pytest.approx(float(x.abs().max()) / 128, rel=1e-7)
    levels = {alpha * 2.0**k for k in range(8)}
    magnitudes = set(out[out != 0].abs().tolist())
    assert magnitudes <= {float(torch.tensor(v, dtype=torch.float32)) for v in levels}
    below = x.abs() < alpha
    assert torch.equal(out[below], stochastic_prune(x, alpha, seed=3)[below])
    assert torch.equal(torch.sign(out[out != 0]), torch.sign(x[out != 0]))


def test_luq_specials_pass_through_and_zeros_stay():
    x = lognormal_gradient(1000, sigma=2.0)  # 0, -0, NaN, +-Inf first
    out = quantize_luq(x, seed=1)
    assert torch.equal(out[:2], x[:2]) and torch.isnan(out[2]) and torch.equal(out[3:5], x[3:5])
    assert float(luq_alpha(x, 4)) == pytest.approx(float(x[5:].abs().max()) / 128, rel=1e-7)
    assert torch.equal(quantize_luq(torch.zeros(10), seed=0), torch.zeros(10))


def _draws(x: torch.Tensor, replicas: int, **kwargs) -> torch.Tensor:
    """`replicas` independent quantizations of x (x tiled, so every copy gets its own random bits), with
    alpha pinned by one large value at the end."""
    tiled = torch.cat([x.repeat(replicas), x.abs().max().reshape(1) * 2])
    out = kwargs.pop("op")(tiled, seed=11, **kwargs)[:-1]
    return out.view(replicas, -1)


def _luq_variance_of(x: torch.Tensor, alpha: float) -> torch.Tensor:
    """The exact conditional variance of one LUQ draw of each element."""
    magnitude = x.abs().double()
    low = alpha * torch.exp2(torch.floor(torch.log2(magnitude / alpha)))
    above = (magnitude - low) * (2 * low - magnitude)
    return torch.where(magnitude < alpha, magnitude * (alpha - magnitude), above)


def test_luq_is_unbiased_and_smp_divides_its_variance():
    """Every element's mean over 4,000 draws within 5 standard errors of the element (the exact variance
    of a draw is known), and the mean of 4 samples has a quarter of the variance (within 15 %)."""
    x = lognormal_gradient(500, sigma=2.0, mu=-4.0, specials=False)
    draws = _draws(x, 4000, op=quantize_luq)
    alpha = float(x.abs().max()) * 2 / 128
    variance = _luq_variance_of(x, alpha)
    z = (draws.double().mean(0) - x.double()) / (variance / 4000).sqrt().clamp_min(1e-30)
    assert float(z.abs().max()) < 5
    single = draws.double().var(0).sum()
    averaged = _draws(x, 4000, op=quantize_luq, samples=4).double().var(0).sum()
    assert float(averaged / single) == pytest.approx(0.25, rel=0.15)


# --- N:M ----------------------------------------------------------------------------------------------------
CASES = [(2, 4, (8, 64), -1), (1, 2, (6, 10, 5), 1), (2, 4, (3, 7, 6), -1), (3, 8, (5, 16, 2), 1)]


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize(("n", "m", "shape", "axis"), CASES)
def test_nm_kernel_matches_the_torch_path_bit_for_bit(kernel_device, dtype, n, m, shape, axis):
    x = lognormal_gradient(shape, sigma=2.0).to(dtype)
    x = torch.where(kernel_can_hold(x), x, 0.0)
    expected = nm_prune(x, n, m, axis, seed=5, backend="torch")
    got = nm_prune(x.to(kernel_device), n, m, axis, seed=5, backend="triton").cpu()
    assert torch.equal(torch.nan_to_num(got), torch.nan_to_num(expected))
    assert torch.equal(torch.isnan(got), torch.isnan(expected))


@pytest.mark.parametrize(("n", "m"), [(1, 2), (2, 4), (2, 8)])
def test_nm_keeps_exactly_n_of_every_m(n, m):
    x = lognormal_gradient((64, 8 * m), sigma=2.0, specials=False)
    x[0, :m] = 0.0  # a block of zeros
    x[1, : m - 1] = 0.0  # a block with one non-zero
    out = nm_prune(x, n, m, seed=2)
    kept = (out != 0).view(-1, m).sum(1)
    nonzeros = (x != 0).view(-1, m).sum(1)
    assert torch.equal(kept, nonzeros.clamp(max=n))
    assert torch.equal(out[1, m - 1], x[1, m - 1])  # kept with probability 1, unscaled


def test_nm_one_of_two_is_the_papers_closed_form():
    x = torch.tensor([[0.3, -0.1], [-2.0, 1.0], [0.0, 4.0]])
    out = nm_prune(x, 1, 2, seed=0)
    total = x.abs().sum(1, keepdim=True)
    kept = out != 0
    assert torch.equal(kept.sum(1), torch.tensor([1, 1, 1]))
    assert torch.allclose(out[kept], (torch.sign(x) * total.expand_as(x))[kept])


def test_nm_remainder_non_finite_and_axis():
    x = lognormal_gradient((4, 6), sigma=1.0, specials=False)
    x[2, 1] = math.inf
    out = nm_prune(x, 2, 4, axis=-1, seed=1)
    assert torch.equal(out[2, :4], x[2, :4])  # the block with Inf passes through
    assert int((out[:, 4:] != 0).sum(1).max()) <= 2  # the 2-element remainder keeps at most 2
    channels = nm_prune(x.T.contiguous(), 2, 4, axis=0, seed=1)
    assert torch.equal(channels.T, out)


def test_nm_is_unbiased_with_less_variance_than_uniform_sampling():
    """Each element's mean over 20,000 draws within 6 standard errors (the exact variance of a draw,
    x^2 (1/p - 1), is known; 6 because rarely kept elements make skewed means), and the summed variance
    below that of the naive unbiased 2:4 (two of four at random, times 2)."""
    x = lognormal_gradient((1, 400), sigma=2.0, mu=0.0, specials=False)
    draws = nm_prune(x.repeat(20_000, 1), 2, 4, seed=3).double()  # every row its own random bits
    p = keep_probabilities(x.double().abs().view(-1, 4), 2).view(-1)
    variance = x[0].double() ** 2 * (1 / p - 1)
    z = (draws.mean(0) - x[0].double()) / (variance / 20_000).sqrt().clamp_min(1e-30)
    assert float(z.abs().max()) < 6
    assert float(draws.var(0).sum()) == pytest.approx(float(variance.sum()), rel=0.05)
    naive = (x[0].double() ** 2).sum()  # each element kept with probability 1/2, doubled: variance x^2
    assert float(variance.sum()) < 0.8 * float(naive)


# --- theory -------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("sigma", [1.0, 1.5])
def test_variance_theory_matches_monte_carlo(sigma):
    """Added variance per element E[(out - g)^2] on 2^21 lognormal draws over E[g^2] = exp(2 sigma^2), within
    4 % of the theory: at sigma 1.5 (ln units; 2.2 binades, the default's layers) the Monte-Carlo error of the
    mean is below 1.5 % (N:M's per-block variance 2|a||b| is itself lognormal, with sigma 2.1); the
    sample's own mean of g^2 would be far noisier, and LUQ's alpha is the sample's largest value."""
    g = lognormal_gradient(1 << 21, sigma=sigma, mu=0.0, seed=4, specials=False)
    energy = math.exp(2 * sigma * sigma)

    def measured(out: torch.Tensor) -> float:
        return float(((out.double() - g.double()) ** 2).mean()) / energy

    largest = float(g.abs().max())
    luq = quantize_luq(g, 4, seed=1)
    assert measured(luq) == pytest.approx(luq_variance(sigma, 4, largest=largest), rel=0.04)
    for n, m in ((1, 2), (2, 4)):
        assert measured(nm_prune(g, n, m, seed=1)) == pytest.approx(nm_variance(sigma, n, m), rel=0.04)
    pruned = stochastic_prune(g, lognormal_threshold(g, 0.5), seed=1)
    assert measured(pruned) == pytest.approx(prune_variance(sigma, 0.5), rel=0.04)


def test_one_of_two_has_the_closed_form_variance():
    assert nm_variance(1.5, 1, 2) == pytest.approx(math.exp(-(1.5**2)))
    assert nm_variance(1.5, 1, 2, nodes=12) == nm_variance(1.5, 1, 2)


# --- policies -----------------------------------------------------------------------------------------------
@pytest.mark.parametrize("spec", ["luq", "luq:bits=4,samples=2", "nm:n=2,m=4", "nm:n=1,m=2"])
def test_the_policies_train(spec):
    torch.manual_seed(0)
    model = nn.Sequential(nn.Conv2d(3, 8, 3, padding=1), nn.ReLU(), nn.Flatten(), nn.Linear(8 * 64, 4))
    handle = attach(model, spec)
    seen = {}
    handle.observers.append(lambda name, g, active: seen.setdefault(name, g.clone()))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    for _ in range(3):
        optimizer.zero_grad()
        nn.functional.cross_entropy(model(torch.randn(4, 3, 8, 8)), torch.arange(4)).backward()
        optimizer.step()
    assert all(torch.isfinite(p.grad).all() for p in model.parameters())
    assert 0 <= handle.sparsity() < 1
    policy = parse_policy(spec)
    assert parse_policy(policy.describe()) == policy


def test_nm_blocks_run_along_the_output_features():
    """A convolution's output gradient (N, C, H, W) is pruned in blocks of channels, a linear one's along
    its last axis: the reduction axis of the input-gradient GEMM."""
    model = nn.Sequential(nn.Conv2d(3, 8, 3), nn.Flatten(), nn.Linear(8, 4))
    handle = attach(model, "nm:n=2,m=4")
    assert [layer.feature_axis for layer in handle.layers] == [1, -1]
    g = lognormal_gradient((2, 8, 5, 5), sigma=2.0, specials=False)
    out = compress(parse_policy("nm"), GradientCopy(g, seed=0, feature_axis=1), LayerStats())
    assert int((out != 0).movedim(1, -1).reshape(-1, 4).sum(1).max()) == 2


@pytest.mark.parametrize(("spec", "bits"), [("luq", 4.0), ("luq:samples=2", 8.0), ("nm:n=2,m=4", 16.75)])
def test_the_policies_say_their_bits(spec, bits):
    assert parse_policy(spec).bits_per_element({}) == pytest.approx(bits)


@pytest.mark.parametrize(("spec", "match"), [("luq:bits=9", "bits"), ("luq:samples=0", "samples"),
                                              ("nm:n=4,m=4", "1 <= n < m")])  # fmt: skip
def test_bad_settings_are_refused(spec, match):
    with pytest.raises(ValueError, match=match):
        parse_policy(spec)


def test_the_ops_are_their_kernels_without_sync(kernel_device):
    x = lognormal_gradient((64, 96), sigma=2.0, specials=False).to(kernel_device)
    for call, launches in ((lambda: quantize_luq(x, seed=1, backend="triton"), 3),
                           (lambda: quantize_luq(x, samples=3, seed=1, backend="triton"), 5),
                           (lambda: nm_prune(x, 2, 4, seed=1, backend="triton"), 1)):  # fmt: skip
        call()
        with count_work() as work:
            call()
        assert sum(work.launches.values()) == launches and not work.syncs, str(work)


def test_c3_predictions_are_relative_to_the_measured_energy():
    """On one lognormal the rescaling to the measured mean square changes nothing beyond sampling noise; on
    a two-population gradient (a layer's usual shape, A1) it keeps the prediction in absolute terms."""
    from gradcomp.analysis.sequels import predicted_variance

    policy = parse_policy("prune:sparsity=0.5")
    g = lognormal_gradient((1 << 16,), sigma=1.0, specials=False).double()
    assert predicted_variance(policy, g) == pytest.approx(prune_variance(1.0, 0.5), rel=0.05)
    outliers = torch.cat([g, 1e3 * g[:64]])
    assert predicted_variance(policy, outliers) < 0.1 * prune_variance(1.0, 0.5)


# --- At the edges of the range ------------------------------------------------------------------------------
DTYPES = [torch.float32, torch.float16, torch.bfloat16]
F32_MAX = torch.finfo(torch.float32).max
# a 2:4 block whose rounded p add up to 2 + 2^-21, and a seed whose first block draws u = 0: without the
# cap of the running sum at n, this block keeps 3
OVERSHOOT_BLOCK = [0.6672822833061218, 0.7637840509414673, 0.7370861768722534, 0.3129650354385376]
OVERSHOOT_SEED = 18795701


def run(op: Callable[..., Tensor], x: Tensor, *args, device: str, **kwargs) -> Tensor:
    """op on the torch path, after checking that its kernel on `device` gives the same bits (float64 has no
    kernel)."""
    expected = op(x, *args, backend="torch", **kwargs)
    if x.dtype != torch.float64:
        got = op(x.to(device), *args, backend="triton", **kwargs).cpu()
        assert same_bits(got, expected), (x, got, expected)
    return expected


def subnormal(dtype: torch.dtype) -> float:
    """The smallest positive subnormal of dtype."""
    info = torch.finfo(dtype)
    return info.tiny * info.eps


def assert_unbiased(draws: Tensor, x: Tensor, variance_of: Callable[[Tensor, float], Tensor]) -> None:
    """Every element's mean over the rows of `draws` within 5 standard errors of x (exactly x where the
    variance of a draw is 0). variance_of(x * unit, unit): the exact variance of one draw of x times unit,
    a power of two that brings x's largest magnitude near 1 (so that squares and sums stay finite)."""
    exponent = math.floor(math.log2(float(x.double().abs().max())))
    unit = 2.0 ** -min(max(exponent, -1000), 1000)
    scaled = x.double() * unit
    error = ((draws.double() * unit).mean(0) - scaled).abs()
    bound = 5 * (variance_of(scaled, unit) / draws.shape[0]).sqrt()
    assert (error <= bound).all(), (x[error > bound], error[error > bound], bound[error > bound])


def luq_draw_variance(x: Tensor, alpha: float) -> Tensor:
    """The exact variance of one LUQ draw of each element (alpha > 0; 0 where x passes through)."""
    magnitude = x.double().abs()
    low = alpha * torch.exp2(torch.floor(torch.log2(magnitude / alpha)))
    low = torch.where(low > magnitude, low / 2, low)
    return torch.where(
        magnitude < alpha, magnitude * (alpha - magnitude), (magnitude - low) * (2 * low - magnitude)
    )


def nm_draw_variance(rows: Tensor, n: int, m: int) -> Tensor:
    """The exact variance of one N:M draw of each element of rows of blocks, x^2 (1/p - 1)."""
    values = rows.double()
    p = keep_probabilities(values.abs().reshape(-1, m), n).reshape(values.shape)
    return torch.where(p > 0, values**2 * (1 / p - 1), 0.0)


def assert_pattern(out: Tensor, n: int, m: int) -> None:
    assert int((out != 0).reshape(-1, m).sum(1).max()) <= n


# --- N:M ----------------------------------------------------------------------------------------------------
def test_nm_float16_beyond_its_range_overflows_as_documented(kernel_device):
    """4 x 20000 at 1:4: the unbiased kept value 80000 is beyond float16 (65504), so it is Inf; in float32
    the same block gives 80000 exactly."""
    out = run(nm_prune, torch.full((4,), 20000.0, dtype=torch.float16), 1, 4, seed=0, device=kernel_device)
    assert int((out != 0).sum()) == 1 and out.abs().max() == math.inf
    out = run(nm_prune, torch.full((4,), 20000.0), 1, 4, seed=0, device=kernel_device)
    assert sorted(out.tolist()) == [0.0, 0.0, 0.0, 80000.0]


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_nm_blocks_near_the_largest_value_keep_n(kernel_device, dtype):
    """Blocks whose sums overflow the dtype (4 x 1e38 at 2:4, once all zero) keep exactly 2, each twice
    its value, and random blocks of magnitudes up to max/4 stay finite (their kept values are at most
    3/4 of the largest)."""
    x = torch.full((4,), 1e38, dtype=dtype)
    out = run(nm_prune, x, 2, 4, seed=0, device=kernel_device)
    assert int((out != 0).sum()) == 2 and bool((out[out != 0] == 2 * x[0]).all())
    generator = torch.Generator().manual_seed(0)
    magnitudes = torch.finfo(dtype).max / 4 * torch.rand(64, 16, generator=generator)
    x = (magnitudes * torch.where(torch.rand(64, 16, generator=generator) < 0.5, -1.0, 1.0)).to(dtype)
    for n, m in ((2, 4), (1, 2), (3, 8)):
        out = run(nm_prune, x, n, m, seed=1, device=kernel_device)
        assert_pattern(out, n, m)
        assert torch.isfinite(out).all()


def test_nm_a_running_sum_rounded_above_n_keeps_n(kernel_device):
    x = torch.tensor([OVERSHOOT_BLOCK])
    p = keep_probabilities(x, 2)[0]
    assert float(p[0] + p[1] + p[2] + p[3]) == 2 + 2.0**-21
    assert int(uniform24(random_bits(OVERSHOOT_SEED, 1, x.device))) == 0
    out = run(nm_prune, x, 2, 4, seed=OVERSHOOT_SEED, device=kernel_device)
    assert int((out != 0).sum()) == 2


@pytest.mark.parametrize(
    ("dtype", "scale"),
    [
        (torch.float32, F32_MAX / 8),
        (torch.bfloat16, 2.0**120),
        (torch.float16, 4096.0),
        (torch.float64, 1e300),
    ],
)
def test_nm_is_unbiased_near_the_largest_value(kernel_device, dtype, scale):
    """Blocks of magnitudes up to an eighth of the largest value (kept values up to about 3/4 of it)."""
    x = (torch.tensor([[1.0, -0.5, 0.25, 0.75, -1.0, 0.9, 0.1, -0.3]], dtype=torch.float64) * scale).to(dtype)
    draws = run(nm_prune, x.repeat(4000, 1), 2, 4, seed=3, device=kernel_device)
    assert torch.isfinite(draws).all()
    assert_pattern(draws, 2, 4)
    assert_unbiased(draws, x[0], lambda scaled, _: nm_draw_variance(scaled, 2, 4))


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.float64])
def test_nm_is_unbiased_on_subnormals(kernel_device, dtype):
    """Subnormal blocks whose kept values the dtype holds exactly (multiples of its smallest subnormal)."""
    units = torch.tensor([[1.0, 2.0, 3.0, 6.0, 2.0, 2.0, 2.0, 2.0, 1.0, 0.0, 1.0, 0.0]], dtype=torch.float64)
    x = (units * subnormal(dtype)).to(dtype)
    draws = run(nm_prune, x.repeat(4000, 1), 2, 4, seed=5, device=kernel_device)
    assert_pattern(draws, 2, 4)
    assert_unbiased(draws, x[0], lambda scaled, _: nm_draw_variance(scaled, 2, 4))


# --- LUQ ----------------------------------------------------------------------------------------------------
def test_luq_of_the_issue_is_exact_on_its_small_entries(kernel_device):
    """[1, 1e-42 x 3] at 8 bits once made every small entry alpha = 2^-127 (5,900 times the input): alpha is
    2^-126 now, below 2^24/max, so the small entries pass through as stochastic_prune would."""
    x = torch.tensor([1.0, 1e-42, 1e-42, 1e-42])
    assert float(luq_alpha(x, 8)) == 2.0**-126
    draws = run(quantize_luq, x.repeat(200), 8, seed=0, device=kernel_device).view(200, -1)
    assert torch.equal(draws[:, 1:], x[1:].expand(200, 3))
    assert bool((draws[:, 0] == 1.0).all())


@pytest.mark.parametrize(
    ("x", "bits"),
    [
        ([5e-30, 1e-32, 2e-32, -3e-32, 6e-32, 1e-31, 4e-31, -2.5e-30], 4),  # alpha 3.9e-32: small ones stay
        ([1e-29, 2e-31, -9e-32, 5e-32, 1e-30, 3e-31, -7e-30, 4e-30], 4),  # alpha 7.8e-32: they underflow
        ([2e8, 1e-31, 2e-31, -3e-31, 5e-30, 1e-20, 3.0, -1e5], 8),  # alpha 1.2e-30
        ([1.5, 1e-38, 5e-39, 2e-38, -3e-38, 1e-37, 1e-3, 5e-20], 8),  # alpha raised, 1.5 * 2^-126
    ],
)
def test_luq_is_unbiased_on_tiny_tensors(kernel_device, x, bits):
    x = torch.tensor(x)
    alpha = float(luq_alpha(x, bits))
    draws = run(quantize_luq, x.repeat(4000), bits, seed=1, device=kernel_device).view(4000, -1)
    stays = (x.abs() < alpha) & (alpha < 2.0**24 / F32_MAX)  # stochastic_prune's rule: no underflow
    assert_unbiased(
        draws, x, lambda scaled, unit: torch.where(stays, 0.0, luq_draw_variance(scaled, alpha * unit))
    )


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
@pytest.mark.parametrize("largest", [2.0**-20, 3 * 2.0**-13, 0.01])
def test_luq_is_unbiased_on_half_precision_tensors_with_tiny_values(kernel_device, dtype, largest):
    """Levels below the dtype's normal range are not used (float16 could not hold them): every output is
    exact in the dtype. bfloat16 takes the same values (all in its normal range)."""
    units = torch.tensor(
        [1.0, 0.5, 0.3, 0.07, 0.01, 0.004, -0.002, 0.0009, 0.0003, 0.0001], dtype=torch.float64
    )
    x = (units * largest).to(dtype)
    x = torch.where(kernel_can_hold(x), x, 0.0)
    draws = run(quantize_luq, x.repeat(4000), 4, seed=2, device=kernel_device).view(4000, -1)
    alpha = float(luq_alpha(x, 4))
    assert alpha >= torch.finfo(dtype).tiny or alpha == float(x.abs().max())
    assert_unbiased(draws, x, lambda scaled, unit: luq_draw_variance(scaled, alpha * unit))


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16, torch.float64])
@pytest.mark.parametrize("samples", [1, 3])
def test_luq_near_the_largest_value_is_finite_and_unbiased(kernel_device, dtype, samples):
    largest = torch.finfo(dtype).max
    units = torch.tensor([1.0, -0.9, 0.7, 0.45, -0.3, 0.01, 1e-3, 0.6], dtype=torch.float64)
    x = (units * largest).to(dtype)
    draws = run(quantize_luq, x.repeat(2000), 4, samples, seed=4, device=kernel_device).view(2000, -1)
    assert torch.isfinite(draws).all()
    if dtype in (torch.float32, torch.float64) or samples == 1:  # else each mean is rounded to x's dtype
        alpha = float(luq_alpha(x, 4))
        assert_unbiased(draws, x, lambda scaled, unit: luq_draw_variance(scaled, alpha * unit) / samples)
    constant = torch.full((4,), largest, dtype=dtype)  # SMP sums of largest values once overflowed
    assert torch.equal(run(quantize_luq, constant, 4, 3, seed=0, device=kernel_device), constant)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float64])
def test_luq_passes_a_subnormal_tensor_through(kernel_device, dtype):
    """The largest magnitude subnormal: it is alpha, below 2^24 / max, so nothing is pruned (bfloat16
    subnormals on the torch path only: the interpreter's conversions flush them)."""
    x = torch.tensor([3.0, -1.0, 7.0, 0.0, -7.0], dtype=torch.float64) * subnormal(dtype)
    x = x.to(dtype)
    for bits, samples in ((4, 1), (8, 2)):
        assert same_bits(quantize_luq(x, bits, samples, seed=0, backend="torch"), x)
        held = torch.where(kernel_can_hold(x), x, 0.0)
        assert same_bits(run(quantize_luq, held, bits, samples, seed=0, device=kernel_device), held)


def test_luq_of_a_zero_dimensional_tensor(kernel_device):
    assert run(quantize_luq, torch.tensor(-2.5), 4, seed=0, device=kernel_device).item() == -2.5


# --- properties over extreme values -------------------------------------------------------------------------
KERNEL_PROPERTY = kernel_property(60)


@st.composite
def extreme_tensors(draw) -> Tensor:
    """A 1-d tensor of a kernel dtype: magnitudes 2^e around a centre from subnormal to the largest value
    (the ends often), spread over up to 40 binades (often none), random signs, some zeros (and values the
    interpreter flushes)."""
    dtype = draw(st.sampled_from(DTYPES))
    info = torch.finfo(dtype)
    low, high = math.log2(subnormal(dtype)), math.log2(info.max)
    size = draw(st.integers(1, 24))
    centre = draw(st.sampled_from([low, high - 3, high]) | st.floats(low, high))
    spread = draw(st.just(0.0) | st.floats(0, 40))
    exponents = draw(st.lists(st.floats(-1, 1), min_size=size, max_size=size))
    signs = draw(st.lists(st.sampled_from([-1.0, 1.0, 0.0]), min_size=size, max_size=size))
    magnitudes = torch.tensor([centre + spread * e for e in exponents], dtype=torch.float64).clamp(low, high)
    x = (torch.tensor(signs, dtype=torch.float64) * torch.exp2(magnitudes).clamp(max=info.max)).to(dtype)
    return torch.where(kernel_can_hold(x), x, 0.0)


@KERNEL_PROPERTY
@given(
    x=extreme_tensors(),
    nm=st.sampled_from([(1, 2), (2, 4), (1, 4), (3, 8), (4, 16)]),
    seed=st.integers(0, 2**40),
)
def test_nm_keeps_its_pattern_and_overflows_only_beyond_the_dtype(kernel_device, x, nm, seed):
    """At most n non-zeros per block, at least one where the block has one; Inf only where |x| / p (the
    float32 p it samples with, the quotient exact) is beyond x's dtype."""
    n, m = nm
    out = run(nm_prune, x, n, m, seed=seed, device=kernel_device)
    padded = torch.nn.functional.pad(x, (0, -x.numel() % m)).view(-1, m)
    kept = (torch.nn.functional.pad(out, (0, -x.numel() % m)).view(-1, m) != 0).sum(1)
    assert (kept <= n).all() and (kept >= (padded != 0).any(1).long()).all()
    p = keep_probabilities(padded.float().abs(), n).view(-1)[: x.numel()]
    exact = torch.where(p > 0, x.double().abs() / p.double(), 0.0)
    assert (torch.isfinite(out) | ~torch.isfinite(exact.to(x.dtype))).all()


@KERNEL_PROPERTY
@given(x=extreme_tensors(), bits=st.integers(2, 8), samples=st.integers(1, 3), seed=st.integers(0, 2**40))
def test_luq_is_finite_and_lands_on_its_levels(kernel_device, x, bits, samples, seed):
    """Finite for finite x; one sample lands on 0, a level alpha * 2^k (k < 2^(bits-1)) or, below a
    2^24 / max alpha, x itself."""
    out = run(quantize_luq, x, bits, samples, seed=seed, device=kernel_device)
    assert torch.isfinite(out).all()
    if samples == 1:
        alpha = float(luq_alpha(x, bits))
        levels = {alpha * 2.0**k for k in range(2 ** (bits - 1))}
        for value, original in zip(out.abs().tolist(), x.abs().tolist(), strict=True):
            assert value in levels or value == 0 or (value == original and alpha < 2.0**24 / F32_MAX)
