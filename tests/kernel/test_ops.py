"""apply / re-apply / rollback / flush / list / ownership, against the real kernel.

Tests taking the `backend` fixture run once per legacy iptables backend (restore,
python-iptables), `any_backend` once with nftables and once with restore; the
nftables backend's own tests are in test_nftables.py."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys

import pytest

from netlimit.kernel import reconcile, traffic
from netlimit.kernel.reconcile import BACKEND_ENV as BACKEND_ENV_NAME
from netlimit.kernel.reconcile import ApplyError

pytestmark = pytest.mark.netns

NETLIMIT = [sys.executable, "-m", "netlimit.cli"]


def full(topo, rate: str = "100/second", bw: str = "10mbit") -> str:
    return f"""
version: 1
exempt: [198.18.0.250/32, "2001:db8::fa/128"]
network:
  - name: udp-flood
    protocol: udp
    ports: [5000, "6000-6010"]
    limit: {rate}
    burst: 10
  - name: ssh-guard
    protocol: tcp
    ports: [22]
    new_connections: true
    limit: 3/minute
    method: recent
  - name: conns
    protocol: tcp
    ports: [443]
    max_connections: 20
  - name: shadow
    protocol: tcp
    ports: [8443]
    limit: 10/second
    action: log
  - name: fwd
    chain: forward
    protocol: udp
    ports: [53]
    limit: 50/second
    action: reject
bandwidth:
  - name: bulk
    interface: {topo.srv_if}
    ports: [5201]
    protocol: tcp
    rate: {bw}
  - name: to-client
    interface: {topo.srv_if}
    sources: [{topo.cli4}/32, "{topo.cli6}/128"]
    rate: 50mbit
  - name: in-cap
    interface: {topo.srv_if}
    direction: ingress
    rate: 100mbit
"""


def _save(topo) -> str:
    return topo.sx("iptables-legacy-save", "-c").stdout + topo.sx("ip6tables-legacy-save", "-c").stdout


def _strip_dates(text: str) -> str:
    """Without comments (dates) and without built-in chain policy counters (IPv6 ND moves them)."""
    return "\n".join(
        re.sub(r"^(:[A-Z]+ [A-Z]+) \[\d+:\d+\]", r"\1", l) for l in text.splitlines() if not l.startswith("#")
    )


def _tc(topo) -> str:
    out = []
    for dev in (topo.srv_if, "nlifb-s0"):
        for what in (
            ["qdisc", "show", "dev", dev],
            ["class", "show", "dev", dev],
            ["filter", "show", "dev", dev],
            ["filter", "show", "dev", dev, "ingress"],
        ):
            out.append(topo.sx("tc", *what, check=False).stdout)
    return "\n".join(out)


def _owned_summary(st) -> dict:
    if st.backend == "nftables":
        t = st.filter.table
        filt = (
            None
            if t is None
            else {
                "chains": sorted(t.chains),
                "sets": sorted((s.name, s.comment) for s in t.sets.values()),
                "rules": {c: [r.comment for r in lst] for c, lst in t.rules.items()},
            }
        )
    else:
        filt = {
            fam: {c: [lr.kspec for lr in s.rules.get(c, [])] for c in s.chains}
            | {f"jumps:{b}": [lr.kspec for lr in j] for b, j in s.jumps.items()}
            for fam, s in st.filter.families.items()
        }
    tc = sorted(str(x.obj) for x in st.tc.objects())
    return {"filter": filt, "tc": tc}


def test_apply_then_reapply_writes_nothing(topo, backend):
    r1 = topo.apply(full(topo))
    assert r1.changed
    # traffic so that counters are non-zero, then re-apply: counters and tc handles must not move
    traffic.udp_flood(topo.cli, topo.cli4, topo.srv4, 5000, 500, 0.5)
    before_ipt = _strip_dates(_save(topo))
    before_tc = _tc(topo)
    assert traffic.counter_by_comment(topo.srv, "netlimit:udp-flood") > 0
    r2 = topo.apply(full(topo))
    assert not r2.changed, r2.changes.lines()
    assert _strip_dates(_save(topo)) == before_ipt
    assert _tc(topo) == before_tc
    print("apply timings", r1.timings, "re-apply", r2.timings)


def test_changing_one_rule_keeps_the_other_rules_counters(topo, backend):
    """Both iptables backends write through the shared planner: only the changed rule is
    replaced (deleted and inserted at its place); the others keep their counters."""
    topo.apply(full(topo))
    traffic.udp_flood(topo.cli, topo.cli4, topo.srv4, 5000, 500, 0.5)
    flood = traffic.counter_by_comment(topo.srv, "netlimit:udp-flood")
    assert flood > 0
    res = topo.apply(full(topo).replace("max_connections: 20", "max_connections: 30"))
    assert res.changes.counts() == {"add": 2, "remove": 2, "reorder": 0}, res.changes.lines()
    assert traffic.counter_by_comment(topo.srv, "netlimit:udp-flood") == flood
    lines = _strip_dates(_save(topo))
    assert lines.count("--connlimit-above 30") == 2 and "--connlimit-above 20" not in lines


def test_partial_state_is_repaired(topo, backend):
    topo.apply(full(topo))
    want = _owned_summary(topo.state())
    # a "crash": one rule gone, one tc class gone, the ingress redirect gone
    topo.sx("iptables-legacy", "-D", "NETLIMIT", "3")
    topo.sx("ip6tables-legacy", "-D", "INPUT", "1")
    topo.sx("tc", "qdisc", "del", "dev", "nlifb-s0", "root")
    topo.sx("tc", "filter", "del", "dev", topo.srv_if, "ingress", "pref", "20044")
    r = topo.apply(full(topo))
    assert r.changed
    assert _owned_summary(topo.state()) == want
    assert not topo.apply(full(topo)).changed


def test_rollback_when_a_later_step_fails(topo, backend):
    topo.apply(full(topo))
    before = _owned_summary(topo.state())
    before_text = _strip_dates(topo.sx("iptables-legacy-save").stdout + topo.sx("ip6tables-legacy-save").stdout)
    # iptables changes fine (new rate), then tc fails: the bandwidth rule names a missing interface
    bad = (
        full(topo, rate="70/second")
        + """
  - name: nowhere
    interface: nosuch0
    rate: 10mbit
"""
    )
    with pytest.raises(ApplyError) as ei:
        topo.apply(bad)
    msg = str(ei.value)
    print("apply failed as expected:", msg)
    assert "nowhere" in msg and "nosuch0" in msg and "restored" in msg
    assert ei.value.rolled_back
    assert _owned_summary(topo.state()) == before
    assert _strip_dates(topo.sx("iptables-legacy-save").stdout + topo.sx("ip6tables-legacy-save").stdout) == before_text
    assert not topo.apply(full(topo)).changed


def test_kernel_refusal_names_the_rule_and_rolls_back(topo, backend):
    topo.apply(full(topo))
    before = _owned_summary(topo.state())
    # a foreign root qdisc on the interface the file wants to shape: netlimit must not replace it
    topo.sx("ip", "link", "add", "x0", "type", "veth", "peer", "name", "x1")
    topo.sx("tc", "qdisc", "add", "dev", "x0", "root", "handle", "1:", "htb", "default", "1")
    bad = (
        full(topo, rate="70/second")
        + """
  - name: foreign-dev
    interface: x0
    rate: 10mbit
"""
    )
    with pytest.raises(ApplyError) as ei:
        topo.apply(bad)
    assert "foreign-dev" in str(ei.value) and "x0" in str(ei.value)
    assert _owned_summary(topo.state()) == before
    assert "qdisc htb 1: " in topo.sx("tc", "qdisc", "show", "dev", "x0").stdout


def _add_foreign(topo) -> str:
    topo.sx(
        "iptables-legacy",
        "-A",
        "INPUT",
        "-p",
        "tcp",
        "--dport",
        "9999",
        "-m",
        "comment",
        "--comment",
        "other-tool",
        "-j",
        "ACCEPT",
    )
    topo.sx("iptables-legacy", "-N", "OTHER")
    topo.sx("iptables-legacy", "-A", "OTHER", "-s", "198.51.100.0/24", "-j", "DROP")
    topo.sx("iptables-legacy", "-I", "INPUT", "1", "-j", "OTHER")
    topo.sx("iptables-legacy", "-A", "FORWARD", "-j", "ACCEPT")
    topo.sx("ip6tables-legacy", "-A", "INPUT", "-p", "udp", "--dport", "9999", "-j", "DROP")
    topo.sx("ip", "link", "add", "x0", "type", "veth", "peer", "name", "x1")
    topo.sx("tc", "qdisc", "add", "dev", "x0", "root", "handle", "1:", "htb", "default", "1")
    topo.sx(
        "tc",
        "qdisc",
        "add",
        "dev",
        "x1",
        "root",
        "handle",
        "5:",
        "tbf",
        "rate",
        "1mbit",
        "burst",
        "10kb",
        "latency",
        "50ms",
    )
    return _foreign(topo)


def _foreign(topo) -> str:
    ipt = [
        l
        for l in (topo.sx("iptables-legacy", "-S").stdout + topo.sx("ip6tables-legacy", "-S").stdout).splitlines()
        if "netlimit" not in l and "NETLIMIT" not in l
    ]
    tcq = topo.sx("tc", "qdisc", "show", "dev", "x0").stdout + topo.sx("tc", "qdisc", "show", "dev", "x1").stdout
    return "\n".join(ipt) + "\n" + tcq


def test_foreign_rules_and_qdiscs_survive_apply_reapply_flush(topo, backend):
    foreign = _add_foreign(topo)
    topo.apply(full(topo))
    assert _foreign(topo) == foreign
    topo.apply(full(topo, rate="70/second", bw="20mbit"))  # a changed file
    assert _foreign(topo) == foreign
    topo.apply(full(topo, rate="70/second", bw="20mbit"))  # no change
    reconcile.flush(topo.srv)
    assert _foreign(topo) == foreign
    assert topo.state().empty


def test_flush_leaves_zero_owned_objects(topo, backend):
    topo.apply(full(topo))
    assert not topo.state().empty
    reconcile.flush(topo.srv)
    st = topo.state()
    assert st.empty
    text = _save(topo) + _tc(topo) + topo.sx("ip", "-br", "link").stdout
    for marker in ("netlimit", "NETLIMIT", "nlifb", "4e4c"):
        assert marker not in text
    assert "ingress" not in topo.sx("tc", "qdisc", "show", "dev", topo.srv_if).stdout
    reconcile.flush(topo.srv)  # flushing nothing is fine


def test_list_shows_objects_and_counters(topo, backend):
    topo.apply(full(topo))
    traffic.udp_flood(topo.cli, topo.cli4, topo.srv4, 5000, 1000, 1.0)
    rows = reconcile.list_owned(topo.srv)
    by_rule = {}
    for r in rows:
        by_rule.setdefault(r["rule"], []).append(r)
    assert {"udp-flood", "ssh-guard", "conns", "shadow", "fwd", "bulk", "to-client", "in-cap", "(exempt)"} <= set(
        by_rule
    )
    flood = [r for r in by_rule["udp-flood"] if r["layer"] == "iptables"][0]
    assert flood["dropped"] > 800 and flood["table"] == "hashlimit udp-flood" and flood["table_entries"] == 1
    assert any(r["layer"] == "tc" and r["kind"] == "class" for r in by_rule["bulk"])


def _cli(*args: str, check: bool = False) -> subprocess.CompletedProcess:
    return subprocess.run(
        NETLIMIT + list(args),
        capture_output=True,
        text=True,
        timeout=120,
        check=check,
        cwd=os.path.dirname(os.path.dirname(os.path.dirname(__file__))),
    )


def test_cli_apply_plan_live_list_flush(topo, tmp_path, any_backend):
    f = tmp_path / "rules.yaml"
    f.write_text(full(topo))
    layer = "nft" if any_backend == "nftables" else "iptables"
    live = _cli("plan", str(f), "--live", "--netns", topo.srv)
    assert live.returncode == 0 and f"+ {layer}" in live.stdout and "nothing was changed" in live.stdout
    assert f"# backend: {any_backend} ({BACKEND_ENV_NAME} {any_backend})" in live.stdout
    assert topo.state().empty  # plan --live changed nothing
    a1 = _cli("apply", str(f), "--netns", topo.srv)
    assert a1.returncode == 0, a1.stderr
    assert "applied" in a1.stdout and "adopting 0 owned objects found in the kernel" in a1.stdout
    # the legacy note only where a legacy backend writes on an nf_tables host, and only from apply
    assert ("iptables-legacy" in a1.stderr) == (any_backend != "nftables"), a1.stderr
    a2 = _cli("apply", str(f), "--netns", topo.srv)
    assert a2.returncode == 0 and "no changes" in a2.stdout
    n = int(re.search(r"already matches .* \((\d+) owned objects\)", a2.stdout).group(1))
    assert n == topo.state().count() and n > 0  # what an apply finds in place, it adopts
    assert "no changes" in _cli("plan", str(f), "--live", "--netns", topo.srv).stdout
    lj = json.loads(_cli("list", "--netns", topo.srv, "--json").stdout)
    assert lj["backend"] == any_backend
    assert any(o["rule"] == "bulk" and o["layer"] == "tc" for o in lj["objects"])
    assert any(
        o["rule"] == "udp-flood" and o["layer"] == ("nftables" if layer == "nft" else "iptables") for o in lj["objects"]
    )
    ls = _cli("list", "--netns", topo.srv)
    assert "udp-flood" in ls.stdout and f"backend: {any_backend}" in ls.stdout and ls.stderr == ""
    fl = _cli("flush", "--netns", topo.srv)
    assert fl.returncode == 0 and "flushed" in fl.stdout
    assert topo.state().empty


def test_cli_missing_netns_fails_clearly_and_creates_nothing(tmp_path):
    name = f"nlt-{os.getpid()}-missing"
    f = tmp_path / "r.yaml"
    f.write_text("version: 1\nnetwork:\n  - name: a\n    protocol: udp\n    ports: [1]\n    limit: 1/second\n")
    for args in (["apply", str(f)], ["plan", str(f), "--live"], ["list"], ["flush"]):
        p = _cli(*args, "--netns", name)
        assert p.returncode == 64, (args, p.stdout, p.stderr)
        assert "does not exist" in p.stderr
    assert not os.path.exists(f"/run/netns/{name}")


def test_cli_apply_failure_exit_code(topo, tmp_path):
    f = tmp_path / "bad.yaml"
    f.write_text("version: 1\nbandwidth:\n  - name: nowhere\n    interface: nosuch0\n    rate: 10mbit\n")
    p = _cli("apply", str(f), "--netns", topo.srv)
    assert p.returncode == 2
    assert "nowhere" in p.stderr and "nosuch0" in p.stderr
    assert topo.state().empty


def test_read_diff_api_for_the_daemon(topo, backend):
    d = topo.desired(full(topo))
    st = reconcile.read_owned(topo.srv)
    assert st.empty and not reconcile.diff(d, st).empty
    reconcile.apply(d, topo.srv)
    ch = reconcile.diff(d, reconcile.read_owned(topo.srv))
    assert ch.empty and ch.lines() == []
    topo.sx("iptables-legacy", "-F", "NETLIMIT")  # drift
    lines = reconcile.diff(d, reconcile.read_owned(topo.srv)).lines()
    assert lines and all(l.startswith("+ iptables") for l in lines)


def test_concurrent_applies_do_not_lose_rules(topo, tmp_path, any_backend):
    """Two writers at once (python-iptables takes no lock of its own): both succeed,
    the kernel ends equal to the file, nothing is lost or duplicated."""
    f = tmp_path / "rules.yaml"
    f.write_text(full(topo))
    procs = [
        subprocess.Popen(
            NETLIMIT + ["apply", str(f), "--netns", topo.srv, "-q"],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for _ in range(3)
    ]
    outs = [p.communicate(timeout=120) for p in procs]
    assert all(p.returncode == 0 for p in procs), outs
    assert sum("applied" in o for o, _ in outs) == 1
    assert not topo.apply(full(topo)).changed
    st = topo.state()
    if any_backend == "nftables":
        assert sum(len(v) for v in st.filter.table.rules.values()) == len(topo.desired(full(topo)).nft.rules)
    else:
        assert len(st.filter.families[4].jumps["INPUT"]) == 1


def test_cli_apply_confirm_rolls_back_without_confirmation(topo, tmp_path, any_backend):
    topo.apply(full(topo))
    before = _owned_summary(topo.state())
    f = tmp_path / "new.yaml"
    f.write_text(full(topo, rate="70/second", bw="20mbit"))
    p = subprocess.run(
        NETLIMIT + ["apply", str(f), "--netns", topo.srv, "--confirm", "2"],
        stdin=subprocess.DEVNULL,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert p.returncode == 2, p.stderr
    assert "no terminal to confirm on (stdin is not a terminal): the previous rules were restored" in p.stderr
    assert _owned_summary(topo.state()) == before
    ok = subprocess.run(
        NETLIMIT + ["apply", str(f), "--netns", topo.srv, "--confirm", "5"],
        input="\n",
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert ok.returncode == 0, ok.stderr
    assert not topo.apply(full(topo, rate="70/second", bw="20mbit")).changed


def test_cli_apply_confirm_on_a_terminal(topo, tmp_path):
    """On a pseudo-terminal (script(1)): silence rolls back "not confirmed within 1 s";
    Enter keeps the rules."""
    import shlex

    topo.apply(full(topo))
    before = _owned_summary(topo.state())
    f = tmp_path / "new.yaml"
    f.write_text(full(topo, rate="70/second", bw="20mbit"))
    cmd = " ".join(shlex.quote(a) for a in [*NETLIMIT, "apply", str(f), "--netns", topo.srv, "--confirm", "1"])
    keep_r, keep_w = os.pipe()  # script's stdin stays open, nothing typed, until the command ends
    try:
        silent = subprocess.Popen(["script", "-qec", cmd, "/dev/null"], stdin=keep_r, stdout=subprocess.PIPE, text=True)
        try:
            out, _ = silent.communicate(timeout=120)
        finally:
            if silent.poll() is None:
                silent.kill()
                silent.wait(10)
    finally:
        os.close(keep_r)
        os.close(keep_w)
    assert silent.returncode == 2, out
    assert "not confirmed within 1 s: the previous rules were restored" in out
    assert _owned_summary(topo.state()) == before
    cmd5 = cmd.replace("--confirm 1", "--confirm 30")
    ok = subprocess.run(["script", "-qec", cmd5, "/dev/null"], input="\n", capture_output=True, text=True, timeout=120)
    assert ok.returncode == 0, ok.stdout
    assert not topo.apply(full(topo, rate="70/second", bw="20mbit")).changed
