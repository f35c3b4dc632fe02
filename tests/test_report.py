"""The Snakemake report: every experiment's page (figure, caption, tables), figure files and tables, and
SUMMARY.md, in natural ID order; and a fresh clone (committed figures, no results/) redoing everything."""

import base64
import json
import re
import shutil
from pathlib import Path

import pytest
import yaml
from helpers import run_snakemake

from gradcomp.experiments import CLAIMS, experiments
from gradcomp.page import markdown_html, write_page

ROOT = Path(__file__).resolve().parents[1]
DEFAULT_IDS = (
    [f"A{n}" for n in range(1, 11)]
    + [f"B{n}" for n in range(1, 5)]
    + ["C1", "C2", "C3", "C4", "F0", "F1", "F2", "X1", "X2", "X3"]
)


def _fresh_clone(folder: Path) -> Path:
    """What a clone holds for the pipeline: the workflow, the configs and the committed default figures."""
    shutil.copy(ROOT / "Snakefile", folder)
    for name in ("workflow", "config", "figures/default"):
        shutil.copytree(ROOT / name, folder / name)
    return folder


@pytest.fixture(scope="module")
def report(tmp_path_factory):
    """The report of the committed default figures, with the pages the `page` rules would write."""
    work = _fresh_clone(tmp_path_factory.mktemp("report"))
    figures = work / "figures" / "default"
    for markdown in figures.glob("*_*.md"):
        page = work / "results" / "default" / "report" / f"{markdown.stem}.html"
        write_page(page, markdown, markdown.with_suffix(".png"))
    write_page(work / "results" / "default" / "report.html", figures / "SUMMARY.md")
    built = run_snakemake(
        "--configfile", "config/default.yaml", "--report", "snakemake-report.html", cwd=work
    )
    assert built.returncode == 0, built.stdout[-3000:] + built.stderr[-3000:]
    html = (work / "snakemake-report.html").read_text()
    categories = json.loads(re.search(r"var categories = (\{.*?\});", html)[1])
    results = json.loads(re.search(r"var results = (\{.*?\});\n", html)[1])
    return html, categories, results


def _content(results: dict, path: str) -> str:
    return base64.b64decode(results[path]["data_uri"].split(",", 1)[1]).decode()


def test_categories_are_the_summary_then_the_experiments_in_natural_id_order(report):
    _, categories, _ = report
    assert sorted(categories) == ["00 Summary"] + [f"{n:02d} {exp}" for n, exp in enumerate(DEFAULT_IDS, 1)]


def test_each_experiment_has_its_page_figures_and_tables_and_the_summary_its_own(report):
    _, categories, _ = report
    for n, exp in enumerate(DEFAULT_IDS, 1):
        prefix = experiments()[exp].prefix
        (files,) = categories[f"{n:02d} {exp}"].values()
        assert sorted(files) == sorted(
            [f"results/default/report/{prefix}.html"]
            + [f"figures/default/{prefix}.{extension}" for extension in ("csv", "md", "pdf", "png")]
        )
    (summary,) = categories["00 Summary"].values()
    assert sorted(summary) == ["figures/default/SUMMARY.md", "results/default/report.html"]


def test_pages_show_the_caption_figure_and_tables_and_the_summary_the_papers_claims(report):
    html, _, results = report
    page = _content(results, "results/default/report/A5_fp_formats.html")
    caption = json.loads((ROOT / "figures/default/A5_fp_formats.json").read_text())["caption"]
    assert "data:image/png;base64," in page and "<th>difference [95 % CI]</th>" in page
    assert markdown_html(caption) in page
    summary = _content(results, "results/default/report.html")
    assert '<h2 id="the-papers-claims">The papers\' claims</h2>' in summary
    assert all(f'<td><a href="#{claim.lower()}">{claim}</a></td>' in summary for claim in CLAIMS)
    assert "gradcomp draw" in html and "gradcomp figure" not in html  # the workflow description


def test_markdown_html_renders_what_gradcomp_writes():
    text = (
        "# A: t\n\nsee `x*y` and **b** *i* a<b [`A.md`](A.md) ![A](A.png)\n\n| a | b |\n|---|---|\n"
        '| 1 \\| 2 |  |\n\n- one\n- two\n\n#### L1: a claim <a id="l1"></a>\n'
    )
    assert markdown_html(text).splitlines() == [
        '<h1 id="a-t">A: t</h1>',
        "<p>see <code>x*y</code> and <strong>b</strong> <em>i</em> a&lt;b "
        '<a href="A.md"><code>A.md</code></a> <a href="A.png">A</a></p>',
        "<table><thead><tr><th>a</th><th>b</th></tr></thead><tbody><tr><td>1 | 2</td><td></td></tr>"
        "</tbody></table>",
        "<ul><li>one</li><li>two</li></ul>",
        '<h4 id="l1">L1: a claim</h4>',
    ]


def test_a_fresh_clone_recomputes_and_redraws_every_experiment(tmp_path):
    work = _fresh_clone(tmp_path)
    dry = run_snakemake("-n", "--cores", "2", "--configfile", "config/default.yaml", cwd=work)
    assert dry.returncode == 0, dry.stdout[-3000:] + dry.stderr[-3000:]
    jobs = re.findall(r"rule (\w+):\n(?:    .*\n)*?    wildcards: exp=(\w+),", dry.stdout)
    config = yaml.safe_load((ROOT / "config" / "default.yaml").read_text())
    assert sorted(config["experiments"]) == sorted(DEFAULT_IDS)
    for rule in ("compute", "draw", "page"):
        assert sorted(exp for name, exp in jobs if name == rule) == sorted(DEFAULT_IDS), rule
    assert re.search(r"rule summary_page:", dry.stdout)
