import math
import statistics

import pytest
import torch
from helpers import lognormal_gradient

from gradcomp.compress import GradientCopy, LayerStats, compress, plan
from gradcomp.policies import Chain, FloatingPoint, Integer, NoCompression, Prune, parse_policy
from gradcomp.theory import fp as fp_theory


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
    compress(FloatingPoint("e4m1", scaling="per_layer_optimal"), GradientCopy(g, 0), stats)
    optimum = (
        fp_theory.optimal_log2_scale(FloatingPoint("e4m1").fmt.positive_values(), sigma2)[0].item() - mu2
    )
    assert abs(math.log2(float(stats.scale)) - optimum) <= 0.5 + 0.05


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
