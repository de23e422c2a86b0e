"""ShouldRateLimit through a real gRPC client and server over loopback, on the
memory store and on a real redis-server: decisions, Lyft's status shapes,
hits_addend, limit overrides, errors, fail-open, health, metrics."""

from __future__ import annotations

import asyncio
import json
import time

import grpc
import pytest
from grpc_health.v1 import health_pb2
from rls_helpers import OK, OVER_LIMIT, U32_MAX, UNIT, desc, headers, make_limiter, request, serving

from netlimit.limit.limiter import Limiter, override_rule
from netlimit.limit.metrics import Metrics
from netlimit.limit.request import Override

CONFIG = """
version: 1
http:
  domain: api
  descriptors:
    - key: remote_address
      rate_limit: {unit: day, requests_per_unit: 3}
    - key: user
      value: vip
      unlimited: true
    - key: user
      rate_limit: {unit: day, requests_per_unit: 2}
      shadow_mode: true
    - key: path
      value: /login
      descriptors:
        - key: remote_address
          rate_limit: {unit: day, requests_per_unit: 2, name: login}
          algorithm: sliding_window_log
    - key: alg
      value: token_bucket
      rate_limit: {unit: day, requests_per_unit: 3}
      algorithm: token_bucket
    - key: alg
      value: leaky_bucket
      rate_limit: {unit: day, requests_per_unit: 3}
      algorithm: leaky_bucket
    - key: alg
      value: fixed_window
      rate_limit: {unit: day, requests_per_unit: 3}
      algorithm: fixed_window
    - key: alg
      value: sliding_window_log
      rate_limit: {unit: day, requests_per_unit: 3}
      algorithm: sliding_window_log
    - key: alg
      value: sliding_window_counter
      rate_limit: {unit: day, requests_per_unit: 3}
      algorithm: sliding_window_counter
    - key: queue
      rate_limit: {unit: second, requests_per_unit: 10}
      algorithm: leaky_bucket
      burst: 5
      delay: true
"""

ALGORITHMS = ("token_bucket", "leaky_bucket", "fixed_window", "sliding_window_log", "sliding_window_counter")


def run(coro):
    return asyncio.run(coro)


@pytest.fixture(params=["memory", "redis"])
def limiter_factory(request):
    """make(config_text=CONFIG, **kw) -> Limiter on the memory store or on the real redis-server."""
    if request.param == "memory":
        return lambda text=CONFIG, **kw: make_limiter(text, **kw)
    server = request.getfixturevalue("redis_server")
    return lambda text=CONFIG, **kw: make_limiter(text, store="redis", redis_url=server.url, **kw)


# ------------------------------------------------------------------------------ decisions


def test_ok_up_to_the_limit_then_over_limit_with_headers_and_body(limiter_factory):
    async def go():
        async with serving(limiter_factory()) as s:
            seen = []
            for _ in range(3):
                r = await s.call("api", [("remote_address", "10.0.0.1")])
                assert r.overall_code == OK
                st = r.statuses[0]
                assert st.code == OK
                assert (st.current_limit.requests_per_unit, st.current_limit.unit, st.current_limit.name) == (
                    3,
                    UNIT.DAY,
                    "remote_address",
                )
                assert 0 < st.duration_until_reset.ToTimedelta().total_seconds() <= 86400
                h = headers(r)
                assert h["X-RateLimit-Limit"] == "3" and "Retry-After" not in h
                assert h["RateLimit-Policy"] == '"remote_address";q=3;w=86400'
                assert not r.raw_body
                seen.append(st.limit_remaining)
            assert seen == [2, 1, 0]
            r = await s.call("api", [("remote_address", "10.0.0.1")])
            assert r.overall_code == OVER_LIMIT and r.statuses[0].code == OVER_LIMIT
            assert r.statuses[0].limit_remaining == 0
            h = headers(r)
            assert h["X-RateLimit-Remaining"] == "0" and int(h["Retry-After"]) >= 1
            assert h["X-RateLimit-Retry-After"] == h["Retry-After"]
            assert h["Content-Type"] == "application/problem+json"
            body = json.loads(r.raw_body)
            assert body["status"] == 429 and body["rule"] == "remote_address" and body["domain"] == "api"
            # another address has its own counter
            assert (await s.call("api", [("remote_address", "10.0.0.2")])).overall_code == OK

    run(go())


@pytest.mark.parametrize("alg", ALGORITHMS)
def test_every_algorithm_decides_through_grpc(limiter_factory, alg):
    async def go():
        async with serving(limiter_factory()) as s:
            codes = await s.codes(4, "api", [("alg", alg)])
            assert codes == [OK, OK, OK, OVER_LIMIT], alg
            r = await s.call("api", [("alg", alg)])
            assert r.statuses[0].current_limit.name == f"alg_{alg}"

    run(go())


def test_statuses_have_lyfts_shapes_one_per_descriptor_in_order():
    async def go():
        async with serving(make_limiter(CONFIG)) as s:
            r = await s.call(
                "api",
                [("nothing", "here")],
                [("user", "vip")],
                [("remote_address", "1.2.3.4")],
                [("remote_address", "1.2.3.4"), ("too", "deep")],
            )
            assert r.overall_code == OK and len(r.statuses) == 4
            none, unlimited, limited, deep = r.statuses
            # no matching rule: OK, no current_limit, remaining 0 (Lyft)
            assert none.code == OK and not none.HasField("current_limit") and none.limit_remaining == 0
            # unlimited: OK, remaining = MaxUint32 (Lyft)
            assert unlimited.code == OK and not unlimited.HasField("current_limit")
            assert unlimited.limit_remaining == U32_MAX
            assert limited.current_limit.requests_per_unit == 3 and limited.limit_remaining == 2
            assert deep.code == OK and not deep.HasField("current_limit")
            # an unknown domain has no limits at all
            r = await s.call("other", [("remote_address", "1.2.3.4")])
            assert r.overall_code == OK and not r.statuses[0].HasField("current_limit") and not headers(r)

    run(go())


def test_hits_addend_is_the_cost(limiter_factory):
    async def go():
        async with serving(limiter_factory()) as s:
            r = await s.call("api", [("remote_address", "h1")], hits=2)
            assert r.overall_code == OK and r.statuses[0].limit_remaining == 1
            r = await s.call("api", [("remote_address", "h1")], hits=2)
            assert r.overall_code == OVER_LIMIT  # 2 more do not fit in the 1 left
            # the 2 denied hits counted all the same (Lyft's INCRBY): 1 more is over too
            r = await s.call("api", [("remote_address", "h1")], hits=0)  # unset: 1
            assert r.overall_code == OVER_LIMIT and r.statuses[0].limit_remaining == 0
            r = await s.call("api", [("remote_address", "h4")], hits=3)
            assert r.overall_code == OK and r.statuses[0].limit_remaining == 0
            # a descriptor's own hits_addend wins over the request's
            r = await s.call("api", desc(("remote_address", "h2"), hits=3), [("remote_address", "h3")], hits=1)
            assert [st.limit_remaining for st in r.statuses] == [0, 2]
            # is_negative_hits (a refund) is a free probe: nothing charged
            r = await s.call("api", desc(("remote_address", "h3"), hits=1, negative=True))
            assert r.overall_code == OK and r.statuses[0].limit_remaining == 2

    run(go())


def test_per_descriptor_path_decides_exactly_like_the_core():
    """The same traffic, once as plain requests (Limiter.check) and once with an
    explicit per-descriptor hits_addend (the per-descriptor path): identical."""
    traffic = [
        [[("remote_address", "a")], [("path", "/login"), ("remote_address", "a")], [("user", "u1")]],
        [[("remote_address", "a")], [("user", "vip")]],
        [[("path", "/login"), ("remote_address", "a")], [("alg", "token_bucket")]],
        [[("remote_address", "a")], [("path", "/login"), ("remote_address", "a")], [("user", "u1")]],
        [[("remote_address", "b")], [("remote_address", "a")], [("alg", "leaky_bucket")]],
    ] * 2

    def strip(r):
        for st in r.statuses:
            st.ClearField("duration_until_reset")
        h = [(x.key, x.value) for x in r.response_headers_to_add if x.key != "RateLimit"]
        r.ClearField("response_headers_to_add")
        return r.SerializeToString(deterministic=True), h

    async def go():
        async with serving(make_limiter(CONFIG)) as plain, serving(make_limiter(CONFIG)) as each:
            for descs in traffic:
                a = await plain.call("api", *descs)
                b = await each.call("api", *[desc(*d, hits=1) for d in descs])
                assert strip(a) == strip(b), descs
            pa = {r.name: (r.stats.hits, r.stats.over, r.stats.shadow) for r in plain.limiter.rules.rules}
            pb = {r.name: (r.stats.hits, r.stats.over, r.stats.shadow) for r in each.limiter.rules.rules}
            assert pa == pb

    run(go())


def test_shadow_mode_answers_ok_counts_and_sends_no_headers():
    async def go():
        async with serving(make_limiter(CONFIG)) as s:
            codes = await s.codes(4, "api", [("user", "u9")])
            assert codes == [OK] * 4
            rule = next(r for r in s.limiter.rules.rules if r.name == "user")
            assert (rule.stats.hits, rule.stats.over, rule.stats.shadow) == (4, 2, 2)
            r = await s.call("api", [("user", "u9")])
            assert r.statuses[0].code == OK and r.statuses[0].current_limit.requests_per_unit == 2
            assert not headers(r)  # a dark-launched limit is never shown to clients

    run(go())


# ------------------------------------------------------------------------------ overrides


def test_limit_override_replaces_the_configured_limit_as_lyft(limiter_factory):
    async def go():
        async with serving(limiter_factory()) as s:
            ov = dict(limit=(2, 4))  # 2 per DAY (envoy.type.v3.RateLimitUnit.DAY = 4)
            codes = [(await s.call("api", desc(("remote_address", "o1"), **ov))).overall_code for _ in range(3)]
            assert codes == [OK, OK, OVER_LIMIT]
            r = await s.call("api", desc(("remote_address", "o1"), **ov))
            cl = r.statuses[0].current_limit
            assert (cl.requests_per_unit, cl.unit, cl.name) == (2, UNIT.DAY, "override 2 per day")
            # the configured limit's own counter was not touched
            r = await s.call("api", [("remote_address", "o1")])
            assert r.overall_code == OK and r.statuses[0].limit_remaining == 2
            # Lyft applies an override even where no configured descriptor matches ...
            codes = [(await s.call("api", desc(("not", "configured"), limit=(1, 1)))).overall_code for _ in range(2)]
            assert codes == [OK, OVER_LIMIT]
            # ... never in shadow mode (the "user" rule is shadow_mode) ...
            codes = [(await s.call("api", desc(("user", "o2"), limit=(1, 4)))).overall_code for _ in range(2)]
            assert codes == [OK, OVER_LIMIT]
            # ... and not in a domain it does not know
            r = await s.call("other", desc(("remote_address", "o1"), limit=(0, 1)))
            assert r.overall_code == OK
            # unit_multiplier is honoured and echoed
            r = await s.call("api", desc(("remote_address", "o3"), limit=(5, 1), multiplier=30))
            cl = r.statuses[0].current_limit
            assert (cl.requests_per_unit, cl.unit, cl.unit_multiplier.value) == (5, UNIT.SECOND, 30)
            assert headers(r)["RateLimit-Policy"].endswith(";q=5;w=30")

    run(go())


def test_override_keeps_the_matched_rules_algorithm_else_lyfts_fixed_window():
    lim = make_limiter(CONFIG)
    rs = lim.rules
    matched = rs.match([("alg", "sliding_window_log")])
    r = override_rule("api", ("alg",), Override("minute", 7, 1), matched)
    assert (r.algorithm, r.limit.limit, r.limit.period, r.shadow) == ("sliding_window_log", 7, 60.0, False)
    assert r.stats is matched.stats  # counted under the configured rule it overrides
    r = override_rule("api", ("x",), Override("hour", 1, 2), None)
    assert (r.algorithm, r.period) == ("fixed_window", 7200)


# ------------------------------------------------------------------------------ errors


@pytest.mark.parametrize(
    "req, message",
    [
        (request("", [("k", "v")]), "domain must not be empty"),
        (request("api"), "descriptor list must not be empty"),
        (request("api", []), "descriptors[0].entries is empty"),
        (request("api", [("k", "v")], [("", "v")]), "descriptors[1].entries[0].key must not be empty"),
        (request("api", *[[("k", str(i))] for i in range(65)]), "at most 64 descriptors"),
        (request("api", [("k", str(i)) for i in range(33)]), "at most 32 entries"),
        (request("api", [("k", "v")], hits=1_000_001), "hits_addend must be a whole number from 0 to 1000000"),
        (request("api", desc(("k", "v"), hits=2_000_000)), "descriptors[0].hits_addend must be a whole number"),
        (request("api", desc(("k", "v"), limit=(5, 0))), "descriptors[0].limit.unit must be one of SECOND, MINUTE"),
    ],
)
def test_malformed_requests_get_invalid_argument_and_the_server_goes_on(req, message):
    async def go():
        async with serving(make_limiter(CONFIG)) as s:
            with pytest.raises(grpc.aio.AioRpcError) as ei:
                await s.stub.ShouldRateLimit(req, timeout=5)
            assert ei.value.code() == grpc.StatusCode.INVALID_ARGUMENT
            assert message in ei.value.details()
            assert s.front.requests[("grpc", "bad_request")] == 1
            assert (await s.call("api", [("remote_address", "x")])).overall_code == OK

    run(go())


def test_an_oversized_message_is_refused_by_grpc_not_by_a_crash():
    async def go():
        async with serving(make_limiter(CONFIG)) as s:
            big = request("api", [("k", "x" * 70_000)])
            with pytest.raises(grpc.aio.AioRpcError) as ei:
                await s.stub.ShouldRateLimit(big, timeout=5)
            assert ei.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
            assert (await s.call("api", [("remote_address", "x")])).overall_code == OK

    run(go())


class BrokenLimiter(Limiter):
    async def check(self, domain, descriptors, cost=1):
        raise RuntimeError("a bug in netlimit")


def test_an_internal_error_fails_open_with_ok():
    async def go():
        base = make_limiter(CONFIG)
        lim = BrokenLimiter(base.rules, base.store)
        async with serving(lim) as s:
            r = await s.call("api", [("remote_address", "x")], [("user", "y")])
            assert r.overall_code == OK and [st.code for st in r.statuses] == [OK, OK]
            assert s.front.requests[("grpc", "error")] == 1

    run(go())


@pytest.mark.parametrize("mode", ["local", "open", "closed"])
def test_redis_down_never_becomes_a_grpc_error(redis_factory, mode):
    """Redis killed mid-traffic: every call is answered by on_store_failure's
    decision (local: the in-memory fallback's; open: OK; closed: OVER_LIMIT)."""
    server = redis_factory()

    async def go():
        lim = make_limiter(CONFIG, store="redis", redis_url=server.url, on_store_failure=mode, timeout_ms=100)
        async with serving(lim) as s:
            assert (await s.call("api", [("remote_address", "r")])).overall_code == OK
            server.stop()
            t0 = time.monotonic()
            codes = await s.codes(5, "api", [("remote_address", "r")])
            assert time.monotonic() - t0 < 5
            if mode == "local":  # a fresh local window: 3 allowed, then over
                assert codes == [OK, OK, OK, OVER_LIMIT, OVER_LIMIT]
            elif mode == "open":
                assert codes == [OK] * 5
                r = await s.call("api", [("remote_address", "r")])
                assert not headers(r)
            else:
                assert codes == [OVER_LIMIT] * 5
            assert not lim.store_available and sum(lim.stats.store_errors.values()) >= 1

    run(go())


def test_leaky_bucket_queue_mode_holds_the_answer():
    async def go():
        async with serving(make_limiter(CONFIG)) as s:
            t0 = time.monotonic()
            codes = await s.codes(3, "api", [("queue", "q")])
            took = time.monotonic() - t0
            assert codes == [OK, OK, OK]
            assert 0.15 <= took < 2.0, took  # the 2nd and 3rd wait 0.1 s each for their slot

    run(go())


# ------------------------------------------------------------------------------ health, metrics


def test_health_service_reports_serving_then_not_serving_on_stop():
    async def go():
        async with serving(make_limiter(CONFIG)) as s:
            assert await s.health_status("") == health_pb2.HealthCheckResponse.SERVING
            assert (
                await s.health_status("envoy.service.ratelimit.v3.RateLimitService")
                == health_pb2.HealthCheckResponse.SERVING
            )
            with pytest.raises(grpc.aio.AioRpcError) as ei:
                await s.health_status("no.such.Service")
            assert ei.value.code() == grpc.StatusCode.NOT_FOUND
            watch = s.health.Watch(health_pb2.HealthCheckRequest(service=""))
            first = await asyncio.wait_for(watch.read(), 5)
            assert first.status == health_pb2.HealthCheckResponse.SERVING
            stopping = asyncio.ensure_future(s.server.stop(2.0))
            nxt = await asyncio.wait_for(watch.read(), 5)
            assert nxt.status == health_pb2.HealthCheckResponse.NOT_SERVING
            await stopping

    run(go())


def test_metrics_are_shared_with_the_http_front_doors():
    async def go():
        async with serving(make_limiter(CONFIG)) as s:
            await s.codes(4, "api", [("remote_address", "m")])
            with pytest.raises(grpc.aio.AioRpcError):
                await s.stub.ShouldRateLimit(request(""), timeout=5)
            text = Metrics(s.limiter, s.front).render().decode()
            assert 'netlimit_http_requests_total{endpoint="grpc",result="ok"} 3.0' in text
            assert 'netlimit_http_requests_total{endpoint="grpc",result="over_limit"} 1.0' in text
            assert 'netlimit_http_requests_total{endpoint="grpc",result="bad_request"} 1.0' in text
            assert 'netlimit_http_rule_hits_total{domain="api",rule="remote_address"} 4.0' in text
            assert 'netlimit_http_rule_over_limit_total{domain="api",rule="remote_address"} 1.0' in text

    run(go())


def test_rules_swapped_by_a_reload_apply_to_the_next_call():
    async def go():
        lim = make_limiter(CONFIG)
        async with serving(lim) as s:
            assert (await s.call("api", desc(("k", "v"), limit=(1, 4)))).overall_code == OK
            new = make_limiter(CONFIG.replace("domain: api", "domain: api2"))
            lim.set_rules(new.rules)
            assert (await s.call("api", [("remote_address", "z")])).statuses[0].HasField("current_limit") is False
            r = await s.call("api2", [("remote_address", "z")])
            assert r.statuses[0].current_limit.requests_per_unit == 3
            # override rules are rebuilt for the new rules (domain api2 now)
            assert (await s.call("api2", desc(("k", "v"), limit=(1, 4)))).overall_code == OK

    run(go())
