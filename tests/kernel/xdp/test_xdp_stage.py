"""The `xdp:` stage end to end through the CLI in namespaces the test creates: `apply`
of a file with `xdp:` and an `early: true` per-source rule attaches netlimit's program
on the server's veth and writes its rule table, exempt and deny; real traffic is
limited in XDP (510 ±1 % for 100/s burst 10 over 5 s) and `list` shows the drops with
layer "xdp"; `plan` shows the stage; a second apply changes nothing; a detached program
is drift that apply puts back; a foreign program is refused with nothing changed;
`flush` detaches and unpins everything."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
from test_xdp_traffic import FOREIGN_C, _expected, _within, count_rule, delivered, flood, sh, xdp_on

from netlimit.config.validate import load_string
from netlimit.kernel import reconcile
from netlimit.kernel.compile import compile_config
from netlimit.kernel.xdp import XdpPath
from netlimit.kernel.xdp.path import pin_dir_for

pytestmark = pytest.mark.netns

NETLIMIT = [sys.executable, "-m", "netlimit.cli"]

CONFIG = """\
version: 1
exempt: ["{exempt}/128"]
deny: ["198.18.0.99/32"]
xdp:
  interfaces: [{iface}]
  mode: native
network:
  - name: udp-early
    protocol: udp
    ports: [5000]
    limit: 100/second
    burst: 10
    early: true
  - name: tcp-late
    protocol: tcp
    ports: [22]
    limit: 50/second
"""


def cli(*args: str, check: bool = True) -> subprocess.CompletedProcess:
    p = subprocess.run([*NETLIMIT, *args], capture_output=True, text=True, timeout=120)
    if check:
        assert p.returncode == 0, f"netlimit {' '.join(args)}: rc {p.returncode}\n{p.stdout}\n{p.stderr}"
    return p


@pytest.fixture
def stage(topo, xdp, tmp_path):
    """The config file for the server namespace; the `xdp` fixture flushes in finally
    (and asserts the pin directory is gone), the netlimit table goes with the namespace."""
    path = tmp_path / "xdp.yaml"
    path.write_text(CONFIG.format(exempt=topo.cli6b, iface=topo.srv_if))
    xdp.flush()  # the fixture loaded a program: start from nothing, as an operator would
    try:
        yield path
    finally:
        cli("flush", "--netns", topo.srv, "-q", check=False)


def rows(topo) -> dict[str, dict]:
    out = json.loads(cli("list", "--netns", topo.srv, "--json").stdout)
    lines = out["rules"] if isinstance(out, dict) else out
    return {r["rule"]: r for r in lines}


def test_plan_shows_the_stage(topo, stage):
    out = cli("plan", str(stage)).stdout
    assert f"# --- xdp: netlimit_xdp on {topo.srv_if} (mode native) ---" in out
    assert "rule 0 udp-early: 100/1s burst 10, udp port 5000-5000, per /32 (IPv4) /128 (IPv6)" in out
    assert f"exempt: 1 prefixes ({topo.cli6b}/128)" in out and "deny: 1 prefixes (198.18.0.99/32)" in out
    assert "rule-tcp-late" in out and "rule-udp-early" not in out  # the early rule is not in nftables
    doc = json.loads(cli("plan", "--json", str(stage)).stdout)["xdp"]
    assert doc["interfaces"] == [topo.srv_if] and [r["rule"] for r in doc["rules"]] == ["udp-early"]
    live = cli("plan", "--netns", topo.srv, str(stage)).stdout
    assert f"+ xdp: attach netlimit_xdp to {topo.srv_if} (mode native)" in live


def test_apply_limits_in_xdp_exactly_list_counts_and_flush_cleans(topo, stage):
    out = cli("apply", "--netns", topo.srv, str(stage)).stdout
    assert f"+ xdp: attach netlimit_xdp to {topo.srv_if} (mode native)" in out and ", xdp " in out, out
    link = xdp_on(topo)
    assert "prog/xdp" in link and "netlimit_xdp" in link, link
    again = cli("apply", "--netns", topo.srv, str(stage), "--json")
    assert json.loads(again.stdout).get("changed") is False, again.stdout
    flows = [(topo.cli4, topo.srv4, 5000), (topo.cli4b, topo.srv4, 5000), (topo.cli6b, topo.srv6, 5000)]
    counts = [count_rule(topo, s, p) for s, _d, p in flows]
    misses: list = []
    for _attempt in range(3):
        with XdpPath(topo.srv) as p:
            p.reset_buckets()  # every attempt starts from full buckets
        before = [delivered(topo, c) for c in counts]
        results = flood(topo, flows, pps=1000, secs=5.0)
        got = [delivered(topo, c) - b for c, b in zip(counts, before, strict=True)]
        misses = [
            (s, g, round(_expected(100, 10, r.duration), 1))
            for (s, _d, _p), g, r in zip(flows[:2], got, results, strict=False)
            if not _within(g, _expected(100, 10, r.duration))
        ]
        if got[2] != results[2].sent:
            misses.append(("exempt", got[2], results[2].sent))
        if not misses:
            break
    assert not misses, f"delivered vs expected (±1 %): {misses}"
    r = rows(topo)["udp-early"]
    assert r["layer"] == "xdp", r
    assert r["dropped"] > 0 and r["packets"] >= r["dropped"] + 2 * 510 * 0.99, r
    assert rows(topo)["tcp-late"]["layer"] == "nftables"
    # `top`: one bucket per limited source, named by its rule; the exempt source has none
    from netlimit.kernel.hot import hot_entries

    hot = [h for h in hot_entries(topo.srv, None, ["udp-early", "tcp-late"], limit=50) if h["table"] == "xdp buckets"]
    assert {h["source"] for h in hot} == {f"{topo.cli4}/32", f"{topo.cli4b}/32"}, hot
    assert all(h["rule"] == "udp-early" and h["score"] >= 0 for h in hot), hot
    cli("flush", "--netns", topo.srv)
    assert "prog/xdp" not in xdp_on(topo)
    assert not os.path.exists(pin_dir_for(topo.srv))


def test_a_detached_program_is_drift_that_apply_repairs(topo, stage):
    cli("apply", "--netns", topo.srv, str(stage))
    sh("ip", "-n", topo.srv, "link", "set", "dev", topo.srv_if, "xdp", "off")
    with XdpPath(topo.srv) as p:
        p.set_prefixes("deny", [])  # a map cleared by hand
    desired = compile_config(load_string(stage.read_text()).config)
    lines = reconcile.diff(desired, reconcile.read_owned(topo.srv)).lines()
    assert f"+ xdp: attach netlimit_xdp to {topo.srv_if} (mode native)" in lines
    assert "~ xdp: deny map: +1 -0 prefixes (1 wanted)" in lines
    cli("apply", "--netns", topo.srv, str(stage))
    assert "netlimit_xdp" in xdp_on(topo)
    assert reconcile.diff(desired, reconcile.read_owned(topo.srv)).lines() == []


def test_a_foreign_program_is_refused_and_nothing_changes(topo, stage, tmp_path):
    src, obj = tmp_path / "foreign.c", tmp_path / "foreign.o"
    src.write_text(FOREIGN_C)
    from netlimit.kernel.xdp.build import command

    subprocess.run(command(str(src), str(obj)), check=True, capture_output=True, timeout=120)
    sh("ip", "-n", topo.srv, "link", "set", "dev", topo.srv_if, "xdpgeneric", "obj", str(obj), "sec", "xdp")
    try:
        p = cli("apply", "--netns", topo.srv, str(stage), check=False)
        assert p.returncode != 0
        assert "someone_else" in p.stderr and "never replaces a foreign XDP program" in p.stderr, p.stderr
        assert "nothing was changed" in p.stderr
        assert "someone_else" in xdp_on(topo)
        assert not os.path.exists(pin_dir_for(topo.srv))
        assert sh("ip", "netns", "exec", topo.srv, "nft", "list", "tables", check=False).stdout.strip() == ""
    finally:
        sh("ip", "-n", topo.srv, "link", "set", "dev", topo.srv_if, "xdpgeneric", "off", check=False)


def test_removing_xdp_from_the_file_detaches_and_unpins(topo, stage):
    cli("apply", "--netns", topo.srv, str(stage))
    plain = stage.with_name("plain.yaml")
    plain.write_text("version: 1\nnetwork:\n  - {name: tcp-late, protocol: tcp, ports: [22], limit: 50/second}\n")
    cli("apply", "--netns", topo.srv, str(plain))
    assert "prog/xdp" not in xdp_on(topo)
    assert not os.path.exists(pin_dir_for(topo.srv))


def test_a_failed_xdp_write_rolls_everything_back(topo, stage):
    """An interface that does not exist fails the XDP write after the filter was written:
    the table is removed again and the program loaded for it is unpinned."""
    bad = stage.with_name("bad.yaml")
    bad.write_text(stage.read_text().replace(f"interfaces: [{topo.srv_if}]", "interfaces: [nope0]"))
    p = cli("apply", "--netns", topo.srv, str(bad), check=False)
    assert p.returncode != 0
    assert "interface nope0" in p.stderr and "no such interface" in p.stderr, p.stderr
    assert "the previous state was restored" in p.stderr, p.stderr
    assert not os.path.exists(pin_dir_for(topo.srv))
    assert "prog/xdp" not in xdp_on(topo)
    assert sh("ip", "netns", "exec", topo.srv, "nft", "list", "tables", check=False).stdout.strip() == ""
