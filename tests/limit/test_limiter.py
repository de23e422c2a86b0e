"""The limiter core: every descriptor charged, most constraining reported, shadow
mode, replaces, store failure modes and the breaker (injected clocks, real MemoryStores)."""

from __future__ import annotations

import asyncio
import math

import pytest

from netlimit.config.validate import load_string
from netlimit.limit.limiter import OK, OVER_LIMIT, SRC_CLOSED, SRC_LOCAL, SRC_OPEN, SRC_STORE, Limiter
from netlimit.limit.metrics import Metrics
from netlimit.limit.request import CheckRequest
from netlimit.limit.rules import from_loaded
from netlimit.limit.stores import MemoryStore, StoreError

CONFIG = """
version: 1
http:
  domain: api
  descriptors:
    - key: ip
      rate_limit: {unit: hour, requests_per_unit: 5, name: per-ip}
      algorithm: token_bucket
    - key: user
      rate_limit: {unit: hour, requests_per_unit: 3, name: per-user}
      algorithm: token_bucket
    - key: org
      rate_limit: {unit: hour, requests_per_unit: 10, name: per-org}
      algorithm: token_bucket
    - key: dark
      rate_limit: {unit: hour, requests_per_unit: 1, name: dark}
      algorithm: token_bucket
      shadow_mode: true
    - key: free
      unlimited: true
    - key: new
      rate_limit: {unit: hour, requests_per_unit: 2, name: new-limit}
      replaces: [{name: per-org}]
    - key: minute
      rate_limit: {unit: minute, requests_per_unit: 2, name: per-minute}
    - key: never
      rate_limit: {unit: minute, requests_per_unit: 0, name: blocked}
"""


def check(lim: Limiter, domain: str, descs, cost: int = 1):
    """One request through the engine's public call."""
    return lim.check(CheckRequest.simple(domain, descs, cost))


class Clock:
    def __init__(self, t: float = 1_000_000.0):
        self.t = t

    def __call__(self) -> float:
        return self.t


class FlakyStore:
    """A real MemoryStore behind a switch: ``fail`` makes every call raise StoreError
    (as RedisStore does on timeouts / refused connections)."""

    def __init__(self, clock):
        self.inner = MemoryStore(clock=clock)
        self.fail = False
        self.calls = 0

    async def hit(self, key, limit, cost=1):
        self.calls += 1
        if self.fail:
            raise StoreError("redis: ConnectionError('Connection refused')") from ConnectionRefusedError(111, "x")
        return self.inner.hit_sync(key, limit, cost)

    async def close(self):
        pass


@pytest.fixture
def rules():
    return from_loaded(load_string(CONFIG, "lim.yaml"))


def run(coro):
    return asyncio.run(coro)


def mk(rules, clock, **kw):
    store = kw.pop("store", None) or MemoryStore(clock=clock)
    lim = Limiter(rules, store, clock=clock, **kw)
    return lim, lim.stats


def stats(rules, name):
    (r,) = [r for r in rules.rules if r.name == name]
    s = r.stats
    return {"hits": s.hits, "within": s.within, "over": s.over, "near": s.near, "shadow": s.shadow}


def test_every_matching_descriptor_is_charged_and_the_most_constraining_reported(rules):
    clock = Clock()
    lim, core = mk(rules, clock)
    descs = [[("ip", "1.1.1.1")], [("user", "alice")], [("nomatch", "x")]]

    async def go():
        out = []
        for _ in range(4):
            out.append(await check(lim, "api", descs))
        return out

    r1, r2, r3, r4 = run(go())
    assert r1.code == OK and r1.report.rule.name == "per-user"  # 2 left of 3 < 4 left of 5
    assert [s.code for s in r1.statuses] == [OK, OK, OK]
    assert r1.statuses[2].rule is None and r1.statuses[2].decision is None
    assert (r1.report.decision.limit, r1.report.decision.remaining) == (3, 2)
    assert (r3.report.decision.remaining, r3.code) == (0, OK)
    # 4th: per-user is over; per-ip was still charged (Lyft charges every match)
    assert r4.code == OVER_LIMIT
    assert [s.code for s in r4.statuses] == [OK, OVER_LIMIT, OK]
    assert r4.report.rule.name == "per-user"
    assert r4.statuses[0].decision.remaining == 1  # 5 - 4
    assert math.isclose(r4.report.decision.retry_after, 1200.0)  # 1 token at 3/hour
    # near as Lyft: past floor(0.8 * limit) used -- 5 of 5 for per-ip (none here), 3 of 3 for per-user
    assert stats(rules, "per-ip") == {"hits": 4, "within": 4, "over": 0, "near": 0, "shadow": 0}
    assert stats(rules, "per-user") == {"hits": 4, "within": 3, "over": 1, "near": 1, "shadow": 0}
    assert core.latency.count == 4 and sum(core.latency.counts) == 4 and 0 < core.latency.sum < 1


def test_among_denials_the_longest_retry_is_reported(rules):
    clock = Clock()
    lim, _ = mk(rules, clock)

    async def go():
        for _ in range(3):
            await check(lim, "api", [[("user", "u")]])
        for _ in range(2):
            await check(lim, "api", [[("minute", "m")]])
        return await check(lim, "api", [[("minute", "m")], [("user", "u")]])

    r = run(go())
    assert [s.code for s in r.statuses] == [OVER_LIMIT, OVER_LIMIT]
    assert r.report.rule.name == "per-user"  # 1200 s beats what is left of the minute


def test_equal_remaining_reports_the_smaller_limit(rules):
    clock = Clock()
    lim, _ = mk(rules, clock)

    async def go():
        for _ in range(2):
            await check(lim, "api", [[("ip", "a")]])  # per-ip: 5 -> 3 left
        return await check(lim, "api", [[("ip", "a")], [("user", "b")]])  # ip 2 left of 5, user 2 left of 3

    r = run(go())
    assert r.report.rule.name == "per-user"


def test_shadow_mode_counts_and_never_blocks_or_reports(rules):
    clock = Clock()
    lim, core = mk(rules, clock)

    async def go():
        return [await check(lim, "api", [[("dark", "d")], [("org", "o")]]) for _ in range(3)]

    rs = run(go())
    assert [r.code for r in rs] == [OK, OK, OK]
    assert [r.statuses[0].shadow_over for r in rs] == [False, True, True]
    assert all(r.report.rule.name == "per-org" for r in rs)  # dark is never the reported one
    assert rs[2].statuses[0].decision.allowed is False
    # counted as over (Lyft does) and as shadow; the first one used 100% of 1: near
    assert stats(rules, "dark") == {"hits": 3, "within": 1, "over": 2, "near": 1, "shadow": 2}


def test_shadow_only_request_has_no_report(rules):
    lim, _ = mk(rules, Clock())
    r = run(check(lim, "api", [[("dark", "x")]]))
    assert r.code == OK and r.report is None


def test_unlimited_is_never_charged_and_unknown_domain_allows(rules):
    lim, core = mk(rules, Clock())
    r = run(check(lim, "api", [[("free", "x")]]))
    assert r.code == OK and r.statuses[0].rule.unlimited and r.statuses[0].decision is None
    r2 = run(check(lim, "other-domain", [[("user", "u")], [("ip", "i")]]))
    assert r2.code == OK and [s.rule for s in r2.statuses] == [None, None]
    assert all(stats(rules, n)["hits"] == 0 for n in ("per-user", "per-ip", "free"))


def test_replaces_drops_the_named_limit(rules):
    lim, core = mk(rules, Clock())
    r = run(check(lim, "api", [[("org", "o")], [("new", "n")]]))
    assert r.statuses[0].rule is None and r.statuses[0].code == OK
    assert r.statuses[1].rule.name == "new-limit"
    assert stats(rules, "per-org")["hits"] == 0 and stats(rules, "new-limit")["hits"] == 1


def test_cost_is_charged_to_every_rule(rules):
    lim, core = mk(rules, Clock())
    r = run(check(lim, "api", [[("ip", "a")], [("org", "b")]], cost=4))
    assert [s.decision.remaining for s in r.statuses] == [1, 6]
    r = run(check(lim, "api", [[("ip", "a")], [("org", "b")]], cost=2))
    assert [s.code for s in r.statuses] == [OVER_LIMIT, OK]
    assert r.statuses[1].decision.remaining == 4


def test_a_zero_limit_denies(rules):
    lim, _ = mk(rules, Clock())
    r = run(check(lim, "api", [[("never", "x")]]))
    assert r.code == OVER_LIMIT and r.report.decision.retry_after == math.inf


def test_near_limit_past_80_percent(rules):
    lim, core = mk(rules, Clock())

    async def go():
        for _ in range(10):
            await check(lim, "api", [[("org", "o")]])

    run(go())
    assert stats(rules, "per-org")["near"] == 2  # used 9, 10 of 10: past floor(0.8 * 10), as Lyft


def test_near_limit_ratio_is_lyfts_near_limit_ratio():
    rules = from_loaded(
        load_string(CONFIG.replace("  domain: api", "  domain: api\n  near_limit_ratio: 0.5"), "r.yaml")
    )
    lim, core = mk(rules, Clock())

    async def go():
        for _ in range(10):
            await check(lim, "api", [[("org", "o")]])

    run(go())
    assert stats(rules, "per-org")["near"] == 5  # used 6 to 10 of 10


# --- store failures ---------------------------------------------------------------------


def test_store_failure_local_mode_breaker_probe_and_recovery(rules, caplog):
    clock = Clock()
    store = FlakyStore(clock)
    lim, core = mk(rules, clock, store=store, local=MemoryStore(clock=clock), retry_interval=1.0)

    async def go():
        r = await check(lim, "api", [[("user", "u")]])
        assert r.statuses[0].source == SRC_STORE and r.report.decision.remaining == 2
        store.fail = True
        r = await check(lim, "api", [[("user", "u")]])  # fails, decided locally
        assert r.statuses[0].source == SRC_LOCAL and r.report.decision.remaining == 2  # local state is fresh
        assert not lim.store_available
        calls = store.calls
        for _ in range(5):  # breaker open: the store is not called
            r = await check(lim, "api", [[("user", "u")]])
        assert store.calls == calls
        assert r.code == OVER_LIMIT and r.statuses[0].source == SRC_LOCAL  # the local store limits too
        clock.t += 1.5  # retry interval over: one probe, still down
        await check(lim, "api", [[("user", "v")]])
        assert store.calls == calls + 1 and not lim.store_available
        store.fail = False
        await check(lim, "api", [[("user", "v")]])  # inside the new interval: no call
        assert store.calls == calls + 1
        clock.t += 1.5
        r = await check(lim, "api", [[("user", "u")]])  # probe succeeds: back to the store
        assert lim.store_available and r.statuses[0].source == SRC_STORE
        assert r.report.decision.remaining == 1  # the store's own count continued

    with caplog.at_level("WARNING", logger="netlimit.sidecar"):
        run(go())
    assert core.store_errors == {"timeout": 0, "connection": 2, "error": 0}
    assert core.fallbacks == {"local": 8, "open": 0, "closed": 0}
    msgs = [r.getMessage() for r in caplog.records]
    # one failure line per log interval (10 s), then the recovery line
    assert len([m for m in msgs if m.startswith("store failure (connection)")]) == 1
    assert "deciding with the local in-memory store (on_store_failure: local)" in msgs[0]
    assert msgs[-1].startswith("store is back after 3.0s; 8 decisions were made without it")


def test_concurrent_probe_is_single(rules):
    clock = Clock()
    gate = asyncio.Event

    class SlowStore(FlakyStore):
        async def hit(self, key, limit, cost=1):
            self.calls += 1
            await self.release.wait()
            raise StoreError("redis: TimeoutError()") from TimeoutError()

    store = SlowStore(clock)

    async def go():
        store.release = gate()
        store.release.set()
        lim, core = mk(rules, clock, store=store)
        await check(lim, "api", [[("user", "u")]])  # opens the breaker
        clock.t += 2
        store.release = gate()
        tasks = [asyncio.create_task(check(lim, "api", [[("user", "u")]])) for _ in range(5)]
        await asyncio.sleep(0.01)
        assert store.calls == 2  # only one probe in flight
        store.release.set()
        res = await asyncio.gather(*tasks)
        assert all(r.statuses[0].source == SRC_LOCAL for r in res)
        assert core.store_errors["timeout"] == 2

    run(go())


def test_store_failure_open_and_closed_modes(rules):
    clock = Clock()
    for mode in ("open", "closed"):
        store = FlakyStore(clock)
        store.fail = True
        lim, core = mk(rules, clock, store=store, on_store_failure=mode, retry_interval=2.0)
        r = run(check(lim, "api", [[("user", "u")], [("dark", "d")], [("nomatch", "x")]]))
        if mode == "open":
            assert r.code == OK and r.report is None
            assert [s.source for s in r.statuses] == [SRC_OPEN, SRC_OPEN, ""]
        else:
            assert r.code == OVER_LIMIT
            assert [s.code for s in r.statuses] == [OVER_LIMIT, OK, OK]  # shadow still never blocks
            st = r.report
            assert st.source == SRC_CLOSED and st.rule.name == "per-user"
            assert (st.decision.allowed, st.decision.retry_after, st.decision.limit) == (False, 2.0, 3)
        assert core.fallbacks[mode] == 2


def test_set_rules_swaps_atomically_and_updates_mode(rules):
    lim, _ = mk(rules, Clock())
    new = from_loaded(
        load_string(
            CONFIG.replace("requests_per_unit: 3, name: per-user", "requests_per_unit: 30, name: per-user"), "new.yaml"
        )
    )
    lim.set_rules(new, "closed")
    r = run(check(lim, "api", [[("user", "u")]]))
    assert r.report.decision.limit == 30 and lim.on_store_failure == "closed"


def test_metrics_hooks_count_per_rule():
    rules = from_loaded(load_string(CONFIG, "m.yaml"))
    lim = Limiter(rules, MemoryStore(clock=Clock()))
    m = Metrics(lim)

    async def go():
        for _ in range(3):
            await check(lim, "api", [[("dark", "d")], [("user", "u")]])
        await check(lim, "api", [[("user", "u")]])

    run(go())
    text = m.render().decode()
    for line in (
        'netlimit_http_rule_hits_total{domain="api",rule="per-user"} 4.0',
        'netlimit_http_rule_over_limit_total{domain="api",rule="per-user"} 1.0',
        'netlimit_http_rule_within_limit_total{domain="api",rule="per-user"} 3.0',
        'netlimit_http_rule_near_limit_total{domain="api",rule="per-user"} 1.0',  # used 3 of 3 (>= 2.4)
        'netlimit_http_rule_over_limit_total{domain="api",rule="dark"} 2.0',
        'netlimit_http_rule_shadow_over_limit_total{domain="api",rule="dark"} 2.0',
        "netlimit_http_decision_seconds_count 4.0",
        "netlimit_http_rules 8.0",
    ):
        assert line in text, line
    # a reload drops the series of a removed rule and keeps the counts of those that stay
    lim.set_rules(from_loaded(load_string(CONFIG.replace("name: dark", "name: dark2"), "m2.yaml")))
    text = m.render().decode()
    assert 'rule="dark"' not in text
    assert 'netlimit_http_rule_hits_total{domain="api",rule="dark2"} 0.0' in text
    assert 'netlimit_http_rule_hits_total{domain="api",rule="per-user"} 4.0' in text


def test_leaky_bucket_queue_mode_reports_the_delay():
    text = """
version: 1
http:
  domain: api
  descriptors:
    - key: q
      rate_limit: {unit: second, requests_per_unit: 2, name: queued}
      algorithm: leaky_bucket
      burst: 2
      delay: true
    - key: dq
      rate_limit: {unit: second, requests_per_unit: 1, name: dark-queue}
      algorithm: leaky_bucket
      delay: true
      shadow_mode: true
"""
    rules = from_loaded(load_string(text, "q.yaml"))
    clock = Clock()
    lim = Limiter(rules, MemoryStore(clock=clock))

    async def go():
        return [await check(lim, "api", [[("q", "x")], [("dq", "y")]]) for _ in range(4)]

    rs = run(go())
    # one at once, two queued 0.5 s apart (nginx limit_req burst=2 without nodelay), then denied
    assert [r.code for r in rs] == [OK, OK, OK, OVER_LIMIT]
    assert [r.delay for r in rs] == [0.0, 0.5, 1.0, 0.0]  # the shadow rule's queue never delays


# --- Lyft's modes: quota_mode, SHADOW_MODE, QUOTA_MODE; several domains -----------------

MODES = """
version: 1
http:
  domain: api
  {extra}
  descriptors:
    - key: plain
      rate_limit: {{unit: hour, requests_per_unit: 1}}
    - key: quota
      quota_mode: true
      rate_limit: {{unit: hour, requests_per_unit: 1}}
    - key: detailed
      detailed_metric: true
      rate_limit: {{unit: hour, requests_per_unit: 5}}
"""


def modes(extra: str = ""):
    return from_loaded(load_string(MODES.format(extra=extra), "modes.yaml"))


def test_quota_mode_denies_only_when_every_quota_descriptor_is_over():
    lim, _ = mk(modes(), Clock())
    q = [("quota", "a")]
    run(check(lim, "api", [q]))
    r = run(check(lim, "api", [q, [("quota", "b")]]))
    assert r.code == OK and [s.code for s in r.statuses] == [OVER_LIMIT, OK]
    assert r.report.rule.name == "quota"  # the reported status is the passing one
    r = run(check(lim, "api", [q, [("quota", "b")]]))
    assert r.code == OVER_LIMIT and r.report.decision.allowed is False
    r = run(check(lim, "api", [q, [("unknown", "x")]]))  # no other quota descriptor: over
    assert r.code == OVER_LIMIT


def test_global_quota_mode_counts_every_descriptor_and_shadow_mode_never_refuses():
    lim, _ = mk(modes("quota_mode: true"), Clock())
    run(check(lim, "api", [[("plain", "a")]]))
    r = run(check(lim, "api", [[("plain", "a")], [("unknown", "x")]]))  # an unmatched one passes
    assert r.code == OK and [s.code for s in r.statuses] == [OVER_LIMIT, OK]
    lim, core = mk(modes("shadow_mode: true"), Clock())
    run(check(lim, "api", [[("plain", "a")]]))
    r = run(check(lim, "api", [[("plain", "a")]]))
    assert r.code == OK and r.statuses[0].code == OVER_LIMIT and r.report is None and core.global_shadow == 1


def test_detailed_metric_counts_per_value_on_the_fast_path():
    rs = modes()
    lim, _ = mk(rs, Clock())
    for v in ("a", "a", "b"):
        assert isinstance(lim.check_fast([[("detailed", v)]]), tuple)  # the HTTP endpoints' path
    (r,) = [x for x in rs.rules if x.name == "detailed"]
    values = r.stats.values
    assert {k: (s.hits, s.within, s.near) for k, s in values.items()} == {
        "api.detailed_a": (2, 2, 0),
        "api.detailed_b": (1, 1, 0),
    }
    for _ in range(4):
        lim.check_fast([[("detailed", "b")]])
    assert (values["api.detailed_b"].hits, values["api.detailed_b"].near, values["api.detailed_b"].over) == (5, 1, 0)


def test_requests_are_routed_by_domain(tmp_path):
    conf = tmp_path / "lyft"
    conf.mkdir()
    (conf / "other.yaml").write_text(
        "domain: other\ndescriptors:\n  - key: k\n    rate_limit: {unit: hour, requests_per_unit: 1}\n"
    )
    (tmp_path / "n.yaml").write_text(MODES.format(extra="lyft_config_dir: lyft"))
    from netlimit.config.validate import load_file

    rs = from_loaded(load_file(tmp_path / "n.yaml"))
    lim, _ = mk(rs, Clock())
    assert run(check(lim, "other", [[("k", "v")]])).code == OK
    r = run(check(lim, "other", [[("k", "v")]]))
    assert r.code == OVER_LIMIT and r.report.rule.domain == "other"
    assert run(check(lim, "api", [[("k", "v")]])).statuses[0].rule is None  # not a rule of "api"
    assert run(check(lim, "nope", [[("k", "v")]])).code == OK
    # the counters of every domain survive a reload
    (r2,) = [x for x in rs.all_rules if x.domain == "other"]
    rs2 = from_loaded(load_file(tmp_path / "n.yaml"))
    lim.set_rules(rs2)
    assert [x.stats for x in rs2.all_rules if x.domain == "other"] == [r2.stats]


class ShardedStore(FlakyStore):
    """Two servers by key (as a Redis Cluster's primaries): keys ending in "1" live on
    b, the others on a; ``down`` names the failing one."""

    def __init__(self, clock):
        super().__init__(clock)
        self.down: str | None = None

    def breaker_of(self, key, limit):
        return "b" if key.endswith("1") else "a"

    async def hit(self, key, limit, cost=1):
        self.calls += 1
        if self.breaker_of(key, limit) == self.down:
            raise StoreError("redis: ConnectionError('Connection refused')") from ConnectionRefusedError(111, "x")
        return self.inner.hit_sync(key, limit, cost)


@pytest.mark.parametrize("mode", ["local", "open", "closed"])
def test_one_breaker_per_part_of_the_store(rules, mode, caplog):
    """A store in parts (breaker_of): a failing part opens its own breaker; keys on the
    other part stay on the store, exact, while keys on the failing one follow
    on_store_failure until it is back (issue 35)."""
    clock = Clock()
    store = ShardedStore(clock)

    async def go():
        lim, core = mk(rules, clock, store=store, on_store_failure=mode, retry_interval=2.0)
        store.down = "b"
        healthy, sick = [], []
        for _ in range(5):  # per-user: 3 per hour
            healthy.append(await check(lim, "api", [[("user", "u0")]]))
            sick.append(await check(lim, "api", [[("user", "u1")]]))
        assert [r.statuses[0].source for r in healthy] == [SRC_STORE] * 5
        assert [r.code for r in healthy] == [OK, OK, OK, OVER_LIMIT, OVER_LIMIT]  # exact: the shared count
        want = {"local": SRC_LOCAL, "open": SRC_OPEN, "closed": SRC_CLOSED}[mode]
        assert [r.statuses[0].source for r in sick] == [want] * 5
        assert not lim.store_available and lim.stores_down() == ["b"]
        assert core.fallbacks[mode] == 5
        store.down = None
        clock.t += 2.5  # the retry interval: the next decision on b probes it
        r = await check(lim, "api", [[("user", "u1")]])
        assert r.statuses[0].source == SRC_STORE
        assert lim.store_available and lim.stores_down() == []

    with caplog.at_level("WARNING", logger="netlimit.limit"):
        run(go())
    msgs = [r.getMessage() for r in caplog.records]
    assert any("for the keys on b (the others go on)" in m for m in msgs)
    assert any(m.startswith("store b is back after 2.5s; 5 decisions were made without it") for m in msgs)
