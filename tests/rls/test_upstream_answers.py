"""envoyproxy/ratelimit's answers, replayed through netlimit's gRPC and JSON
doors on the memory store and on a real Redis (its time fixed, as upstream's
tests fix it): the request sequences of test/integration/integration_test.go
(on its runtime directory, loaded as Lyft loads it), the counting cases of
test/redis/fixed_cache_impl_test.go and test/limiter/base_limiter_test.go
(a mocked ``INCRBY`` result there: the same count reached by real requests
here), and the combination cases of test/service/ratelimit_test.go (shadow
mode, quota mode, unlimited, SHADOW_MODE / QUOTA_MODE, dynamic metadata; the
cache's answers mocked there: reached by real requests here).  Compared: the
overall code and, per descriptor, code / limit / remaining /
duration_until_reset.

Not replayed, on purpose (README, "What answers differently"): Lyft's cache
key format (netlimit's keys are injective: tests/limit/test_rules_tree.py),
LIMIT_RESPONSE_HEADERS_ENABLED (netlimit always sends its rate headers),
Redis errors answered as gRPC errors (netlimit: on_store_failure), the local
over-limit cache and STOP_CACHE_KEY_INCREMENT_WHEN_OVERLIMIT (not available).
"""

from __future__ import annotations

import asyncio
import shutil
from pathlib import Path
from typing import Any

import pytest
from lyft_replay import RUNTIME, Clock, St, expected, limiter, rules, serving_doors
from rls_helpers import OK, OVER_LIMIT, U32_MAX, desc, request

STORES = ["memory", pytest.param("redis", marks=pytest.mark.redis)]


@pytest.fixture(params=STORES)
def store(request) -> tuple[str, str | None]:
    if request.param == "memory":
        return "memory", None
    return "redis", request.getfixturevalue("redis_server").url


def doors(rs, store, clock):
    kind, url = store
    return serving_doors(lambda: limiter(rs, kind, clock, url))


async def expect(d, req, code: int, statuses: list[St], now: float) -> None:
    want = expected(code, statuses, now)
    for door, got in await d.ask(req):
        assert got == want, (door, req)


# ================================================================ integration_test.go


def runtime_rules(tmp: Path, **http: Any):
    """The integration tests' runtime directory, loaded as Lyft loads it."""
    files = {p.name: p.read_text() for p in sorted((RUNTIME / "config").glob("*.yaml"))}
    return rules(tmp, files, **http)


def test_basic_config_sequence(store, tmp_path: Path) -> None:
    """testBasicBaseConfig (the local-cache and per-second-Redis variants give
    the same answers there, and so here)."""
    now = 1_800_000_000.0 + 7.0  # no window ends during the sequence
    clock = Clock(now)
    rs = runtime_rules(tmp_path)

    async def go():
        async with doors(rs, store, clock) as d:
            await expect(d, request("foo", [("hello", "world")]), OK, [St()], now)
            await expect(d, request("basic", [("key1", "foo")]), OK, [St(OK, (50, "SECOND"), 49)], now)
            # over the limit for a minute limit: 20, then OVER_LIMIT with 0 left
            for i in range(25):
                over = i >= 20
                await expect(
                    d,
                    request("another", [("key2", "4242")]),
                    OVER_LIMIT if over else OK,
                    [St(OVER_LIMIT if over else OK, (20, "MINUTE"), 0 if over else 20 - (i + 1))],
                    now,
                )
            # two keys in one request: key2 keeps counting while key3 is over
            for i in range(15):
                over = i >= 10
                await expect(
                    d,
                    request("another", [("key2", "4343")], [("key3", "4343")]),
                    OVER_LIMIT if over else OK,
                    [
                        St(OK, (20, "MINUTE"), 20 - (i + 1)),
                        St(OVER_LIMIT if over else OK, (10, "HOUR"), 0 if over else 10 - (i + 1)),
                    ],
                    now,
                )
            # duration_until_reset ticks down (upstream sleeps 2 s; the clock moves here)
            first = (await d.grpc(request("another", [("key4", "durTest")]))).statuses[0].duration_until_reset.seconds
            clock.now += 2
            second = (await d.grpc(request("another", [("key4", "durTest")]))).statuses[0].duration_until_reset.seconds
            assert second == first - 2

    asyncio.run(go())


def test_config_reload_adds_and_removes_a_domain(store, tmp_path: Path) -> None:
    """testConfigReload, at the engine: before reload.yaml is in the directory
    its domain has no limits; after, its limits apply ("block" is a limit of 0).
    (The sidecar's watch of the directory: test_lyft_config_dir.py.)"""
    now = 1_800_000_000.0
    clock = Clock(now)
    rs = runtime_rules(tmp_path)
    kind, url = store

    async def go():
        lim = limiter(rs, kind, clock, url)
        async with serving_doors(lambda: lim, json_door=False) as d:
            await expect(d, request("reload", [("block", "foo")]), OK, [St()], now)
            shutil.copy(RUNTIME / "reload.yaml", tmp_path / "lyft" / "reload.yaml")
            lim.set_rules(runtime_rules(tmp_path))
            await expect(d, request("reload", [("key1", "foo")]), OK, [St(OK, (50, "SECOND"), 49)], now)
            await expect(d, request("reload", [("block", "foo")]), OVER_LIMIT, [St(OVER_LIMIT, (0, "SECOND"), 0)], now)
            (tmp_path / "lyft" / "reload.yaml").unlink()
            lim.set_rules(runtime_rules(tmp_path))
            await expect(d, request("reload", [("block", "foo")]), OK, [St()], now)

    asyncio.run(go())


def test_share_threshold_sequence(store, tmp_path: Path) -> None:
    """testShareThreshold: values under a share_threshold wildcard share one
    counter; without it each value has its own."""
    now = 1_800_000_000.0
    clock = Clock(now)
    rs = runtime_rules(tmp_path)

    async def go():
        async with doors(rs, store, clock) as d:
            for i in range(10):
                await expect(
                    d,
                    request("share-threshold-test", [("files", "files/a.pdf")]),
                    OK,
                    [St(OK, (10, "HOUR"), 10 - (i + 1))],
                    now,
                )
            await expect(
                d,
                request("share-threshold-test", [("files", "files/b.csv")]),
                OVER_LIMIT,
                [St(OVER_LIMIT, (10, "HOUR"), 0)],
                now,
            )
            for i in range(10):
                await expect(
                    d,
                    request("share-threshold-test", [("files_no_share", f"files_no_share/{i}-x")]),
                    OK,
                    [St(OK, (10, "HOUR"), 9)],
                    now,
                )

    asyncio.run(go())


# ================================================================ fixed_cache_impl_test.go

REDIS_CASES = """
domain: domain
descriptors:
  - key: key
    value: value
    rate_limit: {unit: second, requests_per_unit: 10}
  - key: key2
    value: value2
    descriptors:
      - key: subkey2
        value: subvalue2
        rate_limit: {unit: minute, requests_per_unit: 10}
  - key: key3
    value: value3
    rate_limit: {unit: hour, requests_per_unit: 10}
    descriptors:
      - key: subkey3
        value: subvalue3
        rate_limit: {unit: day, requests_per_unit: 10}
  - key: key4
    value: value4
    rate_limit: {unit: hour, requests_per_unit: 15}
  - key: shadow4
    value: value4
    rate_limit: {unit: hour, requests_per_unit: 15}
    shadow_mode: true
  - key: key5
    value: value5
    rate_limit: {unit: second, requests_per_unit: 20}
  - key: key6
    value: value6
    rate_limit: {unit: second, requests_per_unit: 8}
  - key: key7
    value: value7
    rate_limit: {unit: second, requests_per_unit: 20}
  - key: key8
    value: value8
    rate_limit: {unit: second, requests_per_unit: 20}
  - key: key9
    value: value9
    rate_limit: {unit: second, requests_per_unit: 20}
  - key: key10
    value: value10
    rate_limit: {unit: second, requests_per_unit: 10}
  - key: five
    value: value
    rate_limit: {unit: second, requests_per_unit: 5}
  - key: shadow5
    value: value
    rate_limit: {unit: second, requests_per_unit: 5}
    shadow_mode: true
  - key: shadow10
    value: value
    rate_limit: {unit: second, requests_per_unit: 10}
    shadow_mode: true
"""


async def count_to(d, domain: str, entries: list[tuple[str, str]], n: int) -> None:
    """Bring a counter to ``n`` hits (upstream mocks INCRBY's answer instead)."""
    if n:
        await d.grpc(request(domain, desc(*entries, hits=n)))
        if d.json is not None:
            from netlimit.limit.request import CheckRequest

            await d.json.check(CheckRequest(domain, [entries], [n], []))


def redis_rules(tmp: Path):
    return rules(tmp, {"domain.yaml": REDIS_CASES})


#: (upstream test, time, [(entries, count before, hits)], overall code, statuses)
COUNTING = [
    ("testRedis/first", 1234, [([("key", "value")], 4, 1)], OK, [St(OK, (10, "SECOND"), 5)]),
    (
        "testRedis/nil-and-over",
        1234,
        [([("key2", "value2")], 0, 0), ([("key2", "value2"), ("subkey2", "subvalue2")], 10, 1)],
        OVER_LIMIT,
        [St(), St(OVER_LIMIT, (10, "MINUTE"), 0)],
    ),
    (
        "testRedis/check-only-over",  # hits 0 on a counter already at 11 of 10: still over
        1_000_000,
        [([("key3", "value3")], 11, 0), ([("key3", "value3"), ("subkey3", "subvalue3")], 12, 1)],
        OVER_LIMIT,
        [St(OVER_LIMIT, (10, "HOUR"), 0), St(OVER_LIMIT, (10, "DAY"), 0)],
    ),
    ("TestNearLimit/under", 1_000_000, [([("key4", "value4")], 10, 1)], OK, [St(OK, (15, "HOUR"), 4)]),
    ("TestNearLimit/near", 1_000_000, [([("key4", "value4")], 12, 1)], OK, [St(OK, (15, "HOUR"), 2)]),
    ("TestNearLimit/over", 1_000_000, [([("key4", "value4")], 15, 1)], OVER_LIMIT, [St(OVER_LIMIT, (15, "HOUR"), 0)]),
    ("TestNearLimit/hits-3-under", 1234, [([("key5", "value5")], 2, 3)], OK, [St(OK, (20, "SECOND"), 15)]),
    ("TestNearLimit/hits-2-some-near", 1234, [([("key6", "value6")], 5, 2)], OK, [St(OK, (8, "SECOND"), 1)]),
    ("TestNearLimit/hits-3-all-near", 1234, [([("key7", "value7")], 16, 3)], OK, [St(OK, (20, "SECOND"), 1)]),
    (
        "TestNearLimit/hits-3-some-over",
        1234,
        [([("key8", "value8")], 19, 3)],
        OVER_LIMIT,
        [St(OVER_LIMIT, (20, "SECOND"), 0)],
    ),
    (
        "TestNearLimit/hits-7-three-places",
        1234,
        [([("key9", "value9")], 15, 7)],
        OVER_LIMIT,
        [St(OVER_LIMIT, (20, "SECOND"), 0)],
    ),
    (
        "TestNearLimit/hits-3-all-over",
        1234,
        [([("key10", "value10")], 27, 3)],
        OVER_LIMIT,
        [St(OVER_LIMIT, (10, "SECOND"), 0)],
    ),
    ("TestRedisWithJitter", 1234, [([("key", "value")], 4, 1)], OK, [St(OK, (10, "SECOND"), 5)]),
    # TestOverLimitWithLocalCache: the same answers without the local cache
    ("TestOverLimitWithLocalCache/1", 1_000_000, [([("key4", "value4")], 10, 1)], OK, [St(OK, (15, "HOUR"), 4)]),
    ("TestOverLimitWithLocalCache/2", 1_000_000, [([("key4", "value4")], 12, 1)], OK, [St(OK, (15, "HOUR"), 2)]),
    (
        "TestOverLimitWithLocalCache/3",
        1_000_000,
        [([("key4", "value4")], 15, 1)],
        OVER_LIMIT,
        [St(OVER_LIMIT, (15, "HOUR"), 0)],
    ),
    (
        "TestOverLimitWithLocalCache/4",
        1_000_000,
        [([("key4", "value4")], 16, 1)],
        OVER_LIMIT,
        [St(OVER_LIMIT, (15, "HOUR"), 0)],
    ),
    (
        "TestOverLimitWithLocalCacheShadowRule/1",
        1_000_000,
        [([("shadow4", "value4")], 10, 1)],
        OK,
        [St(OK, (15, "HOUR"), 4)],
    ),
    (
        "TestOverLimitWithLocalCacheShadowRule/2",
        1_000_000,
        [([("shadow4", "value4")], 12, 1)],
        OK,
        [St(OK, (15, "HOUR"), 2)],
    ),
    (
        "TestOverLimitWithLocalCacheShadowRule/3",
        1_000_000,
        [([("shadow4", "value4")], 15, 1)],
        OK,
        [St(OK, (15, "HOUR"), 0)],
    ),
    (
        "TestOverLimitWithLocalCacheShadowRule/4",
        1_000_000,
        [([("shadow4", "value4")], 16, 1)],
        OK,
        [St(OK, (15, "HOUR"), 0)],
    ),
    # base_limiter_test.go: GetResponseDescriptorStatus on (before, after)
    ("TestGetResponseStatusEmptyKey", 1234, [([("nokey", "x")], 0, 1)], OK, [St()]),
    (
        "TestGetResponseStatusOverLimit",
        1234,
        [([("five", "value")], 2, 5)],
        OVER_LIMIT,
        [St(OVER_LIMIT, (5, "SECOND"), 0)],
    ),
    (
        "TestGetResponseStatusOverLimitShadowMode",
        1234,
        [([("shadow5", "value")], 2, 5)],
        OK,
        [St(OK, (5, "SECOND"), 0)],
    ),
    ("TestGetResponseStatusBelowLimit", 1234, [([("key", "value")], 2, 4)], OK, [St(OK, (10, "SECOND"), 4)]),
    (
        "TestGetResponseStatusBelowLimitShadowMode",
        1234,
        [([("shadow10", "value")], 2, 4)],
        OK,
        [St(OK, (10, "SECOND"), 4)],
    ),
]


@pytest.mark.parametrize("case, t, steps, code, statuses", COUNTING, ids=[c[0] for c in COUNTING])
def test_counting_as_lyft(case, t, steps, code, statuses, store, tmp_path: Path) -> None:
    clock = Clock(float(t))
    rs = redis_rules(tmp_path)

    async def go():
        async with doors(rs, store, clock) as d:
            for entries, before, _ in steps:
                await count_to(d, "domain", entries, before)
            req = request("domain", *[desc(*e, hits=h) for e, _, h in steps])
            await expect(d, req, code, statuses, float(t))

    asyncio.run(go())


def test_lyft_stats_of_the_near_limit_sequence(tmp_path: Path) -> None:
    """TestNearLimit's counters, which netlimit keeps as Lyft does for allowed
    requests: hits, within, near (the hits past floor(0.8 * limit)).  (A denied
    request's hits all count as over_limit in netlimit; Lyft counts the part
    that was still under the limit as near.)"""
    from netlimit.limit.limiter import Limiter
    from netlimit.limit.stores import MemoryStore

    clock = Clock(1_000_000.0)
    rs = redis_rules(tmp_path)
    lim = Limiter(rs, MemoryStore(clock=clock))
    (rule,) = [r for r in rs.all_rules if r.name == "key4_value4"]

    async def go():
        async with serving_doors(lambda: lim, json_door=False) as d:
            await count_to(d, "domain", [("key4", "value4")], 10)
            base = (rule.stats.hits, rule.stats.within, rule.stats.near, rule.stats.over)
            for _ in range(3):  # 11, 12, 13: near from 13 (> 12 = floor(0.8 * 15))
                await d.grpc(request("domain", [("key4", "value4")]))
            got = (rule.stats.hits, rule.stats.within, rule.stats.near, rule.stats.over)
            assert tuple(g - b for g, b in zip(got, base)) == (3, 3, 1, 0)
            for _ in range(3):  # 14, 15 near; 16 over
                await d.grpc(request("domain", [("key4", "value4")]))
            got = (rule.stats.hits, rule.stats.within, rule.stats.near, rule.stats.over)
            assert tuple(g - b for g, b in zip(got, base)) == (6, 5, 3, 1)
            # hits_addend > 1: only the hits past the threshold are near (8/s: past 6; 20/s: past 16)
            for key, before, hits, near in (("key6", 5, 2, 1), ("key7", 16, 3, 3), ("key5", 2, 3, 0)):
                (r,) = [x for x in rs.all_rules if x.name == f"{key}_value{key[3:]}"]
                await count_to(d, "domain", [(key, f"value{key[3:]}")], before)
                n0 = r.stats.near
                await d.grpc(request("domain", desc((key, f"value{key[3:]}"), hits=hits)))
                assert r.stats.near - n0 == near, key

    asyncio.run(go())


def test_share_threshold_shares_one_counter(store, tmp_path: Path) -> None:
    """TestGenerateCacheKeysWithShareThreshold, by its effect: every value a
    share_threshold wildcard matches (nested too) counts in one counter."""
    share = """
    domain: domain
    descriptors:
      - key: files
        value: files/*
        share_threshold: true
        rate_limit: {unit: second, requests_per_unit: 10}
      - key: parent
        value: value1
        descriptors:
          - key: files
            value: nested/*
            share_threshold: true
            rate_limit: {unit: second, requests_per_unit: 10}
      - key: files
        value: top/*
        share_threshold: true
        descriptors:
          - key: files
            value: nested/*
            share_threshold: true
            rate_limit: {unit: second, requests_per_unit: 10}
    """
    clock = Clock(1234.0)
    rs = rules(tmp_path, {"d.yaml": share})
    groups = [
        [[("files", v)] for v in ("files/a.pdf", "files/b.csv", "files/c.txt", "files/subdir/f.txt")],
        [[("parent", "value1"), ("files", v)] for v in ("nested/file1.txt", "nested/file2.csv")],
        [
            [("files", a), ("files", b)]
            for a, b in (("top/file1.txt", "nested/sub1.txt"), ("top/file2.pdf", "nested/sub2.csv"))
        ],
    ]

    async def go():
        async with doors(rs, store, clock) as d:
            for group in groups:
                for i, entries in enumerate(group):
                    await expect(d, request("domain", entries), OK, [St(OK, (10, "SECOND"), 10 - (i + 1))], 1234.0)

    asyncio.run(go())


# ================================================================ service/ratelimit_test.go

SERVICE = """
domain: {domain}
descriptors:
  - key: foo
    value: bar
    rate_limit: {{unit: minute, requests_per_unit: 10, name: key_name}}
  - key: shadow1
    value: bar
    rate_limit: {{unit: minute, requests_per_unit: 10}}
    shadow_mode: true
  - key: shadow2
    value: bar
    rate_limit: {{unit: minute, requests_per_unit: 10}}
    shadow_mode: true
  - key: regular
    value: limit
    rate_limit: {{unit: minute, requests_per_unit: {regular}}}
    metadata: {{name: service_1}}
  - key: quota
    value: limit
    quota_mode: true
    rate_limit: {{unit: minute, requests_per_unit: {quota}}}
    metadata: {{{quota_meta}: service_2}}
  - key: quota1
    value: limit
    quota_mode: true
    rate_limit: {{unit: minute, requests_per_unit: 5}}
  - key: quota2
    value: limit
    quota_mode: true
    rate_limit: {{unit: minute, requests_per_unit: 3}}
  - key: baz
    value: qux
    rate_limit: {{unlimited: true}}
  - key: counted
    value: bar
    rate_limit: {{unit: minute, requests_per_unit: 10}}
"""


def service_rules(
    tmp: Path, domain: str = "different-domain", regular: int = 10, quota: int = 5, quota_meta: str = "name", **http
):
    return rules(
        tmp, {"s.yaml": SERVICE.format(domain=domain, regular=regular, quota=quota, quota_meta=quota_meta)}, **http
    )


FOO, HELLO = [("foo", "bar")], [("hello", "world")]
#: (upstream test, http settings, config settings, {descriptor: count before}, request descriptors, code, statuses)
SERVICE_CASES: list[tuple[str, dict, dict, list[tuple[list, int]], list, int, list[St]]] = [
    ("TestService/no-limit", {}, {}, [], [HELLO], OK, [St()]),
    (
        "TestService/over-and-none",
        {},
        {},
        [(FOO, 10)],
        [FOO, HELLO],
        OVER_LIMIT,
        [St(OVER_LIMIT, (10, "MINUTE"), 0), St()],
    ),
    (
        "TestService/none-and-over",
        {},
        {},
        [(FOO, 10)],
        [HELLO, FOO],
        OVER_LIMIT,
        [St(), St(OVER_LIMIT, (10, "MINUTE"), 0)],
    ),
    (
        "TestServiceGlobalShadowMode",
        {"shadow_mode": True},
        {},
        [(FOO, 10)],
        [FOO, HELLO],
        OK,
        [St(OVER_LIMIT, (10, "MINUTE"), 0), St()],
    ),
    # (upstream's mocked cache gives the second status of the next two no current_limit; a real one gives it one)
    (
        "TestRuleShadowMode",
        {},
        {},
        [([("shadow1", "bar")], 10), ([("shadow2", "bar")], 10)],
        [[("shadow1", "bar")], [("shadow2", "bar")]],
        OK,
        [St(OK, (10, "MINUTE"), 0), St(OK, (10, "MINUTE"), 0)],
    ),
    (
        "TestMixedRuleShadowMode",
        {},
        {},
        [([("shadow1", "bar")], 10), ([("counted", "bar")], 10)],
        [[("shadow1", "bar")], [("counted", "bar")]],
        OVER_LIMIT,
        [St(OK, (10, "MINUTE"), 0), St(OVER_LIMIT, (10, "MINUTE"), 0)],
    ),
    (
        "TestUnlimited",
        {},
        {},
        [],
        [FOO, HELLO, [("baz", "qux")]],
        OK,
        [St(OK, (10, "MINUTE"), 9), St(), St(OK, None, U32_MAX)],
    ),
    (
        "TestServiceGlobalQuotaMode",
        {"quota_mode": True},
        {},
        [(FOO, 10), ([("quota1", "limit")], 5)],
        [FOO, [("quota1", "limit")]],
        OVER_LIMIT,
        [St(OVER_LIMIT, (10, "MINUTE"), 0), St(OVER_LIMIT, (5, "MINUTE"), 0)],
    ),
    (
        "TestServicePerDescriptorQuotaMode",
        {},
        {"regular": 5},
        [([("regular", "limit")], 5), ([("quota2", "limit")], 2)],
        [[("regular", "limit")], [("quota2", "limit")]],
        OVER_LIMIT,
        [St(OVER_LIMIT, (5, "MINUTE"), 0), St(OK, (3, "MINUTE"), 0)],
    ),
    (
        "TestServiceMixedPerDescriptorModes",
        {},
        {"regular": 5},
        [([("regular", "limit")], 4), ([("quota2", "limit")], 3)],
        [[("regular", "limit")], [("quota2", "limit")]],
        OVER_LIMIT,
        [St(OK, (5, "MINUTE"), 0), St(OVER_LIMIT, (3, "MINUTE"), 0)],
    ),
    (
        "TestServiceMixedPerDescriptorModesUnderLimit",
        {},
        {"regular": 5},
        [([("regular", "limit")], 4), ([("quota2", "limit")], 2)],
        [[("regular", "limit")], [("quota2", "limit")]],
        OK,
        [St(OK, (5, "MINUTE"), 0), St(OK, (3, "MINUTE"), 0)],
    ),
    (
        "TestServiceQuotaModeOnlyAllOverTheLimit",
        {},
        {},
        [([("quota1", "limit")], 5), ([("quota2", "limit")], 3)],
        [[("quota1", "limit")], [("quota2", "limit")]],
        OVER_LIMIT,
        [St(OVER_LIMIT, (5, "MINUTE"), 0), St(OVER_LIMIT, (3, "MINUTE"), 0)],
    ),
    (
        "TestServiceQuotaModeOnlySomeOverTheLimit",
        {},
        {},
        [([("quota1", "limit")], 5), ([("quota2", "limit")], 2)],
        [[("quota1", "limit")], [("quota2", "limit")]],
        OK,
        [St(OVER_LIMIT, (5, "MINUTE"), 0), St(OK, (3, "MINUTE"), 0)],
    ),
    (
        "TestServiceQuotaModeWithShadowMode",
        {"shadow_mode": True},
        {},
        [([("quota1", "limit")], 5), ([("quota2", "limit")], 3)],
        [[("quota1", "limit")], [("quota2", "limit")]],
        OK,
        [St(OVER_LIMIT, (5, "MINUTE"), 0), St(OVER_LIMIT, (3, "MINUTE"), 0)],
    ),
    (
        "TestServiceMixedModeWithShadowMode",
        {"shadow_mode": True},
        {"regular": 5},
        [([("regular", "limit")], 5), ([("quota2", "limit")], 3)],
        [[("regular", "limit")], [("quota2", "limit")]],
        OK,
        [St(OVER_LIMIT, (5, "MINUTE"), 0), St(OVER_LIMIT, (3, "MINUTE"), 0)],
    ),
]


@pytest.mark.parametrize(
    "case, http, cfg, before, descs, code, statuses", SERVICE_CASES, ids=[c[0] for c in SERVICE_CASES]
)
def test_service_combines_as_lyft(case, http, cfg, before, descs, code, statuses, store, tmp_path: Path) -> None:
    now = 1_800_000_000.0
    clock = Clock(now)
    rs = service_rules(tmp_path, **cfg, **http)

    async def go():
        async with doors(rs, store, clock) as d:
            for entries, n in before:
                await count_to(d, "different-domain", entries, n)
            await expect(d, request("different-domain", *descs), code, statuses, now)

    asyncio.run(go())


METADATA_CASES = [
    # (upstream test, regular rpu, quota rpu, quota's metadata key, counts before, overall, the metadata)
    ("TestMetadataReturnedForPassedDescriptors", 10, 5, "name", (4, 5), OK, {"name": "service_1"}),
    (
        "TestMetadataReturnedForAllPassedDescriptors",
        10,
        5,
        "some_other_name",
        (4, 0),
        OK,
        {"name": "service_1", "some_other_name": "service_2"},
    ),
    ("TestOverlappingMetadataReturnsTheFirstValue", 10, 5, "name", (4, 0), OK, {"name": "service_1"}),
]


@pytest.mark.parametrize(
    "case, regular, quota, key, before, code, meta", METADATA_CASES, ids=[c[0] for c in METADATA_CASES]
)
def test_dynamic_metadata_as_lyft(case, regular, quota, key, before, code, meta, tmp_path: Path) -> None:
    """QUOTA_MODE + RESPONSE_DYNAMIC_METADATA: the metadata of the descriptors
    that passed, the first value of a key kept."""
    from google.protobuf.json_format import MessageToDict

    now = 1_800_000_000.0
    clock = Clock(now)
    rs = service_rules(tmp_path, "quota-domain", regular, quota, key, quota_mode=True, response_dynamic_metadata=True)

    async def go():
        async with doors(rs, ("memory", None), clock) as d:
            await count_to(d, "quota-domain", [("regular", "limit")], before[0])
            await count_to(d, "quota-domain", [("quota", "limit")], before[1])
            r = await d.grpc(request("quota-domain", [("regular", "limit")], [("quota", "limit")]))
            assert r.overall_code == code
            md = MessageToDict(r.dynamic_metadata)
            assert md["domain"] == "quota-domain"
            assert md["descriptors"] == [{"entries": ["regular=limit"]}, {"entries": ["quota=limit"]}]
            assert md["metadata"] == meta

    asyncio.run(go())


def test_empty_domain_and_descriptors_are_errors(tmp_path: Path) -> None:
    """TestEmptyDomain, TestEmptyDescriptors: errors, not answers (gRPC
    INVALID_ARGUMENT naming the field)."""
    import grpc

    rs = service_rules(tmp_path)

    async def go():
        async with doors(rs, ("memory", None), Clock(1.0)) as d:
            for req, says in (
                (request("", [("hello", "world")]), "domain must not be empty"),
                (request("test-domain"), "descriptor list must not be empty"),
            ):
                with pytest.raises(grpc.aio.AioRpcError) as ei:
                    await d.grpc(req)
                assert ei.value.code() == grpc.StatusCode.INVALID_ARGUMENT and says in ei.value.details()

    asyncio.run(go())


def test_global_shadow_mode_is_counted(tmp_path: Path) -> None:
    """TestServiceGlobalShadowMode's global_shadow_mode counter."""
    from netlimit.limit.metrics import Metrics

    clock = Clock(1_800_000_000.0)
    rs = service_rules(tmp_path, shadow_mode=True)
    lim = limiter(rs, "memory", clock)

    async def go():
        async with serving_doors(lambda: lim, json_door=False) as d:
            await count_to(d, "different-domain", FOO, 10)
            r = await d.grpc(request("different-domain", FOO, HELLO))
            assert r.overall_code == OK and r.statuses[0].code == OVER_LIMIT
            assert "netlimit_http_global_shadow_mode_total 1.0" in Metrics(lim).render().decode()

    asyncio.run(go())


# ================================================================ examples/ratelimit/config


def test_upstream_example_files_load_and_answer(store, tmp_path: Path) -> None:
    """examples/ratelimit/config (example.yaml: replaces, shadow_mode, unlimited,
    detailed_metric, quota_mode, metadata; config.yaml with a leading ---) load
    as Lyft files and answer as Lyft's semantics say."""
    from lyft_replay import EXAMPLES

    now = 1_800_000_000.0
    clock = Clock(now)
    rs = rules(tmp_path, {p.name: p.read_text() for p in sorted(EXAMPLES.glob("*.yaml"))})
    assert {"rl", "mongo_cps"} <= set(rs.domains)

    async def go():
        async with doors(rs, store, clock) as d:
            # replaces: category=account (4/min) replaces bkthomps (foo/bar=bkthomps, 1/min)
            await expect(
                d,
                request("rl", [("category", "account")], [("foo", "foo"), ("bar", "bkthomps")]),
                OK,
                [St(OK, (4, "MINUTE"), 3), St()],
                now,
            )
            # the 0 limit ("banned") is over with any hit ...
            banned = [("foo", "foo"), ("bar", "banned")]
            await expect(d, request("rl", banned), OVER_LIMIT, [St(OVER_LIMIT, (0, "MINUTE"), 0)], now)
            # ... unless replaced (destination_cluster=override replaces banned_limit)
            await expect(
                d,
                request("rl", [("source_cluster", "proxy"), ("destination_cluster", "override")], banned),
                OK,
                [St(OK, (2, "MINUTE"), 1), St()],
                now,
            )
            # shadow_mode: over the limit, answered OK
            shady = [("foo", "foo"), ("baz", "shady")]
            for i in range(4):
                await expect(d, request("rl", shady), OK, [St(OK, (3, "MINUTE"), max(0, 3 - (i + 1)))], now)
            # unlimited
            await expect(d, request("rl", [("qux", "q")]), OK, [St(OK, None, U32_MAX)], now)
            await expect(d, request("rl", [("foo", "foo"), ("bay", "b")]), OK, [St(OK, None, U32_MAX)], now)
            # quota_mode: one quota descriptor over, the other passing -> OK
            await count_to(d, "rl", [("service", "service_1")], 1)
            await expect(
                d,
                request("rl", [("service", "service_1")], [("service", "service_2")]),
                OK,
                [St(OVER_LIMIT, (1, "MINUTE"), 0), St(OK, (2, "MINUTE"), 1)],
                now,
            )
            # config.yaml (a leading ---)
            await expect(d, request("mongo_cps", [("database", "users")]), OK, [St(OK, (500, "SECOND"), 499)], now)

    asyncio.run(go())
