"""Envoy's rate limit service (``envoy.service.ratelimit.v3.RateLimitService``):
the gRPC door onto the engine, a thin adapter (as envoyproxy/ratelimit's
``NewJsonHandler`` is onto its service).

The HTTP doors and this one call the same :meth:`Limiter.check` with the same
rules and store, so a request decides the same whichever way it comes in.

Request → engine
----------------
:func:`parse_request` reads ``domain``, each descriptor's ``entries``, the
request's ``hits_addend`` (0 = unset = 1, as Lyft), a descriptor's own
``hits_addend`` (Envoy ≥ 1.34), ``is_negative_hits`` (a refund; netlimit's
algorithms only charge, so a free probe) and a descriptor's ``limit``
override into a :class:`~netlimit.limit.request.CheckRequest`; the engine
checks its bounds and decides (``unlimited``, ``shadow_mode``, ``replaces``
and overrides follow Lyft: see netlimit/limit/limiter.py).

Core → response
---------------
* ``overall_code`` OK / OVER_LIMIT; one status per descriptor: no matching rule
  → ``OK`` without ``current_limit`` (limit_remaining 0), unlimited → ``OK``
  with ``limit_remaining`` = 2^32-1 (both exactly as Lyft); otherwise
  ``current_limit {requests_per_unit, unit, name}``, ``limit_remaining`` and
  ``duration_until_reset`` in whole seconds (Lyft's ``CalculateReset``: the
  seconds left in the window, rounded up; set for every limit, 0 included).
* With ``http.response_dynamic_metadata`` (Lyft's RESPONSE_DYNAMIC_METADATA),
  ``dynamic_metadata`` as Lyft builds it: the domain, the descriptors, the
  request's ``hitsAddend`` and the ``metadata`` of the descriptors that passed
  (merged, the first value of a key kept).
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
* A malformed request (the engine's bounds: empty domain, no descriptors, an
  empty key, more than 64 descriptors or 32 entries, a cost above 1,000,000,
  an override with an unknown unit, a period over one year or more than 2^31
  requests) → ``INVALID_ARGUMENT`` with a message naming the field.  Envoy
  then applies ``failure_mode_deny`` (default false: the request passes).
* Store failures never reach Envoy: the core's ``on_store_failure`` decides
  (``local`` by default: the fallback's decision, answered OK/OVER_LIMIT as
  usual).  Anything unexpected in netlimit itself is logged and answered
  ``OK`` (fail open), never as a gRPC error that could fail the request under
  ``failure_mode_deny: true``.
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any

import grpc
from google.protobuf import struct_pb2, text_format

from ..errors import BadRequest
from ..limit.headers import PROBLEM_TYPE, problem_body, rate_headers, reset_seconds
from ..limit.limiter import OK, OVER_LIMIT, CheckResult, Limiter
from ..limit.request import CheckRequest, DescriptorIn, Override, build_request
from ..logevery import LogEvery
from .proto import envoy_core_pb2, rls_pb2, rls_pb2_grpc

log = logging.getLogger("netlimit.rls")

RateLimitRequest = rls_pb2.RateLimitRequest
RateLimitResponse = rls_pb2.RateLimitResponse
HeaderValue = envoy_core_pb2.HeaderValue

#: the longest a leaky bucket in queue mode holds an answer
MAX_DELAY = 60.0
MAX_U32 = 0xFFFFFFFF

#: netlimit / Lyft unit → RateLimitResponse.RateLimit.Unit (Envoy numbering; WEEK is 7)
UNIT_ENUM = {"second": 1, "minute": 2, "hour": 3, "day": 4, "week": 7, "month": 5, "year": 6}

#: the endpoint label of this front door in netlimit_http_requests
ENDPOINT = "grpc"
RESULTS = ("ok", "over_limit", "bad_request", "error")

#: envoy.type.v3.RateLimitUnit (a descriptor's limit override) -> the engine's unit name
OVERRIDE_UNITS = {1: "second", 2: "minute", 3: "hour", 4: "day", 5: "month", 6: "year"}


def parse_request(req: Any) -> CheckRequest:
    """A RateLimitRequest as the engine's CheckRequest (its bounds are the engine's:
    :class:`~netlimit.errors.BadRequest` names what is wrong)."""
    descs = []
    for d in req.descriptors:
        hits = d.hits_addend.value if d.HasField("hits_addend") else None
        if d.is_negative_hits:  # a refund: netlimit's algorithms only charge, so a free probe
            hits = 0
        ov = None
        if d.HasField("limit"):
            lim = d.limit
            mult = lim.unit_multiplier.value if lim.HasField("unit_multiplier") else 1
            unit = OVERRIDE_UNITS.get(lim.unit, f"UNKNOWN ({lim.unit})")
            ov = Override(unit, lim.requests_per_unit, mult)
        descs.append(DescriptorIn([(e.key, e.value) for e in d.entries], hits, ov))
    return build_request(req.domain, descs, req.hits_addend)


# --------------------------------------------------------------------------- response


def _u32(n: int) -> int:
    return 0 if n < 0 else (MAX_U32 if n > MAX_U32 else n)


def build_response(result: CheckResult, request: Any = None) -> Any:
    """The RateLimitResponse of a core decision (``request``: the RateLimitRequest,
    for dynamic metadata when the rules ask for it)."""
    resp = RateLimitResponse(overall_code=result.code)  # type: ignore[arg-type]  # Lyft's Code numbers
    add = resp.statuses.add
    for st in result.statuses:
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
        if rule.multiplier > 1:
            cl.unit_multiplier.value = rule.multiplier
        d = st.decision
        if d is None:  # on_store_failure: open, nothing was decided
            continue
        s.limit_remaining = _u32(d.remaining)
        s.duration_until_reset.SetInParent()
        s.duration_until_reset.seconds = reset_seconds(d.reset)
    headers = rate_headers(result)
    if headers:
        hadd = resp.response_headers_to_add.add
        for k, v in headers.items():
            hadd(key=k, value=v)
    if result.code == OVER_LIMIT and result.report is not None and result.report.rule is not None:
        # Envoy answers 429 with this body; it replaces its own content-type with ours
        resp.raw_body = problem_body(result, 429).encode()
        resp.response_headers_to_add.add(key="Content-Type", value=PROBLEM_TYPE)
    if request is not None:
        resp.dynamic_metadata.CopyFrom(dynamic_metadata(request, result))
    return resp


def _merge(dest: dict[str, Any], src: dict[str, Any]) -> None:
    """Lyft's mergeMetadata: a key already there keeps its value, two mappings merge."""
    for k, v in src.items():
        k = str(k)
        if k not in dest:
            dest[k] = v
        elif isinstance(dest[k], dict) and isinstance(v, dict):
            merged = dict(dest[k])
            _merge(merged, v)
            dest[k] = merged


def dynamic_metadata(request: Any, result: CheckResult) -> Any:
    """Lyft's ``ratelimitToMetadata``: the domain, each descriptor (its entries as
    ``key=value``, its limit override and hits_addend), the request's hits_addend,
    and the merged ``metadata`` of the descriptors that were not over the limit."""
    out: dict[str, Any] = {"domain": request.domain}
    descs = []
    for d in request.descriptors:
        one: dict[str, Any] = {"entries": [f"{e.key}={e.value}" for e in d.entries]}
        if d.HasField("limit"):
            one["limit"] = text_format.MessageToString(d.limit, as_one_line=True)
        if d.HasField("hits_addend"):
            one["hitsAddend"] = d.hits_addend.value
        descs.append(one)
    out["descriptors"] = descs
    if request.hits_addend:
        out["hitsAddend"] = request.hits_addend
    passed: dict[str, Any] = {}
    for st in result.statuses:
        rule = st.rule
        if st.code != OVER_LIMIT and rule is not None and not rule.unlimited and rule.metadata:
            _merge(passed, rule.metadata)
    if passed:
        out["metadata"] = passed
    msg = struct_pb2.Struct()
    msg.update(out)
    return msg


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
        self.limiter = limiter
        self.front = front
        self.max_delay = max_delay
        self.counts = dict.fromkeys(RESULTS, 0)  # also without a FrontStats (tests, bench)
        if front is not None:
            for r in RESULTS:  # the front door's series exist from the start (0)
                front.requests.setdefault((ENDPOINT, r), 0)
        self._log_interval = log_interval
        self._log = LogEvery(log_interval)

    def _count(self, result: str) -> None:
        self.counts[result] += 1
        if self.front is not None:
            k = (ENDPOINT, result)
            self.front.requests[k] = self.front.requests.get(k, 0) + 1

    def _log_due(self, what: str) -> bool:
        return self._log.due(what) >= 0

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
            result = await self.limiter.check(p)
            cfg = self.limiter.rules.config
            resp = build_response(result, request if cfg is not None and cfg.response_dynamic_metadata else None)
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
