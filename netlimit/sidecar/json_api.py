"""The JSON door: ``POST /v1/check`` with the body of envoyproxy/ratelimit's
``/json`` endpoint (a RateLimitRequest in protobuf's JSON mapping), a thin
adapter onto :meth:`Limiter.check`, like the gRPC door.

Request::

    {"domain": "api",
     "descriptors": [{"entries": [{"key": "remote_address", "value": "10.0.0.1"}],
                      "hitsAddend": 2,                                    # optional, per descriptor
                      "limit": {"requestsPerUnit": 5, "unit": "MINUTE"}}], # optional override
     "hitsAddend": 1}

(snake_case field names are accepted too).  Answer: 200 (OK) or 429
(OVER_LIMIT), the rate limit headers, and::

    {"overallCode": "OK", "statuses": [{"code": "OK", "currentLimit": {"name": ..., "requestsPerUnit": 10,
     "unit": "MINUTE"}, "limitRemaining": 9, "durationUntilReset": "42s", "rule": ..., "algorithm": ...,
     "shadowMode": false, "source": "store"}]}

The body's size is bounded by the caller; its depth by the parser (a nested
document answers 400, never a server error).
"""

from __future__ import annotations

import json
import math
from typing import Any

from ..errors import BadRequest
from ..limit.headers import reset_seconds, retry_seconds
from ..limit.limiter import CODE_NAMES, SRC_NONE, CheckResult
from ..limit.request import MAX_COST, CheckRequest, DescriptorIn, Override, build_request

_EXAMPLE = '{"domain": "api", "descriptors": [{"entries": [{"key": "remote_address", "value": "10.0.0.1"}]}]}'
_UNITS = {"SECOND": "second", "MINUTE": "minute", "HOUR": "hour", "DAY": "day", "MONTH": "month", "YEAR": "year"}


def _field(obj: dict[str, Any], camel: str, snake: str, default: Any = None) -> Any:
    return obj.get(camel, obj.get(snake, default))


def _uint(v: Any, what: str) -> int:
    """A protobuf JSON integer: a number, or a string of ASCII digits (64-bit values)."""
    if isinstance(v, str) and v.isascii() and v.isdigit() and len(v) <= 20:
        v = int(v)
    if isinstance(v, bool) or not isinstance(v, int) or v < 0:
        raise BadRequest(f"{what} must be a whole number >= 0, got {v!r:.40}")
    return v


def parse_json_request(raw: bytes) -> CheckRequest:
    """A JSON API body as the engine's CheckRequest; :class:`BadRequest` names the field."""
    if not raw.strip():
        raise BadRequest(f"empty body: expected JSON like {_EXAMPLE}")
    try:
        obj = json.loads(raw)
    except UnicodeDecodeError:
        raise BadRequest("the body is not UTF-8 text") from None
    except json.JSONDecodeError as exc:
        raise BadRequest(f"the body is not valid JSON: {exc.msg} at line {exc.lineno} column {exc.colno}") from None
    except RecursionError:
        raise BadRequest("the body is not valid JSON: nested too deeply") from None
    except ValueError as exc:  # e.g. an integer of more digits than Python converts
        raise BadRequest(f"the body is not valid JSON: {str(exc)[:80]}") from None
    if not isinstance(obj, dict):
        raise BadRequest(f"the body must be a JSON object, got {type(obj).__name__}")
    unknown = set(obj) - {"domain", "descriptors", "hits_addend", "hitsAddend"}
    if unknown:
        names = ", ".join(sorted(repr(u)[:40] for u in unknown)[:5])
        raise BadRequest(f"unknown field(s) {names}: expected domain, descriptors, hitsAddend")
    domain = obj.get("domain")
    if not isinstance(domain, str):
        raise BadRequest("'domain' must be a non-empty string")
    descs = obj.get("descriptors")
    if not isinstance(descs, list):
        raise BadRequest('\'descriptors\' must be a list of {"entries": [{"key": ..., "value": ...}]}')
    out: list[DescriptorIn] = []
    for i, d in enumerate(descs):  # the body is at most 64 KiB: a bounded loop
        if not isinstance(d, dict) or not isinstance(d.get("entries"), list):
            raise BadRequest(f"descriptors[{i}] must be an object with an 'entries' list")
        es = []
        for j, e in enumerate(d["entries"]):
            if not isinstance(e, dict):
                raise BadRequest(f"descriptors[{i}].entries[{j}] must be an object with 'key' and 'value'")
            k = e.get("key")
            v = e.get("value", "")
            if not isinstance(k, str):
                raise BadRequest(f"descriptors[{i}].entries[{j}].key must be a non-empty string")
            if not isinstance(v, str):
                raise BadRequest(f"descriptors[{i}].entries[{j}].value must be a string")
            es.append((k, v))
        hits = _field(d, "hitsAddend", "hits_addend")
        if hits is not None:
            hits = _uint(hits, f"descriptors[{i}].hits_addend")
        if _field(d, "isNegativeHits", "is_negative_hits", False) is True:
            hits = 0
        ov = None
        lim = d.get("limit")
        if lim is not None:
            if not isinstance(lim, dict):
                raise BadRequest(f"descriptors[{i}].limit must be an object with requestsPerUnit and unit")
            unit = lim.get("unit")
            mult = _field(lim, "unitMultiplier", "unit_multiplier", 1)
            ov = Override(
                _UNITS.get(unit, repr(unit)[:20]) if isinstance(unit, str) else repr(unit)[:20],
                _uint(
                    _field(lim, "requestsPerUnit", "requests_per_unit", 0), f"descriptors[{i}].limit.requests_per_unit"
                ),
                _uint(mult, f"descriptors[{i}].limit.unit_multiplier"),
            )
        out.append(DescriptorIn(es, hits, ov))
    hits_addend = _field(obj, "hitsAddend", "hits_addend", 0)
    if isinstance(hits_addend, bool) or not isinstance(hits_addend, int):
        raise BadRequest(f"'hits_addend' must be a whole number from 0 to {MAX_COST}, got {hits_addend!r:.40}")
    return build_request(domain, out, hits_addend)


def _duration(seconds: float) -> str:
    """A protobuf Duration in JSON form ("42s", "0.250s")."""
    if seconds <= 0 or not math.isfinite(seconds):
        return "0s"
    if abs(seconds - round(seconds)) < 1e-6:
        return f"{round(seconds)}s"
    return f"{seconds:.3f}s"


def result_json(result: CheckResult) -> dict[str, Any]:
    statuses = []
    for st in result.statuses:
        s: dict[str, Any] = {"code": CODE_NAMES[st.code]}
        rule = st.rule
        if rule is not None:
            s["rule"] = rule.name
            if rule.unlimited:
                s["unlimited"] = True
            else:
                s["currentLimit"] = {
                    "name": rule.name,
                    "requestsPerUnit": rule.requests_per_unit,
                    "unit": rule.unit.upper(),
                }
                s["algorithm"] = rule.algorithm
                s["shadowMode"] = rule.shadow
                d = st.decision
                if d is not None:
                    s["limitRemaining"] = d.remaining
                    s["durationUntilReset"] = f"{reset_seconds(d.reset)}s"  # whole seconds, as Lyft
                    if not d.allowed:
                        s["retryAfter"] = retry_seconds(st)
                    if d.delay > 0:
                        s["delay"] = _duration(d.delay)
                if st.shadow_over:
                    s["shadowOverLimit"] = True
                if st.source != SRC_NONE:
                    s["source"] = st.source
        statuses.append(s)
    return {"overallCode": CODE_NAMES[result.code], "statuses": statuses}
