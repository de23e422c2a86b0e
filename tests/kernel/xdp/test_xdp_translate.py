"""Which network rules the XDP program can run, and why not (pure)."""

from __future__ import annotations

import pytest

from netlimit.config.validate import load_string
from netlimit.kernel.xdp.maps import MAX_RULES
from netlimit.kernel.xdp.translate import EarlyRefused, early_rules, from_config, refusals

BASE = """
version: 1
exempt: ["10.0.0.0/8"]
deny: ["192.0.2.0/24", "2001:db8:bad::/48"]
network:
{rules}
"""


def cfg(rules: str):
    return load_string(BASE.format(rules=rules), "<test>").config


def test_per_source_rule_translates():
    c = cfg(
        """
  - name: udp-flood
    protocol: udp
    ports: [5000, 5001, "5002-5010"]
    limit: 100/second
    burst: 10
    source_prefix: 24
    source_prefix6: 64
  - name: everyone
    limit: 6/minute
"""
    )
    t = from_config(c, early=lambda r: True)
    assert t.exempt == ["10.0.0.0/8"] and t.deny == ["192.0.2.0/24", "2001:db8:bad::/48"]
    a, b = t.rules
    assert (a.protocol, a.dports, a.limit, a.period_s, a.burst, a.prefix4, a.prefix6) == (
        "udp",
        (5000, 5010),
        100,
        1.0,
        10,
        24,
        64,
    )
    assert (b.protocol, b.dports, b.limit, b.period_s, b.burst, b.prefix4, b.prefix6) == (
        None,
        None,
        6,
        60.0,
        5,
        32,
        128,
    )
    assert t.slot_rule == ["udp-flood", "everyone"]
    for r in t.rules:
        r.encode()


def test_icmp_takes_two_slots_and_per_all_one_bucket():
    c = cfg(
        """
  - name: ping
    protocol: icmp
    limit: 10/second
    per: all
"""
    )
    rules = early_rules(c.network[0])
    assert [(r.protocol, r.family, r.prefix4, r.prefix6) for r in rules] == [("icmp", 4, 0, 0), ("icmpv6", 6, 0, 0)]


@pytest.mark.parametrize(
    ("rule", "why"),
    [
        (
            "method: recent\n    limit: 3/minute\n    protocol: tcp\n    ports: [22]\n    new_connections: true",
            "conntrack",
        ),
        ("protocol: tcp\n    ports: [22]\n    max_connections: 2", "connlimit"),
        ("protocol: tcp\n    ports: [22]\n    new_connections: true\n    limit: 3/minute", "new_connections"),
        ("limit: 3/second\n    per: destination", "per: destination"),
        ("limit: 3/second\n    action: reject", "action: reject"),
        ("limit: 3/second\n    sources: [198.51.100.0/24]", "sources/destinations"),
        ("protocol: udp\n    ports: [53, 5353]\n    limit: 3/second", "one contiguous range"),
    ],
)
def test_what_xdp_cannot_express_is_named(rule, why):
    c = cfg(f"  - name: r1\n    {rule}\n")
    with pytest.raises(EarlyRefused, match=rf"network rule 'r1' cannot be early: .*{why}"):
        from_config(c, early=lambda r: True)
    assert why.split()[0] in refusals(c.network)["r1"]


def test_only_picked_rules_and_the_slot_bound():
    many = "".join(f"  - name: r{i}\n    protocol: icmp\n    limit: 1/second\n" for i in range(MAX_RULES // 2 + 1))
    c = cfg(many + "  - name: conn\n    protocol: tcp\n    ports: [22]\n    max_connections: 2\n")
    assert from_config(c).rules == [], "no rule is early unless picked"
    with pytest.raises(EarlyRefused, match=f"at most {MAX_RULES}"):
        from_config(c, early=lambda r: r.name != "conn")
