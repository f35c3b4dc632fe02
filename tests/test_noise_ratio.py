"""The noise ratio (gradcomp.theory.noise, gradcomp.training.noise_monitor) and the precision guard."""

from __future__ import annotations

import math

import pytest
import torch
from torch import nn

from gradcomp import CompressionConfig, attach
from gradcomp.theory.noise import group_energy, patch_energy, rows_and_groups, weight_noise
from gradcomp.training.compress import GradientCopy, LayerStats, compress
from gradcomp.training.noise_monitor import error_by_group, neural_error
from gradcomp.training.policies import parse_policy

CONVS = [
    nn.Conv2d(6, 8, 3, stride=1, padding=1),
    nn.Conv2d(6, 8, 3, stride=2, padding=1, groups=2),
    nn.Conv2d(6, 4, (1, 3), stride=(1, 2), padding=(0, 2), dilation=(1, 2)),
    nn.Conv1d(6, 4, 5, padding=2),
]


@pytest.mark.parametrize("layer", CONVS, ids=lambda m: repr(m))
def test_patch_energy_is_the_unfolded_patches_energy(layer):
    x = torch.randn(3, 6, 9, 10) if isinstance(layer, nn.Conv2d) else torch.randn(3, 6, 11)
    if isinstance(layer, nn.Conv2d):
        patches = nn.functional.unfold(
            x.double(), layer.kernel_size, layer.dilation, layer.padding, layer.stride
        )
    else:
        patches = nn.functional.unfold(
            x.double()[..., None],
            (*layer.kernel_size, 1),
            (*layer.dilation, 1),
            (*layer.padding, 0),
            (*layer.stride, 1),
        )
    # unfold's rows run over (channel, kernel offset): a group's rows are a contiguous run of them
    per_group = patches.square().sum((0, 2)).reshape(layer.groups, -1).sum(1)
    torch.testing.assert_close(patch_energy(layer, x), per_group, rtol=1e-12, atol=0)


def test_patch_energy_of_a_linear_layer_is_the_input_energy():
    x = torch.randn(4, 7, 5)
    assert float(patch_energy(nn.Linear(5, 3), x)) == pytest.approx(float(x.double().square().sum()))
    with pytest.raises(TypeError, match="zero-padded"):
        patch_energy(nn.Conv2d(2, 2, 3, padding=1, padding_mode="circular"), torch.randn(1, 2, 4, 4))


@pytest.mark.parametrize("layer", [*CONVS[:3], nn.Linear(6, 5)], ids=lambda m: repr(m))
def test_weight_noise_carries_uncorrelated_error_through_the_patch_energy(layer):
    """E||J^T e||^2 for iid Gaussian e against the formula, over 400 draws: within 8 % (the Monte-Carlo mean
    of a sum of many squared terms; its relative standard error here is under 2 %)."""
    torch.manual_seed(0)
    x = torch.randn(4, 6, 8, 8) if isinstance(layer, nn.Conv2d) else torch.randn(4, 3, 6)
    weight = layer.weight.detach().double().requires_grad_()
    forward = (
        (lambda w: nn.functional.linear(x.double(), w))
        if isinstance(layer, nn.Linear)
        else (lambda w: layer._conv_forward(x.double(), w, None))
    )
    y = forward(weight)
    draws = torch.randn(400, *y.shape, dtype=torch.float64)
    noise = [torch.autograd.grad(y, weight, e, retain_graph=True)[0].square().sum() for e in draws]
    measured = float(torch.stack(noise).mean())
    rows, groups = rows_and_groups(layer, y)
    variance = group_energy(torch.ones_like(y), groups, -1 if isinstance(layer, nn.Linear) else 1)
    predicted = weight_noise(variance, patch_energy(layer, x), rows)
    assert measured == pytest.approx(predicted, rel=0.08)


def test_weight_noise_of_a_depthwise_convolution_counts_each_channel_against_its_own_input():
    """A depthwise layer whose dead input channel takes an error 1,000 times the others' (as a batch norm
    after it gives a constant channel): that error adds nothing to the weight gradient, and the per-group
    carrying says so, where spreading the total error evenly over the channels would over-predict the
    noise about 250-fold."""
    torch.manual_seed(0)
    layer = nn.Conv2d(4, 4, 3, padding=1, groups=4, bias=False)
    x = torch.randn(8, 4, 6, 6, dtype=torch.float64)
    x[:, 0] = 0.0
    weight = layer.weight.detach().double().requires_grad_()
    y = layer._conv_forward(x, weight, None)
    sd = torch.tensor([1000.0, 1.0, 1.0, 1.0], dtype=torch.float64).view(1, 4, 1, 1)
    draws = torch.randn(200, *y.shape, dtype=torch.float64) * sd
    noise = [torch.autograd.grad(y, weight, e, retain_graph=True)[0].square().sum() for e in draws]
    measured = float(torch.stack(noise).mean())
    rows, groups = rows_and_groups(layer, y)
    variance = group_energy(sd.expand_as(y).square(), groups, 1)
    energy = patch_energy(layer, x)
    assert measured == pytest.approx(weight_noise(variance, energy, rows), rel=0.08)
    spread = weight_noise(variance.sum() / groups * torch.ones(groups), energy, rows)
    assert spread > 200 * measured


def _lognormal(shape, sigma=1.5, seed=0):
    generator = torch.Generator().manual_seed(seed)
    magnitude = torch.exp(-8 + sigma * torch.randn(shape, generator=generator, dtype=torch.float64))
    sign = torch.randint(0, 2, shape, generator=generator) * 2 - 1
    return (magnitude * sign).float()


# (policy, relative tolerance): the theory's prediction of the error on a lognormal sample
PREDICTED = [
    ("prune:sparsity=0.9", 0.1),
    ("fp:format=e4m1", 0.1),
    ("fp:format=e2m1", 0.15),
    ("fp:format=e3m2,rounding=stochastic", 0.1),
    ("luq:bits=4", 0.15),
    ("nm:n=2,m=4", 0.1),
    ("mxfp4", 0.25),
    ("nvfp4:rounding=stochastic", 0.25),
    ("int:bits=4,scheme=ptq,weight_scheme=same", 0.02),
    ("int:bits=4,scheme=psq,weight_scheme=same", 0.02),
    ("int:bits=5,scheme=ptq", 0.02),
]


@pytest.mark.parametrize(("spec", "tolerance"), PREDICTED)
def test_neural_error_predicts_the_compression_error(spec, tolerance):
    """The predicted E||Q(g) - g||^2 against the mean over 8 draws of the policy on a lognormal gradient of
    64 x 32 x 4 x 4 (block formats: their iid model within blocks, looser)."""
    policy = parse_policy(spec)
    g = _lognormal((64, 32, 4, 4))
    stats = LayerStats()
    errors = []
    for seed in range(8):
        copy = GradientCopy(g, seed, weight_path=True, feature_axis=1, backend="torch")
        out = compress(policy, copy, stats)
        errors.append(float((out.double() - g.double()).square().sum()))
    predicted = neural_error(policy, g, stats.scale, weight_path=True)
    assert predicted == pytest.approx(sum(errors) / len(errors), rel=tolerance)


def test_neural_error_is_none_where_there_is_no_theory_and_zero_without_compression():
    g = _lognormal((16, 8))
    assert neural_error(parse_policy("int:bits=4,scheme=bhq,weight_scheme=same"), g) is None
    assert neural_error(parse_policy("prune:sparsity=0.9,estimator=topk"), g) is None
    assert neural_error(parse_policy("none"), g) == 0.0
    assert neural_error(parse_policy("int:bits=4,weight_scheme=none"), g, weight_path=True) == 0.0


def _net() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(
        nn.Conv2d(3, 8, 3, padding=1), nn.BatchNorm2d(8), nn.ReLU(),
        nn.Conv2d(8, 8, 3, stride=2, padding=1), nn.ReLU(), nn.Flatten(), nn.Linear(8 * 16, 10),
    )  # fmt: skip


def _batch(seed: int = 0):
    generator = torch.Generator().manual_seed(seed)
    return torch.randn(16, 3, 8, 8, generator=generator), torch.arange(16) % 10


def _step(model: nn.Module, seed: int = 0) -> None:
    images, labels = _batch(seed)
    model.zero_grad(set_to_none=True)
    nn.functional.cross_entropy(model(images), labels).backward()


def test_the_measured_ratio_is_that_of_the_exact_and_compressed_weight_gradients():
    """The last layer receives the exact neural gradient: its measured signal is the uncompressed run's
    weight gradient, its noise the distance of the compressed run's weight gradient from it, and its
    compressed signal that gradient's energy."""
    exact = _net()
    _step(exact)
    reference = exact[-1].weight.grad.double()
    model = _net()
    config = CompressionConfig(
        "fp:format=e2m1", layer_types=("conv", "linear"), noise_every=1, measure_noise=True
    )
    handle = attach(model, config)
    _step(model)
    compressed = model[-1].weight.grad.double()
    rows = {row["layer"]: row for row in handle.noise_ratios()}
    assert set(rows) == {"0", "3", "6"}
    last = rows["6"]
    assert last["measured_signal"] == pytest.approx(float(reference.square().sum()), rel=1e-5)
    assert last["measured_noise"] == pytest.approx(float((compressed - reference).square().sum()), rel=1e-4)
    assert last["compressed_signal"] == pytest.approx(float(compressed.square().sum()), rel=1e-6)
    expected = math.sqrt(last["measured_signal"] / last["measured_noise"])
    assert last["measured_ratio"] == pytest.approx(expected)
    for row in rows.values():
        assert row["step"] == 0 and row["theory_ratio"] > 0 and row["carried_noise"] > 0


def test_the_predicted_noise_tracks_the_measured_one_within_a_factor_of_two():
    """On a small net's real gradients, per layer and noise step: int4 PTQ's neural error is predicted
    exactly (in expectation), so this checks the carrying through the input energy, whose assumption (an
    error uncorrelated across entries, of even variance) real activations only approach."""
    model = _net()
    config = CompressionConfig(
        "int:bits=4,weight_scheme=same", layer_types=("conv", "linear"), noise_every=2, measure_noise=True
    )
    handle = attach(model, config)
    for step in range(6):
        _step(model, step)
    rows = handle.noise_ratios()
    assert [row["step"] for row in rows] == [0] * 3 + [2] * 3 + [4] * 3
    for row in rows:
        assert 0.5 < row["carried_noise"] / row["measured_noise"] < 2, row


def test_the_guard_switches_a_layer_below_its_threshold_after_its_patience():
    model = _net()
    config = CompressionConfig(
        "fp:format=e2m1", layer_types=("conv", "linear"), noise_every=2, guard=1e9, guard_patience=2
    )
    handle = attach(model, config)
    for step in range(7):
        _step(model, step)
    report = handle.switch_report()
    assert report["switched"] == {"0": 2, "3": 2, "6": 2}  # below at steps 0 and 2
    assert all(layer.policy == parse_policy("none") for layer in handle.layers)
    # steps 0-2 under FP4 (4 bits: one copy feeds both GEMMs), 3-6 exact (32 bits)
    assert report["fallback_share"] == pytest.approx(4 / 7)
    assert report["average_bits"] == pytest.approx(3 / 7 * 4 + 4 / 7 * 32)
    exact = _net()
    exact.load_state_dict(model.state_dict())
    _step(exact, 7)
    _step(model, 7)
    for ours, theirs in zip(model.parameters(), exact.parameters(), strict=True):
        torch.testing.assert_close(ours.grad, theirs.grad, rtol=0, atol=0)


def test_the_guard_leaves_layers_above_its_threshold_alone():
    model = _net()
    handle = attach(model, CompressionConfig("fp:format=e2m1", noise_every=1, guard=1e-9))
    for step in range(4):
        _step(model, step)
    assert handle.switch_report()["switched"] == {} and all(layer.policy is None for layer in handle.layers)
    assert handle.switch_report()["fallback_share"] == 0


@pytest.mark.parametrize(
    ("keys", "message"),
    [
        ({"measure_noise": True}, "measure_noise needs noise_every"),
        ({"guard": 1.7}, "guard needs noise_every"),
        ({"guard": 0, "noise_every": 5}, "guard must be a finite number > 0"),
        ({"policy": "none", "guard": 1.7, "noise_every": 5}, "nothing to switch from"),
        ({"guard": 1.7, "noise_every": 5, "fallback": "int:bits=8"}, "one-stream fallback"),
        ({"noise_every": 0}, "noise_every must be"),
        ({"guard": 1.7, "noise_every": 5, "guard_patience": 0}, "guard_patience must be"),
    ],
)
def test_bad_noise_and_guard_settings_are_refused(keys, message):
    with pytest.raises(ValueError, match=message):
        CompressionConfig(**{"policy": "fp:format=e2m1", **keys})


def test_the_noise_ratio_needs_the_output_placement():
    with pytest.raises(ValueError, match="placement='output'"):
        CompressionConfig("prune:sparsity=0.5", layer_types=("bn",), placement="input", noise_every=2)


def test_the_guard_state_survives_a_checkpoint():
    """A checkpoint after a noise step holds its record and the guard's pending reading of it: the resumed
    attachment switches as the uninterrupted one does when the next step begins."""
    config = CompressionConfig("fp:format=e2m1", noise_every=1, guard=1e9, guard_patience=1)
    reports = []
    for resumed in (False, True):
        model = _net()
        handle = attach(model, config)
        _step(model)
        if resumed:
            state = handle.state_dict()
            handle.detach()
            handle = attach(model, config)
            handle.load_state_dict(state)
        _step(model, 1)
        reports.append((handle.switch_report(), handle.noise_ratios()))
        assert [layer.policy for layer in handle.layers] == [parse_policy("none")] * 2
        handle.detach()
    assert reports[0] == reports[1]
    assert reports[0][0]["switched"] == {"0": 0, "3": 0}


def test_switch_step_switches_every_layer_from_that_step():
    model = _net()
    handle = attach(model, CompressionConfig("fp:format=e2m1", layer_types=("conv", "linear"), switch_step=3))
    for step in range(5):
        _step(model, step)
    report = handle.switch_report()
    assert report["switched"] == {"0": 3, "3": 3, "6": 3}
    assert report["fallback_share"] == pytest.approx(2 / 5)
    state = handle.state_dict()
    handle.detach()
    again = attach(model, CompressionConfig("fp:format=e2m1", layer_types=("conv", "linear"), switch_step=3))
    again.load_state_dict(state)
    assert again.switch_report() == report
    assert all(layer.policy == parse_policy("none") for layer in again.layers)


def test_keep_last_keeps_the_last_layers_exact_from_the_start():
    """NVIDIA's recipe: the last k selected layers (model order) take the fallback from step 0, their
    gradients exact; the others compress."""
    model = _net()
    handle = attach(model, CompressionConfig("fp:format=e2m1", layer_types=("conv", "linear"), keep_last=2))
    for step in range(3):
        _step(model, step)
    report = handle.switch_report()
    assert report["switched"] == {"3": 0, "6": 0}
    assert [layer.policy for layer in handle.layers] == [None] + [parse_policy("none")] * 2
    exact = _net()
    exact.load_state_dict(model.state_dict())
    _step(exact, 3)
    _step(model, 3)
    ours, theirs = list(model.parameters()), list(exact.parameters())
    torch.testing.assert_close(ours[-1].grad, theirs[-1].grad, rtol=0, atol=0)  # the last layer: exact
    assert not torch.equal(ours[0].grad, theirs[0].grad)  # the first: compressed


def test_keep_worst_keeps_the_layers_of_lowest_predicted_ratio_from_the_first_noise_step():
    model = _net()
    config = CompressionConfig("fp:format=e2m1", layer_types=("conv", "linear"), noise_every=2, keep_worst=1)
    handle = attach(model, config)
    for step in range(6):
        _step(model, step)
    first = {row["layer"]: row["carried_ratio"] for row in handle.noise_ratios() if row["step"] == 0}
    lowest = min(first, key=first.get)
    assert handle.switch_report()["switched"] == {lowest: 0}  # chosen once, on step 0's ratios
    with pytest.raises(ValueError, match="keep_worst needs noise_every"):
        CompressionConfig("fp:format=e2m1", keep_worst=1)
    with pytest.raises(ValueError, match="nothing to switch from"):
        CompressionConfig("none", keep_last=1)


def test_the_noise_ratio_reads_a_parametrized_weight_through_its_original():
    """Under QAT's forward quantizer (a parametrization) the weight is computed; its gradient accumulates
    into the original parameter, where the compressed signal is read."""
    from gradcomp.training.qat import quantize_forward

    model = _net()
    quantize_forward(model, 8)
    config = CompressionConfig("int:bits=4", noise_every=1, measure_noise=True)
    handle = attach(model, config)
    _step(model)
    rows = handle.noise_ratios()
    assert rows and all(row["compressed_signal"] > 0 and row["measured_ratio"] > 0 for row in rows)


LOSSY = [
    "prune:sparsity=0.9",
    "fp:format=e2m1",
    "int:bits=4",
    "mxfp4",
    "nvidia_nvfp4",
    "luq",
    "nm:n=2,m=4",
    "prune:sparsity=0.9+fp:format=e4m1",
]


@pytest.mark.parametrize("spec", LOSSY)
def test_the_guard_acts_on_every_lossy_policy(spec):
    """A threshold above every layer's R switches them all after the patience, one below none; the
    switched layers then train with exact gradients."""
    for guard, switched in ((1e9, {"0", "3", "6"}), (1e-9, set())):
        model = _net()
        config = CompressionConfig(spec, layer_types=("conv", "linear"), noise_every=1, guard=guard)
        handle = attach(model, config)
        for step in range(3):
            _step(model, step)
        assert set(handle.switch_report()["switched"]) == switched, spec
        assert all((layer.policy is not None) == (layer.name in switched) for layer in handle.layers)


def test_the_theory_error_is_spread_over_groups_by_energy_or_by_elements_for_integer_grids():
    g = torch.ones(2, 4, 3, 3)
    g[:, 0] = 10.0  # channel 0 holds 100 / 103 of the energy
    fp, integer = parse_policy("fp:format=e4m1"), parse_policy("int:bits=4,scheme=ptq")
    by_energy = error_by_group(fp, 2.06, g, 4, 1)
    torch.testing.assert_close(by_energy, torch.tensor([2.0, 0.02, 0.02, 0.02], dtype=torch.float64))
    by_elements = error_by_group(integer, 2.0, g, 2, 1)
    torch.testing.assert_close(by_elements, torch.tensor([1.0, 1.0], dtype=torch.float64))
    assert error_by_group(fp, 1.0, torch.zeros(2, 4), 1, -1).tolist() == [0.0]


def _train(model: nn.Module, handle, steps: int, hook=None) -> list:
    """`steps` plain steps (SGD), with `hook` as a step hook; returns what the handle records."""
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05)
    if hook is not None:
        handle.add_step_hook(hook)
    for step in range(steps):
        _step(model, step)
        optimizer.step()
    return [handle.noise_ratios(), handle.switch_report(), handle.layer_summary()]


def _read_everything(handle, step):
    """A step hook that reads every handle method (the README's place for logging and checkpoints)."""
    handle.noise_ratios()
    handle.switch_report()
    handle.layer_summary()
    handle.sparsity()
    handle.load_state_dict(handle.state_dict())


@pytest.mark.parametrize(
    "keys", [{"guard": 1e9, "guard_patience": 1}, {"keep_worst": 1}, {"guard": 3.0, "keep_worst": 1}]
)
def test_reading_the_records_in_a_step_hook_changes_nothing(keys):
    """A noise step is measured, recorded and acted on whenever its records are read: reading them (and a
    state_dict round trip) as each step begins gives the run without the hook, bit for bit (it used to end
    the noise step before its forward pass: no rows, no switch, keep_worst picking nothing)."""
    config = CompressionConfig("fp:format=e2m1", layer_types=("conv", "linear"), noise_every=2, **keys)
    runs = []
    for hook in (None, _read_everything):
        model = _net()
        runs.append((_train(model, attach(model, config), 6, hook), [p.detach() for p in model.parameters()]))
    (records, weights), (hooked, hooked_weights) = runs
    assert hooked == records
    assert [row["step"] for row in records[0]] == [0] * 3 + [2] * 3 + [4] * 3
    assert records[1]["switched"]  # the guard (or keep_worst) acted
    for ours, theirs in zip(weights, hooked_weights, strict=True):
        assert torch.equal(ours, theirs)


def test_accumulated_micro_batches_each_measure_their_own_weight_gradient():
    """Four micro-batches per optimizer step, each a step of the attachment: a noise step reads the weight
    gradient its own backward pass adds (it read the accumulated .grad, whose energy grows with the
    micro-batch's index), as in a loop that zeroes the gradients before each micro-batch."""
    config = CompressionConfig(
        "fp:format=e2m1", layer_types=("conv", "linear"), noise_every=1, measure_noise=True
    )
    records = []
    for accumulate in (True, False):
        model = _net()
        handle = attach(model, config)
        for micro in range(4):
            if not accumulate:
                model.zero_grad(set_to_none=True)
            images, labels = _batch(micro)
            nn.functional.cross_entropy(model(images), labels).backward()
        records.append(handle.noise_ratios())
    accumulated, separate = records
    assert accumulated == separate
    for row in accumulated:  # ||g + e||^2 of this micro-batch's own g and e (measured apart)
        signal, noise = row["measured_signal"], row["measured_noise"]
        assert abs(row["compressed_signal"] - signal - noise) <= 2 * math.sqrt(signal * noise) * (1 + 1e-6)


def test_the_guard_reads_the_ratio_guard_on_names():
    """With measure_noise the guard reads the measured R unless told otherwise (the carried prediction
    overstates R for nearest rounding, whose error is correlated with the gradient); each choice switches
    the layers whose own R is below the guard."""
    model = _net()
    config = CompressionConfig(
        "fp:format=e2m1", layer_types=("conv", "linear"), noise_every=1, measure_noise=True
    )
    handle = attach(model, config)
    _step(model)
    rows = handle.noise_ratios()
    assert CompressionConfig("fp", noise_every=1, measure_noise=True, guard=1.7).guard_on == "measured"
    assert CompressionConfig("fp", noise_every=1, guard=1.7).guard_on == "carried"
    guard = math.sqrt(min(row["measured_ratio"] for row in rows) * max(row["measured_ratio"] for row in rows))
    switched = {}
    for kind in ("measured", "carried", "theory"):
        keys = {"guard": guard, "guard_patience": 1, "guard_on": kind}
        model = _net()
        handle = attach(model, CompressionConfig(**{**config.to_dict(), **keys}))
        _step(model)
        _step(model, 1)
        below = {row["layer"]: 0 for row in rows if row[f"{kind}_ratio"] < guard}
        assert handle.switch_report()["switched"] == below, kind
        switched[kind] = below
    assert switched["measured"] != switched["carried"]  # the last layer: measured R 0.88, carried 3.5


def test_keep_last_beyond_the_layers_is_refused_and_the_rest_keep_their_count():
    """keep_last=k on a model with fewer than k selected layers kept one layer (the slice wrapped around)."""
    for k in (3, 4):
        with pytest.raises(ValueError, match=f"keep_last={k} keeps every one of the 3 selected layers"):
            attach(_net(), CompressionConfig("fp:format=e2m1", layer_types=("conv", "linear"), keep_last=k))
    handle = attach(_net(), CompressionConfig("fp:format=e2m1", layer_types=("conv", "linear"), keep_last=2))
    assert handle.switch_report()["switched"] == {"3": 0, "6": 0}


def test_switch_step_zero_switches_every_layer_and_says_so():
    """switch_step=0 (a falsy 0, taken as unset) switched every layer while the records showed no switch,
    the policy's format, and skipped the fallback's checks."""
    config = CompressionConfig("fp:format=e2m1", layer_types=("conv", "linear"), switch_step=0)
    assert config.switching == ["switch_step"]
    with pytest.raises(ValueError, match="one-stream fallback"):
        CompressionConfig("fp:format=e2m1", switch_step=0, fallback="int:bits=8")
    model = _net()
    handle = attach(model, config)
    _step(model)
    assert handle.switch_report()["switched"] == {"0": 0, "3": 0, "6": 0}
    assert handle.switch_report()["fallback_share"] == 1
    for layer in handle.layer_summary().values():
        assert layer["switched_at"] == 0 and "format" not in layer  # the fallback (none) ran, not FP4


def test_layer_summary_marks_switched_layers_and_reports_what_they_run():
    model = _net()
    config = CompressionConfig(
        "fp:format=e2m1", layer_types=("conv", "linear"), keep_last=1, fallback="fp:format=e4m3"
    )
    handle = attach(model, config)
    _step(model)
    summary = handle.layer_summary()
    assert [layer["switched_at"] for layer in summary.values()] == [None, None, 0]
    assert [layer["format"] for layer in summary.values()] == ["e2m1", "e2m1", "e4m3"]


def test_a_discarded_step_leaves_the_counts_and_the_noise_records():
    """A step whose update is skipped (its loss NaN: every gradient NaN, as GradScaler and `gradcomp train`
    skip them) and discarded leaves sparsity(), layer_summary() and the noise records as if it had not
    run (its NaN elements counted as non-zeros drew pruning's sparsity from 0.8 toward 0.53)."""
    model = _net()
    handle = attach(model, CompressionConfig("prune:sparsity=0.8", noise_every=1, guard=1e-9))
    for step in range(3):
        images, labels = _batch(step)
        model.zero_grad(set_to_none=True)
        loss = nn.functional.cross_entropy(model(images), labels)
        (loss * (math.nan if step == 1 else 1.0)).backward()
        if step == 1:
            handle.discard_step()
    elements = 2 * 16 * 8 * 8 * 8  # two steps of the first convolution's (16, 8, 8, 8) output
    assert handle.layer_summary()["0"]["elements"] == elements
    assert 0.75 < handle.sparsity() < 0.85
    rows = handle.noise_ratios()
    assert [row["step"] for row in rows] == [0, 0, 2, 2] and all(
        math.isfinite(r["carried_ratio"]) for r in rows
    )
