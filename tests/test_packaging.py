import re
import subprocess
import sys
from pathlib import Path

import yaml
from helpers import pins

ROOT = Path(__file__).resolve().parents[1]


def test_environment_yml_mirrors_requirements():
    requirements = pins((ROOT / "requirements.txt").read_text().splitlines())
    environment = yaml.safe_load((ROOT / "environment.yml").read_text())
    pip_section = next(item["pip"] for item in environment["dependencies"] if isinstance(item, dict))
    assert pins(pip_section) == requirements
    assert "python=3.11" in environment["dependencies"]
    for package in ("torch", "torchvision", "triton", "timm", "scipy", "seaborn", "snakemake", "pytest"):
        assert package in requirements, package
    assert (requirements["torch"], requirements["torchvision"], requirements["triton"]) == (
        "2.14.1",
        "0.29.1",
        "3.8.0",
    )


def test_readme_states_the_two_setup_commands_that_the_makefile_and_ci_run():
    readme = (ROOT / "README.md").read_text()
    commands = re.findall(r"^    (make \w+)$", readme, flags=re.MULTILINE)
    assert commands[:2] == ["make run", "make test"]
    assert "make test" in (ROOT / ".ci" / "run").read_text()
    makefile = (ROOT / "Makefile").read_text()
    assert re.search(r"^run:", makefile, flags=re.MULTILINE) and re.search(
        r"^test:", makefile, flags=re.MULTILINE
    )


def test_module_entry_point_and_console_script():
    for command in (
        [sys.executable, "-m", "gradcomp", "--help"],
        [str(Path(sys.executable).parent / "gradcomp"), "info"],
    ):
        result = subprocess.run(command, capture_output=True, text=True, check=False)
        assert result.returncode == 0, result.stderr
