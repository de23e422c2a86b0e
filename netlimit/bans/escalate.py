"""Escalation at L7: a client denied `after` times within `within` by a rule with
`escalate` is banned at L3 (the whole fleet's kernels) for `ban`.

How it hangs together (docs/architecture.md): the engine knows nothing of bans. The
Limiter calls one hook, ``on_over(rule, descriptor)``, for every enforced denial, in
whichever door asked (HTTP endpoints, proxy, gRPC); the sidecar sets it to
:meth:`Escalator.note`. That call only queues (bounded, O(1)): the counting and the
ban happen in the escalator's own task, off the request path.

Counting uses the engine's own algorithm and store: a sliding window counter of
`after - 1` per `within` under the key of the client's prefix (`prefix4` / `prefix6`),
on the limiter's store, so sidecars sharing a Redis count a client's denials together
(the `after`-th denial in the window is the one refused: it bans). Memory stays
bounded: the store's (max_keys, Redis TTLs), the queue's, and the short list of
prefixes just banned (no second write while the first one travels).

Never banned: exempt networks and prefixes that hold a trusted proxy (skipped and
counted, model.Protected).
"""

from __future__ import annotations

import asyncio
import logging
import socket
import time
from collections import Counter, OrderedDict, deque
from collections.abc import Callable, Sequence
from typing import Any

from ..config.model import Config, Escalate
from ..limit.algorithms import SLIDING_WINDOW_COUNTER, Limit
from ..limit.stores import MemoryStore
from ..logevery import LogEvery
from .model import IPNetwork, Protected, client_prefix

log = logging.getLogger("netlimit.bans")

#: denials waiting to be counted (a flood beyond it is dropped and counted: it bans itself anyway)
MAX_QUEUE = 10_000
#: prefixes remembered as just banned
MAX_RECENT = 10_000
ALGORITHM = SLIDING_WINDOW_COUNTER


def rule_paths(config: Config) -> dict[str, Escalate]:
    """The Lyft stat path (limit.rules.Rule.path) of each escalating descriptor."""
    out: dict[str, Escalate] = {}

    def walk(descs: Sequence[Any], stat: tuple[str, ...]) -> None:
        for d in descs:
            s2 = stat + (f"{d.key}_{d.value}" if d.value else d.key,)
            if d.escalate is not None:
                out[".".join(s2)] = d.escalate
            walk(d.descriptors, s2)

    if config.http is not None:
        walk(config.http.descriptors, ())
    return out


class Escalator:
    """Counts denials and bans (see the module doc). `bans`: an async ban writer
    (redis_store.AsyncRedisBanList, socket_client.AsyncSocketBanList) or None when
    the file uses no escalation."""

    def __init__(
        self,
        config: Config,
        store: Any,
        bans: Any,
        *,
        host: str | None = None,
        clock: Callable[[], float] = time.monotonic,
        max_queue: int = MAX_QUEUE,
    ):
        self.store = store
        self.bans = bans
        self.by = f"sidecar@{host or socket.gethostname()}"
        self.clock = clock
        self.max_queue = max_queue
        self.local = MemoryStore(max_keys=100_000)  # counts while the shared store is down
        self._queue: deque[tuple[Escalate, str, str, str]] = deque()
        self._wake = asyncio.Event()
        self._recent: OrderedDict[IPNetwork, float] = OrderedDict()
        self._limits: dict[tuple[str, Escalate], Limit] = {}
        self._task: asyncio.Task | None = None
        self._log = LogEvery(10.0, clock)
        self.specs: dict[str, Escalate] = {}
        self.protected = Protected([], [])
        # counters (metrics)
        self.denials = 0
        self.banned: Counter[str] = Counter()  # by rule name
        self.skipped: Counter[str] = Counter()  # by reason
        self.errors: Counter[str] = Counter()  # store | ban_store
        self.configure(config)

    def configure(self, config: Config) -> None:
        """(Re)load the escalating rules, exempt networks and trusted proxies."""
        self.specs = rule_paths(config)
        self.protected = Protected(
            list(config.exempt), list(config.http.trusted_proxies) if config.http is not None else []
        )
        self._limits.clear()

    # --- the Limiter's hook (sync, on the decision path) -------------------------------------

    def note(self, rule: Any, descriptor: Sequence[tuple[str, str]]) -> None:
        spec = self.specs.get(rule.path)
        if spec is None:
            return
        addr = None
        for k, v in descriptor:
            if k == "remote_address":
                addr = v
        if addr is None:
            self.skipped["no_address"] += 1
            return
        if len(self._queue) >= self.max_queue:
            self.skipped["queue_full"] += 1
            return
        self._queue.append((spec, rule.name, rule.path, addr))
        self._wake.set()

    # --- the task ------------------------------------------------------------------------------

    def start(self) -> None:
        if self._task is None:
            self._task = asyncio.get_running_loop().create_task(self.run(), name="escalation")

    async def close(self) -> None:
        if self._task is not None:
            self._task.cancel()
            try:
                await self._task
            except asyncio.CancelledError:
                pass
            self._task = None
        if self.bans is not None:
            await self.bans.close()

    async def run(self) -> None:
        while True:
            await self._wake.wait()
            self._wake.clear()
            while self._queue:
                spec, name, path, addr = self._queue.popleft()
                try:
                    await self.escalate(spec, name, path, addr)
                except asyncio.CancelledError:
                    raise
                except Exception as exc:  # one bad denial must not stop escalation
                    self.errors["internal"] += 1
                    if self._log.due("internal") >= 0:
                        log.exception("escalation: %r", exc)

    async def wait_idle(self, timeout: float = 5.0) -> None:
        """Until the queue is empty (tests, the demo)."""
        deadline = self.clock() + timeout
        while self._queue and self.clock() < deadline:
            await asyncio.sleep(0.005)

    def _limit(self, path: str, spec: Escalate) -> Limit:
        lim = self._limits.get((path, spec))
        if lim is None:
            lim = self._limits[(path, spec)] = Limit(
                algorithm=ALGORITHM, limit=spec.after - 1, period=float(spec.within), name=f"escalate {path}"
            )
        return lim

    async def escalate(self, spec: Escalate, name: str, path: str, addr: str) -> bool:
        """Count one denial of `addr` under the rule; True when it banned."""
        self.denials += 1
        net = client_prefix(addr, spec.prefix4, spec.prefix6)
        if net is None:
            self.skipped["invalid_address"] += 1
            return False
        why = self.protected.reason(net)
        if why is not None:
            self.skipped["exempt" if "exempt" in why else "trusted_proxy"] += 1
            if self._log.due("skip:" + path) >= 0:
                log.info("escalation: rule %r would ban %s but %s: never banned", name, net, why)
            return False
        now = self.clock()
        until = self._recent.get(net)
        if until is not None and until > now:
            return False
        limit = self._limit(path, spec)
        key = str(net)
        try:
            dec = await self.store.hit(key, limit)
        except Exception as exc:  # the shared store is down: count here meanwhile
            self.errors["store"] += 1
            if self._log.due("store") >= 0:
                log.warning("escalation: the store failed (%s); counting denials locally", exc)
            dec = self.local.hit_sync(key, limit)
        if dec.allowed:
            return False
        if self.bans is None:  # pragma: no cover - escalator_for always gives one with specs
            return False
        reason = spec.reason or f"{spec.after} denials within {spec.within} s"
        repeat = spec.repeat.as_tuple if spec.repeat is not None else None
        try:
            res = await self.bans.add(
                net, float(spec.ban), rule=name, reason=reason, by=self.by, origin="http", extend=True, repeat=repeat
            )
        except Exception as exc:  # a ban list (memory, Redis, netlimitd) that fails must not stop escalation
            self.errors["ban_store"] += 1
            if self._log.due("ban") >= 0:
                log.warning("escalation: could not ban %s (rule %r): %s", net, name, exc)
            return False
        self.banned[name] += 1
        left = float(getattr(res, "left", spec.ban) or spec.ban)  # a repeat ban lasts longer than `ban`
        self._recent[net] = now + left
        self._recent.move_to_end(net)
        while len(self._recent) > MAX_RECENT:
            self._recent.popitem(last=False)
        log.info("escalation: banned %s for %.0f s (rule %r: %s)", net, left, name, reason)
        return True

    # --- metrics (the sidecar registers this collector) ------------------------------------------

    def describe(self) -> list[Any]:
        return []

    def collect(self):
        from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

        banned = CounterMetricFamily(
            "netlimit_http_bans_added", "Clients banned at L3 by escalation, by rule", labels=["rule"]
        )
        for name, n in sorted(self.banned.items()):
            banned.add_metric([name], n)
        counted = CounterMetricFamily("netlimit_http_escalation_denials", "Denials counted toward escalation")
        counted.add_metric([], self.denials)
        skipped = CounterMetricFamily(
            "netlimit_http_escalation_skipped",
            "Denials not counted or bans not made: exempt, trusted_proxy, invalid_address, no_address, queue_full",
            labels=["reason"],
        )
        for reason in ("exempt", "trusted_proxy", "invalid_address", "no_address", "queue_full"):
            skipped.add_metric([reason], self.skipped[reason])
        errors = CounterMetricFamily(
            "netlimit_http_escalation_errors", "Failures: store (counting), ban_store (banning)", labels=["what"]
        )
        for what in ("store", "ban_store", "internal"):
            errors.add_metric([what], self.errors[what])
        queued = GaugeMetricFamily("netlimit_http_escalation_queue", "Denials waiting to be counted")
        queued.add_metric([], len(self._queue))
        yield banned
        yield counted
        yield skipped
        yield errors
        yield queued


def escalator_for(config: Config, store: Any, storage_override: str | None = None) -> Escalator:
    """The escalator of a sidecar: its limiter's `store`, and the ban list the file names
    (bans.store, else the sidecar's storage: `storage_override` (--redis) or http.storage)."""
    url = config.bans.store if config.bans is not None and config.bans.store else None
    url = url or storage_override or (config.http.storage if config.http is not None else "memory")
    prefix = config.bans.key_prefix if config.bans is not None else "netlimit"
    bans: Any
    if url == "memory":
        from .socket_client import AsyncSocketBanList

        bans = AsyncSocketBanList(config.bans.socket if config.bans is not None else "/run/netlimit/netlimitd.sock")
    else:
        from .redis_store import AsyncRedisBanList

        bans = AsyncRedisBanList(url, key_prefix=prefix, max_entries=config.max_bans)
    return Escalator(config, store, bans)
