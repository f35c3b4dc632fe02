"""A1-A3: what neural gradients look like (log2 histograms, goodness of fit, statistics over training)."""

from __future__ import annotations

import numpy as np
import seaborn as sns

from gradcomp.analysis.fit import DISTRIBUTIONS, ks_statistics
from gradcomp.analysis.runs import load_runs
from gradcomp.plots import FigureInputs, experiment
from gradcomp.plots.style import save, subplots
from gradcomp.probe import load_probe


def _probe(inputs: FigureInputs) -> dict[str, np.ndarray]:
    run = load_runs(inputs.runs)[inputs.params["run"]]
    path = run.folder / "probe.npz"
    if not path.exists():
        raise FileNotFoundError(f"{path}: run {run.name!r} was trained without a probe (set runs.*.probe)")
    return load_probe(path)


def _rows(probe: dict[str, np.ndarray], kind: str, step: int | None = None) -> np.ndarray:
    """Row indices of one tensor kind (at one step), in forward layer order (gradients arrive backwards)."""
    mask = probe["kind"] == kind
    if step is not None:
        mask &= probe["step"] == step
    order = {name: i for i, name in enumerate(dict.fromkeys(probe["layer"][probe["kind"] != "gradient"]))}
    rows = np.flatnonzero(mask)
    return rows[np.argsort([order.get(name, len(order)) for name in probe["layer"][rows]], kind="stable")]


def _spread_layers(rows: np.ndarray, count: int) -> np.ndarray:
    return rows[np.unique(np.linspace(0, len(rows) - 1, count).round().astype(int))]


@experiment(
    "A1",
    "gradient_histograms",
    "Neural gradients are near-lognormal",
    """Top: histograms of log2|g| of the neural gradients (loss gradient w.r.t. a convolution's output) of
    four layers, from the first to the last, at the last probed step of the baseline run, with the normal
    density of the same mean and standard deviation (the lognormal fit) overlaid; exact zeros are counted
    apart. Bottom: the same layer's gradient, weights and activations in linear scale (reservoir samples):
    gradients are spiky and heavy-tailed, weights and activations bell-shaped.""",
)
def gradient_histograms(inputs: FigureInputs) -> dict:
    probe = _probe(inputs)
    edges, centres = probe["edges"], (probe["edges"][1:] + probe["edges"][:-1]) / 2
    last = int(probe["step"].max())
    gradient_rows = _rows(probe, "gradient", last)
    figure, axes = subplots(ncols=4, nrows=2, width=3.6, height=3.0)
    rows = []
    for ax, index in zip(axes[0], _spread_layers(gradient_rows, 4), strict=False):
        counts = probe["hist"][index]
        mean, std = probe["log2_mean"][index], probe["log2_std"][index]
        width = edges[1] - edges[0]
        ax.bar(centres, counts, width=width, color="C0", alpha=0.6, label="measured")
        fit = counts.sum() * width * np.exp(-0.5 * ((centres - mean) / std) ** 2) / (std * np.sqrt(2 * np.pi))
        ax.plot(centres, fit, color="C3", label="lognormal fit")
        ax.set_xlim(mean - 5 * std, mean + 4 * std)
        ax.set(title=str(probe["layer"][index]), xlabel="log2 |g|", ylabel="count")
        zero_share = probe["zeros"][index] / probe["count"][index]
        ax.text(0.02, 0.95, f"zeros {zero_share:.0%}", transform=ax.transAxes, va="top", fontsize=9)
    axes[0][0].legend(loc="upper right", fontsize=8)
    layer = str(probe["layer"][gradient_rows[len(gradient_rows) // 2]])
    for ax, kind in zip(axes[1][:3], ("gradient", "weight", "activation"), strict=True):
        match = np.flatnonzero((probe["kind"] == kind) & (probe["layer"] == layer) & (probe["step"] == last))
        values = probe["samples"][match[0]] if len(match) else np.array([np.nan])
        values = values[np.isfinite(values)]
        if values.size:
            ax.hist(values, bins=80, color="C2", log=kind == "gradient")
        ax.set(title=f"{layer} {kind} (linear)", xlabel=kind + " value", ylabel="count")
    ax = axes[1][3]
    occupied = []
    for kind, colour in (("gradient", "C0"), ("weight", "C1"), ("activation", "C4")):
        match = np.flatnonzero((probe["kind"] == kind) & (probe["layer"] == layer) & (probe["step"] == last))
        if len(match):
            counts = probe["hist"][match[0]]
            ax.plot(centres, counts / max(counts.sum(), 1), color=colour, label=kind)
            occupied += list(centres[counts > 0])
    if occupied:
        ax.set_xlim(min(occupied) - 1, max(occupied) + 1)
    ax.set(title=f"{layer}: log2 |x|", xlabel="log2 |x|", ylabel="share of non-zeros")
    ax.legend(fontsize=8)
    for kind in ("gradient", "weight", "activation"):
        for index in _rows(probe, kind, last):
            rows.append(
                {
                    "layer": str(probe["layer"][index]),
                    "kind": kind,
                    "step": last,
                    "log2_mean": float(probe["log2_mean"][index]),
                    "log2_std": float(probe["log2_std"][index]),
                    "zero_fraction": float(probe["zeros"][index] / probe["count"][index]),
                }
            )
    sigmas = [row["log2_std"] for row in rows if row["kind"] == "gradient"]
    means = [row["log2_mean"] for row in rows if row["kind"] == "gradient"]
    headline = {
        "step": last,
        "gradient_log2_sigma_median": float(np.median(sigmas)),
        "gradient_log2_mean_range": [float(min(means)), float(max(means))],
    }
    return save(inputs, figure, rows, "A1 log2 histograms of neural gradients (baseline run)", headline)


def _box_with_points(ax, x: list, y: list, colour: str, order: list | None = None) -> None:
    sns.boxplot(x=x, y=y, order=order, ax=ax, color=colour, fliersize=0)
    sns.stripplot(x=x, y=y, order=order, ax=ax, color="k", size=3)


@experiment(
    "A2",
    "goodness_of_fit",
    "Goodness of fit: |g| against lognormal and alternatives",
    """Kolmogorov-Smirnov statistic D (lower is better) of |x| against distributions fitted by maximum
    likelihood (location 0): lognormal, half-normal, exponential (|Laplace|), Weibull, log-Laplace and
    log-logistic, per layer, on the reservoir samples (non-zero values) of the baseline run's last probed
    step. Left: neural gradients, every family. Right: the lognormal D of gradients next to that of weights
    and activations of the same layers.""",
)
def goodness_of_fit(inputs: FigureInputs) -> dict:
    probe = _probe(inputs)
    last = int(probe["step"].max())
    families = inputs.params.get("distributions", list(DISTRIBUTIONS))
    rows = []
    for kind in ("gradient", "weight", "activation"):
        chosen = families if kind == "gradient" else ["lognormal"]
        for index in _rows(probe, kind, last):
            samples = probe["samples"][index]
            samples = np.abs(samples[np.isfinite(samples)])
            for family, statistic in ks_statistics(samples, chosen).items():
                rows.append(
                    {"layer": str(probe["layer"][index]), "kind": kind, "family": family, "ks_d": statistic}
                )
    figure, axes = subplots(ncols=2, width=5.5, height=4.0)
    gradients = [row for row in rows if row["kind"] == "gradient"]
    order = sorted(families, key=lambda f: np.mean([r["ks_d"] for r in gradients if r["family"] == f]))
    _box_with_points(
        axes[0][0], [r["family"] for r in gradients], [r["ks_d"] for r in gradients], "C0", order
    )
    axes[0][0].set(yscale="log", xlabel="fitted family (neural gradients)", ylabel="KS statistic D")
    axes[0][0].tick_params(axis="x", rotation=30)
    lognormal = [row for row in rows if row["family"] == "lognormal"]
    _box_with_points(axes[0][1], [r["kind"] for r in lognormal], [r["ks_d"] for r in lognormal], "C1")
    axes[0][1].set(yscale="log", xlabel="tensor", ylabel="KS D against a lognormal")
    mean_d = {f: float(np.mean([r["ks_d"] for r in gradients if r["family"] == f])) for f in families}
    layers = {r["layer"] for r in gradients}
    best = [
        min((r for r in gradients if r["layer"] == layer), key=lambda r: r["ks_d"])["family"]
        for layer in layers
    ]
    headline = {
        "gradient_mean_ks_d": mean_d,
        "lognormal_best_fraction": best.count("lognormal") / len(best),
        "best_family_counts": {f: best.count(f) for f in families if best.count(f)},
        "lognormal_mean_ks_d_by_kind": {
            kind: float(np.mean([r["ks_d"] for r in lognormal if r["kind"] == kind]))
            for kind in ("gradient", "weight", "activation")
        },
    }
    if "lognormal" in mean_d and order[0] != "lognormal":
        inputs.notes.append(
            f"{order[0]} fits these gradients slightly better than the lognormal on average (mean D "
            f"{mean_d[order[0]]:.3f} against {mean_d['lognormal']:.3f}; best in {best.count(order[0])} of "
            f"{len(best)} layers), and both fit far better than the linear-scale families (worst: "
            f"{order[-1]}, D {mean_d[order[-1]]:.3f}): 'near-lognormal', close to Gaussian in log space."
        )
    return save(inputs, figure, rows, "A2 goodness of fit (KS statistic)", headline)


@experiment(
    "A3",
    "statistics_over_training",
    "Per-layer mu and sigma of log2|g| over training",
    """Mean (mu2) and standard deviation (sigma2) of log2|g| over the non-zero neural gradients of every
    probed layer, against the training step of the baseline run (probe every few steps). Layers sit many
    binades apart and drift during training, which is why one global loss scale cannot suit them all;
    sigma2 sets the exponent bits an FP format needs.""",
)
def statistics_over_training(inputs: FigureInputs) -> dict:
    probe = _probe(inputs)
    index = _rows(probe, "gradient")
    rows = [
        {
            "layer": str(probe["layer"][i]),
            "step": int(probe["step"][i]),
            "log2_mean": float(probe["log2_mean"][i]),
            "log2_std": float(probe["log2_std"][i]),
        }
        for i in index
        if np.isfinite(probe["log2_mean"][i])  # all-zero gradients (e.g. zero-initialised residual BN)
    ]
    layers = list(dict.fromkeys(row["layer"] for row in rows))
    palette = sns.color_palette("viridis", len(layers))
    figure, axes = subplots(ncols=2, width=5.2, height=4.0)
    for colour, layer in zip(palette, layers, strict=True):
        mine = [row for row in rows if row["layer"] == layer]
        steps = [row["step"] for row in mine]
        axes[0][0].plot(steps, [row["log2_mean"] for row in mine], color=colour, label=layer)
        axes[0][1].plot(steps, [row["log2_std"] for row in mine], color=colour)
    axes[0][0].set(xlabel="training step", ylabel="mu2 = mean log2 |g|  (binades)")
    axes[0][1].set(xlabel="training step", ylabel="sigma2 = std log2 |g|  (binades)")
    axes[0][1].legend(
        *axes[0][0].get_legend_handles_labels(), loc="upper left", bbox_to_anchor=(1.02, 1), fontsize=6
    )
    complete = [
        s for s in sorted({r["step"] for r in rows}) if sum(r["step"] == s for r in rows) == len(layers)
    ]
    first, last = complete[0], complete[-1]
    at = {s: [r for r in rows if r["step"] == s] for s in (first, last)}
    means_last = [r["log2_mean"] for r in at[last]]
    headline = {
        "layers": len(layers),
        "mu2_spread_last_step_binades": float(max(means_last) - min(means_last)),
        "sigma2_mean_last_step": float(np.mean([r["log2_std"] for r in at[last]])),
        "drift_from_step": first,
        "mu2_mean_drift_binades": float(np.mean(means_last) - np.mean([r["log2_mean"] for r in at[first]])),
    }
    return save(inputs, figure, rows, "A3 per-layer gradient statistics over training", headline)
