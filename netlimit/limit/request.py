"""What a door asks the engine: :class:`CheckRequest`, and the one place its
bounds are checked.

A request is a domain and a list of descriptors, each a list of ``(key,
value)`` entries, with what Envoy's rate limit protocol lets a client say per
descriptor: its own cost (``hits_addend``) and a limit ``override``.  Both doors
(the HTTP sidecar's JSON endpoint and the gRPC RateLimitService) translate their
wire format into the same plain arguments of :func:`build_request`, so they
refuse the same requests with the same messages, and the engine never sees one
it cannot decide.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import NamedTuple

from ..config.model import UNIT_SECONDS
from ..errors import BadRequest

Entry = tuple[str, str]

#: more descriptors than any Envoy route produces; bounds the work per request
MAX_DESCRIPTORS = 64
MAX_ENTRIES = 32
#: a cost above this is a client bug, not a request
MAX_COST = 1_000_000
#: the longest key or value accepted (store keys are hashed beyond
#: ``http.max_key_length`` anyway; this bounds what a request can make us hash)
MAX_TEXT = 4096
#: the units of a limit override (Envoy's RateLimitUnit without UNKNOWN)
OVERRIDE_UNITS = ("second", "minute", "hour", "day", "month", "year")
#: the longest period a limit override may ask for (unit x unit_multiplier): one year
#: (365 days).  Longer ones are refused at the door, never handed to a store (Redis
#: cannot expire a key that far out, and one request must not make the store fail)
MAX_OVERRIDE_PERIOD = UNIT_SECONDS["year"]
#: the most requests per period a limit override may ask for (2^31)
MAX_OVERRIDE_REQUESTS = 2**31


class Override(NamedTuple):
    """A descriptor's ``limit`` override (envoyproxy/ratelimit ``GetLimit``): it
    replaces the configured limit of that descriptor."""

    unit: str
    requests_per_unit: int
    multiplier: int = 1


class DescriptorIn(NamedTuple):
    """One descriptor as a door read it, before the bounds are checked."""

    entries: Sequence[Entry]
    #: its own cost, or None for the request's
    hits_addend: int | None = None
    override: Override | None = None


@dataclass(slots=True)
class CheckRequest:
    """A validated request.  ``costs`` has one cost per descriptor (>= 0; 0 is a
    free probe); ``overrides`` one override or None per descriptor, or is empty
    when no descriptor has one."""

    domain: str
    descriptors: list[list[Entry]]
    costs: list[int]
    overrides: list[Override | None]

    @classmethod
    def simple(cls, domain: str, descriptors: list[list[Entry]], cost: int = 1) -> CheckRequest:
        """A request built by netlimit itself (the HTTP endpoints' actions): one
        cost for every descriptor, no override, bounds already guaranteed."""
        return cls(domain, descriptors, [cost] * len(descriptors), [])


def build_request(domain: str, descriptors: Sequence[DescriptorIn], hits_addend: int = 0) -> CheckRequest:
    """Check a door's request against the bounds; :class:`BadRequest` names the
    field.  ``hits_addend`` 0 means 1 (proto3's unset value, as Lyft reads it)."""
    if not domain:
        raise BadRequest("domain must not be empty (the http.domain of the netlimit file)")
    n = len(descriptors)
    if n == 0:
        raise BadRequest("the descriptor list must not be empty")
    if n > MAX_DESCRIPTORS:
        raise BadRequest(f"at most {MAX_DESCRIPTORS} descriptors per request, got {n}")
    cost = _cost(hits_addend, "hits_addend") or 1
    descs: list[list[Entry]] = []
    costs: list[int] = []
    overrides: list[Override | None] = []
    for i, d in enumerate(descriptors):
        entries = d.entries
        if not entries:
            raise BadRequest(f"descriptors[{i}].entries is empty")
        if len(entries) > MAX_ENTRIES:
            raise BadRequest(f"descriptors[{i}].entries: at most {MAX_ENTRIES} entries, got {len(entries)}")
        for j, (k, v) in enumerate(entries):
            if not k:
                raise BadRequest(f"descriptors[{i}].entries[{j}].key must not be empty")
            if len(k) > MAX_TEXT or len(v) > MAX_TEXT:
                raise BadRequest(f"descriptors[{i}].entries[{j}]: keys and values are limited to {MAX_TEXT} characters")
        descs.append(list(entries))
        costs.append(cost if d.hits_addend is None else _cost(d.hits_addend, f"descriptors[{i}].hits_addend"))
        ov = d.override
        if ov is not None:
            if ov.unit not in OVERRIDE_UNITS:
                raise BadRequest(
                    f"descriptors[{i}].limit.unit must be one of {', '.join(u.upper() for u in OVERRIDE_UNITS)}, "
                    f"got {ov.unit!r}"
                )
            if not 0 <= ov.requests_per_unit <= MAX_OVERRIDE_REQUESTS:
                raise BadRequest(
                    f"descriptors[{i}].limit.requests_per_unit must be 0-{MAX_OVERRIDE_REQUESTS} (2^31), "
                    f"got {_short(ov.requests_per_unit)}"
                )
            if ov.multiplier < 1:
                ov = ov._replace(multiplier=1)
            if UNIT_SECONDS[ov.unit] * ov.multiplier > MAX_OVERRIDE_PERIOD:
                raise BadRequest(
                    f"descriptors[{i}].limit: the period ({ov.unit} x unit_multiplier "
                    f"{_short(ov.multiplier)}) "
                    f"is longer than the maximum of one year ({MAX_OVERRIDE_PERIOD} seconds)"
                )
        overrides.append(ov)
    if all(o is None for o in overrides):
        overrides = []
    return CheckRequest(domain, descs, costs, overrides)


def _cost(n: int, field: str) -> int:
    if not 0 <= n <= MAX_COST:
        raise BadRequest(f"{field} must be a whole number from 0 to {MAX_COST}, got {n}")
    return n


def _short(n: int) -> str:
    """A client's number for a message: at most 20 digits shown."""
    t = str(n)
    return t if len(t) <= 20 else f"{t[:20]}... ({len(t)} digits)"
