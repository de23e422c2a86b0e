"""Actions: request -> descriptor lists; who the client is (X-Forwarded-For trust)."""

from __future__ import annotations

import ipaddress

import pytest
from hypothesis import given
from hypothesis import strategies as st
from multidict import CIMultiDict, CIMultiDictProxy

from netlimit.limit.actions import (
    ActionPlan,
    BadAddress,
    ClientKey,
    TrustedProxies,
    client_address,
    normalize_path,
    path_function,
    path_of_uri,
)


def nets(*cidrs):
    return [ipaddress.ip_network(c) for c in cidrs]


def H(**kw):
    d = CIMultiDict()
    for k, v in kw.items():
        d.add(k.replace("_", "-"), v)
    return CIMultiDictProxy(d)


# --- client address ------------------------------------------------------------------


def test_no_trusted_proxies_means_the_peer_even_with_xff():
    t = TrustedProxies([])
    assert client_address("203.0.113.9", "1.1.1.1", t) == "203.0.113.9"


def test_spoofed_xff_from_an_untrusted_peer_is_ignored():
    t = TrustedProxies(nets("10.0.0.0/8"))
    assert client_address("203.0.113.9", "1.1.1.1", t) == "203.0.113.9"
    assert client_address("203.0.113.9", "10.0.0.5, 1.1.1.1", t) == "203.0.113.9"


def test_trusted_peer_gives_the_rightmost_untrusted_hop():
    t = TrustedProxies(nets("10.0.0.0/8", "192.168.0.0/16"))
    # client spoofs "6.6.6.6" in front; the real client 198.51.100.7 was appended by our proxies
    assert client_address("10.0.0.1", "6.6.6.6, 198.51.100.7, 192.168.1.1", t) == "198.51.100.7"
    assert client_address("10.0.0.1", "198.51.100.7", t) == "198.51.100.7"


def test_all_hops_trusted_gives_the_leftmost():
    t = TrustedProxies(nets("10.0.0.0/8"))
    assert client_address("10.0.0.1", "10.1.1.1, 10.2.2.2", t) == "10.1.1.1"


def test_garbage_hop_stops_the_walk():
    t = TrustedProxies(nets("10.0.0.0/8"))
    assert client_address("10.0.0.1", "1.2.3.4, not-an-ip", t) == "10.0.0.1"
    assert client_address("10.0.0.1", "", t) == "10.0.0.1"
    assert client_address("10.0.0.1", "not-an-ip, 10.9.9.9", t) == "10.9.9.9"


def test_ipv6_ports_and_mapped_addresses():
    t = TrustedProxies(nets("::1/128", "127.0.0.0/8"))
    assert client_address("::1", "2001:db8::1", t) == "2001:db8::1"
    assert client_address("::1", "[2001:db8::2]:443", t) == "2001:db8::2"
    assert client_address("::ffff:127.0.0.1", "198.51.100.1:5555", t) == "198.51.100.1"
    assert client_address("::ffff:203.0.113.1", "1.1.1.1", t) == "203.0.113.1"
    assert client_address("::1", "::ffff:198.51.100.3", t) == "198.51.100.3"


def test_trust_is_per_family():
    t = TrustedProxies(nets("0.0.0.0/0"))
    assert "10.0.0.1" in t and "::1" not in t


# --- paths -----------------------------------------------------------------------------


@pytest.mark.parametrize(
    "uri,path",
    [
        ("/login?next=/x", "/login"),
        ("/a/../login", "/login"),
        ("//login", "/login"),
        ("/./login/", "/login/"),
        ("/%6Cogin", "/login"),
        ("/caf%C3%A9", "/caf\u00e9"),
        ("/bad%FF", "/bad\ufffd"),
        ("/../../etc", "/etc"),
        ("http://example.com/abs?q", "/abs"),
        ("", "/"),
        ("/a#frag", "/a"),
    ],
)
def test_path_of_uri(uri, path):
    assert path_of_uri(uri) == path


def test_normalize_path_fast_path_returns_the_same_object():
    p = "/plain/path"
    assert normalize_path(p) is p


# --- descriptors ---------------------------------------------------------------------------


def test_each_action_list_is_one_descriptor_in_order():
    plan = ActionPlan(
        [["remote_address"], ["path", "remote_address"], ["method", "path"], ["generic:tier=free", "header:X-Api-Key"]]
    )
    d = plan.descriptors(peer="198.51.100.7", method="POST", path="/login", headers=H(X_Api_Key="k1"))
    assert d == [
        [("remote_address", "198.51.100.7")],
        [("path", "/login"), ("remote_address", "198.51.100.7")],
        [("method", "POST"), ("path", "/login")],
        [("tier", "free"), ("header:X-Api-Key", "k1")],
    ]


def test_header_lookup_is_case_insensitive_and_a_missing_header_drops_the_descriptor():
    plan = ActionPlan([["header:x-api-key"], ["header:X-Tenant", "path"], ["path"]])
    d = plan.descriptors(peer="1.2.3.4", method="GET", path="/p", headers=H(X_API_KEY="abc"))
    assert d == [[("header:x-api-key", "abc")], [("path", "/p")]]


def test_path_callable_is_only_called_when_needed():
    calls = []

    def path():
        calls.append(1)
        return "/x"

    ActionPlan([["remote_address"]]).descriptors(peer="1.2.3.4", method="GET", path=path, headers=H())
    assert calls == []
    d = ActionPlan([["path"], ["path", "method"]]).descriptors(peer="1.2.3.4", method="GET", path=path, headers=H())
    assert calls == [1] and d == [[("path", "/x")], [("path", "/x"), ("method", "GET")]]


def test_xff_used_only_from_trusted_proxies_in_descriptors():
    plan = ActionPlan([["remote_address"]], nets("127.0.0.1/32"))
    h = H(X_Forwarded_For="6.6.6.6, 198.51.100.7")
    assert plan.descriptors(peer="127.0.0.1", method="GET", path="/", headers=h) == [
        [("remote_address", "198.51.100.7")]
    ]
    assert plan.descriptors(peer="203.0.113.5", method="GET", path="/", headers=h) == [
        [("remote_address", "203.0.113.5")]
    ]
    assert plan.needs_remote and not plan.needs_path


def test_unknown_action_is_refused():
    with pytest.raises(ValueError):
        ActionPlan([["cookie:x"]])


def test_shipped_http_example_actions_reach_its_rules():
    """rules/http-descriptors.yaml: each action list produces descriptors its rules match."""
    from pathlib import Path

    from netlimit.config.validate import load_file
    from netlimit.limit.rules import from_loaded

    loaded = load_file(Path(__file__).resolve().parents[2] / "rules" / "http-descriptors.yaml")
    rs = from_loaded(loaded)
    http = loaded.config.http
    plan = ActionPlan(http.actions, http.trusted_proxies)
    d = plan.descriptors(
        peer="127.0.0.1", method="POST", path="/login", headers=H(X_Forwarded_For="198.51.100.7", X_Api_Key="key-1")
    )
    assert d == [
        [("remote_address", "198.51.100.7")],
        [("path", "/login"), ("remote_address", "198.51.100.7")],
        [("header:X-Api-Key", "key-1")],
    ]
    assert [rs.match(x).name for x in d] == ["remote_address", "path_/login.remote_address", "header:X-Api-Key"]


# --- issue 29: keys and paths (docs/security.md) ---------------------------------------------

DEFAULT = path_function()
_SEG = st.text(alphabet="abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789-_", min_size=1, max_size=8)


@given(st.lists(_SEG, min_size=1, max_size=4), st.data())
def test_every_case_slash_and_params_variant_of_a_path_is_the_path(segs, data):
    """The default http.path_match: any mix of case, a trailing slash, ;params on
    any segment, repeated slashes and percent-encoded letters is the lower-case
    path; normalizing twice changes nothing."""
    base = "/" + "/".join(s.lower() for s in segs)
    parts = []
    for s in segs:
        s = "".join(c.upper() if data.draw(st.booleans()) else c for c in s)
        if data.draw(st.booleans()):
            s = s[0] + "".join(f"%{ord(c):02X}" if c.isalpha() else c for c in s[1:])
        if data.draw(st.booleans()):
            s += ";jsessionid=" + data.draw(_SEG)
        parts.append(s)
    variant = "/" + ("//" if data.draw(st.booleans()) else "/").join(parts)
    if data.draw(st.booleans()):
        variant += "/"
    assert DEFAULT(variant) == base, variant
    assert DEFAULT(DEFAULT(variant)) == DEFAULT(variant)


def test_path_match_switches():
    assert path_function("sensitive", "keep", "keep")("/Login/;a=1") == path_of_uri("/Login/;a=1") == "/Login/;a=1"
    assert path_function("sensitive", "ignore", "strip")("/Login/;a=1") == "/Login"
    assert path_function("insensitive", "keep", "strip")("/Login/;a=1") == "/login/"
    assert path_function("insensitive", "ignore", "keep")("/Login;a=1/") == "/login;a=1"
    assert DEFAULT("/") == "/" and DEFAULT("//") == "/" and DEFAULT("/;x") == "/"
    assert DEFAULT("/x/..;/login") == "/login"  # Tomcat's ..; is .. once the params are cut
    assert DEFAULT("/login#frag") == "/login" and DEFAULT("/login?x=/A") == "/login"


@given(st.integers(0, 2**64 - 1), st.integers(0, 2**64 - 1))
def test_every_address_of_a_64_is_one_key(a, b):
    key = ClientKey()
    net = 0x20010DB800010002 << 64
    ka = key(str(ipaddress.IPv6Address(net | a)))
    assert ka == key(str(ipaddress.IPv6Address(net | b))) == "2001:db8:1:2::/64"


def test_client_key_forms():
    assert ClientKey()("198.51.100.7") == "198.51.100.7"
    assert ClientKey()("::ffff:198.51.100.7") == "198.51.100.7"
    assert ClientKey(24, 128)("198.51.100.7") == "198.51.100.0/24"
    assert ClientKey(32, 128)("2001:DB8::1") == "2001:db8::1"
    assert ClientKey(32, 48)("2001:db8:1:2::1") == "2001:db8:1::/48"
    assert ClientKey()("fe80::1%eth0") == ClientKey()("fe80::2") == "fe80::/64"


def test_the_plan_keys_peers_and_forwarded_clients_by_prefix():
    plan = ActionPlan([["remote_address"]])
    assert plan.build("2001:db8::1", "GET", "/", {}) == [[("remote_address", "2001:db8::/64")]]
    assert plan.build("198.51.100.7", "GET", "/", {}) == [[("remote_address", "198.51.100.7")]]
    plan = ActionPlan([["remote_address"]], nets("127.0.0.1/32"), (24, 56))
    assert plan.build("127.0.0.1", "GET", "/", {"x-forwarded-for": "2001:db8:0:ff::1%eth0"}) == [
        [("remote_address", "2001:db8::/56")]
    ]
    assert plan.build("127.0.0.1", "GET", "/", {}, "203.0.113.77") == [[("remote_address", "203.0.113.0/24")]]


@pytest.mark.parametrize("elem", ["001.002.003.004", "1.2.3.04", "0x7f.1", "127.1", "01.2.3.4:80", "16909060"])
def test_an_ipv4_in_another_spelling_is_refused_not_keyed(elem):
    t = TrustedProxies(nets("10.0.0.0/8"))
    with pytest.raises(BadAddress):
        client_address("10.0.0.1", f"{elem}, 10.0.0.2", t)
    assert client_address("10.0.0.1", "unknown", t) == "10.0.0.1"  # other garbage: the last trusted hop


def test_zone_ids_are_stripped():
    t = TrustedProxies(nets("10.0.0.0/8"))
    for e in ("fe80::1%eth0", "fe80::1%25eth0", "[fe80::1%eth0]:443"):
        assert client_address("10.0.0.1", e, t) == "fe80::1"


def test_rule_values_are_written_as_requests_are():
    """The http: section's path and address values are normalized like the
    requests' (rules.build), so a rule says /Login or 2001:db8::1 and matches."""
    plan = ActionPlan([["path"]])
    assert plan.rule_value("path", "/Login/") == "/login"
    assert plan.rule_value("path", "/Admin*") == "/admin*"
    assert plan.rule_value("remote_address", "2001:db8::1") == "2001:db8::/64"
    assert plan.rule_value("remote_address", "198.51.100.7") == "198.51.100.7"
    assert plan.rule_value("remote_address", "2001:DB8:0:1::5/64") == "2001:db8:0:1::/64"
    assert plan.rule_value("remote_address", "198.51.100.7/32") == "198.51.100.7"
    assert plan.rule_value("header:X-Api-Key", "Key") == "Key"
    exact = ActionPlan([["path"]], path_match=("sensitive", "keep", "keep"))
    assert exact.rule_value("path", "/Login/") == "/Login/"
