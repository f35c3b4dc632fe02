"""The report page of the committed default figures (`results/<config>/report.html`): it opens with the claims
at a glance, every claim links to its block and every block to its experiment's figure, embedded; and it
renders in a real headless browser (Chromium), where every image decodes, every in-page link finds its
target and the glance table is on the first screen. In CI (CI=true) a missing Chromium fails the test;
elsewhere it skips (`.ci/run` installs Chromium from Debian)."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
from pathlib import Path

import matplotlib.image
import pytest

from gradcomp.experiments import CLAIMS, experiments
from gradcomp.page import write_page

ROOT = Path(__file__).resolve().parents[1]
SUMMARY = ROOT / "figures" / "default" / "SUMMARY.md"
BROWSERS = ("chromium", "chromium-browser", "google-chrome", "google-chrome-stable")
SCREEN = (1400, 1000)
# run in the page once it has loaded: what a reader would meet, written into the DOM for --dump-dom to print
CHECK = """<script>
window.addEventListener("load", () => {
  const images = [...document.images];
  const targets = [...document.querySelectorAll('a[href^="#"]')].map((a) => a.getAttribute("href").slice(1));
  const glance = document.querySelector("table");
  document.body.setAttribute("data-check", JSON.stringify({
    images: images.length,
    broken: images.filter((image) => !(image.complete && image.naturalWidth > 0)).map((image) => image.id),
    missing: [...new Set(targets.filter((id) => !document.getElementById(id)))],
    glance_top: glance.getBoundingClientRect().top,
    glance_rows: glance.querySelectorAll("tbody tr").length,
  }));
});
</script>"""


@pytest.fixture(scope="module")
def page(tmp_path_factory) -> Path:
    return write_page(tmp_path_factory.mktemp("report") / "report.html", SUMMARY)


def test_the_page_opens_with_the_claims_at_a_glance_and_links_each_claim_to_its_figure(page):
    html = page.read_text()
    first_table = html.index("<table>")
    assert first_table < html.index("<img"), "the claims at a glance come before any figure"
    glance = html[first_table : html.index("</table>", first_table)]
    assert [m for m in re.findall(r'<td><a href="#([a-z0-9]+)">', glance)] == [c.lower() for c in CLAIMS]
    for claim in CLAIMS.values():
        block = html.split(f'<h4 id="{claim.id.lower()}">', 1)[1].split("<h4", 1)[0]
        figure = experiments()[claim.experiment].prefix
        assert f'href="#fig-{figure}"' in block, claim.id
        assert f'<img id="fig-{figure}"' in html  # the figure, embedded in its experiment's section


def _browser() -> str | None:
    found = next((path for name in BROWSERS if (path := shutil.which(name))), None)
    if found is None and os.environ.get("CI") == "true":
        pytest.fail(f"CI needs a headless browser ({', '.join(BROWSERS)}): .ci/run installs chromium")
    if found is None:
        pytest.skip("no Chromium here (`apt-get install chromium`); CI runs this test")
    return found


def _headless(browser: str, *args: str) -> subprocess.CompletedProcess:
    command = [browser, "--headless", "--no-sandbox", "--disable-gpu", "--hide-scrollbars", *args]
    return subprocess.run(command, capture_output=True, text=True, timeout=180, check=True)


def test_the_page_renders_in_a_headless_browser(page, tmp_path):
    browser = _browser()
    checked = tmp_path / "checked.html"
    checked.write_text(page.read_text().replace("</body>", CHECK + "</body>"))
    size = f"--window-size={SCREEN[0]},{SCREEN[1]}"
    dom = _headless(browser, size, "--virtual-time-budget=20000", "--dump-dom", checked.as_uri()).stdout
    found = re.search(r'data-check="([^"]*)"', dom)
    assert found, "the page's check did not run: " + dom[-2000:]
    check = json.loads(found[1].replace("&quot;", '"'))
    figures = {experiment.prefix for experiment in experiments().values()}
    embedded = set(re.findall(r"\((\w+)\.png\)", SUMMARY.read_text())) & figures
    assert check["images"] == len(embedded) and check["broken"] == [], check
    assert check["missing"] == [], check  # every in-page link finds its target
    assert check["glance_rows"] == len(CLAIMS) and 0 <= check["glance_top"] < SCREEN[1], check
    shot = tmp_path / "top.png"
    _headless(browser, size, f"--screenshot={shot}", page.as_uri())
    pixels = matplotlib.image.imread(shot)[..., :3]
    assert pixels.shape[:2] == (SCREEN[1], SCREEN[0])
    assert (pixels.mean(axis=2) < 0.5).mean() > 0.02, "the first screen shows text (not a blank page)"
