"""B1 decides S1 on every quantized layer: PSQ and BHQ against PTQ on each, one Holm family; its figure."""

import itertools
from pathlib import Path

import pytest
import torch
from helpers import train_run

from gradcomp.analysis.gradients import output_gradients
from gradcomp.analysis.runs import eval_batches, load_groups, load_trained_model
from gradcomp.analysis.seeds import PerSeed
from gradcomp.analysis.statquant import _scheme_pairs, bin_usage
from gradcomp.analysis.tables import Record, write_result
from gradcomp.experiments import experiments
from gradcomp.plots.style import save_figure, titled

SEEDS = (0, 1)
SCHEMES = ("ptq", "psq", "bhq")
# the tiny pipeline's ResNet-18 (tests/pipeline_tiny.yaml), trained with 8-bit forward quantization like qat8
MODEL = {"model": "resnet18", "model_kwargs": {"channels": [8, 8, 16, 16]}, "forward_bits": 8}


@pytest.fixture(scope="module")
def qat8(tmp_path_factory):
    folder = tmp_path_factory.mktemp("b1")
    previous = torch.get_num_threads()
    try:
        for seed in SEEDS:
            train_run(folder, f"qat8_{seed}", seed=seed, max_steps=3, **MODEL)
    finally:
        torch.set_num_threads(previous)  # training sets the thread count
    return load_groups({"qat8": {seed: folder / f"qat8_{seed}" for seed in SEEDS}})


@pytest.fixture(scope="module")
def result(qat8):
    section = {"run": "qat8", "bits": 8, "layer": "layer2.0.conv1", "draws": 2}
    settings = experiments()["B1"].params.from_config(section, "experiments.B1")
    return bin_usage(settings, qat8)


def _quantized_layers(qat8) -> list[str]:
    """Every layer output_gradients captures, in the model's module order."""
    run = qat8["qat8"].first
    model = load_trained_model(run).eval()
    captured = output_gradients(model, *eval_batches(run, 1)[0])
    return [name for name, _ in model.named_modules() if name in captured]


def test_s1_is_decided_by_psq_and_bhq_against_ptq_on_every_layer(qat8, result):
    layers = _quantized_layers(qat8)
    assert len(layers) > 10 and "layer2.0.conv1" in layers and layers[-1] == "fc"
    assert result.facts["layers"] == layers
    deciding = [c for c in result.comparisons if c.family == "S1"]
    assert len(deciding) == 2 * len(layers)
    assert all(c.tests == 2 * len(layers) and c.test == "superiority" for c in deciding)
    assert all(c.higher_is_better and c.unit == "bits of entropy" for c in deciding)
    assert [(c.a, c.b) for c in deciding] == [
        (f"{scheme} on {layer}", "PTQ on the same layer") for layer in layers for scheme in ("PSQ", "BHQ")
    ]
    assert {c.seeds for c in deciding} == {len(SEEDS)}
    # like comparisons pool their planning sd over the layers: one sd for PSQ vs PTQ, one for BHQ vs PTQ
    for scheme in ("PSQ", "BHQ"):
        mine = [c for c in deciding if c.a.startswith(scheme)]
        assert len({c.sd_pooled for c in mine}) == 1
        assert {c.sd_df for c in mine} == {len(layers) * (len(SEEDS) - 1)}
    # BHQ against PSQ stays secondary, on the detailed layer only
    secondary = [c for c in result.comparisons if c.family != "S1"]
    assert [(c.a, c.b, c.family, c.tests) for c in secondary] == [
        ("BHQ on layer2.0.conv1", "PSQ on the same layer", "", 1)
    ]
    (decision,) = result.claims
    assert decision.claim == "S1"
    assert f"Holm over S1's {2 * len(layers)} comparisons" in result.findings[0]
    assert f"of {len(layers)} quantized layers" in result.findings[0]


def test_the_main_table_has_a_row_per_layer_and_scheme(result):
    layers = result.facts["layers"]
    rows = result.rows()
    assert [(row["layer"], row["scheme"]) for row in rows] == list(itertools.product(layers, SCHEMES))
    assert all(0 <= row["entropy_bits_mean"] <= 8 for row in rows)
    verdicts = {(row["layer"], row["scheme"]): row.get("vs_ptq") for row in rows}
    deciding = iter(c for c in result.comparisons if c.family == "S1")
    for layer in layers:
        assert verdicts[layer, "ptq"] is None
        assert [verdicts[layer, "psq"], verdicts[layer, "bhq"]] == [next(deciding).verdict for _ in range(2)]
    # the quantization variance is measured on the detailed layer only (its own table)
    assert not any("quantization_variance_mean" in row for row in rows)
    detail = result.rows("detail")
    assert [(row["layer"], row["scheme"]) for row in detail] == [("layer2.0.conv1", s) for s in SCHEMES]
    assert all(row["quantization_variance_mean"] > 0 for row in detail)
    assert f"each of the {len(layers)} layers" in result.caption
    assert "2 draws" in result.caption


def _overlapping_texts(figure) -> list[tuple[str, str]]:
    """Pairs of visible texts (titles, axis and tick labels, legends, panel texts) whose boxes overlap, and
    texts reaching outside the figure."""
    figure.canvas.draw()
    renderer = figure.canvas.get_renderer()
    boxes = [(figure._suptitle.get_text(), figure._suptitle.get_window_extent(renderer))]
    for ax in figure.axes:
        texts = [ax.title, ax.xaxis.label, ax.yaxis.label, *ax.texts]
        for axis, (low, high) in ((ax.xaxis, ax.get_xlim()), (ax.yaxis, ax.get_ylim())):
            low, high = sorted((low, high))
            ticks = [*axis.get_major_ticks(), *axis.get_minor_ticks()]
            # the ticks drawn: inside the view, with a visible label
            texts += [
                tick.label1 for tick in ticks if tick.label1.get_visible() and low <= tick.get_loc() <= high
            ]
        boxes += [(text.get_text(), text.get_window_extent(renderer)) for text in texts if text.get_text()]
        if ax.get_legend() is not None:
            boxes.append(("legend", ax.get_legend().get_window_extent(renderer)))
    whole = figure.bbox
    problems = [
        (name, "outside the figure")
        for name, box in boxes
        if box.x0 < whole.x0 - 1 or box.y0 < whole.y0 - 1 or box.x1 > whole.x1 + 1 or box.y1 > whole.y1 + 1
    ]
    for (name, box), (other, other_box) in itertools.combinations(boxes, 2):
        if box.shrunk(0.98, 0.98).overlaps(other_box.shrunk(0.98, 0.98)):
            problems.append((name, other))
    return problems


def test_the_figure_adds_the_entropy_of_every_layer_without_overprinting(result, tmp_path: Path):
    prefix = tmp_path / "B1_bin_usage"
    experiment = experiments()["B1"]
    write_result(result, "B1", experiment.title, prefix)
    record = Record.load(prefix.with_suffix(".json"))
    figure = experiment.draw(record)
    titles = [ax.get_title() for ax in figure.axes]
    assert [title[:3] for title in titles] == ["(a)", "(b)", "(c)", "(d)", "(e)"]
    layers = record.facts["layers"]
    panel = figure.axes[-1]
    assert [label.get_text() for label in panel.get_xticklabels()] == layers
    assert len(panel.get_legend().get_texts()) == 5  # three schemes, the detailed layer, the 8-bit limit
    figure.suptitle(experiment.title, wrap=True)  # as save_figure puts it
    assert _overlapping_texts(figure) == []
    paths = save_figure(titled(figure, experiment.title), prefix)
    assert all(path.stat().st_size > 0 for path in paths)


def test_scheme_pairs_without_a_layer_keep_b2s_names_and_rows():
    values = PerSeed(("scheme",))
    for seed, scheme in itertools.product(SEEDS, SCHEMES):
        values.add(seed, {"scheme": scheme}, x=float(seed + SCHEMES.index(scheme)))
    pairs = _scheme_pairs(values, "scheme", "x", "u", False)
    assert [(p.a, p.b, p.arm, p.baseline) for p in pairs] == [
        ("PSQ", "PTQ", "psq", "ptq"),
        ("BHQ", "PTQ", "bhq", "ptq"),
        ("BHQ", "PSQ", "bhq", "psq"),
    ]
    assert pairs[0].a_values == {0: 1.0, 1: 2.0} and pairs[0].b_values == {0: 0.0, 1: 1.0}
    assert len({p.like for p in pairs}) == 3  # no two of them pool a planning sd
