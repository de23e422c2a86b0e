"""Packet and connection limits against the real kernel, with real traffic between
namespaces, under nftables and the legacy restore backend (the `any_backend` fixture)."""

from __future__ import annotations

import time

import pytest

from netlimit.kernel import traffic

pytestmark = pytest.mark.netns

PORT = 5000
PPS = 2000
SECS = 5.0


def _count_rule(topo, src: str, family: int = 4, port: int = PORT) -> str:
    """A foreign ACCEPT rule in the legacy INPUT chain: it counts what got through
    netlimit (whose nftables chain runs before it, and whose legacy jump is first)."""
    comment = f"test-count-{src}-{port}"
    tool = "iptables-legacy" if family == 4 else "ip6tables-legacy"
    topo.sx(
        tool,
        "-A",
        "INPUT",
        "-s",
        src,
        "-p",
        "udp",
        "--dport",
        str(port),
        "-m",
        "comment",
        "--comment",
        comment,
        "-j",
        "ACCEPT",
    )
    return comment


def _flood(topo, flows: list[tuple[str, str, int]], pps: float = PPS, secs: float = SECS):
    """Flood every (source, destination, port) at once, once; returns FloodResults.

    One flood per call: a caller reads its counters before and after, so a retry must
    be the caller's (with fresh counters). A retry in here counted two floods against
    one bucket (issue 35: the exempt flow "delivered" 10,000 of 5,000 offered when the
    first flood looked starved on a busy host and was sent again)."""
    procs = [traffic.udp_flood_start(topo.cli, s, d, port, pps, secs) for s, d, port in flows]
    return [traffic.flood_result(p, timeout=secs + 60) for p in procs]


def _span(results) -> float:
    """The time several senders into one bucket covered: first send of any to last send
    of any (their start skew under load is refill time too; each one's own duration
    missed it, issue 35's +2.5 % on the shared /24)."""
    return max(r.end for r in results) - min(r.start for r in results)


def _expected(rate: float, burst: int, duration: float) -> float:
    return rate * duration + burst


def _within(measured: float, expected: float, tol: float) -> bool:
    return abs(measured - expected) <= tol * expected


HASHLIMIT = """
version: 1
network:
  - name: udp-flood
    protocol: udp
    ports: [5000]
    limit: 100/second
    burst: 10
{extra}
"""

TABLE = """
version: 1
exempt: ["{exempt}/128"]
network:
  - name: per-source
    protocol: udp
    ports: [5000]
    limit: 100/second
    burst: 10
  - name: per-24
    protocol: udp
    ports: [5001]
    limit: 100/second
    burst: 10
    source_prefix: 24
  - name: per-port
    protocol: udp
    ports: [5002, 5003]
    limit: 100/second
    burst: 10
    per: source+port
"""


def test_exactness_table(topo, any_backend):
    """The exactness table, all flows at once for 5 s against 100/s burst 10 (510 each,
    ±1 %): two sources with their own buckets, IPv6, two sources of one /24 sharing a
    bucket, one source on two ports under per: source+port (a bucket each), and an
    exempt IPv6 source that is never limited."""
    topo.apply(TABLE.format(exempt=topo.cli6b))
    flows = [
        (topo.cli4, topo.srv4, 5000, "own"),
        (topo.cli4b, topo.srv4, 5000, "own"),
        (topo.cli6, topo.srv6, 5000, "own"),
        (topo.cli4, topo.srv4, 5001, "shared"),
        (topo.cli4b, topo.srv4, 5001, "shared"),
        (topo.cli4, topo.srv4, 5002, "own"),
        (topo.cli4, topo.srv4, 5003, "own"),
        (topo.cli6b, topo.srv6, 5000, "exempt"),
    ]
    fams = [6 if ":" in src else 4 for src, _d, _p, _k in flows]
    counters = [_count_rule(topo, src, fam, port) for (src, _d, port, _k), fam in zip(flows, fams)]
    for attempt in range(3):
        before = [traffic.counter_by_comment(topo.srv, c, fam) for c, fam in zip(counters, fams)]
        results = _flood(topo, [(s, d, p) for s, d, p, _k in flows], pps=1000)
        time.sleep(0.2)
        got = [traffic.counter_by_comment(topo.srv, c, fam) - b for c, fam, b in zip(counters, fams, before)]
        misses = []
        shared = [g for g, f in zip(got, flows) if f[3] == "shared"]
        shared_exp = _expected(100, 10, _span([r for r, f in zip(results, flows) if f[3] == "shared"]))
        for (src, _d, port, kind), g, r in zip(flows, got, results):
            print(f"{any_backend}: {kind:6} {src}:{port} offered {r.sent} in {r.duration:.3f} s, delivered {g}")
            if kind == "own" and not _within(g, _expected(100, 10, r.duration), 0.01):
                misses.append((src, port, g, round(_expected(100, 10, r.duration), 1)))
            if kind == "exempt" and g != r.sent:
                misses.append((src, port, g, r.sent))
        if not _within(sum(shared), shared_exp, 0.01):
            misses.append(("/24", 5001, sum(shared), round(shared_exp, 1)))
        if not misses or attempt == 2:
            break
        time.sleep(1.5)  # a retry needs full buckets again
    assert not misses, f"delivered vs expected (±1 %): {misses}"


def _measure(topo, source, dst, rate=100, burst=10):
    comment = _count_rule(topo, source)
    for attempt in range(2):
        before = traffic.counter_by_comment(topo.srv, comment)
        (r,) = _flood(topo, [(source, dst, PORT)])
        time.sleep(0.2)
        got = traffic.counter_by_comment(topo.srv, comment) - before
        exp = _expected(rate, burst, r.duration)
        print(f"hashlimit {rate}/s burst {burst}: offered {r.sent} in {r.duration:.3f} s, delivered {got}")
        if _within(got, exp, 0.01) or attempt == 1:
            return got, exp
        time.sleep(burst / rate + 0.5)  # a retry needs a full bucket
    return got, exp


def test_hashlimit_rate_change_takes_effect(topo, every_backend):
    """A changed rate must reach the per-source state too: legacy keeps a hashlimit
    table's first settings while any rule uses its name (the old rule goes in a first
    commit); nftables keeps each element's limit (the set is replaced)."""
    topo.apply(HASHLIMIT.format(extra=""))
    topo.apply(HASHLIMIT.format(extra="").replace("100/second", "50/second"))
    got, exp = _measure(topo, topo.cli4, topo.srv4, rate=50)
    assert _within(got, exp, 0.01), f"after the change: delivered {got}, expected {exp:.1f} at 50/s"


def test_a_pause_banks_no_more_than_the_burst(topo, any_backend):
    """Two 1 s floods with a pause between: the bucket refills to its burst during the
    pause and no further, so 100/s x (flood time) + 2 x burst pass, not 100/s x the whole
    span + burst. This is what the Vagrant scenario's bucket replay expects when a
    stalled VM gets its packets in clumps (vagrant/scenario.py, bucket_passes)."""
    topo.apply(HASHLIMIT.format(extra=""))
    comment = _count_rule(topo, topo.cli4)
    for attempt in range(2):
        before = traffic.counter_by_comment(topo.srv, comment)
        first = _flood(topo, [(topo.cli4, topo.srv4, PORT)], secs=1.0)[0]
        t_pause = time.monotonic()
        time.sleep(1.0)  # the pause itself is the traffic's shape: 10x the 0.1 s the burst needs to refill
        pause = time.monotonic() - t_pause
        second = _flood(topo, [(topo.cli4, topo.srv4, PORT)], secs=1.0)[0]
        time.sleep(0.2)
        got = traffic.counter_by_comment(topo.srv, comment) - before
        exp = _expected(100, 10, first.duration) + _expected(100, 10, second.duration)
        naive = _expected(100, 10, first.duration + pause + second.duration)
        print(
            f"{any_backend}: floods {first.duration:.3f} + {second.duration:.3f} s, pause {pause:.3f} s: "
            f"delivered {got}, bucket {exp:.1f}, rate x span + burst {naive:.1f}"
        )
        if _within(got, exp, 0.02) or attempt == 1:
            break
        time.sleep(0.5)  # a retry needs a full bucket
    assert _within(got, exp, 0.02), f"delivered {got}, expected {exp:.1f} (±2 %)"
    assert got < naive - 50


RECENT = """
version: 1
network:
  - name: new-conns
    protocol: tcp
    ports: [8080]
    new_connections: true
    limit: {limit}
    method: recent
"""


def test_recent_fourth_new_connection_dropped(topo, any_backend):
    topo.apply(RECENT.format(limit="3/minute"))
    lst = traffic.tcp_listener(topo.srv, topo.srv4, 8080, seconds=30)
    try:
        res = traffic.tcp_connects(topo.cli, topo.cli4, topo.srv4, 8080, 5, timeout=1.0)
        print("recent 3/minute: connections", res)
        assert res == [True, True, True, False, False]
        # another source has its own entry
        assert traffic.tcp_connects(topo.cli, topo.cli4b, topo.srv4, 8080, 1, timeout=1.0) == [True]
    finally:
        lst.kill()
        lst.wait()


def test_recent_new_connection_passes_after_window(topo, any_backend):
    """The issue's case: 3 new connections / 10 s; the 4th is dropped, a new one passes
    after the window (nftables: the ban the dropped attempts renewed has run out)."""
    topo.apply(RECENT.format(limit="3/10s"))
    lst = traffic.tcp_listener(topo.srv, topo.srv4, 8080, seconds=40)
    try:
        res = traffic.tcp_connects(topo.cli, topo.cli4, topo.srv4, 8080, 4, timeout=1.0)
        print("recent 3/10s: connections", res)
        assert res == [True, True, True, False]
        # still inside the window (the dropped SYNs refreshed it): dropped again
        assert traffic.tcp_connects(topo.cli, topo.cli4, topo.srv4, 8080, 1, timeout=1.0) == [False]
        time.sleep(10.5)
        assert traffic.tcp_connects(topo.cli, topo.cli4, topo.srv4, 8080, 1, timeout=1.0) == [True]
    finally:
        lst.kill()
        lst.wait()


CONNLIMIT = """
version: 1
network:
  - name: two-conns
    protocol: tcp
    ports: [8081]
    max_connections: 2
"""


@pytest.mark.parametrize("family", [4, 6])
def test_connlimit_third_concurrent_connection_refused(topo, family, any_backend):
    topo.apply(CONNLIMIT)
    srv, cli = (topo.srv4, topo.cli4) if family == 4 else (topo.srv6, topo.cli6)
    lst = traffic.tcp_listener(topo.srv, srv, 8081, seconds=30)
    try:
        res = traffic.tcp_connects(topo.cli, cli, srv, 8081, 3, timeout=1.0)
        print(f"connlimit 2 (IPv{family}): connections", res)
        assert res == [True, True, False]
    finally:
        lst.kill()
        lst.wait()
