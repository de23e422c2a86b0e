"""The iptables-legacy-save/-restore backend against the real kernel: spelling round
trip, adoption across backends, refusals that change nothing, writes only when needed."""

from __future__ import annotations

import dataclasses
import re
import subprocess
from pathlib import Path

import pytest

from netlimit.config.validate import load_file, load_string
from netlimit.kernel import reconcile, traffic
from netlimit.kernel.compile import compile_config
from netlimit.kernel.objects import Match
from netlimit.kernel.reconcile import ApplyError
from netlimit.kernel.render import iptables_save_text, rule_spec
from netlimit.kernel.savefmt import canon
from netlimit.kernel.xtables import restore as restore_backend

pytestmark = pytest.mark.netns

RULES = sorted(Path(__file__).resolve().parents[2].glob("rules/*.yaml"))

# every match kind and option netlimit writes, IPv4 and IPv6: hashlimit modes and masks,
# rates the kernel respells (3/10s, 86400/day, 5/minute with expire = its unit), recent
# both ways, connlimit masks, multiport ranges and chunks, icmp, reject, log chains
WIDE = """
version: 1
exempt: [198.18.0.250/32, "2001:db8::fa/128", 10.0.0.0/8, "fe80::/10"]
network:
  - name: udp-flood
    protocol: udp
    ports: [5000, "6000-6010", 7000, 7001, 7002, 7003, 7004, 7005, 7006, 7007, 7008, 7009, 7010, 7011, 7012, 7013]
    limit: 100/second
    burst: 10
  - name: per-dst
    protocol: tcp
    ports: [80]
    limit: 3/10s
    per: destination
    destinations: [198.51.100.0/24, "2001:db8:1::/48"]
    interface: eth9
  - name: per-all
    protocol: icmp
    limit: 1000/hour
    per: all
    action: reject
  - name: srcport
    protocol: tcp
    ports: [8080]
    limit: 5/minute
    per: source+port
    source_prefix: 24
    source_prefix6: 64
    htable_size: 1024
    htable_max: 2048
    htable_expire: 60000
    action: reject
  - name: full-mask
    protocol: udp
    ports: [8081]
    limit: 20/second
    source_prefix: 32
    source_prefix6: 128
  - name: day
    protocol: all
    limit: 86400/day
    sources: [192.0.2.0/24, "2001:db8:2::/64"]
  - name: ssh-guard
    protocol: tcp
    ports: [22]
    new_connections: true
    limit: 3/minute
    method: recent
  - name: rec-dst
    protocol: udp
    ports: [123]
    limit: 5/second
    method: recent
    per: destination
  - name: conns
    protocol: tcp
    ports: [443]
    max_connections: 20
  - name: conns24
    protocol: tcp
    ports: [444]
    max_connections: 5
    source_prefix: 24
    source_prefix6: 56
  - name: conns-all
    protocol: tcp
    ports: [445]
    max_connections: 100
    per: all
  - name: conns-dst
    protocol: tcp
    ports: [446]
    max_connections: 7
    per: destination
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
  - name: a-very-long-rule-name-that-needs-shortening
    protocol: udp
    ports: [9999]
    limit: 7/second
    action: log
"""

FILES = [pytest.param(p, id=p.name) for p in RULES] + [pytest.param("WIDE", id="wide")]


def _desired(which):
    loaded = load_string(WIDE, "<wide>") if which == "WIDE" else load_file(which)
    # iptables only: the files' bandwidth rules name interfaces these namespaces lack
    return dataclasses.replace(compile_config(loaded.config), devices=())


def _save_rules(topo, family: int) -> dict[str, list[str]]:
    tool = "iptables-legacy-save" if family == 4 else "ip6tables-legacy-save"
    out: dict[str, list[str]] = {}
    for line in topo.sx(tool, "-t", "filter").stdout.splitlines():
        if line.startswith("-A "):
            _, chain, spec = line.split(" ", 2)
            out.setdefault(chain, []).append(spec)
    return out


def _tables(topo) -> str:
    """Both families' filter tables without dates and counters."""
    text = (
        topo.sx("iptables-legacy-save", "-t", "filter").stdout + topo.sx("ip6tables-legacy-save", "-t", "filter").stdout
    )
    return "\n".join(re.sub(r"\[\d+:\d+\]", "", ln) for ln in text.splitlines() if not ln.startswith("#"))


@pytest.mark.parametrize("which", FILES)
def test_render_round_trips_through_save(topo, which):
    """What render.py writes, put through savefmt.canon, is exactly what -save prints
    back, rule for rule and in order, for every rule of every example file (both
    families); canon leaves -save's own spelling alone; the restore backend then
    reads the namespace as equal to the file."""
    d = _desired(which)
    checked = 0
    if d.ipsets:  # the sets the ban rules match come first, as the backend makes them
        sets = "".join(f"create {s.name} {s.type} {s.header}\n" for s in d.ipsets)
        topo.sx("sh", "-c", f"printf '{sets}' | ipset restore -exist")
    for fam in (4, 6):
        text = iptables_save_text(d, fam, headers=False)
        if not text:
            continue
        tool = "iptables-legacy" if fam == 4 else "ip6tables-legacy"
        p = subprocess.run(
            ["ip", "netns", "exec", topo.srv, f"{tool}-restore", "--noflush"],
            input=text,
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert p.returncode == 0, p.stderr
        live = _save_rules(topo, fam)
        want: dict[str, list[str]] = {}
        for r in d.family_rules(fam):
            want.setdefault(r.chain, []).append(canon(rule_spec(r), fam))
        assert {c: v for c, v in live.items() if c in want} == want, f"IPv{fam}"
        for specs in live.values():
            for spec in specs:
                assert canon(spec, fam) == spec
        checked += sum(len(v) for v in want.values())
    assert checked == len(d.rules)
    st = reconcile.read_owned(topo.srv, backend="restore")
    ch = reconcile.diff(d, st)
    assert ch.empty, ch.lines()


def test_each_backend_adopts_the_others_rules(topo):
    """Switching backends (or the default changing under a running host) rewrites nothing.
    (python-iptables cannot install a hashlimit rule whose htable-expire equals its rate's
    unit -- it re-reads the rule through libxtables' save, which leaves that expire out, and
    the kernel then refuses expire 0 -- so srcport gets another expire here.)"""
    d = compile_config(load_string(WIDE.replace("htable_expire: 60000", "htable_expire: 120000"), "<w>").config)
    d = dataclasses.replace(d, devices=())
    reconcile.apply(d, topo.srv, backend="python-iptables")
    assert not reconcile.apply(d, topo.srv, backend="restore").changed
    reconcile.flush(topo.srv, backend="restore")
    assert reconcile.read_owned(topo.srv, backend="python-iptables").empty
    reconcile.apply(d, topo.srv, backend="restore")
    assert not reconcile.apply(d, topo.srv, backend="python-iptables").changed
    reconcile.flush(topo.srv, backend="python-iptables")
    assert "NETLIMIT" not in _tables(topo)


BASE = """
version: 1
exempt: [198.18.0.250/32]
network:
  - name: udp-flood
    protocol: udp
    ports: [5000]
    limit: 100/second
    burst: 10
  - name: conns
    protocol: tcp
    ports: [443]
    max_connections: 20
"""


def _with_bad(d, families=(4, 6), **change):
    """`d` with a rule 'bad-one' after each udp-flood rule of `families`, changed by `change`."""
    out = []
    for r in d.rules:
        out.append(r)
        if r.rule == "udp-flood" and r.family in families:
            out.append(dataclasses.replace(r, rule="bad-one", comment="netlimit:bad-one", **change))
    return dataclasses.replace(d, rules=tuple(out))


# REJECT --reject-with tcp-reset on a UDP rule: iptables parses it, the kernel's
# checkentry refuses the table at COMMIT
KERNEL_REFUSED = dict(target="REJECT", target_options=(("reject-with", "tcp-reset"),))


def test_kernel_refused_rule_changes_nothing_and_is_named(topo, backend):
    d0 = topo.desired(BASE)
    reconcile.apply(d0, topo.srv)
    before = _tables(topo)
    bad = _with_bad(topo.desired(BASE.replace("100/second", "70/second")), **KERNEL_REFUSED)
    with pytest.raises(ApplyError) as ei:
        reconcile.apply(bad, topo.srv)
    msg = str(ei.value)
    print(backend, "refused:", msg)
    assert "bad-one" in msg and ei.value.rolled_back
    if backend == "restore":  # found by trying the new rules alone: only the culprit is named
        assert ei.value.rule == "bad-one" and "tcp-reset" in msg
    assert _tables(topo) == before
    assert not reconcile.apply(d0, topo.srv).changed


def test_second_family_refused_puts_the_first_back(topo, backend):
    """IPv4 commits, then the kernel refuses the IPv6 table: IPv4 is restored as it was."""
    d0 = topo.desired(BASE)
    reconcile.apply(d0, topo.srv)
    before = _tables(topo)
    bad = _with_bad(topo.desired(BASE.replace("100/second", "70/second")), families=(6,), **KERNEL_REFUSED)
    with pytest.raises(ApplyError) as ei:
        reconcile.apply(bad, topo.srv)
    assert "bad-one" in str(ei.value) and "restored" in str(ei.value) and ei.value.rolled_back
    assert _tables(topo) == before
    assert not reconcile.apply(d0, topo.srv).changed


def test_unparseable_rule_names_the_rule_and_its_line(topo):
    """A line iptables-restore itself rejects ('line N failed'): the error names that rule."""
    d0 = topo.desired(BASE)
    reconcile.apply(d0, topo.srv, backend="restore")
    before = _tables(topo)
    bad = _with_bad(d0, matches=(Match("nosuchmatch", (("foo", "1"),)),), target="DROP")
    with pytest.raises(ApplyError) as ei:
        reconcile.apply(bad, topo.srv, backend="restore")
    msg = str(ei.value)
    print("refused:", msg)
    assert ei.value.rule == "bad-one" and "nosuchmatch" in msg and "restored" in msg
    assert _tables(topo) == before


def test_noop_runs_no_restore_and_a_change_keeps_other_counters(topo, monkeypatch):
    d0 = topo.desired(BASE)
    reconcile.apply(d0, topo.srv, backend="restore")
    traffic.udp_flood(topo.cli, topo.cli4, topo.srv4, 5000, 500, 0.5)
    flood = traffic.counter_by_comment(topo.srv, "netlimit:udp-flood")
    assert flood > 0

    calls: list[int] = []
    real = restore_backend._restore
    monkeypatch.setattr(restore_backend, "_restore", lambda fam, *a, **k: (calls.append(fam), real(fam, *a, **k)))
    assert not reconcile.apply(d0, topo.srv, backend="restore").changed
    assert calls == [], "a no-op apply ran iptables-restore"
    # change only the connlimit rule: udp-flood is not rewritten, its counter stays
    res = reconcile.apply(
        topo.desired(BASE.replace("max_connections: 20", "max_connections: 30")), topo.srv, backend="restore"
    )
    assert res.changes.counts() == {"add": 2, "remove": 2, "reorder": 0}, res.changes.lines()
    assert calls == [4, 6]
    assert traffic.counter_by_comment(topo.srv, "netlimit:udp-flood") >= flood


def test_rollback_keeps_counters(topo):
    """restore() (apply --confirm's undo) puts the old rules back with their counters."""
    d0 = topo.desired(BASE)
    reconcile.apply(d0, topo.srv, backend="restore")
    traffic.udp_flood(topo.cli, topo.cli4, topo.srv4, 5000, 500, 0.5)
    flood = traffic.counter_by_comment(topo.srv, "netlimit:udp-flood")
    res = reconcile.apply(topo.desired(BASE.replace("100/second", "70/second")), topo.srv, backend="restore")
    assert res.changed
    reconcile.restore(res.before, topo.srv)
    assert not reconcile.apply(d0, topo.srv, backend="restore").changed
    assert traffic.counter_by_comment(topo.srv, "netlimit:udp-flood") >= flood


def test_jump_moved_by_another_tool_is_kept_and_duplicates_go(topo):
    """The jump from INPUT may sit anywhere (other tools insert above it); a second copy is removed."""
    d0 = topo.desired(BASE)
    reconcile.apply(d0, topo.srv, backend="restore")
    topo.sx("iptables-legacy", "-I", "INPUT", "1", "-p", "tcp", "--dport", "9", "-j", "ACCEPT")
    assert not reconcile.apply(d0, topo.srv, backend="restore").changed
    topo.sx("iptables-legacy", "-A", "INPUT", "-m", "comment", "--comment", "netlimit: jump", "-j", "NETLIMIT")
    res = reconcile.apply(d0, topo.srv, backend="restore")
    assert res.changes.counts()["remove"] == 1
    lines = topo.sx("iptables-legacy", "-S", "INPUT").stdout.splitlines()
    assert lines[1:] == [
        "-A INPUT -p tcp -m tcp --dport 9 -j ACCEPT",
        '-A INPUT -m comment --comment "netlimit: jump" -j NETLIMIT',
    ]


def test_unknown_backend_is_refused_before_touching_anything(topo):
    with pytest.raises(ApplyError) as ei:
        reconcile.apply(topo.desired(BASE), topo.srv, backend="nftables-someday")
    assert "restore, python-iptables" in str(ei.value)
    assert "NETLIMIT" not in _tables(topo)
