"""X4: the headline claims at several training budgets. Settings and registrations; the compute and draw steps
are in gradcomp.analysis.convergence and gradcomp.plots.convergence."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from gradcomp.experiments.base import (
    CLAIMS,
    Params,
    register,
)


@dataclass(frozen=True)
class Budgets(Params):
    """X4: headline arms and their references trained for each of `budgets` (epochs; run `<stem>_<b>ep`,
    cosine schedule over the budget); `pairs`: (arm stem, reference stem, claim) each; `reference`: the fp32
    stem, whose learning curves show where accuracy levels off; `plateau`: a longer budget trained for the
    reference only, whose gain over the longest of `budgets` shows whether that budget is at a plateau;
    `replicates`: the budget at which the pairs replicate the claims' verdicts of config/default.yaml's full
    scale (on other seeds). Gaps within `margin` points count as none."""

    pairs: tuple[tuple[str, str, str], ...]
    reference: str = "baseline"
    budgets: tuple[int, ...] = (2, 4, 8)
    plateau: int = 16
    replicates: int = 2
    margin: float = 1.0

    def __post_init__(self) -> None:
        if len(self.budgets) < 3 or list(self.budgets) != sorted(set(self.budgets)):
            raise ValueError(f"budgets must be at least 3 increasing epoch counts, got {list(self.budgets)}")
        if self.plateau <= self.budgets[-1]:
            raise ValueError(f"plateau must exceed the longest budget {self.budgets[-1]}, got {self.plateau}")
        if self.replicates not in self.budgets:
            raise ValueError(
                f"replicates must be one of the budgets {list(self.budgets)}, got {self.replicates}"
            )
        for _, _, claim in self.pairs:
            if claim not in CLAIMS:
                raise ValueError(f"pairs: unknown claim {claim!r}; known: {list(CLAIMS)}")

    @staticmethod
    def run(stem: str, budget: int) -> str:
        return f"{stem}_{budget}ep"

    def named_runs(self, all_runs: Sequence[str]) -> list[str]:
        stems = [self.reference, *(stem for pair in self.pairs for stem in pair[:2])]
        runs = [self.run(stem, b) for b in self.budgets for stem in stems]
        return list(dict.fromkeys([*runs, self.run(self.reference, self.plateau)]))


register(
    id="X4",
    slug="training_budget",
    stage="convergence",
    title="Accuracy gaps against the training budget: loss or slower convergence",
    params=Budgets,
)
