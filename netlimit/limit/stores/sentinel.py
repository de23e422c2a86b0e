"""Redis Sentinel for the RedisStore: which server is the primary, and
following it when the sentinels fail over.

* Resolving: the sentinels are asked in turn (the one that answered last
  first) ``SENTINEL get-master-addr-by-name <service>``; the address they name is
  used once it answers ``ROLE`` with ``master``.  Commands then go to that one
  :class:`~netlimit.limit.stores.resp.RespClient` (``primary``), one round trip
  per decision as with a single server.
* Following: one pub/sub connection to a sentinel, subscribed to
  ``+switch-master``; a switch for our service moves ``primary`` to the new
  address at once (after its ``ROLE`` check).  The subscription is kept alive
  with a PING every :data:`PING_EVERY` seconds and moves to the next sentinel
  when its connection ends; each (re)subscription resolves again, so a switch
  announced while it was down is not missed.
* Failures: a lost or refused connection to the primary, a timeout, or
  ``-READONLY`` / ``-LOADING`` / ``-MASTERDOWN`` (the old primary is a replica
  now, or not ready) mean a failover may be under way: the caller's command
  fails (the store-failure policy decides) and the sentinels are asked again
  every ``watch_interval`` until the primary answers or another is named (at most
  ``WATCH_FOR`` seconds).
"""

from __future__ import annotations

import asyncio
import logging
import time
from typing import Any

import hiredis

from ...logevery import LogEvery
from .resp import Address, ReplyError, RespClient, RespConnectionError, RespError, pack
from .topology import TopologyStats

log = logging.getLogger("netlimit.limit")

#: the subscription's keep-alive
PING_EVERY = 5.0
#: how long a failing primary makes the client ask the sentinels again
WATCH_FOR = 30.0
#: the most a pub/sub message may take before the connection is dropped
MAX_MESSAGE = 64 * 1024


def _s(v: Any) -> str:
    return v.decode("utf-8", "replace") if isinstance(v, bytes) else str(v)


class SentinelClient:
    """The primary of one service as the sentinels name it (module docstring).

    ``sentinels`` carry the sentinels' own credentials and TLS; ``template``
    the data servers' (credentials, database, TLS)."""

    def __init__(
        self,
        sentinels: list[Address],
        service: str,
        template: Address,
        *,
        timeout: float,
        stats: TopologyStats | None = None,
        resolve_interval: float = 0.1,
        watch_interval: float = 0.2,
    ) -> None:
        if not sentinels:
            raise ValueError("a sentinel URL needs at least one sentinel")
        self.sentinels = list(sentinels)
        self.service = service
        self.template = template
        self.timeout = float(timeout)
        self.stats = stats if stats is not None else TopologyStats()
        self.resolve_interval = resolve_interval
        self.watch_interval = watch_interval
        #: where commands go (None until resolved)
        self.primary: RespClient | None = None
        self.replicas: list[tuple[str, str]] = []  # (address, flags) as the sentinels last listed them
        self.subscribed_to: str | None = None
        self.last_error: str | None = None
        self.last_resolve: float | None = None  # time.monotonic() of the last answer from a sentinel
        self._sclients: dict[str, RespClient] = {}
        self._good = 0  # index of the sentinel that answered last
        self._resolve_task: asyncio.Task | None = None
        self._again = False
        self._watch_task: asyncio.Task | None = None
        self._sub_task: asyncio.Task | None = None
        self._tasks: set[asyncio.Task] = set()
        self._closed = False
        self._log = LogEvery(10.0)

    # -- resolving ----------------------------------------------------------------------

    def _sentinel_client(self, addr: Address) -> RespClient:
        key = str(addr)
        c = self._sclients.get(key)
        if c is None:
            c = self._sclients[key] = RespClient(addr, timeout=max(self.timeout, 0.25))
        return c

    async def start(self, budget: float) -> bool:
        """Resolve the primary (at most ``budget`` seconds) and subscribe to switches."""
        ok = await self.resolve(budget)
        if self._sub_task is None and not self._closed:
            self._sub_task = asyncio.get_running_loop().create_task(self._subscribe_loop())
        return ok

    async def ensure_primary(self, budget: float) -> RespClient:
        """The primary, resolving it first (within ``budget``) if none is known."""
        if self.primary is not None:
            return self.primary
        t = self._resolve_task
        if t is None or t.done():
            t = self._resolve_task = asyncio.get_running_loop().create_task(self.resolve())
        try:
            await asyncio.wait_for(asyncio.shield(t), max(budget, 0.0))
        except TimeoutError:
            pass
        if self.primary is None:
            raise RespConnectionError(
                f"redis sentinel: no primary known for {self.service!r} ({self.last_error or 'still asking'})"
            )
        return self.primary

    async def resolve(self, budget: float = 2.0) -> bool:
        """Ask the sentinels for the primary; switch to it once ROLE says master."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + budget
        self.stats.refreshes += 1
        errors: list[str] = []
        n = len(self.sentinels)
        for i in range(n):
            left = deadline - loop.time()
            if left <= 0:
                errors.append("out of time")
                break
            idx = (self._good + i) % n
            s = self.sentinels[idx]
            client = self._sentinel_client(s)
            try:
                reply = await client.execute_command(
                    b"SENTINEL", b"GET-MASTER-ADDR-BY-NAME", self.service, timeout=min(left, max(self.timeout, 0.25))
                )
            except (RespError, OSError) as e:
                errors.append(f"sentinel {s}: {e}")
                continue
            if not reply:
                errors.append(f"sentinel {s} does not monitor {self.service!r}")
                continue
            self._good = idx
            self.last_resolve = time.monotonic()
            host, port = _s(reply[0]), int(reply[1])
            problem = await self._verify_and_switch(host, port, deadline, f"named by sentinel {s}")
            if problem is None:
                self.last_error = None
                await self._list_replicas(client, deadline)
                return True
            errors.append(problem)
        self.last_error = "; ".join(errors)[:500] or "no sentinel to ask"
        return False

    async def _verify_and_switch(self, host: str, port: int, deadline: float, why: str) -> str | None:
        """Use ``host:port`` as the primary if it says so (ROLE); else what is wrong."""
        key = f"{host}:{port}"
        cur = self.primary
        mine = cur is not None and str(cur.address) == key
        client = cur if mine and cur is not None else RespClient(self.template.at(host, port), timeout=self.timeout)
        left = deadline - asyncio.get_running_loop().time()
        try:
            role = await client.execute_command(b"ROLE", timeout=max(0.001, min(left, max(self.timeout, 0.25))))
        except (RespError, OSError) as e:
            if not mine:
                await client.aclose()
            return f"{key}: {e}"
        if not role or role[0] != b"master":
            if not mine:
                await client.aclose()
            return f"{key} is a {_s(role[0]) if role else '?'}, not a primary (a failover is under way)"
        if not mine:
            now = self.primary
            if now is not None and str(now.address) == key:  # another resolve got there first
                await client.aclose()
            else:
                self._switch(client, why)
        return None

    async def _list_replicas(self, client: RespClient, deadline: float) -> None:
        """For /healthz: the replicas the sentinel knows (best effort)."""
        left = deadline - asyncio.get_running_loop().time()
        if left <= 0:
            return
        try:
            reply = await client.execute_command(b"SENTINEL", b"REPLICAS", self.service, timeout=min(left, 0.25))
        except (RespError, OSError):
            return
        out = []
        for r in reply[:32]:
            d = dict(zip(r[::2], r[1::2]))
            out.append((f"{_s(d.get(b'ip', b'?'))}:{_s(d.get(b'port', b'?'))}", _s(d.get(b"flags", b""))))
        self.replicas = out

    def _switch(self, client: RespClient, why: str) -> None:
        old = self.primary
        self.primary = client
        if old is None:
            log.info("redis sentinel %r: primary %s (%s)", self.service, client.address, why)
            return
        self.stats.failovers += 1
        log.warning(
            "redis sentinel %r: the primary is now %s (was %s; %s)", self.service, client.address, old.address, why
        )
        t = asyncio.get_running_loop().create_task(old.aclose())
        self._tasks.add(t)
        t.add_done_callback(self._tasks.discard)

    def request_resolve(self) -> None:
        """Resolve again in the background, at most once per ``resolve_interval``."""
        if self._closed:
            return
        t = self._resolve_task
        if t is not None and not t.done():
            self._again = True
            return
        last = self.last_resolve if self.last_resolve is not None else -1e9
        delay = max(0.0, last + self.resolve_interval - time.monotonic())
        self._resolve_task = asyncio.get_running_loop().create_task(self._background(delay))

    async def _background(self, delay: float) -> None:
        if delay > 0:
            await asyncio.sleep(delay)
        while True:
            self._again = False
            await self.resolve()
            if not self._again or self._closed:
                return
            await asyncio.sleep(self.resolve_interval)

    def failed(self, node: RespClient, err: BaseException) -> None:
        """A command to ``node`` failed: if it is the primary, a failover may be under way."""
        self.stats.node_error(str(node.address))
        if node is not self.primary:
            return
        if self._watch_task is None or self._watch_task.done():
            self._watch_task = asyncio.get_running_loop().create_task(self._watch(node))

    async def _watch(self, node: RespClient) -> None:
        loop = asyncio.get_running_loop()
        end = loop.time() + WATCH_FOR
        while not self._closed and loop.time() < end and self.primary is node:
            await self.resolve(min(2.0, self.watch_interval * 5))
            if self.primary is not node or node.reachable:
                return
            await asyncio.sleep(self.watch_interval)

    # -- following switches ---------------------------------------------------------------

    async def _subscribe_loop(self) -> None:
        backoff = 0.1
        i = self._good
        while not self._closed:
            s = self.sentinels[i % len(self.sentinels)]
            i += 1
            try:
                await self._subscribe_once(s)
                backoff = 0.1
            except asyncio.CancelledError:
                raise
            except Exception as e:  # any failure of this connection: the next sentinel
                self.subscribed_to = None
                held = self._log.due("sub")
                if held >= 0:
                    log.warning(
                        "redis sentinel %r: subscription to +switch-master at %s ended: %s%s",
                        self.service,
                        s,
                        e,
                        f" ({held} more since the last report)" if held else "",
                    )
            await asyncio.sleep(backoff)
            backoff = min(backoff * 2, 2.0)

    async def _subscribe_once(self, s: Address) -> None:
        """One subscription at sentinel ``s``, until its connection ends."""
        async with asyncio.timeout(max(1.0, 10 * self.timeout)):
            if s.ssl is not None:
                reader, writer = await asyncio.open_connection(s.host, s.port, ssl=s.ssl, server_hostname=s.host)
            else:
                reader, writer = await asyncio.open_connection(s.host, s.port)
        try:
            parser = hiredis.Reader()
            out = b""
            if s.password is not None:
                out += pack((b"AUTH", s.username, s.password) if s.username else (b"AUTH", s.password))
            out += pack((b"SUBSCRIBE", b"+switch-master"))
            writer.write(out)
            await writer.drain()
            pending = 0  # bytes fed since the last whole message
            quiet = 0
            confirmed = False
            while not self._closed:
                try:
                    data = await asyncio.wait_for(reader.read(65536), PING_EVERY)
                except TimeoutError:
                    quiet += 1
                    if quiet > 1:
                        raise RespConnectionError(f"no answer to PING within {PING_EVERY:g} s") from None
                    writer.write(pack((b"PING",)))
                    continue
                if not data:
                    raise RespConnectionError("the sentinel closed the connection")
                quiet = 0
                parser.feed(data)
                pending += len(data)
                while (msg := parser.gets()) is not False:
                    pending = 0
                    if isinstance(msg, hiredis.ReplyError):
                        raise ReplyError(str(msg))
                    if not isinstance(msg, list) or len(msg) < 3:
                        continue
                    if msg[0] == b"subscribe" and not confirmed:
                        confirmed = True
                        self.subscribed_to = str(s)
                        self.request_resolve()  # a switch may have come while not subscribed
                    elif msg[0] == b"message":
                        self._on_switch(_s(msg[2]))
                if pending > MAX_MESSAGE:
                    raise RespConnectionError(f"a message over {MAX_MESSAGE} bytes")
        finally:
            self.subscribed_to = None
            writer.close()

    def _on_switch(self, text: str) -> None:
        """``+switch-master <service> <old-ip> <old-port> <new-ip> <new-port>``."""
        parts = text.split()
        if len(parts) != 5 or parts[0] != self.service or not parts[4].isdigit():
            return
        host, port = parts[3], int(parts[4])
        log.info("redis sentinel %r: +switch-master to %s:%s", self.service, host, port)

        async def follow() -> None:
            loop = asyncio.get_running_loop()
            problem = await self._verify_and_switch(host, port, loop.time() + 2.0, "+switch-master")
            if problem is not None:
                self.last_error = problem
                self.request_resolve()

        t = asyncio.get_running_loop().create_task(follow())
        self._tasks.add(t)
        t.add_done_callback(self._tasks.discard)

    # -- for operators ----------------------------------------------------------------------

    def topology(self) -> dict[str, Any]:
        p = self.primary
        nodes: list[dict[str, Any]] = []
        if p is not None:
            nodes.append({"address": str(p.address), "role": "primary", "reachable": p.reachable})
        nodes += [
            {"address": a, "role": "replica", "flags": f, "reachable": None}  # no commands go to replicas
            for a, f in self.replicas
        ]
        return {
            "kind": "sentinel",
            "service": self.service,
            "primary": None if p is None else str(p.address),
            "subscribed_to": self.subscribed_to,
            "last_error": self.last_error,
            "nodes": nodes,
            "sentinels": [
                {
                    "address": str(s),
                    "reachable": None if str(s) not in self._sclients else self._sclients[str(s)].reachable,
                }
                for s in self.sentinels
            ],
        }

    async def close(self) -> None:
        self._closed = True
        for t in (self._resolve_task, self._watch_task, self._sub_task, *self._tasks):
            if t is not None and not t.done():
                t.cancel()
        if self.primary is not None:
            await self.primary.aclose()
        for c in self._sclients.values():
            await c.aclose()
