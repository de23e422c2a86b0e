"""Shared state in Redis: one Lua script per limit, one round trip per decision.

The scripts in ``lua/`` perform exactly the floating-point operations of
:mod:`netlimit.limit.algorithms`, so this store and the memory store return
identical decisions for identical inputs (``tests/limit/test_conformance.py``).
"""

from __future__ import annotations

import asyncio
import hashlib
import math
from importlib import resources
from time import monotonic as _monotonic
from typing import Any

from redis.exceptions import NoScriptError as _RedisNoScriptError
from redis.exceptions import RedisError

from ...errors import StoreError
from ..algorithms import REGISTRY, Decision, Limit
from ..algorithms.base import _deny_all, _new
from .base import hash_key
from .resp import NoScriptError, RespClient, RespError, RespTimeoutError, bulk, parse_url

# What counts as "the store is sick" (fail open) rather than a bug in the caller:
# client errors (timeouts, connection, server/script errors, bad replies), socket
# errors and the overall asyncio.timeout.
_STORE_FAILURES = (RedisError, RespError, OSError, TimeoutError)

_LUA_CACHE: dict[str, str] = {}
# by Limit._sig: (the limit's script, its SHA1 as EVALSHA wants it, pack or None)
_LIMIT_LUA: dict[str, tuple[str, bytes, int | None]] = {}


def load_lua(algorithm: str) -> str:
    """The script body for ``algorithm``: ``lua/_prelude.lua`` (argument and time
    handling every script shares) followed by the algorithm's script (its module
    names it: :attr:`Algorithm.lua`).  It runs only behind the first line
    :func:`limit_lua` writes for a limit."""
    src = _LUA_CACHE.get(algorithm)
    if src is None:
        alg = REGISTRY.get(algorithm)
        if alg is None:
            raise ValueError(f"unknown algorithm {algorithm!r}")
        lua = resources.files(__package__).joinpath("lua")
        src = lua.joinpath("_prelude.lua").read_text("utf-8") + lua.joinpath(alg.lua).read_text("utf-8")
        _LUA_CACHE[algorithm] = src
    return src


def limit_lua(limit: Limit) -> str:
    """The Lua script for one limit: its constants as Lua literals in a first line
    (parsed once, when Redis compiles the script, instead of from ARGV on every
    call), then :func:`load_lua`.  Limits with the same parameters share it."""
    return _limit_script(limit)[0]


def _pack(limit: Limit) -> int | None:
    """The power of two an admission packs its reset (µs) under (``admit`` in
    _prelude.lua): above the longest reset an admission reports in steady use (two
    periods for the sliding counter, a full bucket's refill), with ``(cap + 1) *
    pack <= 2**53`` so the integer is exact in Lua's doubles; None if no such
    power exists (an admission then answers the full table)."""
    if not limit.limit:
        return None
    most = 2.0 * max(limit.period, limit._cap / limit._rate)
    pack = 1 << (math.ceil(most * 1e6) + 1).bit_length()
    return pack if (limit._cap + 1) * pack <= 2**53 else None


def _limit_script(limit: Limit) -> tuple[str, bytes, int | None]:
    s = _LIMIT_LUA.get(limit._sig)
    if s is None:
        alg = limit.algorithm
        nowstr = REGISTRY[alg].lua_now_string
        pack = _pack(limit)
        head = (
            "local lim, period, cap, ttl, queue, pack, nowstr_needed = "
            f"{limit.limit}, {limit.period!r}, {limit._cap}, '{math.ceil(limit.period * 1000) + 1000}', "
            f"{'true' if limit.delay else 'false'}, {pack or 'nil'}, {'true' if nowstr else 'false'}\n"
        )
        src = head + load_lua(alg)
        s = _LIMIT_LUA[limit._sig] = (src, hashlib.sha1(src.encode("utf-8")).hexdigest().encode(), pack)
    return s


def _decode(res: Any, limit: Limit, pack: int | None) -> Decision:
    """A script's reply as a Decision: ``{allowed, limit, remaining, retry_after,
    reset, delay}``, or an admission packed into one integer, ``remaining * pack
    + reset in µs`` (``admit`` in _prelude.lua)."""
    if res.__class__ is int:
        if pack is None or res < 0:
            raise ValueError("a packed admission from a limit that has none")
        d = _new(Decision)
        d.allowed = True
        d.limit = limit._cap
        d.remaining, r = divmod(res, pack)
        d.retry_after = 0.0
        d.reset = r / 1e6
        d.delay = 0.0
        return d
    return Decision(res[0] == 1, int(res[1]), int(res[2]), float(res[3]), float(res[4]), float(res[5]))


def _evalsha_frame(sha: bytes, argv: tuple[bytes, ...]) -> tuple[bytes, bytes]:
    """RESP for ``EVALSHA <sha> 1 <key> <argv...>`` in two parts: before the key
    and after it."""
    head = b"*%d\r\n" % (4 + len(argv)) + b"".join(map(bulk, (b"EVALSHA", sha, b"1")))
    return head, b"".join(map(bulk, argv))


def _argv(cost: int, now: float | None, dry: bytes) -> tuple[bytes, ...]:
    """ARGV of a call (_prelude.lua): none for the usual one (cost 1, the server's
    clock, a real hit), else cost, now ('' = the server's) and the dry-run flag."""
    if cost == 1 and now is None and dry == b"0":
        return ()
    return (b"%d" % cost, b"" if now is None else repr(float(now)).encode(), dry)


class RedisStore:
    """Shared state in Redis: one Lua script per limit (its constants compiled
    in, :func:`limit_lua`), one EVALSHA round trip per decision, time from the
    Redis server (``TIME``) so that sidecars with skewed clocks agree.

    ``url_or_client`` is a URL (the store then owns its client) or a
    ``redis.asyncio.Redis`` / ``RedisCluster`` instance (left open by
    :meth:`close`).  ``redis://[user:password@]host:port/db`` and
    ``unix://[user:password@]/path?db=N`` URLs use netlimit's own lean client
    (:mod:`netlimit.limit.stores.resp`: one pipelined connection, several times less
    Python per decision than redis-py); ``rediss://`` (TLS) and URLs with other
    options use redis-py.  Every call is bounded by ``timeout_ms`` in total;
    timeouts, refused connections, server errors and bad replies raise
    :class:`StoreError`.

    Keys: one per (rule, key), ``<key_prefix>:{<rule signature>:<key>}``.  The
    braces are a Redis Cluster hash tag; they kept the sliding log's second key
    ``...:seq`` of earlier versions in the same slot (no longer used: left-over
    ones expire by their TTL).  Every written key carries a TTL a second longer
    than the state can matter, so idle keys vanish.
    """

    def __init__(
        self,
        url_or_client: Any = "redis://127.0.0.1:6379/0",
        *,
        timeout_ms: float = 50,
        key_prefix: str = "netlimit",
        max_key_length: int = 256,
    ) -> None:
        if timeout_ms <= 0:
            raise ValueError("timeout_ms must be > 0")
        self._timeout = timeout_ms / 1000.0
        self._prefix = key_prefix
        self._max_key_length = max_key_length
        self._lean = False
        if isinstance(url_or_client, str):
            address = parse_url(url_or_client)
            if address is not None:
                # deadlines per command (connect included) inside the client: no
                # asyncio.timeout (a timer and a context manager) per call
                self._client: Any = RespClient(address, timeout=self._timeout)
                self._lean = True
            else:
                import redis.asyncio as aioredis
                from redis.asyncio.retry import Retry
                from redis.backoff import NoBackoff

                self._client = aioredis.Redis.from_url(
                    url_or_client,
                    # The per-call asyncio.timeout in _call bounds everything (connect,
                    # send, reply); a socket_timeout as well would only add a second
                    # timer per call inside redis-py.
                    socket_timeout=None,
                    socket_connect_timeout=self._timeout,
                    # one immediate retry repairs a stale pooled connection (Redis
                    # restarted); the asyncio.timeout still bounds the total
                    retry=Retry(NoBackoff(), 1),
                    health_check_interval=0,
                )
            self._owns_client = True
        else:
            self._client = url_or_client
            self._owns_client = False
        # lean client, by Limit._ns: (key head "<prefix>:{<sig>:", the script's SHA1,
        # its pack, {(cost, dry): the EVALSHA's RESP before and after the key (_evalsha_frame)})
        self._lean_args: dict[str, tuple[str, bytes, int | None, dict[tuple[int, bytes], tuple[bytes, bytes]]]] = {}

    @property
    def client(self) -> Any:
        """The client in use: a :class:`~netlimit.limit.stores.resp.RespClient` for
        ``redis://`` / ``unix://`` URLs, else the redis-py client."""
        return self._client

    def redis_keys(self, key: str, limit: Limit) -> list[str]:
        """The Redis key names holding ``key``'s state under ``limit``."""
        if len(key) > self._max_key_length:
            key = hash_key(key)
        return [f"{self._prefix}:{{{limit._sig}:{key}}}"]

    async def load_scripts(self, *limits: Limit) -> None:
        """SCRIPT LOAD the script of each of ``limits`` now (otherwise each one is
        loaded on its first use, and after a SCRIPT FLUSH or a restart, on NOSCRIPT:
        one more round trip)."""
        budget = max(self._timeout, 1.0)
        try:
            async with asyncio.timeout(budget):
                for limit in limits:
                    if limit._deny0:
                        continue
                    if self._lean:
                        await self._client.script_load(limit_lua(limit), timeout=budget)
                    else:
                        await self._client.script_load(limit_lua(limit))
        except _STORE_FAILURES as e:
            raise StoreError(f"redis: cannot load scripts: {e!r}") from e

    async def hit(
        self, key: str, limit: Limit, cost: int = 1, *, now: float | None = None, _dry: bytes = b"0"
    ) -> Decision:
        """Decide and consume.  ``now`` overrides the server clock (tests only).

        Through the lean client: one EVALSHA, its deadline kept by the client
        (no asyncio.timeout); everything but the key is encoded once per limit,
        cost and dry run (:func:`_evalsha_frame`).  Written out here, not in a helper,
        to save a coroutine per decision."""
        if not self._lean:
            return await self._call(key, limit, cost, now, _dry)
        if cost < 0:
            raise ValueError(f"cost must be >= 0, got {cost}")
        if limit._deny0:  # a limit of 0 needs no state (unless its algorithm counts denied hits)
            return _deny_all(cost)
        la = self._lean_args.get(limit._ns)
        if la is None:
            _, sha, pack = _limit_script(limit)
            la = (f"{self._prefix}:{{{limit._sig}:", sha, pack, {})
            self._lean_args[limit._ns] = la
        head, sha, pack, frames = la
        rkey = ((head + key if len(key) <= self._max_key_length else head + hash_key(key)) + "}").encode(
            "utf-8", "surrogatepass"
        )
        # the whole EVALSHA but the key, encoded once per (cost, dry run) when the
        # server's clock is used: one bytes formatting per decision
        if now is None:
            frame = frames.get((cost, _dry))
            if frame is None:
                frame = _evalsha_frame(sha, _argv(cost, None, _dry))
                if len(frames) < 64:
                    frames[(cost, _dry)] = frame
        else:
            frame = _evalsha_frame(sha, _argv(cost, now, _dry))
        data = b"%b$%d\r\n%b\r\n%b" % (frame[0], len(rkey), rkey, frame[1])
        t0 = _monotonic()
        try:
            try:
                res = await self._client.send_packed(data)
            except NoScriptError:  # SCRIPT FLUSH or a restarted / failed-over server
                res = await self._reload_and_retry(limit, data, self._timeout - (_monotonic() - t0))
        except _STORE_FAILURES as e:
            raise StoreError(f"redis {limit.algorithm} for {key!r}: {e!r}") from e
        try:
            return _decode(res, limit, pack)
        except (TypeError, ValueError, IndexError, KeyError) as e:
            raise StoreError(f"redis {limit.algorithm} for {key!r}: unexpected reply {res!r:.200}") from e

    async def peek(self, key: str, limit: Limit, cost: int = 1, *, now: float | None = None) -> Decision:
        return await self.hit(key, limit, cost, now=now, _dry=b"1")

    async def close(self) -> None:
        if self._owns_client:
            await self._client.aclose()

    async def _reload_and_retry(self, limit: Limit, data: bytes, budget: float) -> Any:
        """SCRIPT LOAD and the EVALSHA (``data``, encoded) again, sent back to back
        (one more round trip), within what is left of the call's timeout."""
        if budget <= 0:
            raise RespTimeoutError(f"NOSCRIPT for {limit.algorithm} and no time left to reload it")
        client = self._client
        loaded: Any
        res: Any
        loaded, res = await asyncio.gather(
            client.execute_command(b"SCRIPT", b"LOAD", limit_lua(limit), timeout=budget),
            client.send_packed(data, timeout=budget),
            return_exceptions=True,
        )
        if isinstance(loaded, BaseException):
            raise loaded
        if isinstance(res, BaseException):
            raise res
        return res

    async def _call(self, key: str, limit: Limit, cost: int, now: float | None, dry: bytes) -> Decision:
        """The decision through redis-py (a client passed in, or a URL the lean client does not handle)."""
        if cost < 0:
            raise ValueError(f"cost must be >= 0, got {cost}")
        if limit._deny0:  # a limit of 0 needs no state (unless its algorithm counts denied hits)
            return _deny_all(cost)
        keys = self.redis_keys(key, limit)
        src, sha, pack = _limit_script(limit)
        argv = _argv(cost, now, dry)
        try:
            async with asyncio.timeout(self._timeout):
                try:
                    res = await self._client.evalsha(sha, len(keys), *keys, *argv)
                except _RedisNoScriptError:  # first use, SCRIPT FLUSH, or a restarted / failed-over server
                    await self._client.script_load(src)
                    res = await self._client.evalsha(sha, len(keys), *keys, *argv)
        except _STORE_FAILURES as e:
            raise StoreError(f"redis {limit.algorithm} for {key!r}: {e!r}") from e
        try:
            return _decode(res, limit, pack)
        except (TypeError, ValueError, IndexError, KeyError) as e:
            raise StoreError(f"redis {limit.algorithm} for {key!r}: unexpected reply {res!r:.200}") from e
