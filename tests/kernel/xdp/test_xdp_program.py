"""The XDP program's decisions through BPF_PROG_TEST_RUN (no traffic, deterministic):
burst, per-source and per-prefix buckets, exempt/ban/deny order, protocol and port
matching, IPv6; and the map encodings (pure, hypothesis)."""

from __future__ import annotations

import ipaddress
import time

import pytest
from hypothesis import given
from hypothesis import strategies as st

from netlimit.kernel.xdp import MAX_RULES, XdpRule, frame
from netlimit.kernel.xdp.maps import RULE, decode_rule, encode_rules, lpm_key, lpm_key_decode, prefix_key

XDP_DROP, XDP_PASS = 1, 2
DST4, DST6 = "10.0.0.1", "2001:db8:ffff::1"


def run(xdp, src: str, dport: int = 5000, proto: int = 17) -> int:
    dst = DST6 if ":" in src else DST4
    return xdp.test_run(frame(src, dst, proto=proto, dport=dport), repeat=1)[0]


@pytest.mark.netns
def test_burst_then_drop_per_source_and_per_prefix(xdp):
    # interval 1 s: nothing refills while the test runs (microseconds)
    xdp.set_rules(
        [
            XdpRule("per-addr", limit=1, period_s=1.0, burst=10, protocol="udp", dports=(5000, 5000)),
            XdpRule(
                "per-24", limit=1, period_s=1.0, burst=3, protocol="udp", dports=(6000, 6010), prefix4=24, prefix6=64
            ),
        ]
    )
    assert [run(xdp, "10.1.2.3") for _ in range(12)] == [XDP_PASS] * 10 + [XDP_DROP] * 2
    assert run(xdp, "10.1.2.4") == XDP_PASS, "another address has its own bucket"
    # /24 grouping: three from one /24 share 3 tokens, another /24 has its own
    assert [run(xdp, f"10.1.2.{i}", 6005) for i in (1, 2, 3, 4)] == [XDP_PASS] * 3 + [XDP_DROP]
    assert run(xdp, "10.1.3.1", 6010) == XDP_PASS
    # IPv6 /64 grouping
    assert [run(xdp, f"2001:db8:1:1::{i}", 6000) for i in (1, 2, 3, 4)] == [XDP_PASS] * 3 + [XDP_DROP]
    assert run(xdp, "2001:db8:1:2::1", 6000) == XDP_PASS
    # outside the rules' ports / protocol: never limited
    assert all(run(xdp, "10.1.2.3", 5001) == XDP_PASS for _ in range(20))
    assert all(run(xdp, "10.1.2.3", 5000, proto=6) == XDP_PASS for _ in range(20))
    c = xdp.counters()
    assert c.rules == [(11, 2), (8, 2)]


@pytest.mark.netns
def test_refill_rate(xdp):
    """100/s burst 1: after 0.2 s about 20 more packets are admitted (GCRA refill)."""
    xdp.set_rules([XdpRule("r", limit=100, burst=1, protocol="udp")])
    assert run(xdp, "10.2.0.1") == XDP_PASS and run(xdp, "10.2.0.1") == XDP_DROP
    t0 = time.monotonic()
    deadline = t0 + 0.2
    while time.monotonic() < deadline:
        time.sleep(0.01)
    elapsed = time.monotonic() - t0
    admitted = sum(run(xdp, "10.2.0.1") == XDP_PASS for _ in range(100))
    assert admitted <= int(elapsed * 100) + 2 and admitted >= 1


@pytest.mark.netns
def test_exempt_before_ban_before_deny_before_rules(xdp):
    xdp.set_rules([XdpRule("r", limit=1, period_s=60, burst=1)])
    xdp.add_bans(["10.3.0.0/16", "2001:db8:3::/48"])
    xdp.set_prefixes("exempt", ["10.3.1.0/24", "2001:db8:3:1::/64"])
    xdp.set_prefixes("deny", ["10.4.0.0/16"])
    assert all(run(xdp, "10.3.1.7") == XDP_PASS for _ in range(5)), "exempt beats ban and rule"
    assert all(run(xdp, "2001:db8:3:1::7") == XDP_PASS for _ in range(5))
    assert run(xdp, "10.3.2.7") == XDP_DROP and run(xdp, "2001:db8:3:2::7") == XDP_DROP
    assert run(xdp, "10.4.9.9") == XDP_DROP
    assert [run(xdp, "10.5.0.1") for _ in range(2)] == [XDP_PASS, XDP_DROP]
    c = xdp.counters()
    assert (c.exempt, c.banned, c.denied, c.rules) == (10, 2, 1, [(1, 1)])
    assert xdp.prefixes("bans") == {
        ipaddress.ip_network("10.3.0.0/16"): 0,
        ipaddress.ip_network("2001:db8:3::/48"): 0,
    }


@pytest.mark.netns
def test_changed_rule_slot_forgets_its_buckets(xdp):
    a = XdpRule("a", limit=1, period_s=60, burst=1, protocol="udp")
    xdp.set_rules([a])
    assert [run(xdp, "10.6.0.1") for _ in range(2)] == [XDP_PASS, XDP_DROP]
    xdp.set_rules([a])  # unchanged: bucket kept
    assert run(xdp, "10.6.0.1") == XDP_DROP and xdp.bucket_count() == 1
    xdp.set_rules([XdpRule("a", limit=2, period_s=60, burst=1, protocol="udp")])
    assert xdp.bucket_count() == 0 and run(xdp, "10.6.0.1") == XDP_PASS


@pytest.mark.netns
def test_expired_bans_are_removed_by_expire_bans(xdp):
    now = time.time()
    xdp.add_bans({"10.7.0.1/32": now - 1, "10.7.0.2/32": now + 3600, "2001:db8:7::/48": now - 5, "10.7.0.3/32": 0})
    assert run(xdp, "10.7.0.1") == XDP_DROP, "the program itself does not look at expiry"
    gone = xdp.expire_bans(now)
    assert sorted(map(str, gone)) == ["10.7.0.1/32", "2001:db8:7::/48"]
    assert run(xdp, "10.7.0.1") == XDP_PASS and run(xdp, "10.7.0.2") == XDP_DROP and run(xdp, "10.7.0.3") == XDP_DROP
    st_ = xdp.status()
    assert st_["loaded"] and st_["entries"]["bans4"] == 2 and st_["entries"]["bans6"] == 0


@pytest.mark.netns
def test_100k_bans_in_one_batch(xdp):
    bans = [str(ipaddress.IPv4Address(0x0B000000 + i)) + "/32" for i in range(100_000)]
    t0 = time.perf_counter()
    assert xdp.add_bans(bans) == 100_000
    took = time.perf_counter() - t0
    print(f"100k bans written in {took:.3f} s")
    assert xdp.map("bans4")._batch_ok is True, "BPF_MAP_UPDATE_BATCH was not used on the LPM trie"
    assert run(xdp, "11.0.195.80") == XDP_DROP and run(xdp, "11.1.134.160") == XDP_PASS


# -- pure encodings -------------------------------------------------------------------
@given(st.integers(0, 2**32 - 1), st.integers(0, 32))
def test_lpm_key_roundtrip_v4(addr, plen):
    net = ipaddress.IPv4Network((addr, plen), strict=False)
    raw = lpm_key(net)
    assert len(raw) == 8 and lpm_key_decode(raw) == net


@given(st.integers(0, 2**128 - 1), st.integers(0, 128))
def test_lpm_key_roundtrip_v6(addr, plen):
    net = ipaddress.IPv6Network((addr, plen), strict=False)
    raw = lpm_key(net)
    assert len(raw) == 20 and lpm_key_decode(raw) == net


@given(st.integers(0, 2**128 - 1), st.integers(0, 128), st.booleans())
def test_fast_prefix_key_matches_ipaddress(addr, plen, six):
    if not six:
        addr, plen = addr % 2**32, plen % 33
    ip = ipaddress.IPv6Address(addr) if six else ipaddress.IPv4Address(addr)
    text = f"{ip}/{plen}"
    net = ipaddress.ip_network(text, strict=False)
    assert prefix_key(text) == (net.version, lpm_key(net))
    assert prefix_key(str(ip)) == (net.version, lpm_key(ipaddress.ip_network(str(ip))))


@pytest.mark.parametrize("bad", ["10.0.0.1/33", "10.0.0/8", "2001:db8::/129", "host.example", "10.0.0.1/x", ""])
def test_bad_prefix_is_named(bad):
    with pytest.raises(ValueError, match="not an address or prefix"):
        prefix_key(bad)


@given(
    limit=st.integers(1, 10**6),
    period=st.sampled_from([1.0, 60.0, 3600.0]),
    burst=st.integers(1, 10_000),
    lo=st.integers(0, 65535),
    span=st.integers(0, 100),
    p4=st.integers(0, 32),
    p6=st.integers(0, 128),
)
def test_rule_encoding(limit, period, burst, lo, span, p4, p6):
    hi = min(65535, lo + span)
    r = XdpRule("x", limit=limit, period_s=period, burst=burst, protocol="tcp", dports=(lo, hi), prefix4=p4, prefix6=p6)
    raw = r.encode()
    assert len(raw) == RULE.size == 40
    d = decode_rule(raw)
    interval = round(period * 1e9 / limit)
    assert d["interval_ns"] == interval and d["tolerance_ns"] == (burst - 1) * interval
    assert (d["protocol"], d["dports"], d["prefix4"], d["prefix6"]) == (6, (lo, hi), p4, p6)


@pytest.mark.parametrize(
    ("kw", "msg"),
    [
        ({"limit": 0}, "limit must be a positive integer"),
        ({"limit": 1, "burst": 0}, "burst must be an integer >= 1"),
        ({"limit": 1, "protocol": "sctp"}, "protocol 'sctp' is not one of"),
        ({"limit": 1, "protocol": "udp", "dports": (10, 5)}, "port range 10-5"),
        ({"limit": 1, "dports": (80, 80)}, "ports need protocol tcp or udp"),
        ({"limit": 1, "prefix4": 33}, r"source prefix \(IPv4\) must be 0..32"),
    ],
)
def test_bad_rule_is_named(kw, msg):
    with pytest.raises(ValueError, match=rf"xdp rule 'bad': {msg}"):
        XdpRule("bad", **kw).encode()


def test_rule_table_bounds():
    assert len(encode_rules([])) == MAX_RULES
    with pytest.raises(ValueError, match=f"at most {MAX_RULES}"):
        encode_rules([XdpRule(f"r{i}", limit=1) for i in range(MAX_RULES + 1)])
    with pytest.raises(ValueError, match="used twice: a"):
        encode_rules([XdpRule("a", limit=1), XdpRule("a", limit=2)])
