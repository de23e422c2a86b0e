"""The benchmark records which peers it ran against and pins its Python peers
(issue 35 item 5: a figure must be reproducible against the same limits/redis-py)."""

from __future__ import annotations

import re
import tomllib
from pathlib import Path

import pytest

from bench import versions
from bench.report import markdown

REPO = Path(__file__).resolve().parents[2]


def test_every_peer_answers_with_a_version():
    found = versions.peers()
    # the list, plus the tools the sections drive
    for name in ("limits", "redis-py", "nginx", "redis-server", "nft", "iptables", "iptables-legacy", "wrk"):
        assert found[name], f"{name}: no version found"
        assert re.search(r"\d+\.\d+", found[name]), (name, found[name])


def test_constraints_pin_the_bench_extra_and_every_python_peer():
    pinned = versions.pins()
    extra = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["optional-dependencies"]["bench"]
    names = set()
    for req in extra:
        m = re.match(r"([A-Za-z0-9._-]+)(?:\[([^\]]*)\])?", req)
        assert m, req
        if m.group(1).lower() == "netlimit":  # the project's own extras (report, grpc): not peers
            continue
        names.add(m.group(1).lower())
        names.update(x.strip().lower() for x in (m.group(2) or "").split(",") if x.strip())
    names |= {dist for _shown, dist in versions.PYTHON_PEERS}
    missing = sorted(n for n in names if n not in pinned)
    assert not missing, f"bench/constraints.txt does not pin {missing}"


def test_a_bad_constraints_line_names_file_and_line(tmp_path):
    f = tmp_path / "c.txt"
    f.write_text("# ok\nlimits==5.8.0\nredis>=7\n")
    with pytest.raises(ValueError, match=r"c\.txt:3: expected 'name==version', got 'redis>=7'"):
        versions.pins(f)


def test_off_pin_peers_are_marked():
    found = {"limits": "5.8.0", "redis-py": "7.0.0", "nginx": "1.22.1"}
    pinned = {"limits": "5.8.0", "redis": "7.4.1"}
    assert versions.off_pin(found, pinned) == {"redis-py": ("7.0.0", "7.4.1")}
    line = versions.markdown_line(found, pinned)
    assert "redis-py 7.0.0 (**pinned 7.4.1**)" in line and "limits 5.8.0," in line and "nginx 1.22.1" in line


def test_report_names_the_peers_of_each_section():
    now = {"limits": "5.8.0", "redis-py": "7.4.1"}
    old = {"limits": "5.8.0", "redis-py": "5.0.0"}
    sec = {"title": "T", "rows": [], "details": {}, "seconds": 1.0, "error": None}
    doc = {
        "mode": "full",
        "peers": now,
        "pins": {"limits": "5.8.0", "redis": "7.4.1"},
        "sections": {
            "a": sec | {"title": "A", "peers": now},
            "b": sec | {"title": "B", "peers": old},
            "c": sec | {"title": "C"},
        },
    }
    md = markdown(doc)
    assert "Peers: limits 5.8.0, redis-py 7.4.1." in md
    b = md.split("## B")[1].split("## C")[0]
    assert "_measured in an earlier run, with: redis-py 5.0.0_" in b
    assert "earlier run" not in md.split("## A")[1].split("## B")[0]
    assert "not recorded" in md.split("## C")[1]
