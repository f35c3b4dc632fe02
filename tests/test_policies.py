import math
import statistics

import pytest
import torch
from helpers import lognormal_gradient

from gradcomp.ops import quantize_fp
from gradcomp.ops.stats import fit_statistics
from gradcomp.theory import fp as fp_theory
from gradcomp.training.compress import GradientCopy, LayerStats, compress, plan, scale_points
from gradcomp.training.policies import Chain, FloatingPoint, Integer, NoCompression, Prune, parse_policy


@pytest.mark.parametrize(
    ("spec", "expected"),
    [
        ("none", NoCompression()),
        ("prune:sparsity=0.85", Prune(0.85)),
        ("prune:sparsity=0.85,estimator=gaussian", Prune(0.85, "gaussian")),
        ({"name": "prune", "sparsity": 0.9}, Prune(0.9)),
        ("fp:format=e4m1,scaling=per_layer_mean", FloatingPoint("e4m1")),
        ("int:bits=5,scheme=bhq", Integer(5, "bhq")),
        ("prune:sparsity=0.8+fp:format=e4m1", Chain((Prune(0.8), FloatingPoint("e4m1")))),
        (
            [{"name": "prune", "sparsity": 0.8}, {"name": "fp", "format": "e4m1"}],
            Chain((Prune(0.8), FloatingPoint("e4m1"))),
        ),
    ],
)
def test_parse(spec, expected):
    policy = parse_policy(spec)
    assert policy == expected
    assert parse_policy(policy.describe()) == expected


@pytest.mark.parametrize(
    ("spec", "message"),
    [
        ("prunee", "unknown policy"),
        ("prune:sparsity=1.2", "sparsity"),
        ("prune:sparity=0.5", "no parameter 'sparity'"),
        ("prune:0.5", "key=value"),
        ("prune:estimator=median", "estimator"),
        ("fp:format=e9m9", "exp_bits"),
        ("fp:scaling=loss", "scaling"),
        ("int:bits=5.5", "bits"),
        ("prune:min_cosine=high", "min_cosine must be float | None"),
        ("int:scheme=hadamard", "scheme"),
        ({"sparsity": 0.5}, "unknown policy None"),
    ],
)
def test_bad_policies_say_what_is_wrong(spec, message):
    with pytest.raises(ValueError, match=message):
        parse_policy(spec)


def test_prune_policy_refreshes_its_threshold_only_when_asked():
    policy, stats = Prune(0.8), LayerStats()
    g = lognormal_gradient((64, 256), specials=False)
    out = compress(policy, GradientCopy(g, 0, refresh=True), stats)
    first = stats.threshold.clone()
    assert abs(float((out == 0).double().mean()) - 0.8) < 0.01
    compress(policy, GradientCopy(g * 100, 1, refresh=False), stats)
    assert torch.equal(stats.threshold, first)
    compress(policy, GradientCopy(g * 100, 1, refresh=True), stats)
    assert torch.allclose(stats.threshold, first * 100, rtol=1e-4)


def test_dynamic_loss_scaling_backs_off_on_overflow_and_grows_after_clean_steps():
    """GradScaler's rule across layers: any layer beyond the format's largest value halves the shared scale
    for the next step; growth_interval clean steps double it."""
    policy = FloatingPoint("e4m1", scaling="dynamic", global_scale=2.0**16, growth_interval=2)
    small, large = torch.full((64,), 2.0**-20), torch.full((64,), 2.0**-6)  # 2^-6 * 2^16 > 384: overflow
    layers = [LayerStats(), LayerStats()]
    scales = []
    for step in range(6):
        plan(policy, layers, refresh=True)
        scales.append(float(layers[0].scale) if layers[0].scale is not None else None)
        big = large if step == 0 else small
        for g, stats in zip((small, big), layers, strict=True):
            compress(policy, GradientCopy(g, step, refresh=True), stats)
    assert scales == [None, 2.0**15, 2.0**15, 2.0**16, 2.0**16, 2.0**17]
    assert float(layers[1].scale) == float(layers[0].scale)
    with pytest.raises(ValueError, match="growth_interval"):
        FloatingPoint("e4m1", scaling="global", growth_interval=5)


def test_fp_scales():
    g = lognormal_gradient((128, 512), sigma=2.0, mu=-12.0, specials=False)
    mu2 = float(torch.log2(g.abs()).mean())
    sigma2 = float(torch.log2(g.abs()).std())
    stats = LayerStats()
    compress(FloatingPoint("e4m1", scaling="per_layer_mean"), GradientCopy(g, 0), stats)
    assert float(stats.scale) == 2.0 ** round(-mu2 - 3)
    compress(FloatingPoint("e4m1", scaling="global", global_scale=2.0**10), GradientCopy(g, 0), stats)
    assert float(stats.scale) == 2.0**10
    # the lognormal's optimum above the clip-free scale (a narrow lognormal in FP4 [1,2,1]), then below it
    for name, sigma in (("e2m1", 1.0), ("e4m1", 2.0)):
        g = lognormal_gradient((128, 512), sigma=sigma, mu=-12.0, specials=False)
        mu2, sigma2 = float(torch.log2(g.abs()).mean()), float(torch.log2(g.abs()).std())
        policy = FloatingPoint(name, scaling="per_layer_optimal")
        compress(policy, GradientCopy(g, 0), stats)
        optimum = fp_theory.optimal_log2_scale(policy.fmt.positive_values(), sigma2)[0].item() - mu2
        clip_free = math.floor(math.log2(policy.fmt.max_value / float(g.abs().max())))
        if name == "e2m1":
            assert optimum > clip_free + 1 and abs(math.log2(float(stats.scale)) - optimum) <= 0.5 + 0.05
        else:  # the lognormal keeps room for a tail this sample does not have
            assert optimum + 1 < clip_free == math.log2(float(stats.scale))


def test_fp_scale_of_an_all_zero_gradient_is_finite():
    stats = LayerStats()
    out = compress(FloatingPoint("e4m1"), GradientCopy(torch.zeros(10, 10), 0), stats)
    assert torch.isfinite(stats.scale) and torch.equal(out, torch.zeros(10, 10))


def test_integer_weight_path_defaults_follow_the_reference_code():
    g = lognormal_gradient((16, 64), specials=False)
    policy = Integer(bits=2, scheme="psq")
    act = compress(policy, GradientCopy(g, 0, refresh=True), LayerStats())
    weight = compress(policy, GradientCopy(g, 0, refresh=True, weight_path=True), LayerStats())
    assert act.unique().numel() <= 4 * 16  # 2 bits: 4 levels per row
    assert weight.unique().numel() > 4 * 16  # 8-bit per-column quantizer
    assert torch.equal(
        compress(Integer(2, "psq", weight_scheme="none"), GradientCopy(g, 0, weight_path=True), LayerStats()),
        g,
    )


def test_chain_keeps_separate_statistics():
    policy = parse_policy("prune:sparsity=0.5+fp:format=e3m2")
    stats = LayerStats()
    out = compress(policy, GradientCopy(lognormal_gradient((32, 64), specials=False), 0), stats)
    assert len(stats.parts) == 2 and stats.parts[0].threshold is not None and stats.parts[1].scale is not None
    assert float((out == 0).double().mean()) >= 0.45


def test_policies_describe_themselves():
    labels = {
        "none": ("none", "none"),
        "prune:sparsity=0.85": ("prune 0.85", "prune, lognormal"),
        "prune:sparsity=0.5,estimator=gaussian": ("prune 0.5 gaussian", "prune, other threshold"),
        "prune:sparsity=0.95,min_cosine=0.9": ("prune 0.95 cos>=0.9", "prune, lognormal"),
        "fp:format=e4m1": ("FP6 [1,4,1]", "FP, per-layer scale"),
        "fp:format=e4m1,scaling=global,global_scale=256": ("FP6 [1,4,1] global 2^8", "FP, global scale"),
        "fp:format=e3m2,scaling=per_layer_optimal,rounding=stochastic": (
            "FP6 [1,3,2] per-layer min-MSE SR",
            "FP, per-layer scale",
        ),
        "int:bits=4,scheme=bhq": ("int4 BHQ", "int BHQ"),
        "prune:sparsity=0.85+fp:format=e4m1": ("prune 0.85 + FP6 [1,4,1]", "prune + FP"),
    }
    for spec, (label, family) in labels.items():
        policy = parse_policy(spec)
        assert (policy.label, policy.family) == (label, family), spec


def test_bits_per_element_count_every_family_the_same_way():
    # one layer whose threshold sits 1.645 sigmas above the log-mean: 5 % of its elements lie beyond it
    beyond = statistics.NormalDist().inv_cdf(0.95)
    layer = {"sparsity": 0.85, "elements": 100, "mu": 0.0, "sigma": 1.0, "threshold": math.exp(beyond)}
    summary = {"gradient_sparsity": 0.85, "layers": {"a": layer, "b": {**layer, "threshold": None}}}
    assert NoCompression().bits_per_element(summary) == 32
    assert FloatingPoint("e4m1").bits_per_element(summary) == 6
    assert Integer(5, "bhq").bits_per_element(summary) == 13  # 5-bit activation path + 8-bit weight path
    assert Integer(5, "psq", weight_scheme="same").bits_per_element(summary) == 10
    assert Integer(5, "psq", weight_scheme="none").bits_per_element(summary) == 37  # exact float32 copy
    # mask + a sign per survivor + 31 more bits for each survivor beyond the threshold
    assert Prune(0.85).bits_per_element(summary) == pytest.approx(1 + 0.15 + 31 * 0.05)
    assert parse_policy("prune:sparsity=0.85+fp:format=e4m1").bits_per_element(summary) == pytest.approx(
        1 + 0.15 * 6
    )


# --- the MSE-optimal per-layer scale, bounded by the tensor's largest value (issue 40, item 5) -------------
def _relative_mse(out: torch.Tensor, g: torch.Tensor) -> float:
    return float((out.double() - g.double()).square().sum() / g.double().square().sum())


def _scan(g: torch.Tensor, policy: FloatingPoint) -> dict[int, float]:
    """Relative MSE at every power-of-two scale from everything flushed to everything clipped."""
    return {
        k: _relative_mse(quantize_fp(g, policy.fmt, 2.0**k, policy.rounding, seed=5), g)
        for k in range(-40, 90)
    }


def _two_populations(n: int = 1 << 15) -> torch.Tensor:
    """70 % of the values around 2^-8 and 30 % around 2^-30: the energy sits at the top of a fit whose
    sigma2 is 10 binades, where a lognormal's would sit 100 binades higher."""
    generator = torch.Generator().manual_seed(7)
    log2 = torch.where(torch.rand(n, generator=generator) < 0.7, -8.0, -30.0) + torch.randn(
        n, generator=generator
    )
    return 2.0**log2 * torch.where(torch.rand(n, generator=generator) < 0.5, -1.0, 1.0)


def _truncated_lognormal(n: int = 1 << 15) -> torch.Tensor:
    """log2|g| ~ N(-20, 6^2) cut at its median: no upper tail at all."""
    log2 = (torch.randn(n, generator=torch.Generator().manual_seed(8)) * 6.0).clamp(max=0.0) - 20.0
    return 2.0**log2


REAL_LOOKING = {
    "lognormal": lambda: lognormal_gradient((128, 256), sigma=3.0, mu=-12.0, specials=False),
    "two populations": _two_populations,
    "truncated": _truncated_lognormal,
}


def test_min_mse_scale_does_not_flush_a_lognormal_gradient_to_zero():
    """The regression: FP4 [1,3,0] at the lognormal's MSE-optimal scale of a plain lognormal sample (sigma2
    4.3 binades: 2^-7, for a tail the sample does not have) put its largest value below half the format's
    smallest one and flushed every value (relative MSE 1); bounded by the sample's largest value (2^3) it
    keeps them, within 1.1x of the least MSE of a scan over power-of-two scales."""
    g = lognormal_gradient((128, 256), sigma=3.0, mu=-12.0, specials=False)
    policy = FloatingPoint("e3m0", scaling="per_layer_optimal")
    stats = LayerStats()
    out = compress(policy, GradientCopy(g, 0), stats)
    assert (out != 0).any()
    assert _relative_mse(out, g) < 1.1 * min(_scan(g, policy).values()) < 0.1
    assert float(g.abs().max() * stats.scale) <= policy.fmt.max_value < float(2 * g.abs().max() * stats.scale)


@pytest.mark.parametrize("tensor", REAL_LOOKING)
@pytest.mark.parametrize(
    ("fmt", "rounding"),
    [("e3m0", "nearest"), ("e3m0", "stochastic"), ("e2m1fn", "nearest"), ("e4m1", "stochastic"),
     ("e5m2-inf", "nearest"), ("e5m2-inf", "stochastic"), ("e3m1-nosub", "nearest"),
     ("e3m1-nosub", "stochastic"), ("e4m3fn", "nearest")],
)  # fmt: skip
def test_min_mse_scale_is_the_best_scale_that_clips_nothing(tensor, fmt, rounding):
    """On real-looking gradients, with saturating, IEEE-like (Inf) and subnormal-free formats and either
    rounding: the scale is at least the clip-free one, its measured relative MSE is the least of every
    power-of-two scale at or below it (the bound's argument; stochastic rounding with the same bits), never
    1, and where the largest value does not clip an Inf format gives no Inf."""
    g = REAL_LOOKING[tensor]()
    policy = FloatingPoint(fmt, scaling="per_layer_optimal", rounding=rounding)
    stats = LayerStats()
    out = compress(policy, GradientCopy(g, 5), stats)
    log2_scale, amax = math.log2(float(stats.scale)), float(g.abs().max())
    clip_free = math.floor(math.log2(policy.fmt.max_value / amax))
    assert log2_scale >= clip_free
    if log2_scale == clip_free:
        assert torch.isfinite(out).all()
    at_or_below = min(mse for k, mse in _scan(g, policy).items() if k <= log2_scale)
    assert _relative_mse(out, g) <= at_or_below * (1 + 1e-9) and at_or_below < 0.5


@pytest.mark.parametrize("tensor", REAL_LOOKING)
@pytest.mark.parametrize("fmt", ["e3m0", "e4m1", "e5m2-inf", "e3m1-nosub", "e4m3fn"])
def test_min_mse_scale_is_near_the_best_power_of_two(tensor, fmt):
    """Within 1.25x of the least measured MSE of any power-of-two scale (nearest rounding). Not where the best
    scale clips the top of the tensor, which no bound below can see: E2M1 (three binades) on the two
    populations does best 2 binades above the clip-free scale, 5.2x less MSE."""
    g = REAL_LOOKING[tensor]()
    policy = FloatingPoint(fmt, scaling="per_layer_optimal")
    out = compress(policy, GradientCopy(g, 5), LayerStats())
    assert _relative_mse(out, g) <= 1.25 * min(_scan(g, policy).values())


def test_the_clip_free_scale_is_exact_at_the_format_boundary():
    """2^k with amax * 2^k <= max_value: at equality and one float32 ulp above it, for float32 and float64
    amax; no bound without a finite non-zero."""
    from gradcomp.ops.stats import clip_free_log2_scale, largest_finite

    top = FloatingPoint("e4m3fn").fmt.max_value  # 448 = 1.75 * 2^8
    above = float(torch.tensor(top * 2.0**-20).nextafter(torch.tensor(1.0)))  # one float32 ulp above
    for amax, expected in ((top * 2.0**-20, 20.0), (above, 19.0), (2.0**-149, 157.0), (0.0, -math.inf),
                           (math.inf, -math.inf), (math.nan, -math.inf)):  # fmt: skip
        for dtype in (torch.float32, torch.float64):
            got = clip_free_log2_scale(torch.tensor(amax, dtype=dtype), top)
            assert float(got) == expected
    assert float(largest_finite(torch.tensor([0.5, -3.0, math.nan, -math.inf]))) == 3.0
    assert float(largest_finite(torch.zeros(0))) == 0.0


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
def test_bounded_scale_backends_agree_bit_for_bit(kernel_device, dtype):
    """The kernel's largest magnitude (its first pass) and the bound (its finishing kernel) give the torch
    path's scale, where the bound decides and where the lognormal's optimum does, with specials, masks,
    all zeros and empty tensors."""
    fmt = FloatingPoint("e3m0").fmt
    points = scale_points(fmt, "per_layer_optimal", torch.device(kernel_device))
    boundary = torch.full((300,), fmt.max_value * 2.0**-20)  # amax * 2^20 is the format's largest value
    cases = [
        lognormal_gradient((64, 96), sigma=3.0, mu=-12.0),  # with 0, -0, NaN, +-Inf: bounded
        lognormal_gradient((64, 96), sigma=0.3, mu=-12.0),  # the lognormal's optimum decides
        _two_populations(5000),
        torch.cat([boundary, -boundary.nextafter(torch.tensor(math.inf)), torch.tensor([2.0**-40])]),
        torch.zeros(100),
        torch.tensor([math.nan, math.inf, 0.0]),
        torch.zeros(0),
        _truncated_lognormal(20000),
    ]
    for x in cases:
        x = x.to(dtype)
        mask = (torch.arange(x.numel()) % 3 != 0).reshape(x.shape).to(dtype)
        for options in (
            ({}, {"mask": mask}) if x.numel() else ({},)
        ):  # (masked empty: the torch fit divides by 0)
            expected = fit_statistics(
                x, scale_points=points.cpu(), max_value=fmt.max_value, backend="torch", **options
            )
            device_options = {k: v.to(kernel_device) for k, v in options.items()}
            got = fit_statistics(
                x.to(kernel_device),
                scale_points=points,
                max_value=fmt.max_value,
                backend="triton",
                **device_options,
            )
            assert float(got[1][4]) == float(expected[1][4]), (x[:4], options.keys())
            if x.numel() and dtype is torch.float32 and not options:
                unbounded = fit_statistics(x, scale_points=points.cpu(), backend="torch")[1][4]
                assert float(expected[1][4]) >= float(unbounded)


def test_the_analyses_apply_the_training_rule():
    """A10 (per-layer statistics and largest magnitudes) and C2 (the tensor itself) give a layer the scale
    training gives it: the same bounded rule."""
    from gradcomp.analysis import fp_failures as fp_analysis
    from gradcomp.analysis.blocks import _layer, _per_layer
    from gradcomp.training.policies import parse_policy

    g = lognormal_gradient((64, 32, 8, 8), sigma=3.0, mu=-12.0, seed=3, specials=False)
    for name in ("e3m0", "e2m1fn", "e4m1"):
        policy = FloatingPoint(name, scaling="per_layer_optimal")
        stats = LayerStats()
        compress(policy, GradientCopy(g, 0), stats)
        mu2, sigma2 = (stats.fit[:2] / math.log(2)).tolist()
        layers = fp_analysis._Layers(
            ["layer"],
            torch.tensor([mu2]),
            torch.tensor([sigma2]),
            torch.ones(1),
            g.abs().max().double()[None],
        )
        assert float(layers.rule_scales(policy)[0]) == math.log2(float(stats.scale))
    element = parse_policy("mxfp4").format
    training = compress(
        FloatingPoint("e2m1fn", scaling="per_layer_optimal"), GradientCopy(g, 0), LayerStats()
    )
    (_, clipped, mse), _, _ = _per_layer(g, element, *_layer(g))
    assert clipped == 0.0 and mse == _relative_mse(training, g)


def test_a10_reads_each_layers_largest_value_from_the_probe(tmp_path):
    """The probe's exact absmax, its log2 averaged over the seeds."""
    from types import SimpleNamespace

    from gradcomp.analysis import fp_failures as fp_analysis
    from gradcomp.training.probe import Probe, ProbeConfig

    runs = {}
    for seed, top in ((0, 2.0**-3), (1, 2.0**-5)):
        probe = Probe(ProbeConfig(steps=[0], kinds=["gradient"]), [])
        probe.begin_step(0, 0)
        g = lognormal_gradient(4096, sigma=1.0, mu=-12.0, seed=seed, specials=False).clamp(-top, top)
        g[0] = -top
        probe.observe_gradient("conv", g)
        probe.write(tmp_path / str(seed) / "probe.npz")
        runs[seed] = SimpleNamespace(folder=tmp_path / str(seed))
    layers = fp_analysis._Layers.of(SimpleNamespace(runs=runs, name="baseline"))
    assert layers.names == ["conv"] and float(layers.amax[0]) == 2.0**-4
