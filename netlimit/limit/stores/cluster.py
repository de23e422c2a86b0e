"""Redis Cluster routing for the RedisStore: the slot map, one lean client per
primary, and what MOVED / ASK / a failover change in them.

* The slot of a key is CRC16 (XMODEM, ``binascii.crc_hqx``) of its hash tag
  (the text between the first ``{`` and the next ``}``, when not empty; else
  the whole key) modulo 16384, as Redis computes it.  A store key
  ``<prefix>:{<rule>:<key>}`` is one key, so a decision is one slot.
* The map comes from ``CLUSTER SHARDS`` (``CLUSTER SLOTS`` where SHARDS is not
  known), asked of the first node that answers: the primaries known so far,
  then the seeds of the URL.  ``slots`` is a list of 16384 entries, the
  :class:`~netlimit.limit.stores.resp.RespClient` of each slot's primary: the
  store's hot path indexes it and sends, one round trip per decision.
* ``MOVED`` points one slot at its new owner at once (the caller retries
  there) and asks for a full refresh in the background, at most one per
  ``refresh_interval``; ``ASK`` is answered by the caller (``ASKING`` and the
  command, pipelined on the target's connection), the map is not changed.
* A primary that stops answering (connection lost, refused, timed out) starts a
  watch: the map is refreshed every ``watch_interval`` until that node serves
  no slot any more (its replica was promoted) or answers again, at most
  ``WATCH_FOR`` seconds.  Meanwhile its slots fail and the store-failure
  policy decides (netlimit/limit/limiter.py).
"""

from __future__ import annotations

import asyncio
import logging
import time
from binascii import crc_hqx
from dataclasses import dataclass, field
from typing import Any

from .resp import Address, ReplyError, RespClient, RespConnectionError, RespError
from .topology import TopologyStats

log = logging.getLogger("netlimit.limit")

SLOTS = 16384
#: how long a watch started by a failing primary refreshes the map
WATCH_FOR = 30.0
#: the longest one refresh may take (every node tried in turn)
REFRESH_BUDGET = 2.0


def key_slot(key: bytes) -> int:
    """The cluster slot of ``key`` (Redis' keyHashSlot)."""
    s = key.find(b"{")
    if s >= 0:
        e = key.find(b"}", s + 1)
        if e > s + 1:
            key = key[s + 1 : e]
    return crc_hqx(key, 0) & 0x3FFF


@dataclass
class NodeInfo:
    host: str
    port: int
    role: str  # primary | replica
    health: str = "online"  # as the cluster reports it (CLUSTER SHARDS), else "online"
    id: str = ""

    @property
    def address(self) -> str:
        return f"{self.host}:{self.port}"


@dataclass
class Shard:
    ranges: list[tuple[int, int]]
    primary: NodeInfo | None
    replicas: list[NodeInfo] = field(default_factory=list)

    @property
    def n_slots(self) -> int:
        return sum(b - a + 1 for a, b in self.ranges)


def _s(v: Any) -> str:
    return v.decode("utf-8", "replace") if isinstance(v, bytes) else str(v)


def parse_shards(reply: Any, tls: bool, asked: str) -> list[Shard]:
    """CLUSTER SHARDS (Redis >= 7.0) as shards.  A node's address is its
    ``endpoint`` (``cluster-preferred-endpoint-type``), else its ``ip``, else the
    address that was asked (``asked``); its port the ``tls-port`` on TLS."""
    shards = []
    for raw in reply:
        d = dict(zip(raw[::2], raw[1::2]))
        sl = [int(x) for x in d.get(b"slots") or []]
        ranges = list(zip(sl[::2], sl[1::2]))
        primaries: list[NodeInfo] = []
        replicas: list[NodeInfo] = []
        for rn in d.get(b"nodes") or []:
            n = dict(zip(rn[::2], rn[1::2]))
            host = _s(n.get(b"endpoint") or b"")
            if host in ("", "?"):
                host = _s(n.get(b"ip") or b"") or asked
            port = n.get(b"tls-port") if tls and n.get(b"tls-port") else n.get(b"port")
            if not port:
                continue
            role = "primary" if n.get(b"role") == b"master" else "replica"
            info = NodeInfo(host, int(port), role, _s(n.get(b"health") or b"online"), _s(n.get(b"id") or b""))
            (primaries if role == "primary" else replicas).append(info)
        # a failed primary that lost its slots to its replica can still be listed
        primaries.sort(key=lambda p: p.health != "online")
        primary = primaries[0] if primaries else None
        replicas.extend(primaries[1:])
        shards.append(Shard(ranges, primary, replicas))
    return shards


def parse_slots(reply: Any, asked: str) -> list[Shard]:
    """CLUSTER SLOTS (every Redis Cluster) as shards: one per slot range."""
    shards = []
    for entry in reply:
        start, end = int(entry[0]), int(entry[1])
        nodes = []
        for i, n in enumerate(entry[2:]):
            host = _s(n[0]) or asked
            if host == "?":
                host = asked
            nodes.append(
                NodeInfo(host, int(n[1]), "primary" if i == 0 else "replica", id=_s(n[2]) if len(n) > 2 else "")
            )
        shards.append(Shard([(start, end)], nodes[0] if nodes else None, nodes[1:]))
    return shards


class ClusterClient:
    """The slot map and one :class:`RespClient` per primary (module docstring)."""

    def __init__(
        self,
        seeds: list[Address],
        *,
        timeout: float,
        stats: TopologyStats | None = None,
        refresh_interval: float = 0.1,
        watch_interval: float = 0.1,
    ) -> None:
        if not seeds:
            raise ValueError("a cluster needs at least one seed node")
        self.seeds = list(seeds)
        self.timeout = float(timeout)
        self.tls = seeds[0].ssl is not None
        self.stats = stats if stats is not None else TopologyStats()
        self.refresh_interval = refresh_interval
        self.watch_interval = watch_interval
        #: the primary of every slot (None: not known / not served); changed in place
        self.slots: list[RespClient | None] = [None] * SLOTS
        #: clients by "host:port", primaries of the map (and the targets of redirects)
        self.nodes: dict[str, RespClient] = {}
        self.shards: list[Shard] = []
        self.known = False  # a map was loaded
        self.last_refresh: float | None = None  # time.monotonic() of the last map loaded
        self.last_refresh_error: str | None = None
        self._refresh_task: asyncio.Task | None = None
        self._again = False
        self._watch_task: asyncio.Task | None = None
        self._watched: set[str] = set()
        self._tasks: set[asyncio.Task] = set()  # background closes
        self._closed = False

    # -- nodes ---------------------------------------------------------------------------

    def node_at(self, host: str, port: int) -> RespClient:
        """The client of the node at ``host:port`` (made on first use)."""
        key = f"{host}:{port}"
        c = self.nodes.get(key)
        if c is None:
            c = self.nodes[key] = RespClient(self.seeds[0].at(host, port), timeout=self.timeout)
        return c

    @property
    def commands_sent(self) -> int:
        """Commands handed to the primaries' connections (the benchmark reads it)."""
        return sum(c.commands_sent for c in self.nodes.values())

    @property
    def writes(self) -> int:
        return sum(c.writes for c in self.nodes.values())

    def primaries(self) -> list[RespClient]:
        return [self.node_at(s.primary.host, s.primary.port) for s in self.shards if s.primary is not None]

    def moved(self, slot: int, host: str, port: int) -> RespClient:
        """``-MOVED slot host:port``: the slot is served there now; the whole map is
        looked at again in the background."""
        node = self.node_at(host, port)
        self.slots[slot] = node
        self.request_refresh()
        return node

    def failed(self, node: RespClient, err: BaseException) -> None:
        """A command to ``node`` failed with ``err`` (not a redirect)."""
        key = str(node.address)
        self.stats.node_error(key)
        if isinstance(err, ReplyError):
            self.request_refresh()  # READONLY, CLUSTERDOWN, ...: the map may be stale
            return
        self._watched.add(key)
        if self._watch_task is None or self._watch_task.done():
            self._watch_task = asyncio.get_running_loop().create_task(self._watch())

    # -- the map ---------------------------------------------------------------------------

    def request_refresh(self) -> None:
        """Refresh the map in the background, at most once per ``refresh_interval``."""
        if self._closed:
            return
        t = self._refresh_task
        if t is not None and not t.done():
            self._again = True
            return
        last = self.last_refresh if self.last_refresh is not None else -1e9
        self._refresh_task = asyncio.get_running_loop().create_task(
            self._background(max(0.0, last + self.refresh_interval - time.monotonic()))
        )

    async def _background(self, delay: float) -> None:
        if delay > 0:
            await asyncio.sleep(delay)
        while True:
            self._again = False
            await self.refresh()
            if not self._again or self._closed:
                return
            await asyncio.sleep(self.refresh_interval)

    async def ensure_map(self, budget: float) -> bool:
        """A map is loaded (waiting for one at most ``budget`` seconds)."""
        if self.known:
            return True
        t = self._refresh_task
        if t is None or t.done():
            t = self._refresh_task = asyncio.get_running_loop().create_task(self.refresh())
        try:
            await asyncio.wait_for(asyncio.shield(t), budget)
        except TimeoutError:
            return False
        return self.known

    def _candidates(self) -> list[Address]:
        """Nodes to ask for the map: reachable primaries first, then the rest of the
        primaries, the seeds, the replicas last seen."""
        seen: set[str] = set()
        out: list[Address] = []
        prim = [self.nodes[k] for k in self._primary_keys() if k in self.nodes]
        prim.sort(key=lambda c: {True: 0, None: 1, False: 2}[c.reachable])
        addrs = [c.address for c in prim] + self.seeds
        addrs += [self.seeds[0].at(r.host, r.port) for s in self.shards for r in s.replicas]
        for a in addrs:
            k = str(a)
            if k not in seen:
                seen.add(k)
                out.append(a)
        return out

    def _primary_keys(self) -> list[str]:
        return [s.primary.address for s in self.shards if s.primary is not None]

    async def refresh(self, budget: float = REFRESH_BUDGET) -> bool:
        """Load the map from the first node that answers; False if none did."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + budget
        self.stats.refreshes += 1
        errors: list[str] = []
        for addr in self._candidates():
            left = deadline - loop.time()
            if left <= 0:
                errors.append("out of time")
                break
            each = min(left, max(self.timeout, 0.25))
            client = self.nodes.get(str(addr))
            temp = None
            if client is None:
                client = temp = RespClient(addr, timeout=each)
            try:
                shards = await self._ask(client, each)
            except (RespError, OSError) as e:
                errors.append(f"{addr}: {e}")
                continue
            finally:
                if temp is not None:
                    await temp.aclose()
            if not shards:
                errors.append(f"{addr}: no slots assigned")
                continue
            self._apply(shards, str(addr))
            self.last_refresh_error = None
            return True
        self.last_refresh_error = "; ".join(errors)[:500] or "no node to ask"
        return False

    async def _ask(self, client: RespClient, timeout: float) -> list[Shard]:
        host = client.address.host
        try:
            reply = await client.execute_command(b"CLUSTER", b"SHARDS", timeout=timeout)
        except ReplyError as e:
            if "disabled" in str(e):  # "This instance has cluster support disabled"
                raise
            reply = await client.execute_command(b"CLUSTER", b"SLOTS", timeout=timeout)
            return parse_slots(reply, host)
        return parse_shards(reply, self.tls, host)

    def _apply(self, shards: list[Shard], source: str) -> None:
        old_roles = {n.address: n.role for s in self.shards for n in ([s.primary] if s.primary else []) + s.replicas}
        new_slots: list[RespClient | None] = [None] * SLOTS
        for s in shards:
            if s.primary is None:
                continue
            node = self.node_at(s.primary.host, s.primary.port)
            for a, b in s.ranges:
                new_slots[a : b + 1] = [node] * (b - a + 1)
            if old_roles.get(s.primary.address) == "replica":
                self.stats.failovers += 1
                ranges = ",".join(f"{a}-{b}" for a, b in s.ranges[:4]) + ("..." if len(s.ranges) > 4 else "")
                log.warning(
                    "redis cluster: failover: %s (a replica until now) is the primary of slots %s",
                    s.primary.address,
                    ranges,
                )
        self.slots[:] = new_slots
        first = not self.known
        self.shards = shards
        self.known = True
        self.last_refresh = time.monotonic()
        keep = set(self._primary_keys())
        for key in [k for k in self.nodes if k not in keep]:
            self._close_later(self.nodes.pop(key))
        if first:
            covered = sum(1 for c in new_slots if c is not None)
            log.info(
                "redis cluster: %d primaries, %d replicas, %d of %d slots served (map from %s)",
                len(keep),
                sum(len(s.replicas) for s in shards),
                covered,
                SLOTS,
                source,
            )

    def _close_later(self, client: RespClient) -> None:
        t = asyncio.get_running_loop().create_task(client.aclose())
        self._tasks.add(t)
        t.add_done_callback(self._tasks.discard)

    async def _watch(self) -> None:
        """Refresh every watch_interval while a failed primary still serves slots
        and does not answer (bounded by WATCH_FOR)."""
        loop = asyncio.get_running_loop()
        end = loop.time() + WATCH_FOR
        while self._watched and loop.time() < end and not self._closed:
            await asyncio.sleep(self.watch_interval)
            await self.refresh(min(REFRESH_BUDGET, self.watch_interval * 5))
            primaries = set(self._primary_keys())
            for key in list(self._watched):
                c = self.nodes.get(key)
                if key not in primaries or (c is not None and c.reachable):
                    self._watched.discard(key)
        self._watched.clear()

    # -- for operators --------------------------------------------------------------------

    def topology(self) -> dict[str, Any]:
        nodes: list[dict[str, Any]] = []
        for s in self.shards:
            if s.primary is not None:
                c = self.nodes.get(s.primary.address)
                nodes.append(
                    {
                        "address": s.primary.address,
                        "role": "primary",
                        "slots": s.n_slots,
                        "health": s.primary.health,
                        "reachable": None if c is None else c.reachable,
                    }
                )
            for r in s.replicas:
                nodes.append(
                    {
                        "address": r.address,
                        "role": "replica",
                        "of": s.primary.address if s.primary else None,
                        "health": r.health,
                        "reachable": None,  # no commands go to replicas
                    }
                )
        return {
            "kind": "cluster",
            "seeds": [str(a) for a in self.seeds],
            "slots_served": sum(1 for c in self.slots if c is not None),
            "map_age_s": None if self.last_refresh is None else round(time.monotonic() - self.last_refresh, 3),
            "last_refresh_error": self.last_refresh_error,
            "nodes": nodes,
        }

    async def close(self) -> None:
        self._closed = True
        for t in (self._refresh_task, self._watch_task):
            if t is not None and not t.done():
                t.cancel()
        for c in self.nodes.values():
            await c.aclose()
        self.nodes.clear()
        self.slots[:] = [None] * SLOTS
        for t in list(self._tasks):
            t.cancel()


def no_node(slot: int, cluster: ClusterClient) -> RespConnectionError:
    why = cluster.last_refresh_error or "the map has no primary for it"
    return RespConnectionError(f"redis cluster: no node serves slot {slot} ({why})")
