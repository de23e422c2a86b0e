"""Where limiter state lives: in process (MemoryStore) or in Redis (RedisStore).

Both stores run the same algorithms (``algorithms.py`` in Python, ``lua/*.lua``
inside Redis) and return identical :class:`Decision` objects for identical
inputs; ``tests/http/test_conformance.py`` holds them to that.

State is kept per (Limit, key): the same key under two Limits that differ in any
field (name included) is two independent states.  Keys longer than
``max_key_length`` are replaced by a BLAKE2b digest, so clients cannot make the
store hold arbitrarily long strings.
"""

from __future__ import annotations

import asyncio
import hashlib
import math
import time
from array import array
from collections import OrderedDict
from importlib import resources
from typing import Any, Callable, Protocol, runtime_checkable

from redis.exceptions import NoScriptError, RedisError

from .algorithms import ALGORITHMS, DECIDERS, Decision, Limit, _LIMIT_BY_NS, is_idle

__all__ = ["Store", "StoreError", "MemoryStore", "RedisStore", "hash_key", "load_lua"]


class StoreError(Exception):
    """The store could not decide in time (timeout, connection refused, server
    error).  The sidecar catches this to fail open / decide locally."""


@runtime_checkable
class Store(Protocol):
    async def hit(self, key: str, limit: Limit, cost: int = 1) -> Decision:
        """Decide and, when allowed, consume ``cost``."""
        ...

    async def peek(self, key: str, limit: Limit, cost: int = 1) -> Decision:
        """The decision ``hit`` would return now, without consuming anything."""
        ...

    async def close(self) -> None:
        ...


def hash_key(key: str) -> str:
    """Stand-in for a key longer than the store's cap: ``#`` + 32 hex digits."""
    return "#" + hashlib.blake2b(key.encode("utf-8", "surrogatepass"), digest_size=16).hexdigest()


def _deny_all(cost: int) -> Decision:
    if cost == 0:
        return Decision(True, 0, 0, 0.0, 0.0)
    return Decision(False, 0, 0, math.inf, 0.0)


# --------------------------------------------------------------------------- memory

class MemoryStore:
    """Bounded in-process store (one asyncio loop / thread; not thread-safe).

    * At most ``max_keys`` states; when full the least recently used one is
      evicted (``OrderedDict``, O(1)).
    * Idle states (ones that decide exactly like no state) are forgotten lazily:
      each time a new key is inserted the two least recently used entries are
      checked and dropped if idle, and :meth:`purge_idle` sweeps everything.
    * Keys longer than ``max_key_length`` are hashed (:func:`hash_key`).
    * ``clock`` gives "now" in seconds.  The default, ``time.time``, keeps fixed
      windows aligned to the epoch (minute windows start at :00) and agrees with
      Redis' ``TIME``; a clock that steps back is handled conservatively.
    """

    __slots__ = ("_data", "_max_keys", "_max_key_length", "_clock", "evictions")

    def __init__(self, max_keys: int = 100_000, max_key_length: int = 256,
                 clock: Callable[[], float] = time.time) -> None:
        if max_keys < 1:
            raise ValueError("max_keys must be >= 1")
        if max_key_length < 1:
            raise ValueError("max_key_length must be >= 1")
        self._data: OrderedDict[str, Any] = OrderedDict()
        self._max_keys = max_keys
        self._max_key_length = max_key_length
        self._clock = clock
        self.evictions = 0  # states dropped because the store was full (not idle ones)

    def __len__(self) -> int:
        return len(self._data)

    def hit_sync(self, key: str, limit: Limit, cost: int = 1, now: float | None = None) -> Decision:
        """Decide for ``key`` under ``limit`` and consume ``cost`` when allowed."""
        if now is None:
            now = self._clock()
        if len(key) > self._max_key_length:
            key = hash_key(key)
        if cost < 0:
            raise ValueError(f"cost must be >= 0, got {cost}")
        k = limit._ns + key
        data = self._data
        state = data.get(k)
        decision, new_state = DECIDERS[limit.algorithm](limit, state, now, cost)
        if state is None:
            if new_state is not None:
                if len(data) >= self._max_keys:
                    self._make_room(now)
                else:
                    self._drop_idle(now)
                data[k] = new_state
        else:
            if new_state is not state:
                data[k] = new_state
            data.move_to_end(k)
        return decision

    def peek_sync(self, key: str, limit: Limit, cost: int = 1, now: float | None = None) -> Decision:
        """The decision ``hit_sync`` would return, without changing anything."""
        if now is None:
            now = self._clock()
        if len(key) > self._max_key_length:
            key = hash_key(key)
        if cost < 0:
            raise ValueError(f"cost must be >= 0, got {cost}")
        state = self._data.get(limit._ns + key)
        if isinstance(state, array):  # the sliding log updates its array in place
            state = array("d", state)
        return DECIDERS[limit.algorithm](limit, state, now, cost)[0]

    async def hit(self, key: str, limit: Limit, cost: int = 1, *, now: float | None = None) -> Decision:
        return self.hit_sync(key, limit, cost, now)

    async def peek(self, key: str, limit: Limit, cost: int = 1, *, now: float | None = None) -> Decision:
        return self.peek_sync(key, limit, cost, now)

    async def close(self) -> None:
        self._data.clear()

    def clear(self) -> None:
        self._data.clear()

    def purge_idle(self, now: float | None = None) -> int:
        """Drop every idle state (O(n)); returns how many were dropped."""
        if now is None:
            now = self._clock()
        data = self._data
        idle = [k for k, state in data.items() if self._idle(k, state, now)]
        for k in idle:
            del data[k]
        return len(idle)

    # -- internals
    @staticmethod
    def _idle(k: str, state: Any, now: float) -> bool:
        limit = _LIMIT_BY_NS.get(k[: k.index(":") + 1])
        return limit is None or is_idle(limit, state, now)

    def _drop_idle(self, now: float) -> None:
        # Amortised expiry: look at the two least recently used entries.
        data = self._data
        for _ in range(2):
            if not data:
                return
            k = next(iter(data))
            if not self._idle(k, data[k], now):
                return
            del data[k]

    def _make_room(self, now: float) -> None:
        data = self._data
        k = next(iter(data))
        if not self._idle(k, data[k], now):
            self.evictions += 1
        del data[k]


# --------------------------------------------------------------------------- redis

# What counts as "the store is sick" (fail open) rather than a bug in the caller:
# redis-py errors (timeouts, connection, server/script errors), socket errors and
# the overall asyncio.timeout.
_STORE_FAILURES = (RedisError, OSError, TimeoutError)

_LUA_CACHE: dict[str, str] = {}


def load_lua(algorithm: str) -> str:
    """Source of the Lua script for ``algorithm`` (package data ``lua/<algorithm>.lua``)."""
    src = _LUA_CACHE.get(algorithm)
    if src is None:
        if algorithm not in ALGORITHMS:
            raise ValueError(f"unknown algorithm {algorithm!r}")
        src = resources.files(__package__).joinpath("lua", f"{algorithm}.lua").read_text("utf-8")
        _LUA_CACHE[algorithm] = src
    return src


class RedisStore:
    """Shared state in Redis: one Lua script per algorithm, one EVALSHA round trip
    per decision, time from the Redis server (``TIME``) so that sidecars with
    skewed clocks agree.

    ``url_or_client`` is a ``redis://`` URL (the store then owns its client) or a
    ``redis.asyncio.Redis`` / ``RedisCluster`` instance (left open by
    :meth:`close`).  Every call is bounded by ``timeout_ms`` in total; timeouts,
    refused connections and server errors raise :class:`StoreError`.

    Keys: ``<key_prefix>:{<rule signature>:<key>}`` (plus ``...:seq`` for the
    sliding log).  The braces are a Redis Cluster hash tag, so all keys of one
    decision map to one slot.  Every written key carries a TTL a second longer
    than the state can matter, so idle keys vanish.
    """

    def __init__(self, url_or_client: Any = "redis://127.0.0.1:6379/0", *, timeout_ms: float = 50,
                 key_prefix: str = "netlimit", max_key_length: int = 256) -> None:
        if timeout_ms <= 0:
            raise ValueError("timeout_ms must be > 0")
        self._timeout = timeout_ms / 1000.0
        self._prefix = key_prefix
        self._max_key_length = max_key_length
        if isinstance(url_or_client, str):
            import redis.asyncio as aioredis
            from redis.asyncio.retry import Retry
            from redis.backoff import NoBackoff

            self._client = aioredis.Redis.from_url(
                url_or_client,
                socket_timeout=self._timeout,
                socket_connect_timeout=self._timeout,
                # one immediate retry repairs a stale pooled connection (Redis
                # restarted); the asyncio.timeout below still bounds the total
                retry=Retry(NoBackoff(), 1),
                health_check_interval=0,
            )
            self._owns_client = True
        else:
            self._client = url_or_client
            self._owns_client = False
        self._shas: dict[str, str] = {}
        self._args: dict[Limit, tuple[str, str, str, str]] = {}

    @property
    def client(self) -> Any:
        return self._client

    def redis_keys(self, key: str, limit: Limit) -> list[str]:
        """The Redis key names holding ``key``'s state under ``limit``."""
        if len(key) > self._max_key_length:
            key = hash_key(key)
        base = f"{self._prefix}:{{{limit._sig}:{key}}}"
        if limit.algorithm == "sliding_window_log":
            return [base, base + ":seq"]
        return [base]

    async def load_scripts(self) -> None:
        """SCRIPT LOAD every algorithm's script (done lazily on first use)."""
        try:
            async with asyncio.timeout(max(self._timeout, 1.0)):
                for alg in ALGORITHMS:
                    self._shas[alg] = await self._client.script_load(load_lua(alg))
        except _STORE_FAILURES as e:
            raise StoreError(f"redis: cannot load scripts: {e!r}") from e

    async def hit(self, key: str, limit: Limit, cost: int = 1, *, now: float | None = None) -> Decision:
        """Decide and consume.  ``now`` overrides the server clock (tests only)."""
        return await self._call(key, limit, cost, now, "0")

    async def peek(self, key: str, limit: Limit, cost: int = 1, *, now: float | None = None) -> Decision:
        return await self._call(key, limit, cost, now, "1")

    async def close(self) -> None:
        if self._owns_client:
            await self._client.aclose()

    async def _call(self, key: str, limit: Limit, cost: int, now: float | None, dry: str) -> Decision:
        if cost < 0:
            raise ValueError(f"cost must be >= 0, got {cost}")
        if limit.limit == 0:
            return _deny_all(cost)
        args = self._args.get(limit)
        if args is None:
            args = (str(limit.limit), repr(limit.period), str(limit.capacity), "1" if limit.delay else "0")
            self._args[limit] = args
        keys = self.redis_keys(key, limit)
        alg = limit.algorithm
        argv = (*args, str(cost), "" if now is None else repr(float(now)), dry)

        try:
            async with asyncio.timeout(self._timeout):
                sha = self._shas.get(alg)
                if sha is None:
                    sha = self._shas[alg] = await self._client.script_load(load_lua(alg))
                try:
                    res = await self._client.evalsha(sha, len(keys), *keys, *argv)
                except NoScriptError:  # SCRIPT FLUSH or a restarted / failed-over server
                    self._shas[alg] = sha = await self._client.script_load(load_lua(alg))
                    res = await self._client.evalsha(sha, len(keys), *keys, *argv)
        except _STORE_FAILURES as e:
            raise StoreError(f"redis {alg} for {key!r}: {e!r}") from e
        return Decision(res[0] == 1, int(res[1]), int(res[2]), float(res[3]), float(res[4]), float(res[5]))
