"""The benchmark harness runs end to end in --quick mode (its figures are not
judged here: bench/ is not part of the suite's pass/fail, only that it runs)."""

from __future__ import annotations

import json
import math
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
SECTIONS = ("inproc", "redis", "cluster", "http", "workers", "memory", "kernel", "accuracy", "simulate")

pytestmark = [pytest.mark.netns, pytest.mark.redis, pytest.mark.nginx, pytest.mark.timeout(440)]


def test_bench_quick(tmp_path):
    p = subprocess.run(
        [sys.executable, "-m", "bench", "--quick", "--out", str(tmp_path)],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=420,  # 11 sections: about 150 s at load average 6 on 2 CPUs (leases and workers added ~45 s)
    )
    assert p.returncode == 0, p.stderr[-4000:]
    doc = json.loads((tmp_path / "latest.json").read_text())
    assert doc["mode"] == "quick"
    assert doc["peers"]["limits"] and doc["peers"]["redis-py"] and doc["peers"]["nginx"]  # bench/versions.py
    assert all(s["peers"] == doc["peers"] for s in doc["sections"].values())
    for name in SECTIONS:
        sec = doc["sections"][name]
        assert sec["error"] is None, (name, sec["error"])
        assert sec["rows"], name
        for r in sec["rows"]:
            assert isinstance(r["netlimit"], (int, float)) and math.isfinite(r["netlimit"]), (name, r)
            if r["peer"] is not None:
                assert math.isfinite(r["peer"]), (name, r)
    # workers: where each server's time went, per request (bench/workers_bench.py)
    cpu = [r for r in doc["sections"]["workers"]["rows"] if r["case"].startswith("CPU per request")]
    assert len(cpu) == 2 and all(r["netlimit"] > 0 and r["peer"] > 0 for r in cpu), cpu
    md = (tmp_path / "latest.md").read_text()
    assert all(doc["sections"][n]["title"] in md for n in SECTIONS)
