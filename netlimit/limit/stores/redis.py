"""Shared state in Redis: one Lua script per limit, one round trip per decision.

A limit override (a :class:`~netlimit.limit.algorithms.DynamicLimit`, whose
numbers come from a request) has no script of its own: one script per algorithm
reads its numbers from ARGV (:func:`_dynamic_script`), so the scripts Redis caches
stay a bounded set whatever overrides clients send.

The scripts in ``lua/`` perform exactly the floating-point operations of
:mod:`netlimit.limit.algorithms`, so this store and the memory store return
identical decisions for identical inputs (``tests/limit/test_conformance.py``).
"""

from __future__ import annotations

import asyncio
import hashlib
import logging
import math
from binascii import crc_hqx
from dataclasses import replace
from importlib import resources
from time import monotonic as _monotonic
from typing import Any

from redis.exceptions import NoScriptError as _RedisNoScriptError
from redis.exceptions import RedisError

from ...config.redis_url import RedisURL, parse_redis_url
from ...errors import StoreError
from ..algorithms import REGISTRY, Decision, Limit
from ..algorithms.base import _deny_all, _new
from .base import hash_key
from .cluster import ClusterClient, key_slot, no_node
from .resp import (
    NoScriptError,
    ReplyError,
    RespClient,
    RespConnectionError,
    RespError,
    RespTimeoutError,
    bulk,
    url_addresses,
)
from .sentinel import SentinelClient
from .topology import TopologyStats, is_failover_error, parse_redirect

log = logging.getLogger("netlimit.limit")

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


def _dynamic_script(limit: Limit) -> tuple[str, bytes, int | None]:
    """The script of a DynamicLimit (a limit override): one per algorithm, the
    limit's numbers read from ARGV[4..9] (:func:`_dynamic_argv`) instead of Lua
    literals, so any number of overrides run a bounded set of scripts in Redis
    (and in ``_LIMIT_LUA``); the pack is the limit's own."""
    alg = limit.algorithm
    s = _LIMIT_LUA.get("~" + alg)
    if s is None:
        nowstr = REGISTRY[alg].lua_now_string
        head = (
            "local lim, period, cap, ttl, queue, pack, nowstr_needed = tonumber(ARGV[4]), tonumber(ARGV[5]), "
            f"tonumber(ARGV[6]), ARGV[7], ARGV[8] == '1', tonumber(ARGV[9]), {'true' if nowstr else 'false'}\n"
        )
        src = head + load_lua(alg)
        s = _LIMIT_LUA["~" + alg] = (src, hashlib.sha1(src.encode("utf-8")).hexdigest().encode(), None)
    return s[0], s[1], _pack(limit)


def _dynamic_argv(limit: Limit, pack: int | None, cost: int, now: float | None, dry: bytes) -> tuple[bytes, ...]:
    """ARGV of a DynamicLimit's call: cost, now, dry run (always given), then the
    numbers :func:`_limit_script` writes as literals for a configured limit."""
    return (
        b"%d" % cost,
        b"" if now is None else repr(float(now)).encode(),
        dry,
        b"%d" % limit.limit,
        repr(limit.period).encode(),
        b"%d" % limit._cap,
        b"%d" % (math.ceil(limit.period * 1000) + 1000),
        b"1" if limit.delay else b"0",
        b"" if pack is None else b"%d" % pack,
    )


def _limit_script(limit: Limit) -> tuple[str, bytes, int | None]:
    if limit._dynamic:
        return _dynamic_script(limit)
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


_ASKING = b"*1\r\n$6\r\nASKING\r\n"
#: commands one decision may send after its first: a script load, redirects
_MAX_TRIES = 5


class RedisStore:
    """Shared state in Redis: one Lua script per limit (its constants compiled
    in, :func:`limit_lua`), one EVALSHA round trip per decision, time from the
    Redis server (``TIME``) so that sidecars with skewed clocks agree.

    ``url_or_client`` is a URL (the store then owns its client) or a
    ``redis.asyncio.Redis`` / ``RedisCluster`` instance (left open by
    :meth:`close`).  URLs (netlimit/config/redis_url.py) use netlimit's own lean
    client (:mod:`netlimit.limit.stores.resp`: one pipelined connection per
    server, several times less Python per decision than redis-py):

    * ``redis://``, ``rediss://``, ``unix://``: one server.  One that turns out
      to be a Redis Cluster node (``INFO cluster`` at :meth:`start`, or the first
      ``MOVED``) is followed as a cluster, and a warning says so;
    * ``redis+cluster://`` / ``rediss+cluster://``: a Redis Cluster
      (:mod:`.cluster`: the slot map, one connection per primary, MOVED and ASK);
    * ``redis+sentinel://`` / ``rediss+sentinel://``: the primary the sentinels
      name (:mod:`.sentinel`), followed through failovers.

    A single-server URL with query options the lean client does not know uses
    redis-py.  Every call is bounded by ``timeout_ms`` in total, redirects and
    a script reload included; timeouts, refused connections, server errors,
    bad replies, ``TRYAGAIN`` / ``CLUSTERDOWN`` / ``READONLY`` / ``LOADING`` raise
    :class:`StoreError` (the limiter's ``on_store_failure`` decides).

    Keys: one per (rule, key), ``<key_prefix>:{<rule signature>:<key>}``.  The
    braces are a Redis Cluster hash tag: a decision touches one slot.  Every
    written key carries a TTL a second longer than the state can matter, so
    idle keys vanish.
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
        #: redirects, failovers, refreshes and errors per node (netlimit/limit/metrics.py)
        self.stats = TopologyStats()
        # where a decision goes: the cluster's slot map, the sentinels' primary, or one server
        self._cluster: ClusterClient | None = None
        self._slots: list[RespClient | None] | None = None  # self._cluster.slots
        self._sentinel: SentinelClient | None = None
        self._node: RespClient | None = None
        if isinstance(url_or_client, str):
            u = parse_redis_url(url_or_client)
            self._owns_client = True
            self._lean = u.kind == "cluster" or u.kind == "sentinel" or not u.other
            if u.kind == "cluster":
                self._cluster = ClusterClient(url_addresses(u), timeout=self._timeout, stats=self.stats)
                self._slots = self._cluster.slots
                self._client: Any = self._cluster
            elif u.kind == "sentinel":
                self._sentinel = self._client = _sentinel_client(u, self._timeout, self.stats)
            elif self._lean:
                # deadlines per command (connect included) inside the client: no
                # asyncio.timeout (a timer and a context manager) per call
                self._node = self._client = RespClient(url_addresses(u)[0], timeout=self._timeout)
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
        else:
            self._client = url_or_client
            self._owns_client = False
        # lean client, by Limit._ns: (key head "<prefix>:{<sig>:", the script's SHA1,
        # its pack, {(cost, dry): the EVALSHA's RESP before and after the key (_evalsha_frame)},
        # the head's length in bytes, the CRC16 of the hash tag's part in the head or -1)
        self._lean_args: dict[
            str, tuple[str, bytes, int | None, dict[tuple[int, bytes], tuple[bytes, bytes]], int, int]
        ] = {}

    @property
    def client(self) -> Any:
        """The client in use: a :class:`~netlimit.limit.stores.resp.RespClient`
        (one server), a :class:`~.cluster.ClusterClient`, a
        :class:`~.sentinel.SentinelClient`, or the redis-py client."""
        return self._client

    @property
    def kind(self) -> str:
        """single | cluster | sentinel (what the store talks to now)."""
        return "cluster" if self._cluster is not None else "sentinel" if self._sentinel is not None else "single"

    def redis_keys(self, key: str, limit: Limit) -> list[str]:
        """The Redis key names holding ``key``'s state under ``limit``."""
        if len(key) > self._max_key_length:
            key = hash_key(key)
        return [f"{self._prefix}:{{{limit._sig}:{key}}}"]

    async def start(self, budget: float = 2.0) -> None:
        """Learn the topology before the first decision (at most ``budget``
        seconds): the cluster's slot map, the sentinels' primary; for a
        single-server URL, whether it is a Redis Cluster node (then it is followed
        as a cluster, with a warning).  An unreachable store is logged, not
        raised: decisions follow ``on_store_failure`` until it answers.  Raises
        :class:`StoreError` only for a cluster node behind a URL that makes the
        store use redis-py, which cannot follow it."""
        where = self._where()
        try:
            if self._cluster is not None:
                if not await self._cluster.refresh(budget):
                    log.warning("redis cluster %s: no slot map yet (%s)", where, self._cluster.last_refresh_error)
            elif self._sentinel is not None:
                if not await self._sentinel.start(budget):
                    log.warning(
                        "redis sentinel %s: no primary for %r yet (%s)",
                        where,
                        self._sentinel.service,
                        self._sentinel.last_error,
                    )
            elif self._node is not None:
                try:
                    info = await self._node.execute_command(b"INFO", b"cluster", timeout=budget)
                except ReplyError as e:  # e.g. an ACL user without +info
                    log.info(
                        "redis %s: INFO cluster refused (%s); a cluster node is recognised at its first MOVED", where, e
                    )
                    return
                if b"cluster_enabled:1" in info:
                    self._follow_cluster("INFO cluster says cluster_enabled:1")
                    assert self._cluster is not None
                    await self._cluster.refresh(budget)
            elif self._owns_client:
                async with asyncio.timeout(budget):
                    info = await self._client.info("cluster")
                if info.get("cluster_enabled") in (1, "1"):
                    raise StoreError(
                        f"redis at {where} is a Redis Cluster node, and this URL's options make netlimit use "
                        "redis-py's single-server client, which cannot follow a cluster: use "
                        "redis+cluster://host:port/ (options: netlimit/config/redis_url.py)"
                    )
        except _STORE_FAILURES as e:
            log.warning(
                "redis %s: not usable at start (%s); decisions follow on_store_failure until it answers", where, e
            )
            return
        await self._check_eviction_policy(budget)

    async def _check_eviction_policy(self, budget: float) -> None:
        """Warn once when a server's ``maxmemory-policy`` is not ``noeviction``: a
        full Redis then evicts rate limit counters (every key has a TTL, so the
        volatile-* policies pick them too), and a client whose counter is evicted
        gets a fresh limit.  Read from ``INFO memory`` (CONFIG is often disabled);
        a refusal is not an error."""
        policies: dict[str, str] = {}
        try:
            async with asyncio.timeout(budget):
                if self._lean:
                    if self._cluster is not None:
                        nodes = self._cluster.primaries()
                    elif self._sentinel is not None:
                        nodes = [self._sentinel.primary] if self._sentinel.primary is not None else []
                    else:
                        nodes = [self._node] if self._node is not None else []
                    for n in nodes[:64]:
                        info = await n.execute_command(b"INFO", b"memory", timeout=budget)
                        text = info.decode("utf-8", "replace") if isinstance(info, bytes) else str(info)
                        for line in text.splitlines():
                            if line.startswith("maxmemory_policy:"):
                                policies[str(n.address)] = line.split(":", 1)[1].strip()
                elif self._owns_client:
                    info = await self._client.info("memory")
                    if "maxmemory_policy" in info:
                        policies[self._where()] = str(info["maxmemory_policy"])
        except (*_STORE_FAILURES, ReplyError) as e:
            log.info("redis %s: maxmemory-policy not read (%s)", self._where(), e)
            return
        bad = {a: p for a, p in policies.items() if p != "noeviction"}
        if bad:
            where, policy = next(iter(bad.items()))
            log.warning(
                "redis %s: maxmemory-policy is %s%s: when Redis is full it evicts rate limit counters, and a "
                "client whose counter is evicted gets a fresh limit (one flooding a per-client rule can evict "
                "everyone's); set maxmemory-policy noeviction, with which a full Redis refuses the writes and "
                "those decisions follow on_store_failure (docs/security.md, Budgets and overrides)",
                where,
                policy,
                f" (and on {len(bad) - 1} more nodes)" if len(bad) > 1 else "",
            )

    def _where(self) -> str:
        if self._node is not None:
            return str(self._node.address)
        if self._cluster is not None:
            return ",".join(str(a) for a in self._cluster.seeds)
        if self._sentinel is not None:
            return ",".join(str(a) for a in self._sentinel.sentinels)
        return repr(self._client)[:100]

    def _follow_cluster(self, why: str) -> None:
        """A single-server URL named a cluster node: route by slot from now on."""
        node = self._node
        assert node is not None
        addr = node.address
        self._cluster = ClusterClient([addr], timeout=self._timeout, stats=self.stats)
        self._cluster.nodes[str(addr)] = node  # its connection serves on
        self._slots = self._cluster.slots
        self._client = self._cluster
        self._node = None
        log.warning(
            "redis at %s is a Redis Cluster node (%s): following it as a cluster (write redis+cluster://%s/ "
            "to say so; other nodes are learned from it)",
            addr,
            why,
            addr,
        )

    def topology(self) -> dict[str, Any]:
        """What the store talks to, for /healthz: nodes, their role, whether they answer."""
        if self._cluster is not None:
            return self._cluster.topology()
        if self._sentinel is not None:
            return self._sentinel.topology()
        if self._node is not None:
            n = self._node
            return {
                "kind": "single",
                "nodes": [{"address": str(n.address), "role": "primary", "reachable": n.reachable}],
            }
        return {"kind": "single", "client": "redis-py", "nodes": []}

    async def load_scripts(self, *limits: Limit) -> None:
        """SCRIPT LOAD the script of each of ``limits`` now (on every primary of a
        cluster; otherwise each one is loaded on its first use, and after a
        SCRIPT FLUSH, a restart or a failover, on NOSCRIPT: one more round trip)."""
        budget = max(self._timeout, 1.0)
        try:
            async with asyncio.timeout(budget):
                if self._lean:
                    if self._cluster is not None:
                        if not await self._cluster.ensure_map(budget):
                            raise RespConnectionError(f"no slot map: {self._cluster.last_refresh_error}")
                        nodes = self._cluster.primaries()
                    elif self._sentinel is not None:
                        nodes = [await self._sentinel.ensure_primary(budget)]
                    else:
                        assert self._node is not None
                        nodes = [self._node]
                    srcs = [limit_lua(limit) for limit in limits if not limit._deny0]
                    await asyncio.gather(
                        *(n.execute_command(b"SCRIPT", b"LOAD", src, timeout=budget) for n in nodes for src in srcs)
                    )
                else:
                    for limit in limits:
                        if not limit._deny0:
                            await self._client.script_load(limit_lua(limit))
        except _STORE_FAILURES as e:
            raise StoreError(f"redis: cannot load scripts: {e!r}") from e

    async def hit(
        self, key: str, limit: Limit, cost: int = 1, *, now: float | None = None, _dry: bytes = b"0"
    ) -> Decision:
        """Decide and consume.  ``now`` overrides the server clock (tests only).

        Through the lean client: one EVALSHA to the key's server, its deadline
        kept by the client (no asyncio.timeout); everything but the key is encoded
        once per limit, cost and dry run (:func:`_evalsha_frame`).  Anything but a
        reply (NOSCRIPT, a redirect, a failure) goes to :meth:`_slow`.  Written
        out here, not in a helper, to save a coroutine per decision."""
        if cost < 0:
            raise ValueError(f"cost must be >= 0, got {cost}")
        if limit._deny0:  # a limit of 0 needs no state (unless its algorithm counts denied hits)
            return _deny_all(cost)
        if not self._lean:
            return await self._call(key, limit, cost, now, _dry)
        if limit._dynamic:  # an override: its numbers travel as arguments, nothing cached per limit
            head, sha, pack, frames, hlen, seed = _lean(self._prefix, limit)
        else:
            la = self._lean_args.get(limit._ns)
            if la is None:
                la = self._lean_args[limit._ns] = _lean(self._prefix, limit)
            head, sha, pack, frames, hlen, seed = la
        rkey = ((head + key if len(key) <= self._max_key_length else head + hash_key(key)) + "}").encode(
            "utf-8", "surrogatepass"
        )
        # the whole EVALSHA but the key, encoded once per (cost, dry run) when the
        # server's clock is used: one bytes formatting per decision
        if limit._dynamic:
            frame = _evalsha_frame(sha, _dynamic_argv(limit, pack, cost, now, _dry))
        elif now is None:
            cached = frames.get((cost, _dry))
            if cached is None:
                frame = _evalsha_frame(sha, _argv(cost, None, _dry))
                if len(frames) < 64:
                    frames[(cost, _dry)] = frame
            else:
                frame = cached
        else:
            frame = _evalsha_frame(sha, _argv(cost, now, _dry))
        data = b"%b$%d\r\n%b\r\n%b" % (frame[0], len(rkey), rkey, frame[1])
        slots = self._slots
        if slots is not None:
            # the hash tag runs from the head's "{" to the first "}" of the key (or
            # the one closing the key): CRC16 goes on from the head's part of it
            node = slots[crc_hqx(rkey[hlen : rkey.find(b"}", hlen)], seed) & 0x3FFF if seed >= 0 else key_slot(rkey)]
        elif self._sentinel is not None:
            node = self._sentinel.primary
        else:
            node = self._node
        t0 = _monotonic()
        try:
            if node is None:  # no slot map or no primary yet
                res = await self._slow(None, node, limit, data, rkey, t0)
            else:
                try:
                    res = await node.send_packed(data)
                except RespError as e:
                    res = await self._slow(e, node, limit, data, rkey, t0)
        except _STORE_FAILURES as e:
            raise StoreError(f"redis {limit.algorithm} for {key!r}: {e!r}") from e
        try:
            return _decode(res, limit, pack)
        except (TypeError, ValueError, IndexError, KeyError) as e:
            raise StoreError(f"redis {limit.algorithm} for {key!r}: unexpected reply {res!r:.200}") from e

    def breaker_of(self, key: str, limit: Limit) -> str | None:
        """Which circuit breaker a decision for ``key`` belongs to (the Limiter keeps one
        per answer): in a cluster, the primary serving the key's slot now, so that one
        shard failing over leaves the keys of the others on the store; None elsewhere
        (one breaker).  A slot no primary is known for: ``"slot N"``'s own."""
        if self._slots is None or not self._lean:
            return None
        la = self._lean_args.get(limit._ns)
        if la is None:
            la = self._lean_args[limit._ns] = _lean(self._prefix, limit)
        head = la[0]
        rkey = ((head + key if len(key) <= self._max_key_length else head + hash_key(key)) + "}").encode(
            "utf-8", "surrogatepass"
        )
        slot = key_slot(rkey)
        node = self._slots[slot]
        return str(node.address) if node is not None else f"slot {slot}"

    async def peek(self, key: str, limit: Limit, cost: int = 1, *, now: float | None = None) -> Decision:
        return await self.hit(key, limit, cost, now=now, _dry=b"1")

    async def close(self) -> None:
        if not self._owns_client:
            return
        if self._cluster is not None:
            await self._cluster.close()
        elif self._sentinel is not None:
            await self._sentinel.close()
        else:
            await self._client.aclose()

    async def _route(self, rkey: bytes, t0: float) -> RespClient:
        """The node for ``rkey`` when none was known: wait (within the call's
        time) for the slot map or the primary."""
        budget = self._timeout - (_monotonic() - t0)
        if self._cluster is not None:
            slot = key_slot(rkey)
            await self._cluster.ensure_map(budget)
            node = self._cluster.slots[slot]
            if node is None:
                raise no_node(slot, self._cluster)
            return node
        if self._sentinel is not None:
            return await self._sentinel.ensure_primary(budget)
        raise RespConnectionError("redis: no server")  # not reached: a single server is always known

    async def _slow(
        self,
        err: RespError | None,
        node: RespClient | None,
        limit: Limit,
        data: bytes,
        rkey: bytes,
        t0: float,
        src: str | None = None,
    ) -> Any:
        """A decision whose command did not simply answer (``err``; None: no node
        was known for the key).  At most _MAX_TRIES more commands, all within the
        call's timeout:

        * NOSCRIPT: SCRIPT LOAD (``src``, default the limit's script) and the
          command again, pipelined on that node;
        * MOVED: the slot's new owner is remembered (the map refreshed in the
          background) and the command goes there; from a single-server URL this
          turns the store into a cluster one (:meth:`_follow_cluster`);
        * ASK: ASKING and the command, pipelined on the node that imports the slot;
        * anything else (TRYAGAIN, CLUSTERDOWN, READONLY, LOADING, connection lost,
          timeout) is raised after telling the router, so the topology is looked
          at again while the store-failure policy decides."""
        load = asking = False
        for _ in range(_MAX_TRIES):
            if err is None:
                node = await self._route(rkey, t0)
            elif isinstance(err, NoScriptError):
                load = True
            elif isinstance(err, ReplyError):
                assert node is not None
                r = parse_redirect(str(err))
                if r is None:
                    self._node_failed(node, err)
                    raise err
                if self._cluster is None:
                    if self._node is None:  # a sentinel's primary answering MOVED: a misconfiguration
                        self._node_failed(node, err)
                        raise err
                    self._follow_cluster(f"it answered {str(err)[:80]!r}")
                    assert self._cluster is not None
                host = r.host or node.address.host
                self.stats.redirects[r.kind] += 1
                if r.kind == "moved":
                    node = self._cluster.moved(r.slot, host, r.port)
                    asking = False
                else:
                    node = self._cluster.node_at(host, r.port)
                    asking = True
                load = False
            else:  # lost, refused, timed out
                if node is not None:
                    self._node_failed(node, err)
                raise err
            assert node is not None
            budget = self._timeout - (_monotonic() - t0)
            if budget <= 0:
                raise RespTimeoutError(f"no time left for {limit.algorithm} after: {err}")
            futs = []
            if load:
                futs.append(
                    node.execute_command(b"SCRIPT", b"LOAD", limit_lua(limit) if src is None else src, timeout=budget)
                )
            if asking:
                futs.append(node.send_packed(_ASKING, budget))
            futs.append(node.send_packed(data, budget))
            outs = await asyncio.gather(*futs, return_exceptions=True)
            res = outs[-1]
            if not isinstance(res, BaseException):
                return res
            if not isinstance(res, RespError):
                raise res
            err = res
        raise RespConnectionError(f"redis: {limit.algorithm} still redirected after {_MAX_TRIES} tries: {err}")

    def _node_failed(self, node: RespClient, err: BaseException) -> None:
        if self._cluster is not None:
            self._cluster.failed(node, err)
        elif self._sentinel is not None:
            if isinstance(err, ReplyError) and not is_failover_error(str(err)):
                self.stats.node_error(str(node.address))  # a script or ACL error: not the topology's
            else:
                self._sentinel.failed(node, err)
        else:
            self.stats.node_error(str(node.address))

    async def _call(self, key: str, limit: Limit, cost: int, now: float | None, dry: bytes) -> Decision:
        """The decision through redis-py (a client passed in, or a URL the lean client does not
        handle); :meth:`hit` checked the cost and decided limits of 0."""
        keys = self.redis_keys(key, limit)
        src, sha, pack = _limit_script(limit)
        argv = _dynamic_argv(limit, pack, cost, now, dry) if limit._dynamic else _argv(cost, now, dry)
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


def _lean(prefix: str, limit: Limit) -> tuple[str, bytes, int | None, dict, int, int]:
    """What the lean path keeps per limit (RedisStore._lean_args).  The seed is the
    CRC16 of the head's part of the hash tag (after its "{"), so a key's slot is
    that CRC continued over the key up to its first "}"; -1 when a "{" or "}" in
    the prefix or the rule's name puts the tag elsewhere (key_slot decides then)."""
    _, sha, pack = _limit_script(limit)
    head = f"{prefix}:{{{limit._sig}:"
    hb = head.encode("utf-8", "surrogatepass")
    i = hb.find(b"{")
    seed = crc_hqx(hb[i + 1 :], 0) if i == len(prefix.encode("utf-8", "surrogatepass")) + 1 and b"}" not in hb else -1
    return head, sha, pack, {}, len(hb), seed


def _sentinel_client(u: RedisURL, timeout: float, stats: TopologyStats) -> SentinelClient:
    """The SentinelClient of a redis+sentinel:// URL: the URL's user and password
    are the data servers'; sentinel_username / sentinel_password the sentinels'."""
    addrs = url_addresses(u)
    user, pw = u.options.get("sentinel_username"), u.options.get("sentinel_password")
    sentinels = [replace(a, username=user, password=pw, db=0) for a in addrs]
    assert u.service is not None
    return SentinelClient(sentinels, u.service, addrs[0], timeout=timeout, stats=stats)
