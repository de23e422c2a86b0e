"""The store's circuit breaker and what opens it (see limiter.py's module doc).

A store failure that says the store is unusable (:func:`trips`: a timeout, a
connection error, a failover reply) opens a :class:`Breaker`; any other error
concerns one call and leaves it closed.
"""

from __future__ import annotations

import asyncio
from typing import Any


def reason(exc: BaseException) -> str:
    """A bounded label for a store failure: timeout | connection | error."""
    seen = 0
    e: BaseException | None = exc
    while e is not None and seen < 5:
        if isinstance(e, (TimeoutError, asyncio.TimeoutError)) or type(e).__name__ == "TimeoutError":
            return "timeout"
        if isinstance(e, (ConnectionError, OSError)) or type(e).__name__ == "ConnectionError":
            return "connection"
        e = e.__cause__ or e.__context__
        seen += 1
    return "error"


#: replies of a server that cannot serve anyone right now (a failover, a load): like
#: a lost connection, they open the breaker (netlimit/limit/stores/topology.py)
_FAILOVER_REPLIES = ("READONLY", "LOADING", "MASTERDOWN", "CLUSTERDOWN", "TRYAGAIN")
_FAILOVER_CLASSES = ("ReadOnlyError", "BusyLoadingError", "MasterDownError", "ClusterDownError", "TryAgainError")


def trips(exc: BaseException) -> bool:
    """Whether a store failure says the store is unusable (opens the breaker):
    a timeout, a connection error, a failover reply.  Anything else (a script
    error such as an expiry Redis refuses, a reply the store could not parse, a
    bug) concerns one call, and one request must not switch the store off."""
    if reason(exc) != "error":
        return True
    seen = 0
    e: BaseException | None = exc
    while e is not None and seen < 5:
        if type(e).__name__ in _FAILOVER_CLASSES:
            return True
        if type(e).__name__ in ("ReplyError", "ResponseError") and str(e).startswith(_FAILOVER_REPLIES):
            return True
        e = e.__cause__ or e.__context__
        seen += 1
    return False


class Breaker:
    """One circuit breaker: open until ``down_until`` (clock time; 0 = closed)."""

    __slots__ = ("down_since", "down_until", "fallbacks", "part", "probing")

    def __init__(self, part: Any) -> None:
        self.part = part  # what it guards: None (the whole store) or a part's name
        self.down_until = 0.0
        self.down_since = 0.0
        self.probing = False  # one request is asking the store whether it is back
        self.fallbacks = 0  # decisions made without the store since it went down


#: at most this many per-part breakers are kept (see Limiter._part)
MAX_BREAKERS = 256
