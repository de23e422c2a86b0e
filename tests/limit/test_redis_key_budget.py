"""A rule's max_keys bounds what it writes to Redis too (issue 29, item 9): at
most max_keys new keys per period of the rule (per sidecar); a key beyond it is
decided as on_store_failure says, counted per rule, never written.  A real Redis."""

from __future__ import annotations

import asyncio
import textwrap
import uuid

import pytest
import redis

from netlimit.config.validate import load_string
from netlimit.limit.keybudget import KeyBudget
from netlimit.limit.limiter import SRC_LOCAL, SRC_OPEN, SRC_STORE, Limiter
from netlimit.limit.metrics import Metrics
from netlimit.limit.request import CheckRequest
from netlimit.limit.rules import from_loaded
from netlimit.limit.stores import RedisStore

CONFIG = textwrap.dedent("""\
    version: 1
    http:
      domain: api
      descriptors:
        - key: day
          max_keys: 5
          rate_limit: {unit: day, requests_per_unit: 100, name: per-day}
        - key: free
          rate_limit: {unit: day, requests_per_unit: 100, name: no-budget}
    """)


class Clock:
    t = 1_000_000.0

    def __call__(self) -> float:
        return self.t


@pytest.mark.parametrize("mode, src", [("local", SRC_LOCAL), ("open", SRC_OPEN)])
def test_new_keys_beyond_max_keys_are_not_written(redis_server, mode, src, caplog):
    prefix = f"nlkb-{uuid.uuid4().hex[:8]}"
    clock = Clock()
    r = redis.Redis(port=redis_server.port)

    def written() -> int:
        return sum(1 for _ in r.scan_iter(match=f"{prefix}:*", count=1000))

    async def go():
        store = RedisStore(redis_server.url, timeout_ms=1000, key_prefix=prefix)
        lim = Limiter(from_loaded(load_string(CONFIG, "kb.yaml")), store, on_store_failure=mode, clock=clock)
        try:
            srcs = []
            for i in range(20):
                res = await lim.check(CheckRequest.simple("api", [[("day", f"client-{i}")]]))
                srcs.append(res.statuses[0].source)
            assert srcs == [SRC_STORE] * 5 + [src] * 15
            assert written() == 5
            # the keys already written keep going to Redis
            res = await lim.check(CheckRequest.simple("api", [[("day", "client-0")]]))
            assert res.statuses[0].source == SRC_STORE and res.statuses[0].decision.remaining == 98
            # a rule without max_keys is not bounded on Redis
            for i in range(20):
                res = await lim.check(CheckRequest.simple("api", [[("free", f"client-{i}")]]))
                assert res.statuses[0].source == SRC_STORE
            assert lim.stats.over_key_budget == {("api", "per-day"): 15}
            assert lim.store_available  # a budget is not a store failure
            text = Metrics(lim).render().decode()
            assert 'netlimit_http_store_key_budget_exceeded_total{domain="api",rule="per-day"} 15.0' in text
            # the next period: a new budget of new keys
            clock.t += 86400
            res = await lim.check(CheckRequest.simple("api", [[("day", "client-19")]]))
            assert res.statuses[0].source == SRC_STORE
        finally:
            await lim.close()

    with caplog.at_level("WARNING", logger="netlimit.limit"):
        asyncio.run(go())
    lines = [m.getMessage() for m in caplog.records if "wrote its max_keys" in m.getMessage()]
    assert len(lines) == 1 and "rule 'per-day' (domain api) wrote its max_keys of 5 new keys" in lines[0]


def test_key_budget_windows():
    kb = KeyBudget(2, 10)
    assert [kb.admit(k, 5) for k in "abc"] == [True, True, False]
    # the next period: a new budget of 2; a and b were written last period (still alive)
    assert kb.admit("a", 15) and kb.admit("c", 15)
    assert not kb.admit("d", 15)
    assert kb.admit("b", 16)  # not counted again, but known: it goes to the store
    # periods later: nothing is known, the budget is new
    assert [kb.admit(k, 45) for k in "dxy"] == [True, True, False]
