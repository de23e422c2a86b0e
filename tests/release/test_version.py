"""One version: netlimit.__version__ is what `netlimit --version`, the package
metadata (pyproject reads the attribute) and CHANGELOG.md say."""

from __future__ import annotations

import re
import subprocess
import sys
import tomllib
from pathlib import Path

import netlimit

ROOT = Path(__file__).resolve().parents[2]


def test_version_is_semver():
    assert re.fullmatch(r"\d+\.\d+\.\d+", netlimit.__version__), netlimit.__version__


def test_cli_prints_the_package_version():
    out = subprocess.run(
        [sys.executable, "-c", "from netlimit.cli import main; main()", "--version"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == f"netlimit {netlimit.__version__}"


def test_pyproject_reads_the_attribute_and_states_no_version_of_its_own():
    meta = tomllib.loads((ROOT / "pyproject.toml").read_text())
    assert "version" not in meta["project"]
    assert "version" in meta["project"]["dynamic"]
    assert meta["tool"]["setuptools"]["dynamic"]["version"] == {"attr": "netlimit.__version__"}
    assert "nftables" in meta["project"]["description"]
    assert {"Homepage", "Changelog", "Source"} <= set(meta["project"]["urls"])
    assert any(c.startswith("Operating System :: POSIX :: Linux") for c in meta["project"]["classifiers"])


def test_changelog_has_a_section_for_this_version():
    text = (ROOT / "CHANGELOG.md").read_text()
    assert text.startswith("# Changelog")
    assert "## [Unreleased]" in text
    m = re.search(rf"^## \[{re.escape(netlimit.__version__)}\] - (\d{{4}}-\d{{2}}-\d{{2}})$", text, re.M)
    assert m, f"CHANGELOG.md has no '## [{netlimit.__version__}] - YYYY-MM-DD' section"
    # every version heading has its link reference at the bottom (Keep a Changelog)
    for name in re.findall(r"^## \[([^\]]+)\]", text, re.M):
        assert re.search(rf"^\[{re.escape(name)}\]: \S+", text, re.M), f"no link for [{name}]"


def test_project_urls_agree_with_the_debian_package_and_name_files_that_exist():
    """One home for every place that names it (pyproject, debian/control and
    debian/copyright), and the Documentation and Changelog links point at files of
    this tree, so they break in a test, not on PyPI, when a page moves."""
    urls = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["urls"]
    home = urls["Homepage"]
    assert re.fullmatch(r"https://github\.com/[\w.-]+/[\w.-]+", home), home
    assert urls["Source"] == home and urls["Issues"] == f"{home}/issues"
    control = (ROOT / "debian" / "control").read_text()
    assert f"\nHomepage: {home}\n" in control
    assert f"\nSource: {home}\n" in (ROOT / "debian" / "copyright").read_text()
    for key in ("Documentation", "Changelog"):
        assert urls[key].startswith(f"{home}/blob/main/"), urls[key]
        path = urls[key].removeprefix(f"{home}/blob/main/")
        assert (ROOT / path).is_file(), f"{key}: {path} is not in the tree"
