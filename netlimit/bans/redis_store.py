"""The fleet's ban list in Redis: the source of truth every netlimitd follows.

Keys (one hash tag, so the scripts' keys share a Redis Cluster slot):

* ``<prefix>:{bans}``        sorted set: member the prefix ("203.0.113.0/24"), score
  its expiry in ms on Redis's clock (TIME);
* ``<prefix>:{bans}:d``      hash: prefix -> details (JSON: rule, reason, by, added, origin);
* ``<prefix>:{bans}:n``      hash: counters (added, evicted);
* channel ``<prefix>:bans``  one message per change, for instant fan-out (follow.py).

Every change is one Lua script (atomic): it drops expired members first (bounded
work), writes, keeps the set within ``max_entries`` by popping the members that expire
first (ZPOPMIN: counted, and named in the message so followers drop them too), and
publishes the change with Redis's own time, so a follower turns the expiry into time
left without trusting its clock. A message lost (a follower disconnected) is not a
ban lost: a follower loads the whole list on every (re)connect.

Two faces: :class:`RedisBanList` (blocking, redis-py: the CLI and netlimitd) and
:class:`AsyncRedisBanList` (asyncio, redis-py: the sidecar's escalation), on every
storage URL the sidecar takes (one server, unix socket, Redis Cluster, Sentinel, TLS:
:func:`redis_py_client`). In a cluster the keys share one slot and the channel's
messages reach every node; behind Sentinel the client follows the primary.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Callable
from typing import Any

from ..prefixes import prefix_ints
from .model import Ban, IPNetwork, parse_target
from .store import AddResult, BanEvent, Snapshot

log = logging.getLogger("netlimit.bans")

ADD_LUA = """
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local net, ttl, max = ARGV[1], tonumber(ARGV[2]), tonumber(ARGV[4])
local old = redis.call('ZRANGEBYSCORE', KEYS[1], '-inf', now, 'LIMIT', 0, 256)
for i = 1, #old do
  redis.call('ZREM', KEYS[1], old[i])
  redis.call('HDEL', KEYS[2], old[i])
end
local cur = redis.call('ZSCORE', KEYS[1], net)
-- repeat: the last ban of each prefix, remembered until its end + its duration
local gone = redis.call('ZRANGEBYSCORE', KEYS[4], '-inf', now, 'LIMIT', 0, 256)
for i = 1, #gone do
  redis.call('ZREM', KEYS[4], gone[i])
  redis.call('HDEL', KEYS[5], gone[i])
end
if ARGV[7] ~= '' and not (cur and tonumber(cur) > now) then
  local upto = redis.call('ZSCORE', KEYS[4], net)
  local last = redis.call('HGET', KEYS[5], net)
  if upto and last and tonumber(upto) > now then
    local most = math.max(tonumber(ARGV[8]), ttl)
    ttl = math.min(math.max(ttl, math.floor(tonumber(last) * tonumber(ARGV[7]))), most)
  end
end
local exp = now + ttl
local d = cjson.decode(ARGV[3])
d.added = now / 1000
local ds = cjson.encode(d)
if ARGV[5] == '1' and cur and tonumber(cur) >= exp then
  return {0, tostring(cur), tostring(now), {}}
end
redis.call('ZADD', KEYS[1], exp, net)
redis.call('HSET', KEYS[2], net, ds)
redis.call('ZADD', KEYS[4], exp + ttl, net)
redis.call('HSET', KEYS[5], net, ttl)
local nl = redis.call('ZCARD', KEYS[4])
if nl > max then
  local forgot = redis.call('ZPOPMIN', KEYS[4], nl - max)
  for i = 1, #forgot, 2 do redis.call('HDEL', KEYS[5], forgot[i]) end
end
local evicted = {}
local n = redis.call('ZCARD', KEYS[1])
if n > max then
  local popped = redis.call('ZPOPMIN', KEYS[1], n - max)
  for i = 1, #popped, 2 do
    evicted[#evicted + 1] = popped[i]
    redis.call('HDEL', KEYS[2], popped[i])
  end
  redis.call('HINCRBY', KEYS[3], 'evicted', #evicted)
end
redis.call('HINCRBY', KEYS[3], 'added', 1)
redis.call('PUBLISH', ARGV[6], cjson.encode({op = 'add', net = net, exp = exp, now = now, d = ds,
  evicted = evicted}))
return {1, tostring(exp), tostring(now), evicted}
"""

DEL_LUA = """
local n = redis.call('ZREM', KEYS[1], ARGV[1])
redis.call('HDEL', KEYS[2], ARGV[1])
redis.call('ZREM', KEYS[3], ARGV[1])
redis.call('HDEL', KEYS[4], ARGV[1])
if n > 0 then redis.call('PUBLISH', ARGV[2], cjson.encode({op = 'del', net = ARGV[1]})) end
return n
"""

FLUSH_LUA = """
local n = redis.call('ZCARD', KEYS[1])
redis.call('DEL', KEYS[1], KEYS[2], KEYS[3], KEYS[4])
redis.call('PUBLISH', ARGV[1], cjson.encode({op = 'flush'}))
return n
"""

SNAPSHOT_LUA = """
local t = redis.call('TIME')
return {t[1], t[2], redis.call('ZRANGE', KEYS[1], 0, -1, 'WITHSCORES'),
        redis.call('HGETALL', KEYS[2]), redis.call('HGETALL', KEYS[3])}
"""

#: a start's read (lazy snapshot): what the kernel write needs, without the details hash
#: (200,000 more values to send and decode: 0.4 s of 0.6 s for 100,000 bans); the
#: details are read when the bans are made (Snapshot.materialize, after READY=1)
PREFIXES_LUA = """
local t = redis.call('TIME')
return {t[1], t[2], redis.call('ZRANGE', KEYS[1], 0, -1, 'WITHSCORES'), redis.call('HGETALL', KEYS[2])}
"""

#: the longest message a follower reads (an add naming many evicted prefixes is the largest)
MAX_MESSAGE = 1 << 20


def keys(prefix: str) -> tuple[str, str, str, str]:
    """(sorted set, details hash, counters hash, channel) of a key prefix."""
    base = f"{prefix}:{{bans}}"
    return base, base + ":d", base + ":n", f"{prefix}:bans"


def history_keys(prefix: str) -> tuple[str, str]:
    """(sorted set: prefix -> remembered until (ms), hash: prefix -> its last ban's duration
    (ms)) of `escalate.repeat`: the last ban of each prefix, kept for its duration after
    its end; bounded by max_entries like the list."""
    base = f"{prefix}:{{bans}}"
    return base + ":r", base + ":rt"


def _text(v: Any) -> str:
    return v.decode("utf-8", "replace") if isinstance(v, bytes) else str(v)


def _add_args(
    net: IPNetwork,
    ttl: float,
    ban: Ban,
    max_entries: int,
    extend: bool,
    channel: str,
    repeat: tuple[float, float] | None = None,
) -> list[Any]:
    factor, most = (repr(float(repeat[0])), max(1, int(repeat[1] * 1000))) if repeat is not None else ("", 0)
    return [
        str(net),
        max(1, int(ttl * 1000)),
        ban.details(),
        max_entries,
        "1" if extend else "0",
        channel,
        factor,
        most,
    ]


def _add_result(res: Any) -> AddResult:
    added, exp, now, evicted = res
    nets = []
    for m in evicted or []:
        try:
            nets.append(parse_target(_text(m)))
        except ValueError:
            continue
    return AddResult(bool(int(added)), (float(_text(exp)) - float(_text(now))) / 1000, nets)


def redis_py_client(url: str, timeout: float, *, aio: bool = False) -> Any:
    """A redis-py client (``redis.asyncio`` with ``aio``) for a storage URL of any form
    config/redis_url.py parses: one server or a unix socket (``Redis``), a cluster
    (``RedisCluster`` from the seed nodes), Sentinel (the monitored primary, followed
    across failovers), TLS and its options, AUTH/ACL users."""
    import redis
    import redis.asyncio as aioredis
    from redis.backoff import NoBackoff

    from ..config.redis_url import parse_redis_url

    u = parse_redis_url(url)
    mod: Any = aioredis if aio else redis
    if u.other:  # options only redis-py knows: its own URL parser (one server only)
        return mod.Redis.from_url(url, socket_timeout=timeout, socket_connect_timeout=timeout)
    # no retries inside redis-py (its constructors default to three with back-off, several
    # seconds on a dead server): the callers bound every call, and the follower has its own
    # reconnect loop
    kw: dict[str, Any] = dict(
        socket_timeout=timeout,
        socket_connect_timeout=timeout,
        username=u.username,
        password=u.password,
        retry=(aioredis.retry.Retry if aio else redis.retry.Retry)(NoBackoff(), 0),
    )
    if u.tls:
        kw["ssl"] = True
        for name in ("ssl_ca_certs", "ssl_certfile", "ssl_keyfile", "ssl_cert_reqs"):
            if name in u.options:
                kw[name] = u.options[name]
        kw["ssl_check_hostname"] = u.check_hostname
    if u.kind == "unix":
        kw.pop("ssl", None)
        return mod.Redis(unix_socket_path=u.path, db=u.db, **kw)
    if u.kind == "single":
        host, port = u.hosts[0]
        return mod.Redis(host=host, port=port, db=u.db, **kw)
    if u.kind == "cluster":
        cluster: Any = aioredis.cluster if aio else redis.cluster
        nodes = [cluster.ClusterNode(h, p) for h, p in u.hosts]
        return cluster.RedisCluster(startup_nodes=nodes, **kw)
    sentinel_mod: Any = aioredis.sentinel if aio else redis.sentinel
    skw: dict[str, Any] = dict(socket_timeout=timeout, socket_connect_timeout=timeout)
    if "sentinel_username" in u.options:
        skw["username"] = u.options["sentinel_username"]
    if "sentinel_password" in u.options:
        skw["password"] = u.options["sentinel_password"]
    if u.tls:
        skw.update({k: v for k, v in kw.items() if k.startswith("ssl")})
    sentinels = sentinel_mod.Sentinel(list(u.hosts), sentinel_kwargs=skw, **kw)
    return sentinels.master_for(u.service, db=u.db)


def _pairs(flat: Any) -> list[tuple[Any, Any]]:
    """A Lua script's flat [k1, v1, k2, v2, ...] reply as pairs."""
    flat = list(flat or [])
    return list(zip(flat[0::2], flat[1::2]))


def _snapshot_reply(res: Any) -> Snapshot:
    """SNAPSHOT_LUA's reply: TIME, the sorted set with scores, the two hashes (flat lists)."""
    secs, usecs, members, details, counters = res
    return _snapshot((secs, usecs), _pairs(members), dict(_pairs(details)), dict(_pairs(counters)))


def _snapshot_raw(res: Any, details: Callable[[], Any]) -> Snapshot:
    """PREFIXES_LUA's reply with only the prefixes and times left made now (integers:
    what a kernel write needs); the Ban objects when materialized, with `details()`
    (the details hash, read then: a ban it no longer describes gets empty details)."""
    secs, usecs, members, counters = res
    now_ms = int(secs) * 1000 + int(usecs) // 1000
    flat = list(members or [])
    out: list[tuple[int, int, int, float]] = []
    add = out.append
    for m, score in zip(flat[0::2], flat[1::2]):
        left = (float(score) - now_ms) / 1000
        if left <= 0:
            continue
        p = prefix_ints(m.decode("ascii", "replace") if isinstance(m, bytes) else str(m))
        if p is not None:
            add((p[0], p[1], p[2], left))
    snap = _snapshot((secs, usecs), [], {}, dict(_pairs(counters)))  # the counters
    snap.prefixes = out
    snap.build = lambda: _snapshot((secs, usecs), _pairs(flat), details(), {}).bans
    return snap


def _snapshot(now_reply: Any, members: Any, details: Any, counters: Any) -> Snapshot:
    secs, usecs = now_reply
    now_ms = int(secs) * 1000 + int(usecs) // 1000
    det = {_text(k): v for k, v in (details or {}).items()}
    out: list[tuple[Ban, float]] = []
    for member, score in members:
        left = (float(score) - now_ms) / 1000
        if left <= 0:
            continue
        m = _text(member)
        ban = Ban.from_store(m, float(score) / 1000, det.get(m))
        if ban is not None:
            out.append((ban, left))
    evicted = 0
    if counters:
        try:
            evicted = int((counters or {}).get(b"evicted") or (counters or {}).get("evicted") or 0)
        except (TypeError, ValueError):
            evicted = 0
    return Snapshot(out, evicted)


def parse_event(data: bytes | str) -> BanEvent | None:
    """A channel message as a BanEvent (None: not one of ours, or malformed)."""
    if len(data) > MAX_MESSAGE:
        return None
    try:
        m = json.loads(data)
    except ValueError:
        return None
    if not isinstance(m, dict):
        return None
    op = m.get("op")
    try:
        if op == "add":
            exp, now = float(m["exp"]), float(m["now"])
            ban = Ban.from_store(str(m["net"]), exp / 1000, m.get("d") if isinstance(m.get("d"), str) else None)
            if ban is None:
                return None
            ev = m.get("evicted")
            gone = []
            for n in ev if isinstance(ev, list) else []:  # cjson writes an empty list as {}
                try:
                    gone.append(parse_target(str(n)))
                except ValueError:
                    continue
            return BanEvent("add", ban, (exp - now) / 1000, evicted=gone)
        if op == "del":
            return BanEvent("del", net=parse_target(str(m["net"])))
        if op == "flush":
            return BanEvent("flush")
    except (KeyError, TypeError, ValueError):
        return None
    return None


class RedisBanList:
    """The list in Redis, blocking calls (redis-py). Every call is bounded by `timeout`
    seconds; a failure raises redis.exceptions.RedisError (ConnectionError, TimeoutError)."""

    def __init__(self, url: str, *, key_prefix: str = "netlimit", max_entries: int = 100_000, timeout: float = 2.0):
        self.url = url
        self.max_entries = max_entries
        self.zkey, self.dkey, self.nkey, self.channel = keys(key_prefix)
        self.rkey, self.rtkey = history_keys(key_prefix)
        self.r = redis_py_client(url, timeout)
        self._add = self.r.register_script(ADD_LUA)
        self._del = self.r.register_script(DEL_LUA)
        self._flush = self.r.register_script(FLUSH_LUA)
        self._snap = self.r.register_script(SNAPSHOT_LUA)
        self._prefixes = self.r.register_script(PREFIXES_LUA)

    def add(
        self,
        net: IPNetwork,
        ttl: float,
        *,
        rule: str = "",
        reason: str = "",
        by: str = "",
        origin: str = "manual",
        extend: bool = False,
        repeat: tuple[float, float] | None = None,
    ) -> AddResult:
        ban = Ban.make(net, 0, rule=rule, reason=reason, by=by, origin=origin)  # the script sets `added`
        res = self._add(
            keys=[self.zkey, self.dkey, self.nkey, self.rkey, self.rtkey],
            args=_add_args(net, ttl, ban, self.max_entries, extend, self.channel, repeat),
        )
        return _add_result(res)

    def delete(self, net: IPNetwork) -> bool:
        return bool(self._del(keys=[self.zkey, self.dkey, self.rkey, self.rtkey], args=[str(net), self.channel]))

    def flush(self) -> int:
        return int(self._flush(keys=[self.zkey, self.dkey, self.rkey, self.rtkey], args=[self.channel]))

    def snapshot(self, *, lazy: bool = False) -> Snapshot:
        """The whole list, read atomically by one script (TIME, the set, the details, the
        counters: one slot in a cluster, so no MULTI across nodes). `lazy`: the bans are
        made by Snapshot.materialize(), only `prefixes` now (netlimitd's start)."""
        if lazy:
            return _snapshot_raw(self._prefixes(keys=[self.zkey, self.nkey]), self._details)
        return _snapshot_reply(self._snap(keys=[self.zkey, self.dkey, self.nkey]))

    def _details(self) -> dict[Any, Any]:
        """The details hash, for a lazy snapshot's bans (made after READY=1); a store
        that does not answer then leaves them without details (rule, reason: shown
        empty), the bans themselves are the ones read."""
        import redis

        try:
            return dict(self.r.hgetall(self.dkey))
        except redis.exceptions.RedisError as exc:  # details are for show: the bans stand without them
            log.warning("bans: the details of the list not read (%s): shown without", exc)
            return {}

    def close(self) -> None:
        self.r.close()


class AsyncRedisBanList:
    """The same list from an asyncio loop (the sidecar): `add` only."""

    def __init__(self, url: str, *, key_prefix: str = "netlimit", max_entries: int = 100_000, timeout: float = 1.0):
        self.max_entries = max_entries
        self.zkey, self.dkey, self.nkey, self.channel = keys(key_prefix)
        self.rkey, self.rtkey = history_keys(key_prefix)
        self.r = redis_py_client(url, timeout, aio=True)
        self._add = self.r.register_script(ADD_LUA)

    async def add(
        self,
        net: IPNetwork,
        ttl: float,
        *,
        rule: str = "",
        reason: str = "",
        by: str = "",
        origin: str = "manual",
        extend: bool = False,
        repeat: tuple[float, float] | None = None,
    ) -> AddResult:
        ban = Ban.make(net, 0, rule=rule, reason=reason, by=by, origin=origin)  # the script sets `added`
        res = await self._add(
            keys=[self.zkey, self.dkey, self.nkey, self.rkey, self.rtkey],
            args=_add_args(net, ttl, ban, self.max_entries, extend, self.channel, repeat),
        )
        return _add_result(res)

    async def close(self) -> None:
        await self.r.aclose()
