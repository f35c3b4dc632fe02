"""Every claim's design can decide it: a config whose deciding runs lack the seeds a paired test needs is
refused before anything runs, every committed configuration's claims were decidable, and the default's
claims table cites the convergence sweep."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

from gradcomp.analysis.claims import decide, deciding, undecided
from gradcomp.analysis.verdicts import Pair, compare
from gradcomp.experiments import CLAIMS
from gradcomp.pipeline import check_config

ROOT = Path(__file__).resolve().parents[1]
COMMITTED = sorted((ROOT / "figures").glob("*/*.json"))


@pytest.mark.parametrize("path", COMMITTED, ids=lambda p: f"{p.parent.name}/{p.stem}")
def test_every_committed_claim_was_decidable_as_designed_and_shows_its_plan(path):
    for row in json.loads(path.read_text()).get("claims", []):
        assert row["decidable"], f"{row['claim']} cannot be decided as designed: {row['evidence']}"
        assert row["claim"] in CLAIMS and row["plan"], f"{row['claim']} shows no plan"
        assert "replicate" not in json.dumps(row), "a replicate probability is printed"


def test_every_claim_but_an_exact_one_is_planned_and_decided_by_a_committed_configuration():
    configurations = {path.stem for path in (ROOT / "config").glob("*.yaml")}
    for claim in CLAIMS.values():
        assert (claim.plan is None) == (claim.test == "exact"), claim.id
        if claim.plan is not None:
            assert claim.plan.decided_in in configurations and claim.plan.source, claim.id


def test_a_design_without_seeds_to_test_is_flagged():
    base = {0: 0.8}
    (single,) = compare(deciding("L6", [Pair("a", "b", {0: 0.79}, base, margin=1.0)]))
    assert not decide("L6", [single]).decidable
    assert not undecided("L6", "no run").decidable
    two = compare(deciding("L6", [Pair("a", "b", {0: 0.79, 1: 0.8}, {0: 0.8, 1: 0.8}, margin=1.0)]))
    assert decide("L6", two).decidable


def test_the_default_claims_table_cites_the_convergence_sweep():
    summary = (ROOT / "figures" / "default" / "SUMMARY.md").read_text()
    assert "figures/converged" in summary and "**replicated**" in summary


def test_a_config_whose_design_cannot_decide_a_claim_is_refused_before_running():
    config = yaml.safe_load((ROOT / "config" / "default.yaml").read_text())
    config["runs"]["short_prune_85"]["seeds"] = [0]
    refused = r"experiments\.A8\.claim: run short_prune_85 is trained with 1 seed"
    with pytest.raises(ValueError, match=refused):
        check_config(config)
    config = yaml.safe_load((ROOT / "config" / "default.yaml").read_text())
    config["experiments"]["B3"]["seeds"] = [0]
    with pytest.raises(ValueError, match=r"experiments\.B3\.seeds: run qat8 is measured at 1 seed"):
        check_config(config)


def test_the_claims_table_cites_the_deciding_configuration_and_replications_on_other_seeds(tmp_path):
    """L3 is decided at the longest budget of the convergence sweep (its plan names converged): the default's
    row cites that decision, and lists the sweep's decision at the default's scale on other seeds as a
    replication; a claim nobody else decided reads "not replicated"."""
    from gradcomp.analysis.summary import _claims_table, _decisions
    from gradcomp.analysis.tables import Record

    def record(folder: str, name: str, claims: list[dict], facts: dict) -> None:
        (tmp_path / folder).mkdir(exist_ok=True)
        data = {"id": "", "title": "", "caption": "", "tables": {}, "comparisons": [], "findings": []}
        (tmp_path / folder / name).write_text(json.dumps(data | {"claims": claims, "facts": facts}))

    def row(claim: str, status: str, scale: str, seeds: list[int]) -> dict:
        return {"claim": claim, "status": status, "evidence": "e", "seeds": f"{len(seeds)} seeds",
                "scale": scale, "seed_ids": seeds, "plan": "p", "planned": 4, "used": len(seeds)}  # fmt: skip

    record("default", "A5_fp_formats.json", [row("L3", "shown", "2 epochs", [0, 1, 2])], {})
    record("default", "A2_goodness_of_fit.json", [row("L1", "shown", "short", [0, 1, 2])], {})
    x4 = {
        "converged": [row("L3", "shown", "8 epochs", [8, 9])],
        "replications": [row("L3", "refuted", "2 epochs", [8, 9])],
    }
    record("converged", "X4_training_budget.json", [], x4)

    def decisions(folder: str) -> dict:
        return _decisions(folder, [Record.load(path) for path in sorted((tmp_path / folder).glob("*.json"))])

    table = _claims_table("default", decisions("default"), decisions("converged"))
    glance, blocks = table.split("### Each claim")
    assert (
        "| [L3](#l3) | FP6 gradients lose no accuracy |" in glance
        and "| shown (converged) | refuted (converged) |" in glance
    )
    l3 = _block(blocks, "L3")
    assert "**Deciding**: shown at 8 epochs, 2 seeds (figures/converged)" in l3
    assert "**replicated**: refuted at 2 epochs, 2 seeds (figures/converged)" in l3
    assert "**Deciding**: this configuration; **replicated**: not replicated" in _block(blocks, "L1")


def _block(summary: str, claim: str) -> str:
    """A claim's block of the summary (from its heading to the next)."""
    return summary.split(f"#### {claim}:")[1].split("####")[0]


def test_a_summary_cites_every_other_configuration_beside_it(tmp_path):
    """F2's plan names config/failure: the default's summary finds its decision in figures/failure, and the
    convergence sweep's in figures/converged, without being told where to look."""
    from gradcomp.analysis.summary import write_summary

    data = {
        "id": "",
        "title": "",
        "caption": "",
        "tables": {},
        "comparisons": [],
        "findings": [],
        "facts": {},
    }
    decisions = [
        ("default", "refuted", [0, 1]),
        ("failure", "shown", [8]),
        ("converged", "inconclusive", [9]),
    ]
    for folder, status, seeds in decisions:
        (tmp_path / folder).mkdir()
        row = {"claim": "F2", "status": status, "evidence": "e", "seeds": "s", "scale": folder,
               "seed_ids": seeds}  # fmt: skip
        (tmp_path / folder / "F2_late_switch.json").write_text(json.dumps(data | {"claims": [row]}))
    summary = write_summary(tmp_path / "default", tmp_path / "S.md").read_text()
    f2 = _block(summary, "F2")
    assert "**Deciding**: shown at failure, s (figures/failure)" in f2
    assert "**replicated**: inconclusive at converged, s (figures/converged);" in f2


def test_the_default_summary_opens_with_the_claims_at_a_glance_one_short_line_each():
    summary = (ROOT / "figures" / "default" / "SUMMARY.md").read_text()
    glance = summary.split("### At a glance")[1].split("### Each claim")[0]
    rows = [line for line in glance.splitlines() if line.startswith("| [")]
    assert [row.split("|")[1].strip() for row in rows] == [f"[{c}](#{c.lower()})" for c in CLAIMS]
    assert max(len(row.replace("|", " ").split()) for row in rows) <= 40


@pytest.mark.parametrize(
    ("a", "expected"),
    [
        ({0: 0.801, 1: 0.795, 2: 0.812}, "+0.3 pt [-1.9, +2.4]"),  # half-width 2.1: its second digit
        ({0: 0.7001, 1: 0.7002, 2: 0.7003}, "-9.980 pt [-10.005, -9.955]"),  # half-width 0.025
    ],
)
def test_the_headline_is_rounded_to_what_its_interval_supports(a, expected):
    b = {0: 0.8, 1: 0.8, 2: 0.8}
    assert decide("L6", compare(deciding("L6", [Pair("a", "b", a, b, margin=1.0)]))).headline == expected
