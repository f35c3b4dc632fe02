"""LUQ and MVUE N:M (the lognormal paper's sequels): the ops on both backends bit for bit, their
unbiasedness at stated bounds, their patterns, the variance theory against Monte-Carlo, and the policies."""

import math

import pytest
import torch
from helpers import kernel_can_hold, lognormal_gradient
from torch import nn

from gradcomp import lognormal_threshold, nm_prune, parse_policy, quantize_luq, stochastic_prune
from gradcomp.attachment import attach
from gradcomp.compress import GradientCopy, LayerStats, compress
from gradcomp.ops.luq import luq_alpha
from gradcomp.ops.nm import keep_probabilities
from gradcomp.profiling import count_work
from gradcomp.theory.unbiased import luq_variance, nm_variance, prune_variance


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
    with pytest.raises(ValueError, match="1 <= n < m"):
        nm_prune(x, 4, 4)
    with pytest.raises(ValueError, match="axis"):
        nm_prune(x, 2, 4, axis=2)


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
