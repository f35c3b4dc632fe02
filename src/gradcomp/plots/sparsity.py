"""A7-A9: stochastic pruning of neural gradients (threshold accuracy, accuracy vs sparsity, heterogeneity)."""

from __future__ import annotations

import csv
import math

import numpy as np
import torch

from gradcomp.analysis.runs import Run, load_runs
from gradcomp.lognormal import truncated_cosine_similarity
from gradcomp.plots import FigureInputs, experiment
from gradcomp.plots.style import save, subplots
from gradcomp.policies import NoCompression, Prune

_MARKERS = {"lognormal": "o", "gaussian": "s", "laplace": "^", "topk": "D"}


def _prune_runs(runs: dict[str, Run], heterogeneous: bool = False) -> list[Run]:
    return [
        run
        for run in runs.values()
        if isinstance(run.policy, Prune) and (run.policy.min_cosine is not None) == heterogeneous
    ]


def _layer_sparsity(run: Run) -> dict[str, float]:
    return {
        name: layer["sparsity"]
        for name, layer in run.summary["layers"].items()
        if layer["sparsity"] is not None
    }


@experiment(
    "A7",
    "target_vs_achieved_sparsity",
    "Target vs achieved gradient sparsity for each threshold estimator",
    """Fraction of zeros after unbiased stochastic pruning against the target, when the threshold comes from
    the lognormal model (closed form, from mean and std of ln|g|), a Gaussian prior (Ye et al.), a Laplace
    prior, or the exact top-k threshold of the tensor (sorting). (a) Synthetic signed lognormal gradients
    (sigma 1-3, with and without 30% exact zeros). (b) Real training: each point is one convolution's
    achieved sparsity over the last epoch of a run pruned at that target. Lognormal and top-k sit on the
    diagonal; the priors overshoot.""",
)
def target_vs_achieved(inputs: FigureInputs) -> dict:
    with open(inputs.params["synthetic_table"], newline="") as handle:
        synthetic = [
            {key: (value if key == "estimator" else float(value)) for key, value in row.items()}
            for row in csv.DictReader(handle)
        ]
    runs = _prune_runs(load_runs(inputs.runs))
    figure, axes = subplots(ncols=2, width=5.0, height=4.4)
    rows = []
    for column, (title, points) in enumerate(
        (
            ("(a) synthetic lognormal", [(r["estimator"], r["target"], r["achieved"]) for r in synthetic]),
            (
                "(b) training, per layer",
                [
                    (run.policy.estimator, run.policy.sparsity, value)
                    for run in runs
                    for value in _layer_sparsity(run).values()
                ],
            ),
        )
    ):
        ax = axes[0][column]
        for estimator, marker in _MARKERS.items():
            mine = [(t, a) for e, t, a in points if e == estimator]
            if mine:
                jitter = {"lognormal": -0.006, "gaussian": -0.002, "laplace": 0.002, "topk": 0.006}[estimator]
                ax.scatter(
                    [t + jitter for t, _ in mine],
                    [a for _, a in mine],
                    marker=marker,
                    s=14,
                    alpha=0.6,
                    label=estimator,
                )
            for target in sorted({t for t, _ in mine}):
                achieved = [a for t, a in mine if t == target]
                rows.append(
                    {
                        "source": "synthetic" if column == 0 else "training",
                        "estimator": estimator,
                        "target": target,
                        "achieved_mean": float(np.mean(achieved)),
                        "achieved_min": float(np.min(achieved)),
                        "achieved_max": float(np.max(achieved)),
                        "points": len(achieved),
                    }
                )
        ax.plot([0.45, 1.0], [0.45, 1.0], color="grey", linestyle="--", label="target")
        ax.set(
            xlabel="target sparsity",
            ylabel="achieved sparsity",
            title=title,
            xlim=(0.45, 1.0),
            ylim=(0.45, 1.0),
        )
        ax.legend(fontsize=8)

    def error(source: str, estimator: str) -> float | None:
        mine = [
            abs(r["achieved_mean"] - r["target"])
            for r in rows
            if r["source"] == source and r["estimator"] == estimator
        ]
        return max(mine) if mine else None

    headline = {
        f"max_abs_error_{source}": {e: error(source, e) for e in _MARKERS if error(source, e) is not None}
        for source in ("synthetic", "training")
    }
    return save(inputs, figure, rows, "A7 target vs achieved sparsity", headline)


@experiment(
    "A8",
    "accuracy_vs_sparsity",
    "Accuracy vs gradient sparsity",
    """Final test accuracy against the achieved gradient sparsity (fraction of zeros in the pruned
    convolution-output gradients over the last epoch) for stochastic pruning with the lognormal threshold at
    targets 0.5-0.95, and with the Gaussian-prior, Laplace-prior and exact top-k thresholds; dashed: the
    uncompressed run with the same seed. A prior's run lands at a higher sparsity than it asked for.""",
)
def accuracy_vs_sparsity(inputs: FigureInputs) -> dict:
    runs = load_runs(inputs.runs)
    baseline = next((run for run in runs.values() if isinstance(run.policy, NoCompression)), None)
    rows = [
        {
            "run": run.name,
            "estimator": run.policy.estimator,
            "target": run.policy.sparsity,
            "achieved": float(run.summary["gradient_sparsity"]),
            "accuracy": run.accuracy,
            "gap_to_baseline_pt": 100 * (run.accuracy - baseline.accuracy) if baseline else None,
        }
        for run in _prune_runs(runs)
    ]
    rows.sort(key=lambda r: (r["estimator"], r["target"]))
    figure, axes = subplots(width=6.0, height=4.4)
    ax = axes[0][0]
    for estimator, marker in _MARKERS.items():
        mine = [r for r in rows if r["estimator"] == estimator]
        if mine:
            ax.plot(
                [r["achieved"] for r in mine],
                [r["accuracy"] for r in mine],
                marker=marker,
                linestyle="-" if estimator == "lognormal" else "none",
                label=estimator,
            )
    if baseline:
        ax.axhline(
            baseline.accuracy, color="k", linestyle="--", label=f"no pruning ({baseline.accuracy:.3f})"
        )
    ax.set(xlabel="achieved gradient sparsity", ylabel="test accuracy")
    ax.legend(fontsize=8)
    headline = {
        "baseline_accuracy": baseline.accuracy if baseline else None,
        "lognormal": {
            f"{r['target']:g}": {"achieved": r["achieved"], "gap_pt": r["gap_to_baseline_pt"]}
            for r in rows
            if r["estimator"] == "lognormal"
        },
        "priors": {
            f"{r['estimator']} {r['target']:g}": {
                "achieved": r["achieved"],
                "gap_pt": r["gap_to_baseline_pt"],
            }
            for r in rows
            if r["estimator"] != "lognormal"
        },
    }
    return save(inputs, figure, rows, "A8 accuracy vs gradient sparsity", headline)


def _predicted_cosine(layer: dict, truncation: float) -> float:
    if not (layer.get("threshold") and layer.get("sigma")):
        return float("nan")
    alpha_n = torch.tensor(layer["threshold"] * math.exp(-layer["mu"]), dtype=torch.float64)
    return float(
        truncated_cosine_similarity(alpha_n, torch.tensor(layer["sigma"], dtype=torch.float64), truncation)
    )


@experiment(
    "A9",
    "heterogeneous_sparsity",
    "Heterogeneous sparsity with a cosine-similarity constraint",
    """Pruning with a per-layer constraint: a layer whose predicted cosine similarity between pruned and
    original gradient (truncated lognormal, from the layer's mu, sigma and threshold) would fall below the
    minimum gets a smaller threshold. (a) Per-layer achieved sparsity and (b) predicted cosine, for the
    constrained run and the homogeneous run at the same target. (c) Accuracy against overall sparsity:
    the constrained run next to the homogeneous runs.""",
)
def heterogeneous_sparsity(inputs: FigureInputs) -> dict:
    runs = load_runs(inputs.runs)
    constrained = _prune_runs(runs, heterogeneous=True)
    homogeneous = sorted(_prune_runs(runs), key=lambda r: r.policy.sparsity)
    if not constrained:
        raise ValueError("A9 needs a run with prune:...,min_cosine=...")
    het = constrained[0]
    same_target = next((r for r in homogeneous if r.policy.sparsity == het.policy.sparsity), None)
    truncation = het.policy.truncation
    figure, axes = subplots(ncols=3, width=4.8, height=4.2)
    rows = []
    compared = [het] + ([same_target] if same_target else [])
    for offset, run in enumerate(compared):
        layers = run.summary["layers"]
        names = list(layers)
        label = "constrained" if run is het else "homogeneous"
        positions = np.arange(len(names)) + (offset - 0.5) * 0.4
        sparsity = [layers[n]["sparsity"] for n in names]
        cosine = [_predicted_cosine(layers[n], truncation) for n in names]
        axes[0][0].bar(positions, sparsity, width=0.4, label=label)
        axes[0][1].plot(range(len(names)), cosine, "o-", label=label)
        rows += [
            {"run": run.name, "layer": n, "sparsity": s, "predicted_cosine": c}
            for n, s, c in zip(names, sparsity, cosine, strict=True)
        ]
    low = min(r["sparsity"] for r in rows)
    axes[0][0].set(
        xlabel="layer index (input to output)", ylabel="achieved sparsity", title="(a)", ylim=(low - 0.05, 1)
    )
    axes[0][1].axhline(het.policy.min_cosine, color="grey", linestyle="--", label="minimum cosine")
    axes[0][1].set(xlabel="layer index (input to output)", ylabel="predicted cosine similarity", title="(b)")
    for ax in axes[0][:2]:
        ax.legend(fontsize=8)
    ax = axes[0][2]
    ax.plot(
        [r.summary["gradient_sparsity"] for r in homogeneous],
        [r.accuracy for r in homogeneous],
        "o-",
        label="homogeneous",
    )
    ax.scatter(
        [het.summary["gradient_sparsity"]],
        [het.accuracy],
        color="C3",
        marker="*",
        s=150,
        zorder=3,
        label="constrained",
    )
    ax.set(xlabel="overall achieved sparsity", ylabel="test accuracy", title="(c)")
    ax.legend(fontsize=8)
    het_cos = [r["predicted_cosine"] for r in rows if r["run"] == het.name]
    headline = {
        "constrained_overall_sparsity": het.summary["gradient_sparsity"],
        "constrained_accuracy": het.accuracy,
        "homogeneous_same_target_sparsity": same_target.summary["gradient_sparsity"] if same_target else None,
        "homogeneous_same_target_accuracy": same_target.accuracy if same_target else None,
        "constrained_min_predicted_cosine": float(np.nanmin(het_cos)),
        "layer_sparsity_range": [
            float(min(r["sparsity"] for r in rows if r["run"] == het.name)),
            float(max(r["sparsity"] for r in rows if r["run"] == het.name)),
        ],
    }
    return save(inputs, figure, rows, "A9 heterogeneous sparsity", headline)
