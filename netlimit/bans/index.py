"""The active bans of one host and what its kernel set must hold. Pure: no store, no kernel.

A ban list may hold prefixes inside each other (an operator bans 203.0.113.0/24, an
escalation 203.0.113.7/32). An ipset `hash:net` takes both; an nftables interval set
refuses overlapping intervals. With `cover=True` the index keeps the kernel's view to
the *outermost* active prefixes: an inner ban is hidden while an outer one holds, and
shown (written) when the outer one expires or goes, with the time it has left. (While
netlimitd is down nobody shows it: the outer ban's end then also ends the inner one
until the daemon starts again and loads the list.)

Times are deadlines on the host's monotonic clock. The index is bounded: beyond
`max_entries` the ban that expires first goes (the store does the same).
"""

from __future__ import annotations

import heapq
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field

from .model import Ban, IPNetwork

#: a ban read again whose end moved less than this is not written again (a reconnect reads
#: every ban with a time left that differs from the one written by the transit time)
RENEW_TOLERANCE = 1.0


@dataclass
class Delta:
    """What changed in the kernel's view: prefix -> deadline to (re)write, prefixes to remove."""

    add: dict[IPNetwork, float] = field(default_factory=dict)
    remove: set[IPNetwork] = field(default_factory=set)

    def put(self, net: IPNetwork, deadline: float) -> None:
        self.remove.discard(net)
        self.add[net] = deadline

    def drop(self, net: IPNetwork) -> None:
        self.add.pop(net, None)
        self.remove.add(net)

    def merge(self, other: Delta) -> None:
        for n in other.remove:
            self.drop(n)
        for n, d in other.add.items():
            self.put(n, d)

    @property
    def empty(self) -> bool:
        return not self.add and not self.remove


class BanIndex:
    def __init__(self, max_entries: int, *, cover: bool, clock: Callable[[], float]):
        self.max_entries = max_entries
        self.cover = cover
        self.clock = clock
        self.bans: dict[IPNetwork, tuple[Ban, float]] = {}  # net -> (ban, deadline)
        self.shown: dict[IPNetwork, float] = {}  # what the kernel set should hold: net -> deadline
        self._by_len: dict[tuple[int, int], dict[int, IPNetwork]] = {}  # (version, prefixlen) -> {int: net}
        self._heap: list[tuple[float, int, int, IPNetwork]] = []  # (deadline, version, int, net), lazy
        self.evicted = 0  # bans dropped to stay within max_entries

    def __len__(self) -> int:
        return len(self.bans)

    def __contains__(self, net: IPNetwork) -> bool:
        return net in self.bans

    def get(self, net: IPNetwork) -> Ban | None:
        e = self.bans.get(net)
        return None if e is None else e[0]

    def deadline(self, net: IPNetwork) -> float | None:
        e = self.bans.get(net)
        return None if e is None else e[1]

    def next_deadline(self) -> float | None:
        """When the first ban runs out (lazy heap: entries replaced or gone are skipped)."""
        h = self._heap
        while h:
            d, _v, _i, net = h[0]
            e = self.bans.get(net)
            if e is not None and e[1] == d:
                return d
            heapq.heappop(h)
        return None

    # --- the index of prefixes -------------------------------------------------------

    def _index(self, net: IPNetwork) -> None:
        self._by_len.setdefault((net.version, net.prefixlen), {})[int(net.network_address)] = net

    def _unindex(self, net: IPNetwork) -> None:
        k = (net.version, net.prefixlen)
        d = self._by_len.get(k)
        if d is not None:
            d.pop(int(net.network_address), None)
            if not d:
                del self._by_len[k]

    def _ancestors(self, net: IPNetwork) -> Iterable[IPNetwork]:
        """Active bans strictly containing `net`."""
        bits = net.max_prefixlen
        a = int(net.network_address)
        for (v, plen), d in self._by_len.items():
            if v == net.version and plen < net.prefixlen:
                hit = d.get(a >> (bits - plen) << (bits - plen) if plen else 0)
                if hit is not None:
                    yield hit

    def _descendants(self, net: IPNetwork) -> list[IPNetwork]:
        """Active bans strictly inside `net`."""
        bits = net.max_prefixlen
        base = int(net.network_address)
        shift = bits - net.prefixlen
        out: list[IPNetwork] = []
        for (v, plen), d in self._by_len.items():
            if v != net.version or plen <= net.prefixlen:
                continue
            span = 1 << (plen - net.prefixlen)
            if span <= len(d):  # fewer candidates than entries: look each one up
                step = 1 << (bits - plen)
                for x in range(base, base + span * step, step):
                    hit = d.get(x)
                    if hit is not None:
                        out.append(hit)
            else:
                out.extend(n for a, n in d.items() if a >> shift == base >> shift)
        return out

    # --- changes ---------------------------------------------------------------------

    def put(self, ban: Ban, left: float) -> Delta:
        """Add or renew a ban that has `left` seconds to run."""
        delta = Delta()
        if left <= 0:
            return self.remove(ban.net)
        net = ban.net
        deadline = self.clock() + left
        fresh = net not in self.bans
        self.bans[net] = (ban, deadline)
        heapq.heappush(self._heap, (deadline, net.version, int(net.network_address), net))
        if fresh:
            self._index(net)
        if not self.cover or net in self.shown:
            self.shown[net] = deadline
            delta.put(net, deadline)
        elif not any(a in self.shown for a in self._ancestors(net)):
            for d in self._descendants(net):
                if self.shown.pop(d, None) is not None:
                    delta.drop(d)
            self.shown[net] = deadline
            delta.put(net, deadline)
        if len(self.bans) > self.max_entries:
            delta.merge(self._evict())
        return delta

    def remove(self, net: IPNetwork) -> Delta:
        delta = Delta()
        if self.bans.pop(net, None) is None:
            return delta
        self._unindex(net)
        if self.shown.pop(net, None) is not None:
            delta.drop(net)
            if self.cover:
                self._reveal(net, delta)
        return delta

    def _reveal(self, net: IPNetwork, delta: Delta) -> None:
        """`net` left the kernel's view: show the outermost active bans it hid."""
        inner = sorted(self._descendants(net), key=lambda n: n.prefixlen)
        for d in inner:
            if not any(a in self.shown for a in self._ancestors(d)):
                dl = self.bans[d][1]
                self.shown[d] = dl
                delta.put(d, dl)

    def clear(self) -> Delta:
        delta = Delta()
        for net in self.shown:
            delta.drop(net)
        self.bans.clear()
        self.shown.clear()
        self._by_len.clear()
        self._heap.clear()
        return delta

    def replace(self, bans: Iterable[tuple[Ban, float]]) -> Delta:
        """The whole list at once (a snapshot): what the kernel must hold afterwards is
        `shown`; the returned delta says how it differs from before."""
        before = dict(self.shown)
        live = [b for b in bans if b[1] > 0]
        self.bans.clear()
        self.shown.clear()
        self._by_len.clear()
        self._heap.clear()
        now = self.clock()
        items = sorted(live, key=lambda b: -b[1])[: self.max_entries]  # the longest-lived stay
        self.evicted += len(live) - len(items)
        for ban, left in items:
            dl = now + left
            self.bans[ban.net] = (ban, dl)
            self._index(ban.net)
            self._heap.append((dl, ban.net.version, int(ban.net.network_address), ban.net))
        heapq.heapify(self._heap)
        if not self.cover:
            self.shown = {n: e[1] for n, e in self.bans.items()}
        else:
            for net in sorted(self.bans, key=lambda n: n.prefixlen):
                if not any(a in self.shown for a in self._ancestors(net)):
                    self.shown[net] = self.bans[net][1]
        delta = Delta()
        for net in before:
            if net not in self.shown:
                delta.drop(net)
        for net, dl in self.shown.items():
            old = before.get(net)
            if old is None or abs(old - dl) > RENEW_TOLERANCE:  # the same ban read again: no rewrite
                delta.put(net, dl)
        return delta

    def expire(self, now: float | None = None) -> tuple[list[Ban], Delta]:
        """Drop the bans whose time is up; the kernel drops them itself (their element
        timeout), so the delta only shows what they hid."""
        now = self.clock() if now is None else now
        gone: list[Ban] = []
        delta = Delta()
        h = self._heap
        while h and h[0][0] <= now:
            d, _v, _i, net = heapq.heappop(h)
            e = self.bans.get(net)
            if e is None or e[1] != d:
                continue
            gone.append(e[0])
            del self.bans[net]
            self._unindex(net)
            if self.shown.pop(net, None) is not None and self.cover:
                self._reveal(net, delta)
        return gone, delta

    def _evict(self) -> Delta:
        """Over max_entries: the bans that expire first go (as the store drops them)."""
        delta = Delta()
        while len(self.bans) > self.max_entries:
            dl = self.next_deadline()
            if dl is None:  # pragma: no cover - the heap holds every ban
                break
            _d, _v, _i, net = heapq.heappop(self._heap)
            delta.merge(self.remove(net))
            self.evicted += 1
        return delta
