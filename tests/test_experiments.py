"""The experiment layer: settings from configs, and every experiment's compute and draw on synthetic runs."""

import json
import math
import random
from pathlib import Path

import pytest
import yaml

from gradcomp.analysis.claims import STATUSES
from gradcomp.analysis.runs import load_groups
from gradcomp.analysis.tables import Record, write_result
from gradcomp.analysis.verdicts import VERDICTS
from gradcomp.experiments import CLAIMS, experiments
from gradcomp.pipeline import check_config, experiment_reads, run_spec, seeds
from gradcomp.plots.style import save_figure, titled
from gradcomp.training.config import resolve_config
from gradcomp.training.train import train

ROOT = Path(__file__).resolve().parents[1]
SHIPPED = ("default", "gpu", "gpu_headline", "converged", "failure", "cifar10", "imagenet")
CONFIGS = [*(f"config/{name}.yaml" for name in SHIPPED), "tests/pipeline_tiny.yaml"]
TINY = yaml.safe_load((ROOT / "tests" / "pipeline_tiny.yaml").read_text())
TRAINED = ("baseline", "qat8", "other_baseline")  # measured at checkpoints (A1-A3, A10 probe; B1-B3, X2)


@pytest.mark.parametrize("path", CONFIGS)
def test_settings_round_trip_from_every_shipped_config(path):
    config = yaml.safe_load((ROOT / path).read_text())
    for experiment_id in config["experiments"]:
        experiment = experiments()[experiment_id]
        settings = experiment.settings(config)
        assert experiment.params.from_config(settings.to_config(), "x") == settings
        reads = experiment_reads(config, experiment_id)
        assert all(run in config["runs"] for run in reads) and (bool(reads) != (experiment_id == "A4"))


def test_every_experiment_has_its_two_steps_and_every_claim_an_experiment():
    for experiment in experiments().values():
        assert callable(experiment.compute) and callable(experiment.draw), experiment.id
        assert experiment.title
    assert CLAIMS and all(claim.experiment in experiments() and claim.text for claim in CLAIMS.values())


def test_the_schema_names_exactly_the_registered_experiments():
    schema = yaml.safe_load((ROOT / "workflow" / "schemas" / "config.schema.yaml").read_text())
    assert schema["properties"]["experiments"]["propertyNames"]["enum"] == list(experiments())


def test_optional_runs_are_left_out_only_where_the_settings_name_them():
    config = yaml.safe_load((ROOT / "tests" / "pipeline_tiny.yaml").read_text())
    assert "fp_e4m1_later" not in config["runs"]  # named by A5, optional, not trained
    assert "fp_e4m1_later" not in experiment_reads(config, "A5")
    config["experiments"]["A5"]["optional"] = []
    with pytest.raises(ValueError, match=r"experiments.A5: runs \['fp_e4m1_later'\] are not defined"):
        check_config(config)
    with pytest.raises(ValueError, match=r"experiments.A5.optional: \['nope'\] are not among the runs"):
        experiments()["A5"].params.from_config(
            {"baseline": "b", "runs": ["a"], "optional": ["nope"]}, "experiments.A5"
        )


@pytest.mark.parametrize(
    ("experiment_id", "section", "message"),
    [
        ("A5", {"baseline": "b", "run": ["x"]}, r"experiments.A5: unknown settings \['run'\]"),
        ("A5", {"baseline": "b"}, r"experiments.A5: missing settings \['runs'\]"),
        ("B2", {"run": "q", "bits": "4"}, "experiments.B2.bits must be a list"),
        ("B1", {"run": "q", "bits": 8.5}, "experiments.B1.bits must be int"),
        ("B1", {"run": "q", "seeds": [0, "one"]}, "experiments.B1.seeds must be"),
        ("A4", {"kinds": ["ideal", "exact"]}, r"experiments.A4.kinds\[1\] must be one of"),
        ("A4", {"formats": ["e4m3fn", "e4m3x"]}, r"experiments.A4: formats: cannot parse format 'e4m3x'"),
        (
            "A7",
            {"runs": ["p"], "synthetic": {"numl": 3}},
            r"experiments.A7.synthetic: unknown settings \['numl'\]",
        ),
        (
            "A10",
            {"baselines": ["b"], "pairs": [["a", "b", "c"]]},
            r"experiments.A10.pairs\[0\] must be a list of 2",
        ),
        ("X1", {"runs": "some"}, "experiments.X1.runs must be"),
        ("A9", {"constrained": "c", "homogeneous": ["h"], "cosine": 0.9}, r"unknown settings \['cosine'\]"),
        ("X4", {"pairs": [], "budgets": [2, 4, 8], "plateau": 8}, "plateau must exceed the longest budget 8"),
        ("X4", {"pairs": [], "budgets": [2, 4, 8], "replicates": 3}, "replicates must be one of the budgets"),
    ],
)
def test_a_bad_setting_fails_naming_the_key(experiment_id, section, message):
    with pytest.raises(ValueError, match=message):
        experiments()[experiment_id].params.from_config(section, f"experiments.{experiment_id}")


def test_a4_evaluates_named_formats_at_their_optimal_scale():
    settings = experiments()["A4"].params.from_config(
        {
            "bits": [4],
            "kinds": ["fn"],
            "formats": ["e4m3fn", "e8m0fnu"],
            "sigmas": [2.0],
            "monte_carlo": 4096,
            "seeds": [0],
        },
        "experiments.A4",
    )
    result = experiments()["A4"].compute(settings, {})
    rows = {row["format"]: row for row in result.tables["formats"].rows}
    assert set(rows) == {"e4m3fn", "e8m0fnu"} and rows["e4m3fn"]["max_value"] == 448
    # e8m0fnu: powers of two only, so its MSE at the best scale is far above the 3-bit mantissa's
    assert 0 < rows["e4m3fn"]["relative_mse"] < rows["e8m0fnu"]["relative_mse"] < 1


def test_integers_are_accepted_where_floats_are_expected():
    settings = experiments()["A4"].params.from_config({"sigmas": [1, 2.5]}, "experiments.A4")
    assert settings.sigmas == (1.0, 2.5) and all(isinstance(s, float) for s in settings.sigmas)


# --- every experiment's compute and draw on synthetic runs -------------------------------------------------
def _fake_summary(policy, rng: random.Random, accuracy: float) -> dict:
    """A summary.json as training writes it, with plausible per-layer compression statistics."""
    spec = policy.describe()
    sparsity = None
    layers = {}
    if not spec.startswith("none"):
        target = next(
            (p.sparsity for p in getattr(policy, "policies", (policy,)) if hasattr(p, "sparsity")), 0.02
        )
        for index in range(5):
            mu, sigma = -12.0 + index + rng.gauss(0, 0.2), 2.0 + 0.1 * index
            layers[f"layer{index}.conv"] = {
                "sparsity": min(0.999, target + rng.gauss(0, 0.01) + 0.05 * ("gaussian" in spec)),
                "elements": 4096 * (5 - index),
                "mu": mu,
                "sigma": sigma,
                "threshold": math.exp(mu + 0.5 * sigma) if "prune" in spec else None,
                "scale": 2.0 ** round(-mu / math.log(2) - 3) if "fp" in spec else None,
                "format": None,
            }
        total = sum(layer["elements"] for layer in layers.values())
        sparsity = sum(layer["sparsity"] * layer["elements"] for layer in layers.values()) / total
    return {
        "final_test_accuracy": accuracy,
        "best_test_accuracy": accuracy,
        "epochs": 1,
        "steps": 10,
        "wall_seconds": 1.0,
        "gradient_sparsity": sparsity,
        "skipped_steps": 0,
        "policy": spec,
        "layers": layers,
    }


def _fake_steps(rng: random.Random) -> list[dict]:
    """Made-up training losses and noise-ratio rows (one layer) of four logged steps."""
    records = []
    for step in range(4):
        records.append({"kind": "step", "step": step, "loss": 2.0 - 0.1 * step + rng.gauss(0, 0.05)})
        noise = {f"{kind}_{part}": value for kind in ("theory", "carried", "measured")
                 for part, value in (("signal", 1.0), ("noise", rng.lognormvariate(-1, 1)))}  # fmt: skip
        records.append({"kind": "noise", "step": step, "layer": "conv1", "compressed_signal": 1.0, **noise})
    return records


@pytest.fixture(scope="module")
def tiny_runs(tmp_path_factory):
    """Every (run, seed) of tests/pipeline_tiny.yaml: the runs measured at a checkpoint trained for real (a
    few steps on synthetic images), the others written as finished runs with made-up accuracies."""
    root = tmp_path_factory.mktemp("runs")
    rng = random.Random(0)
    folders = {}
    for run in TINY["runs"]:
        for seed in seeds(TINY, run):
            folder = root / run / f"seed{seed}"
            config = resolve_config(**run_spec(TINY, run, seed), out=str(folder), progress=False, max_steps=4)
            if run in TRAINED:
                train(config)
            else:
                folder.mkdir(parents=True)
                (folder / "config.yaml").write_text(yaml.safe_dump(config.to_dict(), sort_keys=False))
                summary = _fake_summary(config.policy, rng, 0.8 + rng.gauss(0, 0.02) - 0.01 * len(run) / 10)
                (folder / "summary.json").write_text(json.dumps(summary))
                epochs = [{"kind": "epoch", "epoch": e, "test_accuracy": summary["final_test_accuracy"]}
                          for e in range(config.epochs)]  # fmt: skip
                records = _fake_steps(rng) if config.compression.noise_every else []
                (folder / "metrics.jsonl").write_text("".join(json.dumps(e) + "\n" for e in records + epochs))
            folders.setdefault(run, {})[seed] = folder
    return folders


@pytest.mark.parametrize("experiment_id", list(TINY["experiments"]))
def test_every_experiment_computes_and_draws_from_its_own_numbers(tmp_path, tiny_runs, experiment_id):
    experiment = experiments()[experiment_id]
    settings = experiment.settings(TINY)
    reads = experiment_reads(TINY, experiment_id)
    groups = load_groups(
        {run: {seed: tiny_runs[run][seed] for seed in chosen} for run, chosen in reads.items()}
    )
    result = experiment.compute(settings, groups)
    prefix = tmp_path / experiment.prefix
    record = write_result(result, experiment.id, experiment.title, prefix)
    assert record.rows() and record.caption and record.id == experiment_id
    for row in record.comparisons:  # exactly one verdict each
        assert row["verdict"] in VERDICTS, row
    decided = {row["claim"]: row["status"] for row in record.claims}
    assert set(decided) == {claim.id for claim in experiment.claims}  # each claim of its experiment
    assert set(decided.values()) <= set(STATUSES)
    figure = experiment.draw(Record.load(prefix.with_suffix(".json")))
    paths = save_figure(titled(figure, record.title), prefix)
    for path in [*paths, prefix.with_suffix(".csv"), prefix.with_suffix(".md")]:
        assert path.stat().st_size > 0
    markdown = prefix.with_suffix(".md").read_text()
    assert record.caption in markdown and experiment.title in markdown
    spread = [key for row in record.rows() for key in row if key.endswith("_sd")]
    assert spread, "every main table carries its spread over seeds"
