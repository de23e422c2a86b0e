"""netlimitd's side of the ban list: load it into the kernel, follow it, repair it,
and hand the bans the kernel made by itself to the fleet.

The list lives in Redis (`bans.store: redis://...`, shared by every host) or, for a
single host, here (`store: memory`: this daemon keeps it and serves it on its status
socket to the CLI and a local sidecar). Either way the main loop only ever sees
inbox items (netlimit.bans.follow): a whole list ("snapshot", on start and on every
reconnect) or one change ("event"), and turns them into kernel writes through the
index (netlimit.bans.index: what the kernel set must hold; the outermost prefixes only
on nftables, whose interval sets refuse overlaps).

Consistency: the kernel is written with changes while they apply cleanly; any refusal
(a set recreated by an apply, an element that expired as it was removed) makes the next
step a full reload. After an apply that changed anything, and when the periodic check
finds the sets differing from the list (drift), the sets are reloaded too. A reload
makes the sets hold the whole list as a start does (banset.sync_prefixes: on nftables
only what differs, in steps that never leave a ban out -- no moment without bans).

Bans are never written for exempt addresses or trusted proxies (skipped, counted).
"""

from __future__ import annotations

import logging
import os
import select
import socket
import time
from collections import Counter
from collections.abc import Callable
from typing import Any

from ..bans.follow import Inbox, RedisFollower
from ..bans.index import BanIndex, Delta
from ..bans.model import Ban, IPNetwork, Protected, parse_target
from ..bans.store import BanEvent, MemoryBanList, Snapshot
from ..logevery import LogEvery
from ..prefixes import network_of
from .kernel_ops import KernelOps
from .readahead import AHEAD_SWITCH, ReadAhead
from .startphases import difference

#: what a kernel write reports that bans.last_load carries (banset.sync_prefixes)
_LOAD_KEYS = ("write", "held", "added", "removed", "held_from", "why", "steps", "foreign")
log = logging.getLogger("netlimit.daemon")

#: expiries are handled at most this often (a list of 100,000 bans expires continuously)
EXPIRE_EVERY = 0.25
#: after a refused write, the next full reload is tried this much later
RETRY_AFTER = 1.0
#: the kernel's own bans are read this often at most
KERNEL_POLL = 1.0
#: every this many drift checks compares every prefix (the others compare counts)
FULL_CHECK_EVERY = 10
#: the longest netlimitd waits at start for the list to be in the kernel before READY=1
READY_WAIT = 30.0
#: the longest a start's first write waits for the read of the sets begun ahead (it is
#: then done sooner than a read begun anew, which a busy host makes as slow; the bound is
#: for a read that never ends: after it the write reads them itself). 5 s was too short at
#: a load of 11: the write dumped the sets again beside a read nearly done.
AHEAD_WAIT = 15.0
#: distinct `rule` label values in the metrics (a list may carry any text; the rest: "other")
MAX_RULE_LABELS = 100


def _written(done: dict[str, Any] | None) -> str:
    """What a sync wrote, for the log line: its difference, if it wrote one."""
    return f"; {difference(done)}" if done and done.get("write") == "diff" else ""


class BanFollower:
    def __init__(self, config: Any, kernel: KernelOps, wake, *, netns: str | None = None):
        self.kernel = kernel
        self.netns = netns
        self.wake = wake
        self.clock = time.monotonic
        self.store_url = config.ban_store
        self.key_prefix = config.bans.key_prefix if config.bans is not None else "netlimit"
        self.max_entries = config.max_bans
        self.inbox = Inbox(wake)
        self.index = BanIndex(self.max_entries, cover=True, clock=self.clock)
        self.redis: RedisFollower | None = None
        self.memory: MemoryBanList | None = None
        self.host = socket.gethostname()
        self.need_reload = False
        self.kernel_known = False  # the kernel's sets hold what this process wrote (else: reload whole)
        self.retry_at = 0.0
        self.next_expire = 0.0
        self.next_poll = 0.0
        self.kernel_seen: dict[tuple[str, IPNetwork], float] = {}  # kernel bans handed on -> deadline
        self.protected = Protected([], [])
        self.escalating: list[tuple[str, int, int]] = []
        self.repeats: dict[str, tuple[float, float]] = {}  # escalating rule -> its repeat (factor, max s)
        self._log = LogEvery(10.0)
        # counters (status, metrics)
        self.loads = 0
        self.load_seconds = 0.0  # the last whole write of the sets
        self.list_timings: dict[str, Any] = {}  # the last whole list: read, index, kernel (ms)
        # the last list written from its prefixes: read, filter, kernel (s); how (diff/whole)
        self.load_timings: dict[str, Any] = {}
        self.lists = 0  # whole lists received (start, reconnects)
        self.ready_seconds = 0.0  # how long READY=1 waited for the first list (start)
        self.first_loaded = False  # a whole list has been in the kernel since start
        # a whole list written to the kernel from its prefixes alone, its index still to
        # make: (the snapshot, when its handling began, what the kernel was given)
        self._unindexed: tuple[Snapshot, float, list[tuple[int, int, int, float]]] | None = None
        # what the kernel's sets hold, read in a thread from here on (a start: the dump of
        # 100,000 prefixes is kernel time, spent beside the apply and the list's read)
        self._ahead: ReadAhead | None = None
        self._ahead_miss: str | None = None  # why the read ahead gave nothing (status)
        if self.store_url != "memory" and hasattr(kernel, "bans_held_ahead"):
            self._ahead = ReadAhead(lambda: kernel.bans_held_ahead(config), switch=AHEAD_SWITCH)
        self.events = 0
        self.writes = 0
        self.write_errors = 0
        self.skipped = 0
        self.drift_repairs = 0
        self.verifies = 0
        self.kernel_published = 0
        self.added: Counter[tuple[str, str]] = Counter()  # (rule, origin)
        self.expired: Counter[tuple[str, str]] = Counter()
        self.removed = 0
        self.last_error = ""
        self.configure(config)

    # --- set-up ------------------------------------------------------------------------

    def configure(self, config: Any) -> None:
        """The parts of a (re)loaded file the follower uses every time (exempt, trusted
        proxies, the escalating network rules). The store, its key prefix and
        max_entries take effect at restart."""
        self.protected = Protected(
            list(config.exempt), list(config.http.trusted_proxies) if config.http is not None else []
        )
        self.escalating = [
            (r.name, r.escalate.prefix4, r.escalate.prefix6) for r in config.network if r.escalate is not None
        ]
        self.repeats = {
            r.name: r.escalate.repeat.as_tuple
            for r in config.network
            if r.escalate is not None and r.escalate.repeat is not None
        }
        if self.redis is not None and not self.first_loaded and self.lists == 0:
            self.index.cover = self.kernel.ban_sets_cover()  # started before the first apply chose the backend
        if config.ban_store != self.store_url:
            log.warning("bans.store changed to %s: it takes effect when netlimitd restarts", config.ban_store)

    def start(self) -> None:
        """Once the first apply made the sets: start following the list."""
        self.index.cover = self.kernel.ban_sets_cover()
        if self.store_url == "memory":
            self.memory = MemoryBanList(self.max_entries, clock=time.time, on_event=self.inbox.event)
            self._adopt_kernel()
        else:
            self.redis = RedisFollower(
                self.store_url, key_prefix=self.key_prefix, max_entries=self.max_entries, inbox=self.inbox
            )
            self.redis.start()

    def _adopt_kernel(self) -> None:
        """store: memory: what the kernel sets still hold (a restart after a crash, or
        on_stop: keep) is the list we start from."""
        try:
            held = self.kernel.bans_read() or {}
        except Exception as exc:  # a kernel read (netlink, ipset, libiptc) must never stop the daemon's start
            log.warning("bans: cannot read the kernel's ban sets: %s", exc)
            held = {}
        assert self.memory is not None
        for net, left in held.items():
            if left is not None and left > 0:
                self.memory.add(net, left, reason="kept in the kernel across a restart", by=f"netlimitd@{self.host}")
        self.memory.on_event = self.inbox.event

    def close(self) -> None:
        if self.redis is not None:
            self.redis.stop()

    @property
    def loaded(self) -> bool:
        """The list as the store had it at start is in the kernel (store: memory: the
        kernel's own sets are the list, nothing to load)."""
        return self.memory is not None or self.first_loaded

    def wait_loaded(self, wake_fd: int, stop: Callable[[], bool], bound: float = READY_WAIT) -> bool:
        """At start, before READY=1: run the main loop's ban work (the wake pipe `wake_fd`,
        the retry timer) until the first list is in the kernel, at most `bound` seconds
        or until `stop()` (a SIGTERM: the main loop handles it). False: not loaded (the
        store does not answer, the kernel refused): the daemon is ready without it and
        loads it when it can; the log says so."""
        t0 = time.monotonic()
        deadline = t0 + bound
        while not self.loaded and not stop():
            now = time.monotonic()
            if now >= deadline:
                log.warning(
                    "bans: the list is not in the kernel %.0f s after start (%s); ready without it, "
                    "it loads as soon as the store answers",
                    bound,
                    self.last_error or (self.redis.last_error if self.redis is not None else "") or "no answer yet",
                )
                return False
            try:
                wait = min(0.25, deadline - now)
                if self.need_reload:
                    wait = max(0.0, min(wait, self.retry_at - now))
                ready, _, _ = select.select([wake_fd], [], [], wait)
            except InterruptedError:
                ready = []
            if ready:
                try:
                    while os.read(wake_fd, 512):
                        pass
                except BlockingIOError:
                    pass
            self.on_wake()
            if self.need_reload and time.monotonic() >= self.retry_at:
                self.reload("retry")
        self.ready_seconds = time.monotonic() - t0
        return self.loaded

    # --- the main loop's calls -----------------------------------------------------------

    def next_timer(self) -> float:
        """When the main loop must call `tick` (monotonic)."""
        if self._unindexed is not None:
            return 0.0  # at once (tick makes the index)
        t = [self.next_poll if self.escalating else float("inf")]
        nd = self.index.next_deadline()
        if nd is not None:
            t.append(max(nd, self.next_expire))
        if self.need_reload:
            t.append(self.retry_at)
        return min(t)

    def on_wake(self) -> None:
        """Drain the inbox and write what it changes."""
        items = self.inbox.drain()
        if not items:
            return
        delta = Delta()
        for kind, item in items:
            self._settle()  # what follows a list written ahead of its index needs the index
            if kind == "snapshot":
                self._snapshot(item)
                delta = Delta()  # the reload wrote everything
            elif kind == "event":
                self.events += 1
                delta.merge(self._event(item))
            elif kind == "down":
                self.last_error = str(item)
        self._write(delta)

    def tick(self) -> None:
        self._settle()
        now = self.clock()
        if self.need_reload and now >= self.retry_at:
            self.reload("retry")
        if now >= self.next_expire:
            self.next_expire = now + EXPIRE_EVERY
            gone, delta = self.index.expire(now)
            for b in gone:
                self.expired[self._labels(b)] += 1
            self._write(delta)
            self._expire_xdp()
        if self.escalating and now >= self.next_poll:
            self.next_poll = now + KERNEL_POLL
            self.poll_kernel()

    def _expire_xdp(self) -> None:
        """The XDP bans map keeps an expiry per prefix that nothing in the kernel enforces:
        remove what is due (the index's removals above reach it too; this catches the rest)."""
        try:
            self.kernel.bans_xdp_expire()
        except Exception as exc:  # a refused map read is retried at the next expiry tick, never fatal
            if self._log.due("xdp-expire") >= 0:
                log.warning("bans: expiring the XDP bans map failed: %s", exc)

    def after_apply(self) -> None:
        """An apply changed the rule set: a ban set may have been made anew (empty)."""
        self.kernel_known = False
        if self.loads or self.store_url == "memory":
            self.reload("after an apply")

    def verify(self) -> list[str]:
        """Drift: compare the kernel's sets with the list; reload them when they differ.
        Most checks compare counts (on nftables a dump of every element, no more); every
        FULL_CHECK_EVERY-th one compares every prefix."""
        self._settle()
        self.verifies += 1
        full = self.verifies % FULL_CHECK_EVERY == 1
        try:
            held = self.kernel.bans_read() if full else None
            count = len(held) if held is not None else (None if full else self.kernel.bans_count())
        except Exception as exc:  # any failure of the read is drift to report, never a crash of the resync
            return [f"bans: cannot read the ban sets: {exc}"]
        if count is None:
            return ["bans: a ban set is missing"]  # the rule-set diff sees it too; its apply reloads
        now = self.clock()
        if held is None:
            want = len(self.index.shown)
            soon = sum(1 for dl in self.index.shown.values() if dl - now <= 1.0)  # may be gone already
            if want - soon <= count <= want:
                return self._verify_xdp(count)
            why = f"bans: the kernel's ban sets hold {count} prefixes, the list {want}"
        else:
            wanted = {n for n, dl in self.index.shown.items() if dl - now > 1.0}
            missing = wanted - set(held)
            extra = {n for n in set(held) - set(self.index.shown) if (held[n] or 0) > 1.0}
            if not missing and not extra:
                return self._verify_xdp(len(held))
            why = f"bans: the kernel's ban sets lack {len(missing)} and have {len(extra)} unknown prefixes"
        return self._repair(why)

    def _repair(self, why: str) -> list[str]:
        """Drift found: say it, count it, and reload the whole list into the kernel."""
        log.warning("drift: %s; reloading them", why)
        self.drift_repairs += 1
        self.kernel_known = False
        self.reload("drift")
        return [why]

    def _verify_xdp(self, count: int) -> list[str]:
        """Drift of the XDP bans map (`xdp:`): it holds what the sets hold; a map cleared
        or changed by hand is reloaded whole (sets and map)."""
        try:
            held = self.kernel.bans_xdp_count()
        except Exception as exc:  # any failure of the read is drift to report, never a crash of the resync
            return [f"bans: cannot read the XDP bans map: {exc}"]
        if held is None or held == count:  # (one expiring between the reads: one reload more, harmless)
            return []
        return self._repair(f"bans: the XDP bans map holds {held} prefixes, the ban sets {count}")

    # --- list changes ----------------------------------------------------------------------

    def _allowed(self, ban: Ban) -> bool:
        why = self.protected.reason(ban.net)
        if why is None:
            return True
        self.skipped += 1
        if self._log.due("skip") >= 0:
            log.warning("bans: not banning %s (%s, from %s)", ban.net, why, ban.by or "?")
        return False

    def _since(self, received: float) -> float:
        """Seconds an item waited since a follower had it (its time left counts from then)."""
        return max(0.0, self.clock() - received) if received else 0.0

    def _snapshot(self, snap: Snapshot) -> None:
        t0 = time.monotonic()
        if not self.kernel_known and snap.prefixes is not None:
            # a whole write (start, after an apply or a refusal): the kernel first, from the
            # prefixes alone; the bans and their index are made after (_settle), so that a
            # restart is ready with 100,000 bans in ~1 s instead of 3-4 (issue 35)
            written = self._load_prefixes(snap.prefixes, self._since(snap.received), snap.read_seconds)
            if written is not None:
                self._unindexed = (snap, t0, written)
                self.first_loaded = True
                return
        self._ahead = None  # not used: the path below writes the sets whole
        self._index_snapshot(snap, t0)

    def _take_ahead(self) -> Any:
        """What the read begun at start found in the sets (None: none, failed, too slow);
        once: a later whole write reads the sets itself."""
        ahead, self._ahead = self._ahead, None
        if ahead is None:
            return None
        held = ahead.take(AHEAD_WAIT)
        if held is None:  # why (status, the ready line): the early read's own reason first
            self._ahead_miss = getattr(self.kernel, "ahead_miss", None) or ahead.why_none(AHEAD_WAIT)
        return held

    def _load_prefixes(
        self, prefixes: list[tuple[int, int, int, float]], waited: float, read_s: float = 0.0
    ) -> list[tuple[int, int, int, float]] | None:
        """Write the kernel's sets whole from (version, first, length, left) tuples: the
        protected ones left out, the outermost only where the sets refuse overlaps, the
        longest-lived max_entries. What was written (None: the kernel refused; the usual
        path then retries)."""
        t_filter = time.monotonic()
        lim = waited + 0.05
        keep = [(v, a, p, left - waited) for v, a, p, left in prefixes if left > lim]
        keep.sort()  # ascending: the order the kernel's interval tree takes fastest
        keep = self.protected.drop_sorted(keep)  # counted as skipped when the index is made
        if len(keep) > self.max_entries:
            keep = sorted(sorted(keep, key=lambda k: -k[3])[: self.max_entries])
        if self.index.cover:  # by start, the shorter first: one nested in the last kept is hidden
            out: list[tuple[int, int, int, float]] = []
            add = out.append
            lastv, lasthi = 0, -1
            for k in keep:
                v, a, p, _left = k
                if v == lastv and a <= lasthi:
                    continue
                add(k)
                lastv, lasthi = v, a + (1 << ((32 if v == 4 else 128) - p)) - 1
            keep = out
        t_wait = time.monotonic()
        held = self._take_ahead()
        t0 = time.monotonic()
        try:  # the sets may hold the list already (on_stop: keep, a crash): only the difference
            args: tuple[Any, ...] = () if held is None else (held,)
            done = self.kernel.bans_sync_prefixes(keep, *args)
        except Exception as exc:  # the daemon outlives any refused write: counted, then a full reload
            self._failed(f"loading {len(keep)} bans (list loaded)", exc)
            return None
        self.load_seconds = time.monotonic() - t0
        self.load_timings = {
            "read_s": round(read_s, 3),
            "filter_s": round(t_wait - t_filter, 3),
            "ahead_wait_s": round(t0 - t_wait, 3),  # for the read of the sets begun beside the apply
            "kernel_s": round(self.load_seconds, 3),
            **{k: v for k, v in (done or {}).items() if k in _LOAD_KEYS},
        }
        if getattr(self.kernel, "ahead_from", None):  # the read ahead: begun before the imports or beside the apply
            self.load_timings["ahead_from"] = self.kernel.ahead_from
            if self._ahead_miss:  # it gave nothing: why
                self.load_timings["ahead_miss"] = self._ahead_miss
        self.loads += 1
        self.need_reload = False
        self.kernel_known = True
        log.info("bans: %d in the kernel (list loaded%s, %.0f ms)", len(keep), _written(done), self.load_seconds * 1000)
        return keep

    def _settle(self) -> None:
        """Make the index of a list written ahead of it; write what differs from what
        the kernel was given (nothing, unless the list held a prefix twice)."""
        if self._unindexed is None:
            return
        snap, t0, written = self._unindexed
        self._unindexed = None
        t1 = time.monotonic()
        self._index_snapshot(snap, t1, written={(v, a, p) for v, a, p, _left in written})
        self.list_timings["kernel_ms"] = round((t1 - t0) * 1000, 1)
        self.list_timings["index_after_kernel"] = True  # READY=1 came before index_ms

    def _index_snapshot(self, snap: Snapshot, t0: float, written: set[tuple[int, int, int]] | None = None) -> None:
        snap.materialize()
        before = set(self.index.bans)
        waited = self._since(snap.received)
        live = [(b, left - waited) for b, left in snap.bans if self._allowed(b)]
        for b, _left in live:
            if b.net not in before:
                self.added[self._labels(b)] += 1
        delta = self.index.replace(live)
        t1 = time.monotonic()
        self.last_error = ""
        if written is not None:  # the kernel holds `written`: only a difference to write
            shown = {(n.version, int(n.network_address), n.prefixlen): n for n in self.index.shown}
            add = {n: self.index.shown[n] for k, n in shown.items() if k not in written}
            self._write(Delta(add, {network_of(*k) for k in written if k not in shown}))
            how = "whole"
        elif self.kernel_known:  # a reconnect: the kernel holds what we wrote; write the difference
            self._write(delta)
            how = "changes"
        else:  # the first list since start, an apply or a refusal: the whole set, one transaction
            self.reload("list loaded")
            how = "whole"
            self.first_loaded = self.first_loaded or self.kernel_known
        self.list_timings = {
            "bans": len(live),
            "read_ms": round(snap.read_seconds * 1000, 1),
            "index_ms": round((t1 - t0) * 1000, 1),
            "kernel_ms": round((time.monotonic() - t1) * 1000, 1),
            "kernel_write": how,
        }
        self.lists += 1  # last: a status that sees the count sees these timings

    def _event(self, ev: BanEvent) -> Delta:
        delta = Delta()
        if ev.op == "add" and ev.ban is not None:
            if self._allowed(ev.ban):
                self.added[self._labels(ev.ban)] += 1
                delta.merge(self.index.put(ev.ban, ev.left - self._since(ev.received)))
            for n in ev.evicted:
                self.removed += 1
                delta.merge(self.index.remove(n))
        elif ev.op == "del" and ev.net is not None:
            self.removed += 1
            delta.merge(self.index.remove(ev.net))
        elif ev.op == "flush":
            self.removed += len(self.index)
            delta.merge(self.index.clear())
        return delta

    # --- kernel writes -----------------------------------------------------------------------

    def reload(self, why: str) -> None:
        """Make the kernel's sets hold the whole list (after an apply, drift, a refused
        write): what they lack or hold in excess, in steps that never leave a ban out
        (banset.sync_prefixes, as a start writes it: sets emptied by an apply are filled
        in steps, a drift writes only what drifted). Not one transaction of the whole
        list: for 100,000 bans over held sets that took 1.6-2.1 GiB of kernel memory."""
        self._settle()
        now = self.clock()
        prefixes = [
            (n.version, int(n.network_address), n.prefixlen, dl - now)
            for n, dl in self.index.shown.items()
            if dl - now > 0.05
        ]
        prefixes.sort()  # ascending, as sync_prefixes takes them (on nftables the index shows none inside another)
        t0 = time.monotonic()
        try:
            done = self.kernel.bans_sync_prefixes(prefixes)
        except Exception as exc:  # the daemon outlives any refused write: counted, then retried
            self._failed(f"loading {len(prefixes)} bans ({why})", exc)
            return
        dt = time.monotonic() - t0
        self.loads += 1
        self.load_seconds = dt
        self.load_timings = {
            "reason": why,
            "kernel_s": round(dt, 3),
            **{k: v for k, v in (done or {}).items() if k in _LOAD_KEYS},
        }
        self.need_reload = False
        self.kernel_known = True
        log.info("bans: %d in the kernel (%s%s, %.0f ms)", len(prefixes), why, _written(done), dt * 1000)

    def _write(self, delta: Delta) -> None:
        if delta.empty:
            return
        if self.need_reload:  # a full reload is due anyway
            return
        now = self.clock()
        add = {n: dl - now for n, dl in delta.add.items() if dl - now > 0.05}
        try:
            self.kernel.bans_change(add, list(delta.remove))  # the writer orders them (by integer)
            self.writes += 1
        except Exception as exc:  # the daemon outlives any refused change: counted, then a full reload
            self._failed(f"writing {len(add)} additions and {len(delta.remove)} removals", exc)
            self.reload("after a refused change")

    def _failed(self, what: str, exc: Exception) -> None:
        self.write_errors += 1
        self.need_reload = True
        self.kernel_known = False
        self.retry_at = self.clock() + RETRY_AFTER
        self.last_error = f"{what}: {exc}"
        if self._log.due("write") >= 0:
            log.warning("bans: %s failed: %s; retrying with a full reload", what, exc)

    # --- the kernel's own bans ----------------------------------------------------------------

    def poll_kernel(self) -> None:
        """Hand the bans the packet path added (a network rule's escalate) to the list."""
        try:
            found = self.kernel.kernel_bans(self.escalating)
        except Exception as exc:  # a failed poll is logged and tried again; it must not stop the loop
            if self._log.due("poll") >= 0:
                log.warning("bans: cannot read the rules' own ban sets: %s", exc)
            return
        now = self.clock()
        for k in [k for k, dl in self.kernel_seen.items() if dl <= now]:
            del self.kernel_seen[k]
        for rule, net, left in found:
            key = (rule, net)
            dl = now + left
            old = self.kernel_seen.get(key)
            if old is not None and dl - old < 5.0:  # known (renewals within a few seconds are noise)
                continue
            if len(self.kernel_seen) >= self.max_entries:
                break
            self.kernel_seen[key] = dl
            why = self.protected.reason(net)
            if why is not None:
                self.skipped += 1
                continue
            details = {
                "rule": rule,
                "reason": f"network rule {rule}: over-limit packets",
                "by": f"netlimitd@{self.host} (kernel)",
                "origin": "network",
            }
            repeat = self.repeats.get(rule)
            if self.redis is not None:
                ok = self.redis.publish(net, left, repeat=repeat, **details)
            elif self.memory is not None:
                self.memory.add(net, left, extend=True, repeat=repeat, **details)
                ok = True
            else:  # pragma: no cover - start() made one
                ok = False
            if ok:
                self.kernel_published += 1

    # --- the status socket (store: memory) -----------------------------------------------------

    def request(self, req: dict[str, Any]) -> dict[str, Any]:
        """A ban request from the CLI or a sidecar (netlimit.bans.socket_client)."""
        op = req.get("ban")
        if self.memory is None:
            return {
                "ok": False,
                "error": f"this netlimitd follows the list in {self.store_url}: change it there "
                "(netlimit ban ... --config FILE)",
            }
        try:
            if op == "list":
                snap = self.memory.snapshot()
                return {
                    "ok": True,
                    "bans": [b.as_json(b.expires - left) for b, left in snap.bans],
                    "evicted": snap.evicted,
                }
            if op == "flush":
                return {"ok": True, "removed": self.memory.flush()}
            net = parse_target(str(req.get("net", "")))
            if op == "del":
                return {"ok": True, "removed": self.memory.delete(net)}
            if op == "add":
                ttl = float(req.get("ttl", 0))
                if not 0 < ttl <= 2_147_483:
                    return {"ok": False, "error": f"ttl {ttl:g} s is out of range (1 s to 24 days)"}
                why = self.protected.reason(net)
                if why is not None:
                    self.skipped += 1
                    return {"ok": False, "refused": True, "error": f"refused: {why}: never banned"}
                rep = req.get("repeat")
                repeat = None
                if rep is not None:  # [factor, max seconds] of an escalation's repeat
                    factor, most = float(rep[0]), float(rep[1])
                    if not (1 < factor <= 100 and 0 < most <= 2_147_483):
                        return {"ok": False, "error": f"repeat {rep!r} is out of range"}
                    repeat = (factor, most)
                res = self.memory.add(
                    net,
                    ttl,
                    rule=str(req.get("rule", "")),
                    reason=str(req.get("reason", "")),
                    by=str(req.get("by", "")),
                    origin=str(req.get("origin", "manual")),
                    extend=bool(req.get("extend", False)),
                    repeat=repeat,
                )
                return {"ok": True, "added": res.added, "left": res.left, "evicted": [str(n) for n in res.evicted]}
        except (TypeError, ValueError, IndexError) as exc:
            return {"ok": False, "error": str(exc)}
        return {"ok": False, "error": f"unknown ban request {op!r}: add, del, list or flush"}

    # --- reporting -------------------------------------------------------------------------------

    def _labels(self, b: Ban) -> tuple[str, str]:
        rule = b.rule or "(manual)"
        known = {r for r, _o in self.added} | {r for r, _o in self.expired}
        if rule not in known and len(known) >= MAX_RULE_LABELS:
            rule = "(other)"
        return rule, b.origin

    def kernel_sizes(self) -> dict[str, int]:
        """The ban sets' sizes as written (what `counters` shows instead of counting them)."""
        n = {4: 0, 6: 0}
        hosts = {4: 0, 6: 0}  # nftables: single addresses in banhosts4/6, wider prefixes in bans4/6
        for net in list(self.index.shown):  # one C-level copy: the main loop may be changing it
            n[net.version] += 1
            hosts[net.version] += net.prefixlen == net.max_prefixlen
        return {
            "banhosts4": hosts[4], "banhosts6": hosts[6], "bans4": n[4] - hosts[4], "bans6": n[6] - hosts[6],
            "netlimit-bans4": n[4], "netlimit-bans6": n[6],
        }  # fmt: skip

    def status(self) -> dict[str, Any]:
        r = self.redis
        return {
            "store": self.store_url,
            "connected": r.connected if r is not None else True,
            "active": len(self.index),
            "in_kernel": len(self.index.shown),
            "max_entries": self.max_entries,
            "loads": self.loads,
            "lists": self.lists,
            "last_load_ms": round(self.load_seconds * 1000, 1),
            "last_list": self.list_timings,
            "last_load": self.load_timings,
            "ready_wait_ms": round(self.ready_seconds * 1000, 1),
            "events": self.events,
            "writes": self.writes,
            "write_errors": self.write_errors,
            "skipped": self.skipped,
            "evicted": self.index.evicted,
            "drift_repairs": self.drift_repairs,
            "kernel_published": self.kernel_published,
            "last_error": self.last_error or (r.last_error if r is not None else ""),
        }
