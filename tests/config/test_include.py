"""`include:` (issue 31 item 9): conf.d files merged in name order, every problem
still FILE:LINE:COL of the file it is in, duplicate rule names across files
refused; `validate --json`; a failed `--json` command prints a JSON error."""

from __future__ import annotations

import json
import socket
import subprocess
import sys
import textwrap
import threading
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from netlimit.config.validate import ConfigError, load_file

NETLIMIT = [sys.executable, "-m", "netlimit.cli"]

MAIN = """\
version: 1
include: [conf.d/*.yaml]
exempt: [10.0.0.0/8]
network:
  - name: ssh-guard
    protocol: tcp
    ports: [22]
    limit: 3/minute
"""
WEB = """\
network:
  - name: web
    protocol: tcp
    ports: [80]
    limit: 100/second
bandwidth:
  - name: bulk
    interface: eth0
    rate: 10mbit
"""
DNS = """\
version: 1
exempt: ["2001:db8::/32"]
network:
  - name: dns
    protocol: udp
    ports: [53]
    limit: 100/second
"""


def _tree(tmp_path: Path, files: dict[str, str]) -> Path:
    for name, text in files.items():
        p = tmp_path / name
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_text(textwrap.dedent(text))
    return tmp_path / "main.yaml"


def _problems(path: Path) -> list[str]:
    with pytest.raises(ConfigError) as ei:
        load_file(path)
    return [str(p) for p in ei.value.problems]


def test_merged_in_name_order_after_the_main_file(tmp_path):
    main = _tree(tmp_path, {"main.yaml": MAIN, "conf.d/20-web.yaml": WEB, "conf.d/10-dns.yaml": DNS})
    loaded = load_file(main)
    c = loaded.config
    assert [r.name for r in c.network] == ["ssh-guard", "dns", "web"]
    assert [b.name for b in c.bandwidth] == ["bulk"]
    assert [str(n) for n in c.exempt] == ["10.0.0.0/8", "2001:db8::/32"]
    assert [Path(p).name for p, _ in loaded.included] == ["10-dns.yaml", "20-web.yaml"]


def test_the_hash_covers_every_included_file(tmp_path):
    main = _tree(tmp_path, {"main.yaml": MAIN, "conf.d/20-web.yaml": WEB})
    before = load_file(main).sha256
    (tmp_path / "conf.d/20-web.yaml").write_text(WEB.replace("100/second", "200/second"))
    assert load_file(main).sha256 != before
    (tmp_path / "conf.d/20-web.yaml").write_text(WEB)
    assert load_file(main).sha256 == before


def test_problems_name_the_included_file_line_and_column(tmp_path):
    bad = WEB.replace("limit: 100/second", "limit: 100/fortnight").replace("rate: 10mbit", "rat: 10mbit")
    main = _tree(tmp_path, {"main.yaml": MAIN, "conf.d/20-web.yaml": bad, "conf.d/10-dns.yaml": DNS})
    inc = tmp_path / "conf.d/20-web.yaml"
    got = _problems(main)
    assert (
        f"{inc}:5:12: web: bad rate unit 'fortnight' in '100/fortnight': expected second, minute, hour or day (s, m, h, d)"
        in got
    )
    assert any(x.startswith(f"{inc}:9:5: bulk: unknown field 'rat'") for x in got), got
    assert all(not x.startswith(str(main)) for x in got), got


def test_yaml_errors_of_an_included_file_are_its_own(tmp_path):
    main = _tree(tmp_path, {"main.yaml": MAIN, "conf.d/20-web.yaml": "network:\n  - name: [oops\n"})
    got = _problems(main)
    assert len(got) == 1 and got[0].startswith(f"{tmp_path / 'conf.d/20-web.yaml'}:") and "YAML syntax error" in got[0]


def test_duplicate_rule_names_across_files_are_refused(tmp_path):
    dup = WEB.replace("name: web", "name: ssh-guard")
    main = _tree(tmp_path, {"main.yaml": MAIN, "conf.d/20-web.yaml": dup})
    got = _problems(main)
    inc = tmp_path / "conf.d/20-web.yaml"
    assert got[0] == (
        f"{inc}:2:11: ssh-guard: duplicate rule name (first used at {main}:5); names must be unique across "
        "network and bandwidth"
    )
    # two included files naming the same rule: the second one is refused, pointing at the first
    main2 = _tree(tmp_path / "b", {"main.yaml": MAIN, "conf.d/1.yaml": WEB, "conf.d/2.yaml": WEB})
    got = _problems(main2)
    assert got[0].startswith(f"{tmp_path / 'b/conf.d/2.yaml'}:2:11: web: duplicate rule name (first used at ")
    assert f"{tmp_path / 'b/conf.d/1.yaml'}:2)" in got[0]


def test_what_an_included_file_may_hold(tmp_path):
    inc = "version: 2\nhttp: {domain: x}\ninclude: [other.yaml]\nnetwork: {name: x}\n"
    main = _tree(tmp_path, {"main.yaml": MAIN, "conf.d/x.yaml": inc})
    got = _problems(main)
    f = tmp_path / "conf.d/x.yaml"
    assert got == [
        f"{f}:1:1: include: version must be 1, got 2",
        f"{f}:2:1: include: 'http': an included file holds only exempt, network, bandwidth",
        f"{f}:3:1: include: include: is not followed in an included file: an included file holds only exempt, "
        "network, bandwidth",
        f"{f}:4:1: include: 'network' must be a list",
    ]


def test_a_missing_plain_path_is_an_error_an_empty_glob_is_not(tmp_path):
    main = _tree(tmp_path, {"main.yaml": MAIN.replace("[conf.d/*.yaml]", "[conf.d/*.yaml, extra.yaml]")})
    assert _problems(main) == [f"{main}:2:26: include: 'extra.yaml': no such file"]
    (tmp_path / "extra.yaml").write_text(DNS)
    assert [r.name for r in load_file(main).config.network] == ["ssh-guard", "dns"]


@settings(max_examples=25, deadline=None)
@given(st.lists(st.integers(0, 3), min_size=1, max_size=8))
def test_splitting_rules_over_files_changes_nothing(tmp_path_factory, where):
    """The same rules in one file or spread over included files: the same config."""
    tmp = tmp_path_factory.mktemp("split")
    rules = [
        f"  - name: r{i}\n    protocol: udp\n    ports: [{1000 + i}]\n    limit: {i + 1}/second\n"
        for i in range(len(where))
    ]
    one = _tree(tmp / "one", {"main.yaml": "version: 1\nnetwork:\n" + "".join(rules)})
    files = {
        "main.yaml": "version: 1\ninclude: ['d/*.yaml']\nnetwork:\n"
        + "".join(r for r, w in zip(rules, where) if w == 0)
    }
    for k in (1, 2, 3):
        mine = [r for r, w in zip(rules, where) if w == k]
        if mine:
            files[f"d/{k}.yaml"] = "network:\n" + "".join(mine)
    split = _tree(tmp / "split", files)
    a, b = load_file(one).config, load_file(split).config
    order = [0] * 0
    for k in (0, 1, 2, 3):
        order += [i for i, w in enumerate(where) if w == k]
    assert [r.name for r in b.network] == [f"r{i}" for i in order]
    assert sorted(b.network, key=lambda r: r.name) == sorted(a.network, key=lambda r: r.name)


def _cli(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([*NETLIMIT, *args], capture_output=True, text=True, timeout=60)


def test_validate_json(tmp_path):
    good = _tree(tmp_path, {"main.yaml": MAIN, "conf.d/20-web.yaml": WEB})
    bad = _tree(tmp_path / "b", {"main.yaml": MAIN, "conf.d/20-web.yaml": WEB.replace("100/second", "1/fortnight")})
    p = _cli("validate", "--json", str(good), str(bad))
    assert p.returncode == 1
    doc = json.loads(p.stdout)  # one object, nothing else on stdout
    assert doc["valid"] is False
    g, b = doc["files"]
    assert g["valid"] is True and g["network"] == 2 and g["included"] == [str(tmp_path / "conf.d/20-web.yaml")]
    assert len(g["sha256"]) == 64
    assert b["valid"] is False and b["problems"] == [
        {
            "file": str(tmp_path / "b/conf.d/20-web.yaml"),
            "line": 5,
            "col": 12,
            "rule": "web",
            "message": "bad rate unit 'fortnight' in '1/fortnight': expected second, minute, hour or day (s, m, h, d)",
        }
    ]
    ok = _cli("validate", "--json", str(good))
    assert ok.returncode == 0 and json.loads(ok.stdout)["valid"] is True


def test_a_failed_json_command_prints_a_json_error(tmp_path):
    bad = _tree(tmp_path, {"main.yaml": MAIN, "conf.d/20-web.yaml": WEB.replace("name: web", "name: ssh-guard")})
    p = _cli("plan", "--json", str(bad))
    assert p.returncode == 1
    doc = json.loads(p.stdout)
    assert doc["exit_code"] == 1 and doc["error"] == f"{bad}: 2 problems; nothing was changed"
    assert doc["problems"][0]["file"] == str(tmp_path / "conf.d/20-web.yaml") and doc["problems"][0]["line"] == 2
    # and a failure that is not the file's: a "daemon" that answers garbage on its socket
    sock_path = str(tmp_path / "s")
    srv = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    srv.bind(sock_path)
    srv.listen(4)

    def answer() -> None:
        for _ in range(4):
            try:
                c, _ = srv.accept()
            except OSError:
                return
            with c:
                c.sendall(b"not json\n")

    t = threading.Thread(target=answer, daemon=True)
    t.start()
    try:
        q = _cli("status", "--json", "--socket", sock_path)
    finally:
        srv.close()
    assert q.returncode == 2, q
    doc = json.loads(q.stdout)
    assert doc["exit_code"] == 2 and "did not answer properly" in doc["error"], doc
