import math

import pytest
import torch
from helpers import lognormal_gradient

from gradcomp import fp_theory
from gradcomp.policies import Chain, FloatingPoint, Integer, LayerStats, NoCompression, Prune, parse_policy


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
    out = policy.compress(g, stats, refresh=True, seed=0)
    first = stats.threshold.clone()
    assert abs(float((out == 0).double().mean()) - 0.8) < 0.01
    policy.compress(g * 100, stats, refresh=False, seed=1)
    assert torch.equal(stats.threshold, first)
    policy.compress(g * 100, stats, refresh=True, seed=1)
    assert torch.allclose(stats.threshold, first * 100, rtol=1e-4)


def test_fp_scales():
    g = lognormal_gradient((128, 512), sigma=2.0, mu=-12.0, specials=False)
    mu2 = float(torch.log2(g.abs()).mean())
    sigma2 = float(torch.log2(g.abs()).std())
    stats = LayerStats()
    FloatingPoint("e4m1", scaling="per_layer_mean").compress(g, stats, True, 0)
    assert float(stats.scale) == 2.0 ** round(-mu2 - 3)
    FloatingPoint("e4m1", scaling="global", global_scale=2.0**10).compress(g, stats, True, 0)
    assert float(stats.scale) == 2.0**10
    FloatingPoint("e4m1", scaling="per_layer_optimal").compress(g, stats, True, 0)
    optimum = (
        fp_theory.optimal_log2_scale(FloatingPoint("e4m1").fmt.positive_values(), sigma2)[0].item() - mu2
    )
    assert abs(math.log2(float(stats.scale)) - optimum) <= 0.5 + 0.05


def test_fp_scale_of_an_all_zero_gradient_is_finite():
    stats = LayerStats()
    out = FloatingPoint("e4m1").compress(torch.zeros(10, 10), stats, True, 0)
    assert torch.isfinite(stats.scale) and torch.equal(out, torch.zeros(10, 10))


def test_integer_weight_path_defaults_follow_the_reference_code():
    g = lognormal_gradient((16, 64), specials=False)
    policy = Integer(bits=2, scheme="psq")
    act = policy.compress(g, LayerStats(), True, 0)
    weight = policy.compress_weight_path(g, LayerStats(), True, 0)
    assert act.unique().numel() <= 4 * 16  # 2 bits: 4 levels per row
    assert weight.unique().numel() > 4 * 16  # 8-bit per-column quantizer
    assert torch.equal(
        Integer(2, "psq", weight_scheme="none").compress_weight_path(g, LayerStats(), True, 0), g
    )


def test_chain_keeps_separate_statistics():
    policy = parse_policy("prune:sparsity=0.5+fp:format=e3m2")
    stats = LayerStats()
    out = policy.compress(lognormal_gradient((32, 64), specials=False), stats, True, 0)
    assert len(stats.parts) == 2 and stats.parts[0].threshold is not None and stats.parts[1].scale is not None
    assert float((out == 0).double().mean()) >= 0.45
