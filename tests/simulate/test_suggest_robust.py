"""`netlimit suggest` among few clients: a credential stuffer among 60 clients must not
become the proposed limit (outliers set aside, with a warning naming them), a figure one
client decides is flagged, and the rewritten file keeps the operator's comments,
layout, quoting and key order (only the limits change)."""

from __future__ import annotations

import difflib
import subprocess
import sys
from pathlib import Path

import yaml
from simlog import T0, combined, write

from netlimit.simulate.suggest import split_outliers

EXE = str(Path(sys.executable).with_name("netlimit"))
ROOT = Path(__file__).resolve().parents[2]
STUFFER = "198.51.100.66"


def stuffer_log(path: Path) -> Path:
    """10 minutes: 59 clients logging in 2..6 times a minute, one at 6 per second (360 a minute)."""
    ev: list[tuple[float, str]] = []
    for m in range(10):
        for i in range(59):
            k = 2 + i % 5
            ev += [(T0 + 60 * m + 10 * j + i % 7, f"192.0.2.{i + 1}") for j in range(k)]
        ev += [(T0 + 60 * m + s, STUFFER) for s in range(60) for _ in range(6)]
    ev.sort()
    return write(path, [combined(ip, t, "/login", "POST") for t, ip in ev])


def run(*args: str) -> subprocess.CompletedProcess:
    p = subprocess.run([EXE, *args], capture_output=True, text=True, timeout=180)
    assert "Traceback" not in p.stderr, p.stderr
    return p


def test_the_stuffer_is_set_aside_and_the_file_keeps_its_layout(tmp_path):
    original = (ROOT / "rules" / "http-descriptors.yaml").read_text()
    cfg = tmp_path / "rules.yaml"
    cfg.write_text(original)
    p = run("suggest", "--log", str(stuffer_log(tmp_path / "access.log")), "--config", str(cfg))
    assert p.returncode == 0, p.stderr
    doc = yaml.safe_load(p.stdout)
    login = doc["http"]["descriptors"][1]["descriptors"][0]
    # p99 of the 59 others is 6 a minute: 2x that, not 2x the stuffer's 360
    assert login["rate_limit"] == {"unit": "minute", "requests_per_unit": 12}
    assert (
        f"warning: path_/login.remote_address: set aside 1 outlier client of 60 (peak /login, {STUFFER}, 360/minute; "
        "over 10x the median client's 4/minute): p99 of every client would have been 360/minute; the limit "
        "comes from the other 59"
    ) in p.stderr
    assert "#   warning: set aside 1 outlier client of 60" in p.stdout  # in the file's header too
    # per second the stuffer (6/s) is not 10x the others (1/s): kept, and flagged as the one client deciding
    assert "warning: remote_address: p99 of 60 clients is the peak of one client (" in p.stderr
    assert "6/second): that one client decides the limit" in p.stderr
    # the layout: the file after the header differs from the original only where limits changed
    text = "".join(line + "\n" for line in p.stdout.splitlines() if not line.startswith("# netlimit suggest"))
    start = text.index(original.splitlines()[0])
    changed = [
        line
        for line in difflib.unified_diff(original.splitlines(), text[start:].splitlines(), lineterm="", n=0)
        if line[:1] in "+-" and not line.startswith(("+++", "---"))
    ]
    assert changed, p.stdout
    for line in changed:
        assert "requests_per_unit" in line or "algorithm:" in line or "burst:" in line, changed
    for keep in (
        "  storage: memory             # or redis://127.0.0.1:6379/0 to share limits between servers",
        '    - ["header:X-Api-Key"]',
        "    - key: header_match          # never matched by the actions above: shows Lyft's shape",
        "      rate_limit: {unit: hour, requests_per_unit: 1000}",
    ):
        assert keep in p.stdout.splitlines(), keep
    f = tmp_path / "suggested.yaml"
    f.write_text(p.stdout)
    assert run("validate", str(f)).returncode == 0


def test_deny_clients_says_when_one_client_sets_the_limit(tmp_path):
    cfg = tmp_path / "rules.yaml"
    cfg.write_text((ROOT / "rules" / "http-descriptors.yaml").read_text())
    p = run("suggest", "--log", str(stuffer_log(tmp_path / "access.log")), "-c", str(cfg), "--deny-clients", "0.5%")
    assert p.returncode == 0, p.stderr
    login = yaml.safe_load(p.stdout)["http"]["descriptors"][1]["descriptors"][0]
    assert login["rate_limit"]["requests_per_unit"] == 360  # what the target literally asks for ...
    assert "warning: path_/login.remote_address: the limit is one client's peak" in p.stderr  # ... said out loud
    assert "at most 0.5% of 60 clients lets none be denied" in p.stderr


def test_outliers_are_few_and_far_above_the_rest():
    assert split_outliers([(3, 20), (4, 20), (5, 19), (360, 1)]) == ([(3, 20), (4, 20), (5, 19)], [(360, 1)])
    assert split_outliers([(1, 1000), (50, 3)]) == ([(1, 1000)], [(50, 3)])
    # a second population is not outliers: 10% of the clients
    assert split_outliers([(2, 90), (100, 10)]) == ([(2, 90), (100, 10)], [])
    # not far enough above (under 10x the median): kept
    assert split_outliers([(3, 20), (4, 20), (5, 19), (39, 1)])[1] == []
    assert split_outliers([(7, 1)]) == ([(7, 1)], [])
