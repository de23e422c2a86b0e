"""The ban model: parsing what operators and requests give, who is never banned."""

from __future__ import annotations

import ipaddress

import pytest

from netlimit.bans.model import MAX_REASON, Ban, client_prefix, parse_target, skip_reason
from netlimit.config.units import format_duration, format_left, parse_duration

N = ipaddress.ip_network


def test_parse_target_takes_addresses_and_prefixes_and_says_what_is_wrong():
    assert parse_target("203.0.113.7") == N("203.0.113.7/32")
    assert parse_target(" 2001:db8::/64 ") == N("2001:db8::/64")
    with pytest.raises(ValueError, match=r"did you mean 203\.0\.113\.0/24"):
        parse_target("203.0.113.7/24")
    with pytest.raises(ValueError, match=r"not an IP address"):
        parse_target("example.com")


@pytest.mark.parametrize(
    ("addr", "p4", "p6", "want"),
    [
        ("198.51.100.77", 32, 128, "198.51.100.77/32"),
        ("198.51.100.77", 24, 128, "198.51.100.0/24"),
        ("2001:db8:1:2:3:4:5:6", 32, 64, "2001:db8:1:2::/64"),
        ("::ffff:198.51.100.9", 24, 64, "198.51.100.0/24"),  # an IPv4-mapped client is the IPv4 one
        ("fe80::1%eth0", 32, 64, "fe80::/64"),
    ],
)
def test_client_prefix(addr, p4, p6, want):
    assert client_prefix(addr, p4, p6) == N(want)


@pytest.mark.parametrize("bad", ["", "unknown", "1.2.3", "[::1]", "10.0.0.1:80"])
def test_client_prefix_of_what_is_not_an_address_is_none(bad):
    assert client_prefix(bad, 32, 128) is None


def test_never_banned_exempt_networks_and_prefixes_holding_a_trusted_proxy():
    exempt = [N("10.0.0.0/8"), N("::1/128")]
    proxies = [N("192.0.2.10/32")]
    assert "exempt" in skip_reason(N("10.1.2.0/24"), exempt, proxies)
    assert "exempt" in skip_reason(N("::1/128"), exempt, proxies)
    assert "trusted proxy" in skip_reason(N("192.0.2.0/24"), exempt, proxies)
    assert "trusted proxy" in skip_reason(N("192.0.2.10/32"), exempt, proxies)
    # a ban that merely holds an exempt address is fine: the kernel matches exempt first
    assert skip_reason(N("0.0.0.0/1"), exempt, proxies) is None
    assert skip_reason(N("198.51.100.0/24"), exempt, proxies) is None


def test_details_round_trip_and_hostile_text_is_bounded():
    b = Ban.make(N("203.0.113.0/24"), 100.0, rule="login", reason="x\n" * 500, by="me", added=40.0, origin="http")
    assert "\n" not in b.reason and len(b.reason) == MAX_REASON
    back = Ban.from_store("203.0.113.0/24", 100.0, b.details())
    assert back == b
    assert back.as_json(70.0) == {
        "net": "203.0.113.0/24",
        "left": 30.0,
        "rule": "login",
        "reason": b.reason,
        "by": "me",
        "age": 30.0,
        "origin": "http",
    }


@pytest.mark.parametrize("details", [None, b"", b"{not json", b"[1,2]", b'{"rule": 5, "added": "x"}'])
def test_from_store_survives_bad_details(details):
    b = Ban.from_store(b"198.51.100.1/32", 5.0, details)
    assert b is not None and b.net == N("198.51.100.1/32") and b.rule == "" and b.origin == "manual"


def test_from_store_refuses_a_member_that_is_not_a_prefix():
    assert Ban.from_store("not-an-address", 5.0, None) is None
    assert Ban.from_store("10.0.0.1/24", 5.0, None) is None  # host bits: not something netlimit wrote


def test_durations():
    assert parse_duration("15m") == 900
    assert parse_duration("1h") == 3600
    assert parse_duration(" 2 d ") == 172800
    assert parse_duration(90) == 90
    assert parse_duration("45") == 45
    for bad in ("0s", "-1m", "1w", "soon", True, 1.5):
        with pytest.raises(ValueError):
            parse_duration(bad)
    assert [format_duration(s) for s in (900, 90, 86400, 3600, 1, 0.2)] == ["15m", "90s", "1d", "1h", "1s", "1s"]
    assert [format_left(s) for s in (45.9, 843, 7500, 3 * 86400 + 4 * 3600)] == ["45s", "14m03s", "2h05m", "3d04h"]
