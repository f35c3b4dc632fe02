"""X1, X3: comparisons across compressor families (bits per gradient element, pruning with low-bit FP)."""

from __future__ import annotations

from gradcomp.analysis.runs import Run, load_runs
from gradcomp.plots import FigureInputs, experiment
from gradcomp.plots.style import save, subplots
from gradcomp.policies import Chain, FloatingPoint, Integer, NoCompression, Policy, Prune


def _family(run: Run) -> str:
    policy = run.policy
    if isinstance(policy, NoCompression):
        return "QAT (8-bit forward)" if run.config.get("forward_bits") else "fp32"
    if isinstance(policy, FloatingPoint):
        return "FP, global scale" if policy.scaling == "global" else "FP, per-layer scale"
    if isinstance(policy, Prune):
        return "prune, lognormal" if policy.estimator == "lognormal" else "prune, other threshold"
    if isinstance(policy, Integer):
        return f"int {policy.scheme.upper()}"
    if isinstance(policy, Chain):
        return "prune + FP"
    return policy.name


def _label(policy: Policy) -> str:
    """A short name for a policy in a figure: prune 0.85, FP6 [1,4,1], int4 BHQ, prune 0.85 + FP6 [1,4,1]."""
    if isinstance(policy, Prune):
        return f"prune {policy.sparsity:g}" + (
            "" if policy.estimator == "lognormal" else f" {policy.estimator}"
        )
    if isinstance(policy, FloatingPoint):
        fmt = policy.fmt
        scaling = {"per_layer_mean": "", "per_layer_optimal": " min-MSE", "global": " global"}[policy.scaling]
        return f"FP{1 + fmt.exp_bits + fmt.man_bits} [1,{fmt.exp_bits},{fmt.man_bits}]{scaling}"
    if isinstance(policy, Integer):
        return f"int{policy.bits} {policy.scheme.upper()}"
    if isinstance(policy, Chain):
        return " + ".join(_label(p) for p in policy.policies)
    return policy.describe()


def _rows(runs: dict[str, Run]) -> list[dict]:
    return [
        {
            "run": run.name,
            "family": _family(run),
            "policy": run.policy.describe(),
            "label": _label(run.policy),
            "bits_per_element": run.effective_bits(),
            "accuracy": run.accuracy,
        }
        for run in runs.values()
    ]


def _pareto(rows: list[dict]) -> list[dict]:
    """Runs no other run beats on both fewer bits and higher accuracy."""
    front, best = [], -1.0
    for row in sorted(rows, key=lambda r: (r["bits_per_element"], -r["accuracy"])):
        if row["accuracy"] > best:
            front.append(row)
            best = row["accuracy"]
    return front


@experiment(
    "X1",
    "accuracy_vs_bits",
    "Accuracy vs bits per gradient element, every compressor",
    """Final test accuracy of every training run of the config against the bits its compressed neural
    gradients take per element (activation path): FP formats 1+E+M; integer schemes b (per-row scales
    neglected); pruning a 1-bit occupancy mask plus a sign per survivor plus 31 bits for each survivor above
    the threshold (lognormal share from the layer's mu, sigma, threshold); prune + FP a mask plus the FP
    bits per survivor; fp32 32. The line joins the Pareto-optimal runs.""",
)
def accuracy_vs_bits(inputs: FigureInputs) -> dict:
    rows = _rows(load_runs(inputs.runs))
    figure, axes = subplots(width=7.5, height=4.8)
    ax = axes[0][0]
    for index, family in enumerate(sorted({r["family"] for r in rows})):
        mine = [r for r in rows if r["family"] == family]
        ax.scatter(
            [r["bits_per_element"] for r in mine],
            [r["accuracy"] for r in mine],
            label=family,
            marker="osD^vP*X<>"[index % 10],
            s=36,
        )
    front = _pareto(rows)
    ax.plot([r["bits_per_element"] for r in front], [r["accuracy"] for r in front], color="grey", zorder=0)
    ax.set(xscale="log", xlabel="bits per gradient element (log scale)", ylabel="test accuracy")
    ax.set_xticks([1, 2, 4, 8, 16, 32], labels=["1", "2", "4", "8", "16", "32"])
    ax.legend(fontsize=7, loc="lower right")
    headline = {
        "pareto": [
            {"run": r["run"], "bits": round(r["bits_per_element"], 2), "accuracy": r["accuracy"]}
            for r in front
        ],
        "runs": len(rows),
    }
    return save(inputs, figure, rows, "X1 accuracy vs bits per gradient element", headline)


@experiment(
    "X3",
    "prune_plus_fp",
    "Pruning and low-bit FP together",
    """Final test accuracy (bars) and bits per gradient element (labels) of stochastic pruning alone, low-bit
    FP alone (per-layer optimal scale) and the chain prune-then-FP, where the survivors of pruning (including
    the values raised to the threshold) are rounded to the FP format, against fp32 (dashed).""",
)
def prune_plus_fp(inputs: FigureInputs) -> dict:
    runs = load_runs(inputs.runs)
    rows = _rows(runs)
    baseline = next((r for r in rows if r["family"] == "fp32"), None)
    shown = [r for r in rows if r is not baseline]
    figure, axes = subplots(width=7.0, height=4.4)
    ax = axes[0][0]
    bars = ax.bar(
        [r["policy"].replace("+", "\n+ ") for r in shown], [r["accuracy"] for r in shown], color="C0"
    )
    for bar, row in zip(bars, shown, strict=True):
        ax.annotate(
            f"{row['bits_per_element']:.2f} b",
            (bar.get_x() + bar.get_width() / 2, bar.get_height()),
            ha="center",
            va="bottom",
            fontsize=8,
        )
    if baseline:
        ax.axhline(
            baseline["accuracy"], color="k", linestyle="--", label=f"fp32 ({baseline['accuracy']:.3f})"
        )
        ax.legend(fontsize=8)
    low = min(r["accuracy"] for r in rows)
    ax.set(ylabel="test accuracy", ylim=(max(0.0, low - 0.05), None))
    ax.tick_params(axis="x", labelsize=8)
    headline = {
        r["label"]: {"accuracy": r["accuracy"], "bits": round(r["bits_per_element"], 2)} for r in rows
    }
    return save(inputs, figure, rows, "X3 pruning combined with low-bit FP", headline)
