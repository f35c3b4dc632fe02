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
def test_every_committed_claim_was_decidable_as_designed(path):
    for row in json.loads(path.read_text()).get("claims", []):
        assert row["decidable"], f"{row['claim']} cannot be decided as designed: {row['evidence']}"
        assert row["claim"] in CLAIMS and row["replication"]


def test_a_design_without_seeds_to_test_is_flagged():
    base = {0: 0.8}
    (single,) = compare(deciding("L6", [Pair("a", "b", {0: 0.79}, base, margin=1.0)]))
    assert not decide("L6", [single]).decidable
    assert not undecided("L6", "no run").decidable
    two = compare(deciding("L6", [Pair("a", "b", {0: 0.79, 1: 0.8}, {0: 0.8, 1: 0.8}, margin=1.0)]))
    assert decide("L6", two).decidable


def test_the_default_claims_table_cites_the_convergence_sweep():
    summary = (ROOT / "figures" / "default" / "SUMMARY.md").read_text()
    assert "figures/converged" in summary and "on other seeds" in summary


def test_a_config_whose_design_cannot_decide_a_claim_is_refused_before_running():
    config = yaml.safe_load((ROOT / "config" / "default.yaml").read_text())
    config["runs"]["prune_85"]["seeds"] = [0]
    with pytest.raises(ValueError, match=r"experiments\.A8\.claim: run prune_85 is trained with 1 seed"):
        check_config(config)
    config = yaml.safe_load((ROOT / "config" / "default.yaml").read_text())
    config["experiments"]["B3"]["seeds"] = [0]
    with pytest.raises(ValueError, match=r"experiments\.B3\.seeds: run qat8 is measured at 1 seed"):
        check_config(config)


def test_claims_another_configuration_decides_itself_are_cited_as_its_replications(tmp_path):
    from gradcomp.analysis.summary import _cited

    def record(path: str, claims: list[dict], facts: dict) -> None:
        data = {"id": "", "title": "", "caption": "", "tables": {}, "comparisons": [], "findings": []}
        (tmp_path / path).write_text(json.dumps(data | {"claims": claims, "facts": facts}))

    row = {"claim": "F1", "status": "shown", "evidence": "e", "seeds": "3 seeds", "scale": "s"}
    x4 = {"claim": "L6", "status": "inconclusive", "evidence": "x4", "seeds": "6 seeds", "scale": "t"}
    record("F1_stalls.json", [row], {})
    record("X4_budget.json", [], {"replications": [x4]})
    record("Z9_other.json", [x4 | {"evidence": "own"}], {})
    cited = _cited(tmp_path)["replications"]
    assert cited["F1"]["status"] == "shown" and cited["F1"]["where"] == tmp_path.name
    assert cited["L6"]["evidence"] == "x4"  # X4's citation comes first
