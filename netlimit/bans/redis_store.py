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
:class:`AsyncRedisBanList` (asyncio, redis-py: the sidecar's escalation).
"""

from __future__ import annotations

import json
from typing import Any

from .model import Ban, IPNetwork, parse_target
from .store import AddResult, BanEvent, Snapshot

ADD_LUA = """
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local net, ttl, max = ARGV[1], tonumber(ARGV[2]), tonumber(ARGV[4])
local old = redis.call('ZRANGEBYSCORE', KEYS[1], '-inf', now, 'LIMIT', 0, 256)
for i = 1, #old do
  redis.call('ZREM', KEYS[1], old[i])
  redis.call('HDEL', KEYS[2], old[i])
end
local exp = now + ttl
local d = cjson.decode(ARGV[3])
d.added = now / 1000
local ds = cjson.encode(d)
local cur = redis.call('ZSCORE', KEYS[1], net)
if ARGV[5] == '1' and cur and tonumber(cur) >= exp then
  return {0, tostring(cur), tostring(now), {}}
end
redis.call('ZADD', KEYS[1], exp, net)
redis.call('HSET', KEYS[2], net, ds)
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
if n > 0 then redis.call('PUBLISH', ARGV[2], cjson.encode({op = 'del', net = ARGV[1]})) end
return n
"""

FLUSH_LUA = """
local n = redis.call('ZCARD', KEYS[1])
redis.call('DEL', KEYS[1], KEYS[2])
redis.call('PUBLISH', ARGV[1], cjson.encode({op = 'flush'}))
return n
"""

#: the longest message a follower reads (an add naming many evicted prefixes is the largest)
MAX_MESSAGE = 1 << 20


def keys(prefix: str) -> tuple[str, str, str, str]:
    """(sorted set, details hash, counters hash, channel) of a key prefix."""
    base = f"{prefix}:{{bans}}"
    return base, base + ":d", base + ":n", f"{prefix}:bans"


def _text(v: Any) -> str:
    return v.decode("utf-8", "replace") if isinstance(v, bytes) else str(v)


def _add_args(net: IPNetwork, ttl: float, ban: Ban, max_entries: int, extend: bool, channel: str) -> list[Any]:
    return [str(net), max(1, int(ttl * 1000)), ban.details(), max_entries, "1" if extend else "0", channel]


def _add_result(res: Any) -> AddResult:
    added, exp, now, evicted = res
    nets = []
    for m in evicted or []:
        try:
            nets.append(parse_target(_text(m)))
        except ValueError:
            continue
    return AddResult(bool(int(added)), (float(_text(exp)) - float(_text(now))) / 1000, nets)


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
        import redis

        self.url = url
        self.max_entries = max_entries
        self.zkey, self.dkey, self.nkey, self.channel = keys(key_prefix)
        self.r = redis.Redis.from_url(url, socket_timeout=timeout, socket_connect_timeout=timeout)
        self._add = self.r.register_script(ADD_LUA)
        self._del = self.r.register_script(DEL_LUA)
        self._flush = self.r.register_script(FLUSH_LUA)

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
    ) -> AddResult:
        ban = Ban.make(net, 0, rule=rule, reason=reason, by=by, origin=origin)  # the script sets `added`
        res = self._add(
            keys=[self.zkey, self.dkey, self.nkey],
            args=_add_args(net, ttl, ban, self.max_entries, extend, self.channel),
        )
        return _add_result(res)

    def delete(self, net: IPNetwork) -> bool:
        return bool(self._del(keys=[self.zkey, self.dkey], args=[str(net), self.channel]))

    def flush(self) -> int:
        return int(self._flush(keys=[self.zkey, self.dkey], args=[self.channel]))

    def snapshot(self) -> Snapshot:
        """The whole list, read in one transaction (MULTI: TIME, ZRANGE, HGETALL)."""
        p = self.r.pipeline(transaction=True)
        p.time()
        p.zrange(self.zkey, 0, -1, withscores=True)
        p.hgetall(self.dkey)
        p.hgetall(self.nkey)
        now, members, details, counters = p.execute()
        return _snapshot(now, members, details, counters)

    def close(self) -> None:
        self.r.close()


class AsyncRedisBanList:
    """The same list from an asyncio loop (the sidecar): `add` only."""

    def __init__(self, url: str, *, key_prefix: str = "netlimit", max_entries: int = 100_000, timeout: float = 1.0):
        import redis.asyncio as aioredis

        self.max_entries = max_entries
        self.zkey, self.dkey, self.nkey, self.channel = keys(key_prefix)
        self.r = aioredis.Redis.from_url(url, socket_timeout=timeout, socket_connect_timeout=timeout)
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
    ) -> AddResult:
        ban = Ban.make(net, 0, rule=rule, reason=reason, by=by, origin=origin)  # the script sets `added`
        res = await self._add(
            keys=[self.zkey, self.dkey, self.nkey],
            args=_add_args(net, ttl, ban, self.max_entries, extend, self.channel),
        )
        return _add_result(res)

    async def close(self) -> None:
        await self.r.aclose()
