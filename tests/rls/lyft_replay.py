"""What the replay of envoyproxy/ratelimit's own tests (tests/rls/test_upstream_*.py)
shares: where upstream's files are, loading them as a Lyft user would (a
netlimit file whose ``http.lyft_config_dir`` holds them), a Limiter on a fixed
clock (upstream's tests fix time too) over the memory store or the real Redis
store, and the two doors: gRPC (a real server and client on loopback) and the
JSON API (its parser and answer, as ``POST /v1/check`` runs them).

Upstream's files are kept verbatim in tests/rls/upstream (README.md there says
where each came from).  A Go test usually builds its config inline
(``config.YamlRoot{...}``): the replay writes the same config as YAML.
"""

from __future__ import annotations

import json
import textwrap
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from rls_helpers import OK, U32_MAX, RateLimitResponse, serving

from netlimit.config.validate import Loaded, load_file
from netlimit.limit.limiter import Limiter
from netlimit.limit.rules import RuleSet, from_loaded
from netlimit.limit.stores import MemoryStore, RedisStore
from netlimit.rls.servicer import parse_request
from netlimit.sidecar.json_api import parse_json_request, result_json

UPSTREAM = Path(__file__).resolve().parent / "upstream"
CONFIG_DIR = UPSTREAM / "test" / "config"
RUNTIME = UPSTREAM / "test" / "integration" / "runtime" / "current" / "ratelimit"
EXAMPLES = UPSTREAM / "examples" / "ratelimit" / "config"

_UNIT_NAME = RateLimitResponse.RateLimit.Unit.Name  # the response's unit enum (WEEK is 7)

#: Lyft's unit names -> seconds (utils.UnitToDivider) and the response enum
UNIT_SECONDS = {
    "SECOND": 1,
    "MINUTE": 60,
    "HOUR": 3600,
    "DAY": 86400,
    "WEEK": 604800,
    "MONTH": 2592000,
    "YEAR": 31536000,
}


def upstream_text(name: str) -> str:
    return (CONFIG_DIR / name).read_text()


def lyft_dir(tmp: Path, files: dict[str, str], **http: Any) -> Loaded:
    """A netlimit file ``{tmp}/netlimit.yaml`` serving the Lyft files ``files``
    (name -> text) from ``{tmp}/lyft`` (a Lyft runtime directory), with the
    ``http:`` settings ``http`` (Lyft's environment settings)."""
    d = tmp / "lyft"
    d.mkdir(parents=True, exist_ok=True)
    for name, text in files.items():
        (d / name).write_text(textwrap.dedent(text))
    lines = ["version: 1", "http:", "  lyft_config_dir: lyft"]
    lines += [f"  {k}: {json.dumps(v)}" for k, v in http.items()]
    main = tmp / "netlimit.yaml"
    main.write_text("\n".join(lines) + "\n")
    return load_file(main)


def rules(tmp: Path, files: dict[str, str], **http: Any) -> RuleSet:
    return from_loaded(lyft_dir(tmp, files, **http))


class Clock:
    """Upstream's MockTimeSource: a fixed Unix time the test moves."""

    def __init__(self, now: float) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now


class ClockedRedis(RedisStore):
    """The real Redis store (its Lua scripts on a real redis-server) deciding at
    the test's time instead of the server's, as upstream's tests fix time."""

    def __init__(self, url: str, clock: Clock) -> None:
        super().__init__(url, timeout_ms=2000, key_prefix=f"up{uuid.uuid4().hex[:8]}")
        self._test_clock = clock

    async def hit(self, key, limit, cost=1, *, now=None, _dry=b"0"):  # type: ignore[override]
        return await super().hit(key, limit, cost, now=self._test_clock() if now is None else now, _dry=_dry)


def limiter(rs: RuleSet, store: str, clock: Clock, redis_url: str | None = None) -> Limiter:
    if store == "memory":
        return Limiter(rs, MemoryStore(clock=clock))
    assert redis_url is not None
    return Limiter(rs, ClockedRedis(redis_url, clock), on_store_failure="closed")


# ------------------------------------------------------------------ what an answer must be


@dataclass(frozen=True)
class St:
    """One DescriptorStatus as upstream's tests write it: code, current_limit
    (requests_per_unit, UNIT name) or None, limit_remaining; duration_until_reset
    is what Lyft's CalculateReset gives at the test's time (None: not set)."""

    code: int = OK
    limit: tuple[int, str] | None = None
    remaining: int = 0


def reset_of(unit: str, now: float) -> int:
    """utils.CalculateReset: ``unit - now % unit`` in whole seconds of Unix time."""
    sec = UNIT_SECONDS[unit]
    return sec - int(now) % sec


def unlimited() -> St:
    return St(OK, None, U32_MAX)


def answer_of_grpc(resp: Any) -> tuple[int, list[tuple[int, tuple[int, str] | None, int, int | None]]]:
    """(overall code, [(code, (rpu, unit) | None, remaining, reset seconds | None)]) of a RateLimitResponse."""
    out = []
    for s in resp.statuses:
        lim = (
            (s.current_limit.requests_per_unit, _UNIT_NAME(s.current_limit.unit))
            if s.HasField("current_limit")
            else None
        )
        dur = s.duration_until_reset.seconds if s.HasField("duration_until_reset") else None
        if dur is not None:
            assert s.duration_until_reset.nanos == 0, "duration_until_reset is whole seconds, as Lyft's"
        out.append((s.code, lim, s.limit_remaining, dur))
    return resp.overall_code, out


_CODES = {"OK": OK, "OVER_LIMIT": 2, "UNKNOWN": 0}


def answer_of_json(doc: dict[str, Any]) -> tuple[int, list[tuple[int, tuple[int, str] | None, int, int | None]]]:
    """The same from the JSON API's answer (protobuf's JSON mapping of the response)."""
    out = []
    for s in doc["statuses"]:
        cl = s.get("currentLimit")
        lim = (cl["requestsPerUnit"], cl["unit"]) if cl is not None else None
        rem = U32_MAX if s.get("unlimited") else s.get("limitRemaining", 0)
        dur = s.get("durationUntilReset")
        out.append((_CODES[s["code"]], lim, rem, int(dur[:-1]) if dur is not None else None))
    return _CODES[doc["overallCode"]], out


def expected(code: int, statuses: list[St], now: float) -> tuple[int, list[tuple[int, Any, int, int | None]]]:
    return code, [(s.code, s.limit, s.remaining, reset_of(s.limit[1], now) if s.limit else None) for s in statuses]


class Doors:
    """One limiter behind both doors: ``await doors.ask(request)`` sends the
    RateLimitRequest through the gRPC door and, on a twin limiter fed the same
    requests, through the JSON door, and returns both answers."""

    def __init__(self, grpc_running: Any, json_limiter: Limiter | None) -> None:
        self.s = grpc_running
        self.json = json_limiter

    async def grpc(self, req: Any) -> Any:
        return await self.s.stub.ShouldRateLimit(req, timeout=10)

    async def ask(self, req: Any) -> list[tuple[str, Any]]:
        out: list[tuple[str, Any]] = [("grpc", answer_of_grpc(await self.grpc(req)))]
        if self.json is not None:
            body = json.dumps(_json_body(req)).encode()
            result = await self.json.check(parse_json_request(body))
            out.append(("json", answer_of_json(result_json(result))))
        return out


def _json_body(req: Any) -> dict[str, Any]:
    """A RateLimitRequest in the JSON API's body (protobuf's JSON mapping)."""
    descs = []
    for d in req.descriptors:
        one: dict[str, Any] = {"entries": [{"key": e.key, "value": e.value} for e in d.entries]}
        if d.HasField("hits_addend"):
            one["hitsAddend"] = d.hits_addend.value
        if d.HasField("limit"):
            unit = d.limit.DESCRIPTOR.fields_by_name["unit"].enum_type.values_by_number[d.limit.unit].name
            one["limit"] = {"requestsPerUnit": d.limit.requests_per_unit, "unit": unit}
        descs.append(one)
    body: dict[str, Any] = {"domain": req.domain, "descriptors": descs}
    if req.hits_addend:
        body["hitsAddend"] = req.hits_addend
    assert parse_request(req).costs == parse_json_request(json.dumps(body).encode()).costs
    return body


class serving_doors:  # noqa: N801 - used as `async with serving_doors(...)`
    """``async with serving_doors(make) as doors``: ``make()`` builds a limiter;
    one is served over gRPC, a second one answers the JSON door."""

    def __init__(self, make: Callable[[], Limiter], json_door: bool = True) -> None:
        self.make = make
        self.json_door = json_door
        self._cm: Any = None
        self._json: Limiter | None = None

    async def __aenter__(self) -> Doors:
        self._cm = serving(self.make())
        running = await self._cm.__aenter__()
        self._json = self.make() if self.json_door else None
        return Doors(running, self._json)

    async def __aexit__(self, *exc: Any) -> None:
        try:
            if self._json is not None:
                await self._json.close()
        finally:
            await self._cm.__aexit__(*exc)
