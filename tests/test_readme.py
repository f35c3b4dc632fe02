"""The README: its Python examples run as written, each in a fresh interpreter; it is a manual of at most
MAX_LINES lines whose findings are the generated claims table; it holds no commit hash and no hand-typed
result; its links, and those of docs/, reach files and headings that exist."""

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from gradcomp.analysis.seeds import ALPHA
from gradcomp.analysis.summary import claims_at_a_glance
from gradcomp.analysis.verdicts import POWER
from gradcomp.cli import main
from gradcomp.pipeline import run_spec, run_steps, seeds, training_jobs
from gradcomp.training.datasets import DATASETS
from gradcomp.training.policies import Prune, parse_policy

ROOT = Path(__file__).resolve().parents[1]
CLAIMS_BEGIN, CLAIMS_END = "<!-- claims:begin -->", "<!-- claims:end -->"
README = (ROOT / "README.md").read_text()
DOCS = sorted((ROOT / "docs").glob("*.md"))
MAX_LINES = 400
# where the README's claims table comes from, and where its claims link to (relative to the README)
FIGURES = ROOT / "figures" / "default"
SUMMARY_LINK = "figures/default/SUMMARY.md"


def _python_blocks() -> dict[str, str]:
    """Each ```python block of the README, keyed by the section it sits in."""
    blocks = {}
    for section in re.split(r"^## ", README, flags=re.MULTILINE)[1:]:
        title = section.splitlines()[0]
        for index, code in enumerate(re.findall(r"^```python\n(.*?)^```", section, re.S | re.M)):
            blocks[f"{title} #{index}"] = code
    return blocks


def test_the_readme_has_the_examples():
    assert any(key.startswith("Using the ops") for key in _python_blocks())
    assert any(key.startswith("Compressed gradients in your own training loop") for key in _python_blocks())


@pytest.mark.parametrize("name", sorted(_python_blocks()))
def test_readme_example_runs(name, tmp_path):
    result = subprocess.run(
        [sys.executable, "-c", _python_blocks()[name]], cwd=tmp_path, capture_output=True, text=True
    )
    assert result.returncode == 0, result.stderr[-3000:]
    assert "Warning" not in result.stderr, result.stderr[-3000:]
    if name.startswith("Compressed gradients"):
        logged = [float(x) for x in re.findall(r"gradient sparsity ([0-9.]+)", result.stderr)]
        assert len(logged) == 2 and all(0.5 < x <= 1 for x in logged), result.stderr
        assert result.stderr.count("threshold") == 3


def test_the_readme_is_a_manual_of_at_most_400_lines():
    assert len(README.splitlines()) <= MAX_LINES
    assert (ROOT / "CHANGELOG.md").is_file()  # history goes there


# --- the claims table ---------------------------------------------------------------------------------------


def _generated(text: str) -> str:
    """What stands between the claims markers."""
    assert text.count(CLAIMS_BEGIN) == 1 and text.count(CLAIMS_END) == 1, "the README lost its claims markers"
    return text.split(CLAIMS_BEGIN)[1].split(CLAIMS_END)[0].strip("\n")


def test_the_claims_table_is_the_generated_one():
    expected = claims_at_a_glance(FIGURES, summary_link=SUMMARY_LINK)
    assert _generated(README) == expected, "the README's claims are stale: run `gradcomp readme README.md`"
    assert f"[L1]({SUMMARY_LINK}#l1)" in expected  # each claim links to its block in the summary


def test_gradcomp_readme_writes_the_table_between_the_markers_and_nothing_else(tmp_path, capsys):
    readme = tmp_path / "README.md"
    readme.write_text(f"# before\n\n{CLAIMS_BEGIN}\nstale\n{CLAIMS_END}\n\nafter\n")
    for _ in range(2):  # idempotent
        assert main(["readme", str(readme), "--figures", str(FIGURES)]) == 0
        text = readme.read_text()
        assert text.startswith(f"# before\n\n{CLAIMS_BEGIN}\n") and text.endswith(
            f"\n{CLAIMS_END}\n\nafter\n"
        )
    link = Path(os.path.relpath(FIGURES / "SUMMARY.md", tmp_path)).as_posix()
    assert _generated(text) == claims_at_a_glance(FIGURES, summary_link=link)


@pytest.mark.parametrize(
    ("text", "figures", "message"),
    [
        ("# no markers\n", FIGURES, "needs one <!-- claims:begin --> line and, after it, one"),
        (f"{CLAIMS_END}\n{CLAIMS_BEGIN}\n", FIGURES, "needs one <!-- claims:begin --> line"),
        (f"{CLAIMS_BEGIN}\n{CLAIMS_END}\n{CLAIMS_END}\n", FIGURES, "needs one <!-- claims:begin --> line"),
        (f"{CLAIMS_BEGIN}\n{CLAIMS_END}\n", Path("missing"), "--figures missing is not a folder"),
        (None, FIGURES, "cannot be read as text"),
    ],
    ids=["no markers", "reversed", "twice", "no figures", "no README"],
)
def test_gradcomp_readme_refuses_in_one_line_writing_nothing(text, figures, message, tmp_path, capsys):
    readme = tmp_path / "README.md"
    if text is not None:
        readme.write_text(text)
    assert main(["readme", str(readme), "--figures", str(figures)]) == 2
    error = capsys.readouterr().err
    assert error.startswith("gradcomp: error: ") and message in error and error.count("\n") == 1, error
    assert readme.read_text() == text if text is not None else not readme.exists()


# --- no commit hash, no hand-typed result -------------------------------------------------------------------

# A standalone token of 7 to 40 hex digits holding a digit and a letter: an abbreviated or full commit hash.
# Format names (e4m3fn), dates, plain numbers and words of the letters a-f alone are not caught.
COMMIT = re.compile(r"(?<![\w])(?=[0-9a-f]*[0-9])(?=[0-9a-f]*[a-f])[0-9a-f]{7,40}(?![\w])")


def test_the_commit_rule_catches_hashes_and_nothing_else():
    for text in ("at 2bf856b", "(0a01051)", "1a50e30e7617fcdc894ff9e57d42f82fce24a875."):
        assert COMMIT.search(text), text
    for text in ("float8_e4m3fn", "e5m3fnu", "2026-12-07", "1000000", "decade", "faced", "0xdeadbeef", "-9"):
        assert not COMMIT.search(text), text


@pytest.mark.parametrize("path", [ROOT / "README.md", *DOCS], ids=lambda path: path.name)
def test_no_commit_hash(path):
    assert not COMMIT.findall(path.read_text()), "history and its commits go to CHANGELOG.md"


def _prose(text: str) -> str:
    """The README's hand-written prose: without the generated claims table, code blocks, inline code and
    link targets (API examples and parameter defaults are code, not results)."""
    text = text.split(CLAIMS_BEGIN)[0] + text.split(CLAIMS_END)[1]
    text = re.sub(r"^```.*?^```", "", text, flags=re.S | re.M)
    text = re.sub(r"`[^`]+`", "", text)  # inline code may span lines
    return re.sub(r"\]\([^)]*\)", "]", text)


NUMBER = r"[-+−]?\d+(?:\.\d+)?"
# A hand-typed result, the kinds a findings table holds: an interval, an accuracy difference, a percentage,
# a duration or a size (times and sizes are measurements: benchmarks/README.md holds them with date, machine
# and commit). Lists of three or more numbers (the FP formats' [1,4,1]) are no intervals.
RESULTS = {
    "interval": rf"\[\s*{NUMBER}\s*,\s*{NUMBER}\s*\]",
    "accuracy difference": rf"{NUMBER}\s*(?:pts?|pp|points?)\b",
    "percentage": rf"{NUMBER}\s*%",
    "duration or size": rf"{NUMBER}\s*(?:ms|s|sec|seconds?|min|minutes?|h|hours?|days?|[KMGT]i?B)\b",
}
# Percentages that are the statistics' documented levels, not results: 95 % intervals, 90 % power.
LEVELS = {f"{100 * (1 - ALPHA):g} %", f"{100 * POWER:g} %"}


def _documented_decimals() -> dict[str, bool]:
    """Each decimal number the README may state, with the check that its source says the same: the default
    config's headline pruning target (also `prune`'s default) and the Python version of the set-up."""
    runs = yaml.safe_load((ROOT / "config" / "default.yaml").read_text())["runs"]
    environment = (ROOT / "environment.yml").read_text()
    return {
        "0.85": Prune().sparsity == 0.85 and parse_policy(runs["short_prune_85"]["policy"]).sparsity == 0.85,
        "3.11": "python=3.11" in environment
        and 'requires-python = ">=3.11"' in (ROOT / "pyproject.toml").read_text(),
    }


def _config_counts() -> dict[str, set[int]]:
    """What every configuration trains, by the unit the README counts it in: training runs, (run, seed) pairs
    and jobs per configuration; each run's steps, seeds, epochs, images per class and batch size."""
    counts: dict[str, set[int]] = {
        key: set() for key in ("runs", "pairs", "jobs", "steps", "seeds", "epochs")
    }
    counts |= {"images per class": set(), "batch": set()}
    for path in sorted((ROOT / "config").glob("*.yaml")):
        config = yaml.safe_load(path.read_text())
        counts["runs"].add(len(config["runs"]))
        counts["pairs"].add(sum(len(seeds(config, run)) for run in config["runs"]))
        counts["jobs"].add(len(training_jobs(config)))
        for run in config["runs"]:
            spec = run_spec(config, run, 0)
            counts["steps"].add(run_steps(config, run))
            counts["seeds"].add(len(seeds(config, run)))
            counts["epochs"].add(spec.get("epochs", DATASETS[spec["dataset"]].defaults.get("epochs")))
            counts["images per class"].add(spec.get("subset_per_class"))
            counts["batch"].add(spec.get("batch_size"))
    return counts


# A count of what is trained, with its unit: each must be one the configurations give.
COUNTS = {
    "runs": r"(\d[\d,]*) training runs",
    "pairs": r"(\d[\d,]*) \(run, seed\) pairs",
    "jobs": r"(\d[\d,]*) (?:training )?jobs\b",
    "steps": r"(\d[\d,]*) steps\b",
    "seeds": r"(\d[\d,]*) (?:paired )?seeds\b",
    "epochs": r"(\d[\d,]*) epochs?\b",
    "images per class": r"(\d[\d,]*) images per class",
    "batch": r"batch (\d[\d,]*)",
}


def test_the_readme_states_no_hand_typed_result():
    """Outside the generated claims table the README states no result. Its prose (code and inline code are
    API, e.g. parameter defaults) holds no interval, accuracy difference, percentage (but the documented
    levels), duration or size; every decimal number in it is a documented constant checked against its
    source; and every count of steps, seeds, epochs, images per class, batch, training runs, (run, seed)
    pairs or jobs is one the configurations in config/ give."""
    prose = _prose(README)
    for kind, pattern in RESULTS.items():
        found = [m.group(0) for m in re.finditer(pattern, prose)]
        if kind == "percentage":
            found = [text for text in found if text not in LEVELS]
        assert not found, f"hand-typed {kind} in the README: {found}"
    documented = _documented_decimals()
    assert all(documented.values()), documented
    decimals = re.findall(r"(?<![\w.])\d+(?:\.\d+)+", prose)  # versions such as 2.14.1 whole
    assert set(decimals) <= set(documented), (
        f"undocumented decimals in the README: {set(decimals) - set(documented)}"
    )
    counts = _config_counts()
    for unit, pattern in COUNTS.items():
        stated = {int(text.replace(",", "")) for text in re.findall(pattern, prose)}
        assert stated <= counts[unit], f"{unit} the configurations do not give: {stated - counts[unit]}"


def test_the_result_rule_catches_results():
    for text in (
        "-0.61 pt [-1.15, -0.06]",
        "about 86 %",
        "took 36.9 minutes",
        "the venv is 6.0 GB",
        "[0.3, 0.5]",
    ):
        assert any(re.search(pattern, text) for pattern in RESULTS.values()), text
    for text in ("FP6 [1,4,1]", "sqrt(3)", "2^24", "A1-A10", "16-128 channels", "[min, max]", "4 GPUs"):
        assert not any(re.search(pattern, text) for pattern in RESULTS.values()), text
    assert {"95 %", "90 %"} == LEVELS


# --- links --------------------------------------------------------------------------------------------------


def _anchors(path: Path) -> set[str]:
    """The link targets a Markdown file offers: its headings as GitHub names them (lower case, punctuation
    but hyphens dropped, spaces as hyphens, repeats numbered) and its explicit ids."""
    text = re.sub(r"^```.*?^```", "", path.read_text(), flags=re.S | re.M)
    anchors, seen = set(), {}
    for heading in re.findall(r"^#+ (.+)$", text, flags=re.M):
        heading = re.sub(r"<[^>]+>", "", heading).strip()
        slug = re.sub(r"[^\w\- ]", "", heading.lower()).replace(" ", "-")
        anchors.add(slug if slug not in seen else f"{slug}-{seen[slug]}")
        seen[slug] = seen.get(slug, 0) + 1
    return anchors | set(re.findall(r'id="([^"]+)"', text))


@pytest.mark.parametrize("path", [ROOT / "README.md", *DOCS], ids=lambda path: path.name)
def test_every_relative_link_reaches_a_file_and_its_heading(path):
    text = re.sub(r"^```.*?^```", "", path.read_text(), flags=re.S | re.M)
    text = re.sub(r"`[^`]+`", "", text)  # inline code may span lines
    broken = []
    for target in re.findall(r"\]\(([^)\s]+)\)", text):
        if re.match(r"[a-z]+:", target):  # http:, https:, mailto:
            continue
        file, _, anchor = target.partition("#")
        linked = (path.parent / file).resolve() if file else path
        if not linked.exists() or (anchor and linked.suffix == ".md" and anchor not in _anchors(linked)):
            broken.append(target)
    assert not broken, f"{path.name}: links to nothing: {broken}"
