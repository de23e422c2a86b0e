"""Envoy's rate limit service (``envoy.service.ratelimit.v3.RateLimitService``)
on the limiter core: the gRPC front door of the sidecar.

One core, three front doors: the proxy, the HTTP check endpoints and this one
call the same :class:`~netlimit.limit.limiter.Limiter` with the same rules and
store, so a request decides the same whichever way it comes in.

Request → core
--------------
* ``domain`` and each descriptor's ``entries`` as (key, value) lists;
  ``hits_addend`` is the cost (0 = unset = 1, as Lyft); a descriptor's own
  ``hits_addend`` (Envoy ≥ 1.34) wins for that descriptor, ``is_negative_hits``
  (a refund; netlimit's algorithms only charge) makes it a free probe.
* A descriptor's ``limit`` override replaces the configured limit for that
  descriptor as envoyproxy/ratelimit does (``GetLimit``): it applies whenever
  the domain is ours, also when no configured descriptor matches; it is never
  shadow_mode and never replaced nor replacing.  Its counters are keyed by the
  descriptor's keys and values under the override's rate, so they are apart
  from the configured limit's.  Lyft has only a fixed window; here the override
  keeps the algorithm of the configured descriptor it matches (fixed_window when
  none), so Lyft configs decide exactly as with Lyft.
* ``unlimited``, ``shadow_mode`` and ``replaces`` are the core's (see
  limiter.py), which follows Lyft.

Core → response
---------------
* ``overall_code`` OK / OVER_LIMIT; one status per descriptor: no matching rule
  → ``OK`` without ``current_limit`` (limit_remaining 0), unlimited → ``OK``
  with ``limit_remaining`` = 2^32-1 (both exactly as Lyft); otherwise
  ``current_limit {requests_per_unit, unit, name}``, ``limit_remaining`` and
  ``duration_until_reset``.
* ``response_headers_to_add``: the same rate limit headers the HTTP paths send
  (``X-RateLimit-*``, ``RateLimit-Policy``, ``RateLimit``, and ``Retry-After``
  on denials); Envoy adds them to the client's response.  Denials also carry
  ``raw_body``: the same RFC 9457 problem JSON as the HTTP 429 (with its
  ``Content-Type``, which Envoy puts in place of its own on the local reply).
* A leaky bucket in queue mode (``delay: true``) holds the answer for the
  request's slot, as the HTTP paths hold the request; Envoy's ``timeout`` for
  the rate limit service must then be longer than the queue.

Errors
------
* A malformed request (empty domain, no descriptors, an empty key, more than
  64 descriptors or 32 entries, a cost above 1,000,000, an override with an
  unknown unit) → ``INVALID_ARGUMENT`` with a message naming the field.  Envoy
  then applies ``failure_mode_deny`` (default false: the request passes).
* Store failures never reach Envoy: the core's ``on_store_failure`` decides
  (``local`` by default: the fallback's decision, answered OK/OVER_LIMIT as
  usual).  Anything unexpected in netlimit itself is logged and answered
  ``OK`` (fail open), never as a gRPC error that could fail the request under
  ``failure_mode_deny: true``.
"""

from __future__ import annotations

import asyncio
import hashlib
import logging
import math
import time
from collections.abc import Sequence
from typing import Any, NamedTuple

import grpc

from ..config.model import UNIT_SECONDS
from ..limit.algorithms import Limit
from ..limit.headers import PROBLEM_TYPE, problem_body, rate_headers
from ..limit.limiter import OK, OVER_LIMIT, SRC_STORE, CheckResult, DescriptorStatus, Limiter
from ..limit.rules import Rule, RuleSet, RuleStats, sf_string
from .proto import envoy_core_pb2, rls_pb2, rls_pb2_grpc

log = logging.getLogger("netlimit.sidecar")

RateLimitRequest = rls_pb2.RateLimitRequest
RateLimitResponse = rls_pb2.RateLimitResponse
HeaderValue = envoy_core_pb2.HeaderValue

#: the same bounds as the JSON API (app.py), so both front doors refuse the same requests
MAX_DESCRIPTORS = 64
MAX_ENTRIES = 32
MAX_COST = 1_000_000
MAX_DELAY = 60.0
MAX_U32 = 0xFFFFFFFF

#: netlimit / Lyft unit → RateLimitResponse.RateLimit.Unit (Envoy numbering; WEEK is 7)
UNIT_ENUM = {"second": 1, "minute": 2, "hour": 3, "day": 4, "week": 7, "month": 5, "year": 6}
#: envoy.type.v3.RateLimitUnit (a descriptor's limit override) → unit name
OVERRIDE_UNITS = {1: "second", 2: "minute", 3: "hour", 4: "day", 5: "month", 6: "year"}

#: the endpoint label of this front door in netlimit_http_requests
ENDPOINT = "grpc"
RESULTS = ("ok", "over_limit", "bad_request", "error")

_OVERRIDE_CACHE_MAX = 1024


class BadRequest(ValueError):
    """A request the service cannot decide; the message names the field."""


class Override(NamedTuple):
    unit: str
    requests_per_unit: int
    multiplier: int


class Parsed(NamedTuple):
    domain: str
    descriptors: list[list[tuple[str, str]]]
    costs: list[int]
    overrides: list[Override | None]


def parse_request(req: Any) -> Parsed:
    """Validate a RateLimitRequest; :class:`BadRequest` names what is wrong."""
    domain = req.domain
    if not domain:
        raise BadRequest("domain must not be empty (the http.domain of the netlimit file)")
    n = len(req.descriptors)
    if n == 0:
        raise BadRequest("the descriptor list must not be empty")
    if n > MAX_DESCRIPTORS:
        raise BadRequest(f"at most {MAX_DESCRIPTORS} descriptors per request, got {n}")
    cost = req.hits_addend or 1  # proto3: unset is 0, which means 1 (Lyft)
    if cost > MAX_COST:
        raise BadRequest(f"hits_addend must be at most {MAX_COST}, got {cost}")
    descs: list[list[tuple[str, str]]] = []
    costs: list[int] = []
    overrides: list[Override | None] = []
    for i, d in enumerate(req.descriptors):
        entries = d.entries
        if not entries:
            raise BadRequest(f"descriptors[{i}].entries is empty")
        if len(entries) > MAX_ENTRIES:
            raise BadRequest(f"descriptors[{i}].entries: at most {MAX_ENTRIES} entries, got {len(entries)}")
        es = []
        for j, e in enumerate(entries):
            if not e.key:
                raise BadRequest(f"descriptors[{i}].entries[{j}].key must not be empty")
            es.append((e.key, e.value))
        descs.append(es)
        c = cost
        if d.HasField("hits_addend"):
            c = d.hits_addend.value
            if c > MAX_COST:
                raise BadRequest(f"descriptors[{i}].hits_addend must be at most {MAX_COST}, got {c}")
        if d.is_negative_hits:
            c = 0
        costs.append(c)
        if d.HasField("limit"):
            lim = d.limit
            unit = OVERRIDE_UNITS.get(lim.unit)
            if unit is None:
                raise BadRequest(
                    f"descriptors[{i}].limit.unit must be SECOND, MINUTE, HOUR, DAY, MONTH or YEAR, got {lim.unit}"
                )
            mult = lim.unit_multiplier.value if lim.HasField("unit_multiplier") else 1
            overrides.append(Override(unit, lim.requests_per_unit, max(1, mult)))
        else:
            overrides.append(None)
    return Parsed(domain, descs, costs, overrides)


# --------------------------------------------------------------------------- deciding


class Decider:
    """The core call for one parsed request.

    The common case (no override, one cost for every descriptor) is exactly
    :meth:`Limiter.check`.  Overrides and per-descriptor costs go through the
    same core steps (match, ``replaces``, one store hit per limited descriptor
    with the breaker, per-rule counters) one descriptor at a time, and the
    results are combined with the core's rule for the overall code and the
    reported status.
    """

    def __init__(self, limiter: Limiter):
        self.limiter = limiter
        self._ov_rules: RuleSet | None = None
        self._ov_cache: dict[tuple, Rule] = {}

    async def decide(self, p: Parsed) -> CheckResult:
        lim = self.limiter
        costs = p.costs
        c0 = costs[0]
        if all(o is None for o in p.overrides) and all(c == c0 for c in costs):
            return await lim.check(p.domain, p.descriptors, c0)
        return await self._decide_each(p)

    async def _decide_each(self, p: Parsed) -> CheckResult:
        lim = self.limiter
        t0 = time.perf_counter()
        rs = lim.rules
        descs = p.descriptors
        if p.domain != rs.domain:  # Lyft: an unknown domain has no limits, overrides included
            return CheckResult(OK, [DescriptorStatus(OK) for _ in descs])
        rules: list[Rule | None] = []
        for d, ov in zip(descs, p.overrides):
            m = rs.match(d)
            rules.append(m if ov is None else self._override_rule(rs, d, ov, m))
        if rs.has_replaces:  # as the core, over configured rules only (an override has no name)
            replaced = {n for r, ov in zip(rules, p.overrides) if r is not None and ov is None for n in r.replaces}
            if replaced:
                rules = [
                    None if r is not None and ov is None and r.name in replaced else r
                    for r, ov in zip(rules, p.overrides)
                ]
        decided: list[Any] = [None] * len(descs)
        if lim.is_sync:
            store = lim.store
            for i, (d, r, c) in enumerate(zip(descs, rules, p.costs)):
                if r is not None and r.limit is not None:
                    decided[i] = (store.hit_sync(rs.store_key(r, d), r.limit, c), SRC_STORE)
        else:
            pending = [
                (i, r, rs.store_key(r, d), c)
                for i, (d, r, c) in enumerate(zip(descs, rules, p.costs))
                if r is not None and r.limit is not None
            ]
            res = await asyncio.gather(*[lim._hit(k, r, c) for _, r, k, c in pending])
            for (i, _, _, _), dr in zip(pending, res):
                decided[i] = dr
        parts = [lim._evaluate([d], [r], [dd], c) for d, r, dd, c in zip(descs, rules, decided, p.costs)]
        result = combine(parts)
        lim.stats.latency.observe(time.perf_counter() - t0)
        return result

    def _override_rule(
        self, rs: RuleSet, entries: Sequence[tuple[str, str]], ov: Override, matched: Rule | None
    ) -> Rule:
        if self._ov_rules is not rs:  # rules reloaded: rebuild lazily
            self._ov_rules = rs
            self._ov_cache = {}
        keys = tuple(k for k, _ in entries)
        ck = (matched.path if matched is not None else None, keys, ov)
        rule = self._ov_cache.get(ck)
        if rule is not None:
            return rule
        if len(self._ov_cache) >= _OVERRIDE_CACHE_MAX:
            self._ov_cache.clear()
        rule = override_rule(rs.domain, keys, ov, matched)
        self._ov_cache[ck] = rule
        return rule


def override_rule(domain: str, keys: tuple[str, ...], ov: Override, matched: Rule | None) -> Rule:
    """The rule a descriptor's ``limit`` override stands for."""
    period = UNIT_SECONDS[ov.unit] * ov.multiplier
    algorithm, delay = "fixed_window", False
    if matched is not None and matched.limit is not None:
        algorithm, delay = matched.algorithm, matched.limit.delay
    per = f"{ov.multiplier} {ov.unit}s" if ov.multiplier > 1 else ov.unit
    name = f"override {ov.requests_per_unit} per {per}"
    # the Limit's name keeps override state apart from configured rules' state; it
    # holds no request keys, so the number of distinct Limits stays small
    limit = Limit(
        algorithm=algorithm, limit=ov.requests_per_unit, period=float(period), burst=None, delay=delay, name=name
    )
    path = ".".join(keys)
    tag = "\x1f".join(keys)
    if len(tag) > 64:
        tag = "#" + hashlib.blake2b(tag.encode("utf-8", "surrogatepass"), digest_size=16).hexdigest()
    sfn = sf_string(name)
    return Rule(
        name=name,
        path=f"override:{path}",
        domain=domain,
        keys=keys,
        unit=ov.unit,
        requests_per_unit=ov.requests_per_unit,
        period=period,
        algorithm=algorithm,
        limit=limit,
        key_prefix=f"{domain}|~override {ov.requests_per_unit}/{period}s {algorithm}|{tag}|",
        sf_name=sfn,
        policy=f"{sfn};q={ov.requests_per_unit};w={period}",
        near_threshold=limit.capacity - (4 * limit.capacity + 4) // 5,
        # counted with the configured rule it overrides, if any (metric labels stay
        # bounded by the configuration); otherwise not per rule
        stats=matched.stats if matched is not None else RuleStats(),
    )


def combine(parts: list[CheckResult]) -> CheckResult:
    """One result from per-descriptor results, with the core's rule: over the
    limit when any enforced status is; the reported status is the denied one
    with the longest retry_after, else the allowed one with the fewest
    remaining (then the smallest limit); the first wins ties."""
    statuses = [p.statuses[0] for p in parts]
    code = OK
    report: DescriptorStatus | None = None
    delay = 0.0
    for p in parts:
        st = p.report
        if st is None:
            continue
        dec = st.decision
        if st.code == OVER_LIMIT:
            if code != OVER_LIMIT or dec.retry_after > report.decision.retry_after:  # type: ignore[union-attr]
                report = st
            code = OVER_LIMIT
            continue
        if code == OVER_LIMIT:
            continue
        if p.delay > delay:
            delay = p.delay
        if report is None:
            report = st
        else:
            rd = report.decision
            assert rd is not None and dec is not None
            if dec.remaining < rd.remaining or (dec.remaining == rd.remaining and dec.limit < rd.limit):
                report = st
    return CheckResult(code, statuses, report, delay if code == OK else 0.0)


# --------------------------------------------------------------------------- response


def _u32(n: int) -> int:
    return 0 if n < 0 else (MAX_U32 if n > MAX_U32 else n)


def build_response(result: CheckResult, overrides: Sequence[Override | None] = ()) -> Any:
    """The RateLimitResponse of a core decision."""
    resp = RateLimitResponse(overall_code=result.code)  # type: ignore[arg-type]  # Lyft's Code numbers
    add = resp.statuses.add
    for i, st in enumerate(result.statuses):
        s = add(code=st.code)
        rule = st.rule
        if rule is None:
            continue
        if rule.unlimited:
            s.limit_remaining = MAX_U32
            continue
        cl = s.current_limit
        cl.requests_per_unit = _u32(rule.requests_per_unit)
        cl.unit = UNIT_ENUM.get(rule.unit, 0)
        cl.name = rule.name
        ov = overrides[i] if i < len(overrides) else None
        if ov is not None and ov.multiplier > 1:
            cl.unit_multiplier.value = ov.multiplier
        d = st.decision
        if d is None:  # on_store_failure: open, nothing was decided
            continue
        s.limit_remaining = _u32(d.remaining)
        reset = d.reset
        if reset > 0 and math.isfinite(reset):
            s.duration_until_reset.FromNanoseconds(int(reset * 1e9))
    headers = rate_headers(result)
    if headers:
        hadd = resp.response_headers_to_add.add
        for k, v in headers.items():
            hadd(key=k, value=v)
    if result.code == OVER_LIMIT and result.report is not None and result.report.rule is not None:
        # Envoy answers 429 with this body; it replaces its own content-type with ours
        resp.raw_body = problem_body(result, 429).encode()
        resp.response_headers_to_add.add(key="Content-Type", value=PROBLEM_TYPE)
    return resp


def ok_response(n: int) -> Any:
    """The fail-open answer: OK, one OK status per descriptor, no headers."""
    resp = RateLimitResponse(overall_code=OK)  # type: ignore[arg-type]  # Lyft's Code numbers
    for _ in range(n):
        resp.statuses.add(code=OK)
    return resp


# --------------------------------------------------------------------------- servicer


class RateLimitServicer(rls_pb2_grpc.RateLimitServiceServicer):
    """``ShouldRateLimit`` for grpc.aio, on one :class:`Limiter`.

    ``front`` is the sidecar's FrontStats (requests are counted under
    ``endpoint="grpc"``), so /metrics shows all front doors together.
    """

    def __init__(
        self, limiter: Limiter, front: Any = None, *, max_delay: float = MAX_DELAY, log_interval: float = 10.0
    ):
        self.decider = Decider(limiter)
        self.front = front
        self.max_delay = max_delay
        self.counts = dict.fromkeys(RESULTS, 0)  # also without a FrontStats (tests, bench)
        if front is not None:
            for r in RESULTS:  # the front door's series exist from the start (0)
                front.requests.setdefault((ENDPOINT, r), 0)
        self._log_interval = log_interval
        self._next_log = {"bad": 0.0, "error": 0.0, "negative": 0.0}

    @property
    def limiter(self) -> Limiter:
        return self.decider.limiter

    def _count(self, result: str) -> None:
        self.counts[result] += 1
        if self.front is not None:
            k = (ENDPOINT, result)
            self.front.requests[k] = self.front.requests.get(k, 0) + 1

    def _log_due(self, what: str) -> bool:
        now = time.monotonic()
        if now < self._next_log[what]:
            return False
        self._next_log[what] = now + self._log_interval
        return True

    async def ShouldRateLimit(self, request, context):  # noqa: N802 - the gRPC method name
        try:
            p = parse_request(request)
        except BadRequest as exc:
            self._count("bad_request")
            if self._log_due("bad"):
                log.info("gRPC ShouldRateLimit: bad request from %s: %s", context.peer(), exc)
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, str(exc))
            return None  # pragma: no cover - abort raises
        try:
            result = await self.decider.decide(p)
            resp = build_response(result, p.overrides)
        except asyncio.CancelledError:
            raise
        except Exception:  # fail open: never fail Envoy's request because of netlimit
            self._count("error")
            if self._log_due("error"):
                log.exception("gRPC ShouldRateLimit failed; answering OK (fail open)")
            return ok_response(len(p.descriptors))
        if (
            any(c == 0 for c in p.costs)
            and any(d.is_negative_hits for d in request.descriptors)
            and self._log_due("negative")
        ):
            log.info(
                "gRPC ShouldRateLimit: is_negative_hits (a refund) is not supported; those descriptors "
                "were decided as free probes"
            )
        self._count("over_limit" if result.code == OVER_LIMIT else "ok")
        if result.delay > 0:
            await asyncio.sleep(min(result.delay, self.max_delay))
        return resp
