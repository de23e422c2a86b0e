"""What every store is: the interface the limiter calls, its one error, and
the stand-in for over-long keys.

State is kept per (Limit, key): the same key under two Limits that differ in any
field (name included) is two independent states.  Keys longer than the
store's ``max_key_length`` are replaced by a BLAKE2b digest, so clients cannot
make a store hold arbitrarily long strings.
"""

from __future__ import annotations

import hashlib
from typing import Protocol, runtime_checkable

from ..algorithms import Decision, Limit


@runtime_checkable
class Store(Protocol):
    async def hit(self, key: str, limit: Limit, cost: int = 1) -> Decision:
        """Decide and, when allowed, consume ``cost``."""
        ...

    async def peek(self, key: str, limit: Limit, cost: int = 1) -> Decision:
        """The decision ``hit`` would return now, without consuming anything."""
        ...

    async def close(self) -> None: ...


def hash_key(key: str) -> str:
    """Stand-in for a key longer than the store's cap: ``#`` + 32 hex digits."""
    return "#" + hashlib.blake2b(key.encode("utf-8", "surrogatepass"), digest_size=16).hexdigest()
