"""Reads of an nftables table are of one generation while another tool commits
continuously in the same namespace (issue 35 item 3: kube-proxy, a CrowdSec bouncer).

The foreign writer here commits into the table being read, each commit keeping an
invariant (one moving chain whose one rule uses one moving set), so that a torn read
(chains of one generation, rules or sets of the next) is visible in what it returns.
"""

from __future__ import annotations

import errno
import re
import subprocess
import sys
import time

import pytest

from netlimit.kernel.netns import run_in_netns
from netlimit.kernel.nft import netlink as nfnetlink

pytestmark = pytest.mark.netns

TABLE = "torn"
STATIC = 300  # chains with a rule each: dumps long enough for commits to land between them

WRITER = r"""
import subprocess, sys, time
table, seconds = sys.argv[1], float(sys.argv[2])
end = time.monotonic() + seconds
k = 0
while time.monotonic() < end:
    k += 1
    script = (
        f"add chain inet {table} c{k}\n"
        f"add set inet {table} s{k} {{ type ipv4_addr; }}\n"
        f"add rule inet {table} c{k} ip saddr @s{k} counter\n"
        f"flush chain inet {table} c{k - 1}\n"
        f"delete chain inet {table} c{k - 1}\n"
        f"delete set inet {table} s{k - 1}\n"
    )
    p = subprocess.run(["nft", "-f", "-"], input=script, text=True, capture_output=True)
    if p.returncode != 0:
        print(p.stderr, file=sys.stderr, flush=True)
        sys.exit(1)
    print(k, flush=True)
"""


def _setup(ns: str) -> None:
    static = "".join(f"add chain inet {TABLE} st{i}\nadd rule inet {TABLE} st{i} counter\n" for i in range(STATIC))
    script = (
        f"add table inet {TABLE}\n"
        f"add chain inet {TABLE} c0\n"
        f"add set inet {TABLE} s0 {{ type ipv4_addr; }}\n"
        f"add rule inet {TABLE} c0 ip saddr @s0 counter\n" + static
    )
    subprocess.run(["ip", "netns", "exec", ns, "nft", "-f", "-"], input=script, text=True, check=True, timeout=60)


def _torn(t: nfnetlink.Table) -> str | None:
    """What makes this read one no generation ever had (None: consistent)."""
    moving = sorted(c for c in t.chains if re.fullmatch(r"c\d+", c))
    sets = sorted(t.sets)
    if len(moving) != 1 or len(sets) != 1:
        return f"chains {moving}, sets {sets}"
    k = moving[0][1:]
    if sets != [f"s{k}"]:
        return f"chain c{k} beside sets {sets}"
    if set(t.rules) != set(t.chains):
        return f"rules in chains not read: {sorted(set(t.rules) - set(t.chains))}"
    rules = t.rules[f"c{k}"]
    if len(rules) != 1 or rules[0].sets != (f"s{k}",):
        return f"chain c{k} holds {[r.sets for r in rules]}"
    statics = [c for c in t.chains if c.startswith("st")]
    if len(statics) != STATIC or any(len(t.rules[c]) != 1 for c in statics):
        return "a static chain without its rule"
    return None


def _writer(ns: str, seconds: float) -> subprocess.Popen:
    return subprocess.Popen(
        ["ip", "netns", "exec", ns, sys.executable, "-c", WRITER, TABLE, str(seconds)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def _stop(p: subprocess.Popen) -> int:
    """How many commits the writer made (it must not have failed)."""
    if p.poll() is None:
        p.kill()
    out, err = p.communicate(timeout=30)
    assert p.returncode in (0, -9), err
    lines = out.split()
    return int(lines[-1]) if lines else 0


def test_reads_are_of_one_generation_while_another_tool_commits(topo, monkeypatch):
    _setup(topo.srv)
    reads_per_call: list[int] = []
    once = nfnetlink._read_once

    def counted(nl, name, family):
        reads_per_call[-1] += 1
        return once(nl, name, family)

    monkeypatch.setattr(nfnetlink, "_read_once", counted)
    writer = _writer(topo.srv, 60)
    try:
        assert writer.stdout is not None
        first = writer.stdout.readline()  # the writer is committing
        assert first.strip(), writer.stderr.read() if writer.stderr else ""
        deadline = time.monotonic() + 30
        calls = 0
        torn: list[str] = []
        slowest = 0.0
        while time.monotonic() < deadline and (calls < 200 or sum(reads_per_call) == calls):
            reads_per_call.append(0)
            t0 = time.monotonic()
            t = run_in_netns(topo.srv, nfnetlink.read_table, TABLE)
            slowest = max(slowest, time.monotonic() - t0)
            calls += 1
            assert t is not None
            why = _torn(t)
            if why:
                torn.append(why)
        assert writer.poll() is None, "the foreign writer stopped early"
    finally:
        commits = _stop(writer)
    retried = sum(1 for n in reads_per_call if n > 1)
    print(
        f"{calls} reads against {commits} foreign commits: {retried} needed more than one pass, slowest {slowest:.3f} s"
    )
    assert not torn, f"torn reads returned: {torn[:5]}"
    assert retried > 0, "the writer never raced a read: the test proved nothing"
    assert slowest <= nfnetlink.READ_BOUND_S + 0.5


def test_without_a_stable_generation_the_read_fails_after_the_bound_in_time(topo, monkeypatch):
    """A ruleset that moves on between every pair of generation reads (faked here: a
    kernel can not be made to commit that fast on demand): read_table gives up after
    READ_BOUND_S seconds, however many reads that was, with EAGAIN and a message."""
    _setup(topo.srv)
    gen = iter(range(10**9))
    monkeypatch.setattr(nfnetlink.Socket, "generation", lambda self: next(gen))
    t0 = time.monotonic()
    with pytest.raises(nfnetlink.NetlinkError) as exc:
        run_in_netns(topo.srv, nfnetlink.read_table, TABLE, "inet", 0.5)
    took = time.monotonic() - t0
    assert exc.value.errno == errno.EAGAIN
    assert "another tool committed during each of" in str(exc.value) and "no consistent read" in str(exc.value)
    reads = int(re.search(r"each of (\d+) reads", str(exc.value)).group(1))
    assert reads > 1
    assert 0.5 <= took < 0.5 + 2.0
