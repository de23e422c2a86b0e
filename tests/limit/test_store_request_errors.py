"""One request's arguments never switch the shared store off (issue 29, item 7):
a real Redis refuses one call (an expiry it cannot set), that one decision
follows on_store_failure, the breaker stays closed and every other request is
still decided by Redis.  Only timeouts, lost connections and failover replies
open the breaker."""

from __future__ import annotations

import asyncio
import textwrap
import uuid

import pytest

from netlimit.config.validate import load_string
from netlimit.errors import StoreError
from netlimit.limit.limiter import OK, SRC_LOCAL, SRC_OPEN, SRC_STORE, Limiter, _trips
from netlimit.limit.metrics import Metrics
from netlimit.limit.request import CheckRequest, Override
from netlimit.limit.rules import from_loaded
from netlimit.limit.stores import RedisStore
from netlimit.limit.stores.resp import ReplyError, RespConnectionError, RespTimeoutError

CONFIG = textwrap.dedent("""\
    version: 1
    http:
      domain: api
      descriptors:
        - key: k
          rate_limit: {unit: minute, requests_per_unit: 3}
    """)


def _limiter(url: str, mode: str) -> Limiter:
    rs = from_loaded(load_string(CONFIG, "r.yaml"))
    store = RedisStore(url, timeout_ms=500, key_prefix=f"nlreq-{uuid.uuid4().hex[:8]}")
    return Limiter(rs, store, on_store_failure=mode, retry_interval=30.0)


@pytest.mark.parametrize("mode, src", [("local", SRC_LOCAL), ("open", SRC_OPEN)])
def test_a_call_redis_refuses_does_not_open_the_breaker(redis_server, mode, src, caplog):
    async def go():
        lim = _limiter(redis_server.url, mode)
        try:
            # past the door's bounds on purpose (build_request refuses it): 2^32-1 years,
            # a PX Redis answers "invalid expire time" to
            bad = CheckRequest("api", [[("k", "bad")]], [1], [Override("year", 5, 2**32 - 1)])
            for _ in range(5):
                r = await lim.check(bad)
                assert r.code == OK and r.statuses[0].source == src
            assert lim.store_available
            assert lim.stats.store_errors == {"timeout": 0, "connection": 0, "error": 0}
            assert lim.stats.request_errors == 5
            assert lim.stats.fallbacks == {"local": 0, "open": 0, "closed": 0}
            # everyone else is still decided by Redis, with Redis' counts
            good = CheckRequest.simple("api", [[("k", "good")]])
            rems = []
            for _ in range(4):
                r = await lim.check(good)
                assert r.statuses[0].source == SRC_STORE
                rems.append(r.statuses[0].decision.remaining)
            assert rems == [2, 1, 0, 0]
            text = Metrics(lim).render().decode()
            assert "netlimit_http_store_request_errors_total 5.0" in text
            assert "netlimit_http_store_up 1.0" in text
        finally:
            await lim.close()

    with caplog.at_level("WARNING", logger="netlimit.limit"):
        asyncio.run(go())
    lines = [r.getMessage() for r in caplog.records]
    assert len([m for m in lines if m.startswith("the store refused one decision")]) == 1  # rate-limited
    assert not [m for m in lines if m.startswith("store failure")]


def test_what_trips_the_breaker():
    def wrapped(e: BaseException) -> StoreError:
        try:
            raise StoreError(f"redis fixed_window for 'k': {e!r}") from e
        except StoreError as s:
            return s

    assert _trips(wrapped(RespTimeoutError("t")))
    assert _trips(wrapped(RespConnectionError("lost")))
    assert _trips(wrapped(ConnectionRefusedError(111, "refused")))
    assert _trips(wrapped(ReplyError("LOADING Redis is loading the dataset in memory")))
    assert _trips(wrapped(ReplyError("READONLY You can't write against a read only replica.")))
    assert not _trips(wrapped(ReplyError("ERR Error running script: invalid expire time in 'set' command")))
    assert not _trips(wrapped(ValueError("unexpected reply")))
    assert not _trips(KeyError("a bug"))
