"""envoyproxy/ratelimit compatibility: the configuration shapes of Lyft's README
(our own copies: nested descriptors, key-only, wildcard values, `replaces`,
`unlimited`, `shadow_mode`, detailed_metric) load unchanged -- a Lyft
config.yaml indented under `http:` -- and give, through the gRPC API, the
decisions Lyft's README says they give.

Time is a fixed instant (an injected clock), so Lyft's fixed windows never
roll over in the middle of a test.
"""

from __future__ import annotations

import asyncio
import textwrap
from pathlib import Path

import pytest
from rls_helpers import OK, OVER_LIMIT, U32_MAX, UNIT, desc, serving

from netlimit.config.validate import load_file, load_string
from netlimit.limit.limiter import Limiter
from netlimit.limit.rules import from_loaded
from netlimit.limit.stores import MemoryStore

ROOT = Path(__file__).resolve().parents[2]
NOW = 1_800_000_000.25  # mid-second, mid-minute, mid-hour, mid-day: no window ends during a test


def lyft(config: str) -> Limiter:
    """A Lyft config.yaml, unchanged, under `http:` of a netlimit file."""
    text = "version: 1\nhttp:\n" + textwrap.indent(textwrap.dedent(config).strip() + "\n", "  ")
    rules = from_loaded(load_string(text, "lyft.yaml"))
    return Limiter(rules, MemoryStore(clock=lambda: NOW))


def run(coro):
    return asyncio.run(coro)


async def hits(s, n: int, domain: str, *descs, cost: int = 0) -> list[int]:
    return [(await s.call(domain, *descs, hits=cost)).overall_code for _ in range(n)]


def test_example_1_two_values_of_one_key():
    lim = lyft("""
        domain: mongo_cps
        descriptors:
          - key: database
            value: users
            rate_limit:
              unit: second
              requests_per_unit: 500

          - key: database
            value: default
            rate_limit:
              unit: second
              requests_per_unit: 500
    """)

    async def go():
        async with serving(lim) as s:
            for db in ("users", "default"):
                assert await hits(s, 1, "mongo_cps", [("database", db)], cost=500) == [OK]
                assert await hits(s, 1, "mongo_cps", [("database", db)]) == [OVER_LIMIT]
            r = await s.call("mongo_cps", [("database", "users")])
            assert (r.statuses[0].current_limit.requests_per_unit, r.statuses[0].current_limit.unit) == (
                500,
                UNIT.SECOND,
            )
            # a value not in the config has no limit
            assert await hits(s, 3, "mongo_cps", [("database", "other")], cost=1000) == [OK] * 3

    run(go())


def test_example_2_nested_descriptors_and_a_key_only_leaf():
    lim = lyft("""
        domain: messaging
        descriptors:
          # Only allow 5 marketing messages a day
          - key: message_type
            value: marketing
            descriptors:
              - key: to_number
                rate_limit:
                  unit: day
                  requests_per_unit: 5

          # Only allow 100 messages a day to any unique phone number
          - key: to_number
            rate_limit:
              unit: day
              requests_per_unit: 100
    """)
    marketing = [("message_type", "marketing"), ("to_number", "2061111111")]
    number = [("to_number", "2061111111")]

    async def go():
        async with serving(lim) as s:
            # both descriptors in one request: limited on all of them (a logical OR)
            assert await hits(s, 5, "messaging", marketing, number) == [OK] * 5
            r = await s.call("messaging", marketing, number)
            assert r.overall_code == OVER_LIMIT
            assert [st.code for st in r.statuses] == [OVER_LIMIT, OK]
            assert r.statuses[1].limit_remaining == 94  # the 100/day limit was charged every time
            # each number gets its own 5 (the key-only leaf counts each value apart)
            assert (
                await hits(s, 5, "messaging", [("message_type", "marketing"), ("to_number", "2062222222")]) == [OK] * 5
            )
            # the marketing placeholder alone has no limit
            assert await hits(s, 2, "messaging", [("message_type", "marketing")]) == [OK, OK]

    run(go())


def test_example_3_key_value_is_matched_before_key_alone():
    lim = lyft("""
        domain: edge_proxy_per_ip
        descriptors:
          - key: remote_address
            rate_limit:
              unit: second
              requests_per_unit: 10

          # Black list IP
          - key: remote_address
            value: 50.0.0.5
            rate_limit:
              unit: second
              requests_per_unit: 0
    """)

    async def go():
        async with serving(lim) as s:
            assert await hits(s, 11, "edge_proxy_per_ip", [("remote_address", "50.0.0.1")]) == [OK] * 10 + [OVER_LIMIT]
            assert await hits(s, 2, "edge_proxy_per_ip", [("remote_address", "50.0.0.5")]) == [OVER_LIMIT] * 2

    run(go())


def test_example_4_the_request_depth_must_match_the_config_depth():
    flat = lyft("""
        domain: example4
        descriptors:
          - key: key
            value: value
            rate_limit:
              requests_per_unit: 300
              unit: second
    """)
    nested = lyft("""
        domain: example4
        descriptors:
          - key: key
            value: value
            descriptors:
              - key: subkey
                rate_limit:
                  requests_per_unit: 300
                  unit: second
    """)
    two = [("key", "value"), ("subkey", "subvalue")]

    async def go():
        async with serving(flat) as s:
            r = await s.call("example4", two, hits=301)
            assert r.overall_code == OK and not r.statuses[0].HasField("current_limit")
        async with serving(nested) as s:
            assert await hits(s, 2, "example4", two, cost=300) == [OK, OVER_LIMIT]

    run(go())


def test_example_5_unlimited_inside_rate_limit():
    lim = lyft("""
        domain: internal
        descriptors:
          - key: ldap
            rate_limit:
              unlimited: true

          - key: azure
            rate_limit:
              unit: minute
              requests_per_unit: 100
    """)

    async def go():
        async with serving(lim) as s:
            r = await s.call("internal", [("ldap", "x")], hits=1_000_000)
            assert r.overall_code == OK and r.statuses[0].limit_remaining == U32_MAX
            assert not r.statuses[0].HasField("current_limit")
            rule = next(x for x in s.limiter.rules.rules if x.name == "ldap")
            assert rule.unlimited and rule.stats.hits == 0  # never charged, never sent to the store
            assert await hits(s, 2, "internal", [("azure", "x")], cost=100) == [OK, OVER_LIMIT]

    run(go())


def test_example_6_shadow_mode_is_counted_but_never_enforced():
    lim = lyft("""
        domain: example6
        descriptors:
          - key: service
            descriptors:
              - key: user
                value: user-a
                rate_limit:
                  requests_per_unit: 10
                  unit: second
                shadow_mode: true
              - key: user
                value: user-b
                rate_limit:
                  requests_per_unit: 20
                  unit: second
    """)

    async def go():
        async with serving(lim) as s:
            a = [("service", "auth-service"), ("user", "user-a")]
            b = [("service", "auth-service"), ("user", "user-b")]
            assert await hits(s, 15, "example6", a) == [OK] * 15
            rule = next(x for x in s.limiter.rules.rules if x.path == "service.user_user-a")
            assert (rule.stats.over, rule.stats.shadow) == (5, 5)  # Lyft's over_limit and shadow_mode stats
            assert await hits(s, 21, "example6", b) == [OK] * 20 + [OVER_LIMIT]

    run(go())


def test_example_7_replaces_inside_rate_limit():
    lim = lyft("""
        domain: example7
        descriptors:
          - key: key_1
            value: value_1
            descriptors:
              - key: user
                value: bkthomps
                rate_limit:
                  name: specific_limit
                  requests_per_unit: 5
                  unit: second
          - key: key_2
            value: value_2
            descriptors:
              - key: user
                value: bkthomps
                rate_limit:
                  replaces:
                    - name: specific_limit
                  requests_per_unit: 10
                  unit: second
    """)
    d1 = [("key_1", "value_1"), ("user", "bkthomps")]
    d2 = [("key_2", "value_2"), ("user", "bkthomps")]

    async def go():
        async with serving(lim) as s:
            # both together: only the 10/s applies, and the 5/s is not charged
            assert await hits(s, 11, "example7", d1, d2) == [OK] * 10 + [OVER_LIMIT]
            r = await s.call("example7", d1, d2)
            assert r.statuses[0].code == OK and not r.statuses[0].HasField("current_limit")
            assert await hits(s, 6, "example7", d1) == [OK] * 5 + [OVER_LIMIT]  # 5/s, untouched until now

    run(go())


def test_example_8_detailed_metric_is_accepted_and_decides_as_usual():
    lim = lyft("""
        domain: example8
        descriptors:
          - key: key1
            detailed_metric: true
            rate_limit:
              unit: minute
              requests_per_unit: 10
          - key: key1
            value: value1
            rate_limit:
              unit: minute
              requests_per_unit: 20
    """)

    async def go():
        async with serving(lim) as s:
            assert await hits(s, 2, "example8", [("key1", "unspecified_value")], cost=10) == [OK, OVER_LIMIT]
            assert await hits(s, 1, "example8", [("key1", "unspecified_value2")], cost=10) == [OK]
            assert await hits(s, 2, "example8", [("key1", "value1")], cost=20) == [OK, OVER_LIMIT]

    run(go())


def test_example_9_wildcard_values_count_each_value_apart():
    lim = lyft("""
        domain: example9
        descriptors:
          - key: key1
            value: value*
            rate_limit:
              unit: minute
              requests_per_unit: 20
    """)

    async def go():
        async with serving(lim) as s:
            assert await hits(s, 2, "example9", [("key1", "value_1")], cost=20) == [OK, OVER_LIMIT]
            assert await hits(s, 1, "example9", [("key1", "value_2")], cost=20) == [OK]
            r = await s.call("example9", [("key1", "other")], hits=100)
            assert r.overall_code == OK and not r.statuses[0].HasField("current_limit")

    run(go())


def test_example_9_wildcards_in_the_middle_and_several():
    """Upstream README's example 9 as it now reads: each `*` matches any text,
    wherever it stands."""
    lim = lyft("""
        domain: example9
        descriptors:
          - key: path
            value: /api/*/action
            rate_limit:
              unit: minute
              requests_per_unit: 20
          - key: route
            value: /api/*/resource/*/action
            rate_limit:
              unit: minute
              requests_per_unit: 20
    """)

    async def go():
        async with serving(lim) as s:
            for v in ("/api/123/action", "/api/user-id/action"):
                assert await hits(s, 2, "example9", [("path", v)], cost=20) == [OK, OVER_LIMIT]
            r = await s.call("example9", [("path", "/api/123/other")], hits=100)
            assert r.overall_code == OK and not r.statuses[0].HasField("current_limit")
            for v in ("/api/v1/resource/123/action", "/api/v2/resource/456/action"):
                assert await hits(s, 2, "example9", [("route", v)], cost=20) == [OK, OVER_LIMIT]

    run(go())


# --- Lyft's counting: every hit counts, admitted or not ---------------------------------------

COUNTING = """
    domain: counting
    descriptors:
      - key: per_minute
        rate_limit: {unit: minute, requests_per_unit: 20}
      - key: per_hour
        rate_limit: {unit: hour, requests_per_unit: 1}
      - key: tokens
        rate_limit: {unit: minute, requests_per_unit: 100}
      - key: admitted
        count_denied: false
        rate_limit: {unit: minute, requests_per_unit: 20}
"""


@pytest.fixture(params=["memory", pytest.param("redis", marks=pytest.mark.redis)])
def counting(request):
    text = "version: 1\nhttp:\n" + textwrap.indent(textwrap.dedent(COUNTING).strip() + "\n", "  ")
    rules = from_loaded(load_string(text, "counting.yaml"))
    if request.param == "memory":
        return Limiter(rules, MemoryStore(clock=lambda: NOW))
    from lyft_replay import ClockedRedis

    return Limiter(rules, ClockedRedis(request.getfixturevalue("redis_server").url, lambda: NOW))


def test_denied_hits_count_as_lyft_counts_them(counting):
    """3, 16, 3 hits on 20/minute: the last is over with nothing left (22 > 20);
    after a denied request on 1/hour, a check-only request is over too."""

    async def go():
        async with serving(counting) as s:
            got = []
            for n in (3, 16, 3):
                r = await s.call("counting", desc(("per_minute", "a"), hits=n))
                got.append((r.overall_code, r.statuses[0].limit_remaining))
            assert got == [(OK, 17), (OK, 1), (OVER_LIMIT, 0)]
            r = await s.call("counting", desc(("per_minute", "a"), hits=1))
            assert (r.overall_code, r.statuses[0].limit_remaining) == (OVER_LIMIT, 0)
            # count_denied: false keeps netlimit's earlier counting: the 3 did not count
            got = []
            for n in (3, 16, 3, 1):
                r = await s.call("counting", desc(("admitted", "a"), hits=n))
                got.append((r.overall_code, r.statuses[0].limit_remaining))
            assert got == [(OK, 17), (OK, 1), (OVER_LIMIT, 1), (OK, 0)]

            assert (await s.call("counting", [("per_hour", "b")])).overall_code == OK
            assert (await s.call("counting", [("per_hour", "b")])).overall_code == OVER_LIMIT
            r = await s.call("counting", desc(("per_hour", "b"), hits=0))
            assert (r.overall_code, r.statuses[0].code, r.statuses[0].limit_remaining) == (OVER_LIMIT, OVER_LIMIT, 0)
            assert r.statuses[0].duration_until_reset.seconds == 3600 - int(NOW) % 3600

    run(go())


def test_the_token_quota_pattern_is_enforced(counting):
    """Upstream's token quota: check with 0 hits before the work, charge what it
    used when the response ends.  A final charge that overshoots still counts,
    so the next check is refused until the window ends."""

    async def go():
        async with serving(counting) as s:
            for used in (60, 70):  # 60 fits; 70 more overshoots the 100
                r = await s.call("counting", desc(("tokens", "user-1"), hits=0))
                assert r.overall_code == OK
                await s.call("counting", desc(("tokens", "user-1"), hits=used))
            r = await s.call("counting", desc(("tokens", "user-1"), hits=0))
            assert (r.overall_code, r.statuses[0].limit_remaining) == (OVER_LIMIT, 0)

    run(go())


def test_descriptor_without_limit_or_children_allows_everything():
    lim = lyft("""
        domain: allow
        descriptors:
          - key: whitelisted
    """)

    async def go():
        async with serving(lim) as s:
            assert await hits(s, 2, "allow", [("whitelisted", "x")], cost=1_000_000) == [OK, OK]

    run(go())


@pytest.mark.parametrize(
    "bad, message",
    [
        (
            """
        domain: d
        descriptors:
          - key: k
            rate_limit:
              unlimited: true
              unit: second
              requests_per_unit: 5
     """,
            "should not specify rate limit unit when unlimited",
        ),
        (
            """
        domain: d
        descriptors:
          - key: k
            rate_limit:
              replaces:
                - name: other
     """,
            "missing required field 'unit'",
        ),
    ],
)
def test_lyfts_own_rejections_are_rejected_with_a_line(bad, message):
    from netlimit.config.validate import ConfigError

    text = "version: 1\nhttp:\n" + textwrap.indent(textwrap.dedent(bad).strip() + "\n", "  ")
    with pytest.raises(ConfigError) as ei:
        load_string(text, "lyft.yaml")
    assert any(message in str(p) and p.line > 0 for p in ei.value.problems), ei.value.problems


# --- the copy-ready files in rules/ ------------------------------------------------------------


def _file(name: str) -> Limiter:
    return Limiter(from_loaded(load_file(ROOT / "rules" / name)), MemoryStore(clock=lambda: NOW))


def test_rules_lyft_ratelimit_decides_as_its_comments_say():
    async def go():
        async with serving(_file("lyft-ratelimit.yaml")) as s:
            assert await hits(s, 11, "edge", [("remote_address", "10.1.1.1")]) == [OK] * 10 + [OVER_LIMIT]
            assert await hits(s, 1, "edge", [("remote_address", "50.0.0.5")]) == [OVER_LIMIT]
            assert await hits(s, 6, "edge", [("message_type", "marketing"), ("to_number", "1")]) == [OK] * 5 + [
                OVER_LIMIT
            ]
            r = await s.call("edge", [("source_cluster", "internal")], hits=1_000_000)
            assert r.overall_code == OK and r.statuses[0].limit_remaining == U32_MAX
            assert await hits(s, 2, "edge", [("path", "/api/v1/a")], cost=100) == [OK, OVER_LIMIT]
            assert await hits(s, 1, "edge", [("path", "/api/v1/b")], cost=100) == [OK]
            assert await hits(s, 3, "edge", [("user", "u")], cost=60) == [OK] * 3  # shadow_mode
            free = [("org", "acme"), ("plan", "free")]
            export = [("endpoint", "export"), ("org", "acme"), ("plan", "free")]
            assert await hits(s, 2, "edge", free, export, cost=2500) == [OK, OK]  # 5000 replaces 1000
            assert await hits(s, 1, "edge", free, export) == [OVER_LIMIT]
            assert await hits(s, 2, "edge", free, cost=1000) == [OK, OVER_LIMIT]  # free_plan untouched

    run(go())


def test_rules_lyft_envoy_grpc_decides_as_its_comments_say():
    async def go():
        async with serving(_file("lyft-envoy-grpc.yaml")) as s:
            api = [("route", "api"), ("remote_address", "10.0.0.7")]
            assert await hits(s, 21, "edge-api", api) == [OK] * 20 + [OVER_LIMIT]  # token bucket: burst 20
            r = await s.call("edge-api", [("route", "healthz")], hits=1_000_000)
            assert r.overall_code == OK and r.statuses[0].limit_remaining == U32_MAX
            assert await hits(s, 2, "edge-api", [("api_key", "k")], cost=1000) == [OK, OVER_LIMIT]
            rule = next(x for x in s.limiter.rules.rules if x.name == "api_key")
            assert rule.algorithm == "sliding_window_log"

    run(go())
