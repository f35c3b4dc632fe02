"""Calibrated pruning (Prune.calibrate): the feedback that makes the achieved sparsity the target where the
gradient is not lognormal, the same on both backends, and idle where the target cannot be reached."""

import pytest
import torch

from gradcomp import lognormal
from gradcomp.ops.stats import Calibration, fit_statistics
from gradcomp.training.attachment import attach
from gradcomp.training.compress import GradientCopy, LayerStats, compress
from gradcomp.training.policies import Prune, parse_policy


def _heavy_tailed(step: int, device: str = "cpu", n: int = 100_000) -> torch.Tensor:
    """Student-t magnitudes (1.5 degrees of freedom: far heavier tails than a lognormal's), 30 % zeros."""
    generator = torch.Generator().manual_seed(step)
    g = torch.distributions.StudentT(1.5).sample((n,)) * 1e-3
    g[torch.rand(n, generator=generator) < 0.3] = 0
    return g.to(device)


def _achieved(policy: Prune, steps: int, backend: str = "torch", device: str = "cpu"):
    """Each step's achieved sparsity and the layer's statistics after the last."""
    torch.manual_seed(0)
    stats, counter, achieved = LayerStats(), torch.zeros((), dtype=torch.int64, device=device), []
    for step in range(steps):
        g = _heavy_tailed(step, device)
        before = int(counter)
        compress(policy, GradientCopy(g, seed=step, zeros=counter, backend=backend), stats)
        achieved.append((int(counter) - before) / g.numel())
    return achieved, stats


def test_the_closed_form_misses_heavy_tails_and_calibration_corrects_it():
    analytic, _ = _achieved(Prune(0.85, calibrate=False), 6)
    calibrated, stats = _achieved(Prune(0.85), 6)
    assert all(value > 0.855 for value in analytic), analytic  # the lognormal model's own error
    assert analytic[0] == calibrated[0]  # nothing to learn from at the first refresh
    assert all(value == pytest.approx(0.85, abs=0.004) for value in calibrated[1:]), calibrated
    assert float(stats.correction) < -0.005  # the target it solves for is lowered


def test_the_kernel_calibrates_as_the_torch_path(kernel_device):
    torch_run, torch_stats = _achieved(Prune(0.85), 4)
    kernel_run, kernel_stats = _achieved(Prune(0.85), 4, "triton", kernel_device)
    assert kernel_run == pytest.approx(torch_run, abs=2e-5)
    assert float(kernel_stats.correction) == pytest.approx(float(torch_stats.correction), abs=1e-9)
    assert int(kernel_stats.mark) == int(torch_stats.mark)


def test_a_layer_with_more_zeros_than_the_target_prunes_nothing():
    stats, counter = LayerStats(), torch.zeros((), dtype=torch.int64)
    for step in range(4):
        g = torch.randn(10_000)
        g[:9_000] = 0  # 90 % zeros already, target 0.5
        out = compress(Prune(0.5), GradientCopy(g, seed=step, zeros=counter), stats)
        assert torch.equal(out, g)
    assert float(stats.correction) == 0.0 and float(stats.threshold) == 0.0  # a miss that teaches nothing


def test_a_fresh_counter_or_none_learns_no_miss():
    g = _heavy_tailed(0)
    stats = LayerStats()
    compress(Prune(0.85), GradientCopy(g, seed=0, zeros=torch.zeros((), dtype=torch.int64)), stats)
    compress(Prune(0.85), GradientCopy(g, seed=1, zeros=torch.zeros((), dtype=torch.int64)), stats)
    assert float(stats.correction) == 0.0  # the attachment reset its counts in between
    compress(Prune(0.85), GradientCopy(g, seed=2), stats)  # a direct call: no counter, no calibration
    assert float(stats.correction) == 0.0


def test_the_correction_keeps_the_target_a_probability():
    x = torch.randn(1000)
    counter = torch.tensor(0, dtype=torch.int64)  # nothing was pruned over 1000 elements: a miss of 0.95
    threshold = torch.tensor(1.0)
    calibration = Calibration(
        torch.tensor(0.0, dtype=torch.float64), counter, counter.clone(), 1000, threshold
    )
    fit_statistics(x, sparsity=0.95, calibration=calibration)
    assert float(calibration.correction) == pytest.approx(lognormal.MAX_CALIBRATED_TARGET - 0.95)


@pytest.mark.parametrize(
    ("spec", "match"),
    [("prune:sparsity=0.85,calibrate=0", "must be bool"),
     ("prune:sparsity=0.85,estimator=topk,calibrate=false", "lognormal threshold"),
     ("prune:sparsity=0.85,min_cosine=0.9,calibrate=false", "lognormal threshold")],
)  # fmt: skip
def test_calibrate_is_a_flag_of_the_lognormal_threshold(spec, match):
    with pytest.raises(ValueError, match=match):
        parse_policy(spec)


def test_the_zeros_pruning_can_reach_are_counted_on_both_backends(kernel_device):
    x = _heavy_tailed(3)
    mask = (torch.rand(x.shape, generator=torch.Generator().manual_seed(1)) < 0.6).float()
    own = int((x == 0).sum())
    for backend, device in (("torch", "cpu"), ("triton", kernel_device)):
        for min_zeros, expected in ((0, own), (own - 1, own), (own + 7, own + 7)):
            counter = torch.full((), 5, dtype=torch.int64, device=device)
            fit_statistics(
                x.to(device),
                mask.to(device),
                0.85,
                backend=backend,
                count_zeros_into=counter,
                min_zeros=min_zeros,
            )
            assert int(counter) == 5 + expected, (backend, min_zeros)


def test_layer_summary_reports_the_sparsity_pruning_could_reach():
    """At each step the larger of the target and the gradient's own zeros: a step whose gradient is all
    zero counts as fully sparse however low the target."""
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Conv2d(3, 8, 3), torch.nn.ReLU(), torch.nn.Conv2d(8, 4, 3))
    handle = attach(model, "prune:sparsity=0.5")
    seen: dict[str, list[float]] = {}
    handle.observers.append(
        lambda name, g, active: seen.setdefault(name, []).append(float((g == 0).double().mean()))
    )
    for step, scale in enumerate((1.0, 0.0)):  # the second step's loss has no gradient at all
        handle.begin_step(step)
        (model(torch.randn(4, 3, 12, 12)).square().sum() * scale).backward()
    for name, layer in handle.layer_summary().items():
        expected = sum(max(0.5, share) for share in seen[name]) / len(seen[name])
        assert layer["attainable"] == pytest.approx(expected, abs=1e-4)
        assert seen[name][1] == 1.0
    handle.reset_counts()
    assert all(layer["attainable"] is None for layer in handle.layer_summary().values())
