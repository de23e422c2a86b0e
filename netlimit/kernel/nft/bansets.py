"""The nftables family's ban-set writer: the elements of the ban list's sets in table
inet netlimit over netlink (elements.py), and the per-rule sets the packet path fills.

Per family the list is two sets: `banhosts4`/`banhosts6`, a hash set of single addresses
(/32, /128), and `bans4`/`bans6`, an interval set of wider prefixes. An address is one
element of a hash set but two of an interval set (its start and the address after it),
and the kernel's time to write a list goes with its elements: 100,000 bans of the
drill's mix (70 % single addresses) are 130,000 elements instead of 200,000."""

from __future__ import annotations

import bisect
import ipaddress
import time
from dataclasses import dataclass

from ...prefixes import IPNetwork, network_of
from ..banset import by_family, list_by_family
from ..objects import NFT_BAN_HOST_SETS, NFT_BAN_SETS, NFT_FAMILY, NFT_KERNEL_BAN_PREFIX, NFT_TABLE
from . import elements as nfelements
from .netlink import NetlinkError, Socket

#: a prefix the kernel holds with at most this many seconds less than the list says is
#: kept as it is (sync_prefixes); shorter, it is written again with the list's time
SYNC_SHORT_S = 2.0
#: ... and with at most this many seconds more: the time a whole write of 100,000 takes
#: on a busy host (the kernel's clock starts at the write, the list's before it); netlimitd
#: removes it when the list's time is up (its index's expiry), the kernel at its own
SYNC_LONG_S = 60.0


#: elements per transaction when filling empty sets (fill_in_steps): 5 netlink messages;
#: 100,000 bans took 8-46 MiB at the peak in steps, 0.56-1.1 GiB in one (ban_drills --only write)
FILL_STEP = 5000


def fill_in_steps(changes: list[nfelements.Change], starts: dict[str, list[int]]) -> None:
    """Write `changes` (each a flush and the elements of one set) into sets known to hold
    nothing (a start after a reboot): one transaction flushes them all, then one per
    FILL_STEP elements adds them. Why not one transaction: the kernel builds a change
    notification of a page or two for every element (on the 6.18 test host even with
    no listener to be found) and holds a transaction's until its commit ends: 100,000
    bans (130,000 elements) in one transaction took 0.56-1.1 GiB of kernel memory at
    once, and the write's time followed what fresh pages cost (0.4-2.0 s in a VM that
    hands freed pages back to its hypervisor). In steps the same few MiB serve every
    step (docs/reliability.md). Between steps the sets hold part of the list and
    nothing else: from empty they only grow. An interval set is cut only where a
    prefix begins (`starts`: the indexes of its prefixes' first elements), so a start
    and its end go together and its lower bound goes first. A refused step raises
    NetlinkError with the steps before it written; the caller's next write finds them
    (sync_prefixes: a difference, or the sets written whole)."""
    nfelements.write([nfelements.Change(c.table, c.set, c.interval, flush=True) for c in changes], NFT_FAMILY)
    step: list[nfelements.Change] = []
    room = FILL_STEP
    for ch in changes:
        els = ch.elements or []
        cuts = starts.get(ch.set)
        i = 0
        while i < len(els):
            j = min(len(els), i + room)
            if cuts is not None and j < len(els):
                k = bisect.bisect_left(cuts, j)
                j = cuts[k] if k < len(cuts) else len(els)
            step.append(nfelements.Change(ch.table, ch.set, ch.interval, elements=els[i:j]))
            room -= j - i
            i = j
            if room <= 0:
                nfelements.write(step, NFT_FAMILY)
                step, room = [], FILL_STEP
    if step:
        nfelements.write(step, NFT_FAMILY)


@dataclass(frozen=True)
class Held:
    """What the ban sets held (held_prefixes per family; None: a set missing or holding
    what netlimit does not write), read ahead of the list at a start (issue 35: the dump
    of 100,000 prefixes is ~0.4 s of kernel time, spent beside the first apply and the
    list's read), with the ruleset's generation before and after the read: it stands for
    what the sets hold for as long as the generation has not moved (no commit since, by
    anyone: an apply that recreated a set, another tool's flush)."""

    generation: int
    sets: dict[int, dict[tuple[int, int], int]] | None
    at: float  # time.monotonic() at the read's end (the times left count down from then)


def _is_address(n: IPNetwork) -> bool:
    """A single address (the hash set's), not a wider prefix (the interval set's)."""
    return n.prefixlen == n.max_prefixlen


def _changes(add: dict[IPNetwork, float], remove: list[IPNetwork], flush: bool) -> list[nfelements.Change]:
    """One Change per set of each family: `remove` (every element first, with `flush`), then `add`."""
    a, r = by_family(add), list_by_family(remove)
    out: list[nfelements.Change] = []
    for f in (4, 6):
        for name, addresses in ((NFT_BAN_HOST_SETS[f], True), (NFT_BAN_SETS[f], False)):
            adds = {n: left for n, left in a[f].items() if _is_address(n) is addresses}
            gone = [n for n in r[f] if _is_address(n) is addresses]
            out.append(nfelements.Change(NFT_TABLE, name, not addresses, flush=flush, add=adds, delete=gone))
    return out


def generation() -> int:
    with Socket() as nl:
        return nl.generation()


def _generation_is(gen: int) -> bool:
    try:
        return generation() == gen
    except OSError:  # NetlinkError too: the generation unknown, the read ahead is not trusted
        return False


class NftBanSets:
    key = "nftables"
    cover = True

    def held(self) -> Held | None:
        """What the sets hold now, for a later sync_prefixes(held=...); None when the
        ruleset changed while they were read (the sync then reads them itself)."""
        g0 = generation()
        sets = self._read_held()
        # the times left as of the dump's end (its first elements were read earlier, up to
        # a busy host's second or two: they then seem to have that much more; the sync takes
        # up to SYNC_LONG_S more, only SYNC_SHORT_S less)
        t = time.monotonic()
        return Held(g0, sets, t) if generation() == g0 else None

    def _read_held(self) -> dict[int, dict[tuple[int, int], int]] | None:
        """Both sets of each family as one map; None also where the interval set holds a
        single address (as netlimit before the hash sets wrote them: written whole once)."""
        out: dict[int, dict[tuple[int, int], int]] = {}
        for f, width in ((4, 4), (6, 16)):
            h = nfelements.held_prefixes(NFT_TABLE, NFT_BAN_SETS[f], width, NFT_FAMILY)
            if h is None or any(p == 8 * width for _a, p in h):
                return None
            hosts = nfelements.held_addresses(NFT_TABLE, NFT_BAN_HOST_SETS[f], width, NFT_FAMILY)
            if hosts is None:
                return None
            h.update(hosts)
            out[f] = h
        return out

    def _held_now(self, held: Held | None) -> tuple[dict[int, dict[tuple[int, int], int]] | None, float, str]:
        """What the sets hold: `held` if no commit was made since it was read, else one
        dump now; and how old it is (s), and which it was ("prefetch" or "dump")."""
        if held is not None and _generation_is(held.generation):
            return held.sets, time.monotonic() - held.at, "prefetch"
        return self._read_held(), 0.0, "dump"

    def replace(self, bans: dict[IPNetwork, float]) -> None:
        nfelements.write(_changes(bans, [], flush=True), NFT_FAMILY)

    def change(self, add: dict[IPNetwork, float], remove: list[IPNetwork]) -> None:
        nfelements.write(_changes(add, remove, flush=False), NFT_FAMILY)

    def read(self) -> dict[IPNetwork, float | None] | None:
        out: dict[IPNetwork, float | None] = {}
        for f in (4, 6):
            for name, interval in ((NFT_BAN_HOST_SETS[f], False), (NFT_BAN_SETS[f], True)):
                els = nfelements.read(NFT_TABLE, name, NFT_FAMILY)
                if els is None:
                    return None
                out.update(nfelements.prefixes(els, interval=interval))
        return out

    def count(self) -> int | None:
        total = 0
        for f in (4, 6):
            for name in (NFT_BAN_HOST_SETS[f], NFT_BAN_SETS[f]):
                n = nfelements.count(NFT_TABLE, name, NFT_FAMILY)
                if n is None:
                    return None
                total += n
        return total

    def kernel_bans(self, rules: list[tuple[str, int, int]]) -> list[tuple[str, IPNetwork, float]]:
        out: list[tuple[str, IPNetwork, float]] = []
        for name, p4, p6 in rules:
            for f, plen in ((4, p4), (6, p6)):
                els = nfelements.read(NFT_TABLE, f"{NFT_KERNEL_BAN_PREFIX}{f}-{name}", NFT_FAMILY)
                for el in els or []:
                    net = ipaddress.ip_network(f"{ipaddress.ip_address(el.key)}/{plen}", strict=False)
                    if el.left_ms is not None and el.left_ms > 0:
                        out.append((name, net, el.left_ms / 1000))
        return out

    def replace_prefixes(self, prefixes: list[tuple[int, int, int, float]], *, empty: bool = False) -> None:
        """replace() from (version, first address, prefix length, seconds left), ascending and
        none inside another: the elements are made from the integers, byte for byte what
        `add=` makes (banset.replace_prefixes). One transaction, unless `empty`: sets known
        to hold nothing are filled in steps of FILL_STEP elements (fill_in_steps)."""
        changes = []
        starts: dict[str, list[int]] = {}  # per interval set: where each prefix's elements begin
        for f, width in ((4, 4), (6, 16)):
            head, tail, key = nfelements.FIXED[width]
            bits = 8 * width
            top = 1 << bits
            els = [nfelements.elem(bytes(width), end=True)]  # the set's lower bound, as nft writes it
            add = els.append
            hosts: list[bytes] = []  # a hash set's element is an interval's start, byte for byte
            host = hosts.append
            begins = starts[NFT_BAN_SETS[f]] = []
            begin = begins.append
            for v, a, p, left in prefixes:
                if v != f:
                    continue
                start = head + nfelements.to_timeout_ms(left).to_bytes(8, "big") + key + a.to_bytes(width, "big")
                if p == bits:
                    host(start)
                    continue
                begin(len(els))
                add(start)
                after = a + (1 << (bits - p))
                if after < top:
                    add(tail + key + after.to_bytes(width, "big"))
            changes.append(
                nfelements.Change(NFT_TABLE, NFT_BAN_HOST_SETS[f], False, flush=True, elements=hosts or None)
            )
            changes.append(
                nfelements.Change(NFT_TABLE, NFT_BAN_SETS[f], True, flush=True, elements=els if len(els) > 1 else None)
            )
        if empty:
            fill_in_steps(changes, starts)
        else:
            nfelements.write(changes, NFT_FAMILY)

    def sync_prefixes(
        self, prefixes: list[tuple[int, int, int, float]], held: Held | None = None
    ) -> dict[str, int | str]:
        """replace_prefixes() for sets that may hold the list already (a restart after
        on_stop: keep or a crash, issue 35): read what they hold (one dump, matched as
        bytes) and write only the difference, in one transaction: a prefix held with its
        time about right stays untouched, one held too short (or far too long) is written anew
        (removed and added in that transaction: never missing), one not in the list goes.
        Flushing and rewriting 100,000 elements costs the kernel 3-4 times what writing
        them into empty sets does. Sets holding anything netlimit does not write, a
        difference of more than half the list, or a refused write: the sets are written
        whole (replace_prefixes). `held`: what the sets held a moment ago (held(), read
        beside the start's other work), used when no commit was made since (the ruleset's
        generation is the same), else the sets are read now. What was done: {"write":
        "diff"|"whole", "held", "added", "removed", "held_from": "prefetch"|"dump"}."""
        found, age, source = self._held_now(held)
        if found is None:
            self.replace_prefixes(prefixes)
            return {
                "write": "whole", "held": -1, "added": len(prefixes), "removed": 0, "held_from": source, "why": "unread"
            }  # fmt: skip
        n_held = len(found[4]) + len(found[6])
        whole: dict[str, int | str] = {
            "write": "whole", "held": n_held, "added": len(prefixes), "removed": n_held, "held_from": source
        }  # fmt: skip
        if not n_held:  # empty sets (a reboot, a new set): nothing to compare, nothing to keep
            self.replace_prefixes(prefixes, empty=True)
            return dict(whole, why="empty")
        # tuples first, networks only for a difference worth writing (100,000 network
        # objects cost more than the whole write)
        add_t: list[tuple[int, int, int, float]] = []
        remove_t: list[tuple[int, int, int]] = []
        lo, hi = (age - SYNC_SHORT_S) * 1000, (age + SYNC_LONG_S) * 1000  # ms held then - ms wanted now
        # what is left in `rest` after the walk is held but not wanted (a prefix twice in
        # `prefixes`: its second is written again, never left out)
        rest = {4: dict(found[4]), 6: dict(found[6])}
        pop = {v: d.pop for v, d in rest.items()}
        for t in prefixes:
            v, a, p, left = t
            ms = pop[v]((a, p), None)
            if ms is None:
                add_t.append(t)
            elif not lo <= ms - left * 1000 <= hi:
                add_t.append(t)
                remove_t.append((v, a, p))
        for v in (4, 6):
            remove_t.extend((v, a, p) for a, p in rest[v])
        if 2 * (len(add_t) + len(remove_t)) > len(prefixes):
            self.replace_prefixes(prefixes)
            return dict(whole, why="differs")
        add = {network_of(v, a, p): left for v, a, p, left in add_t}
        remove = [network_of(*k) for k in remove_t]
        done: dict[str, int | str] = {
            "write": "diff", "held": n_held, "added": len(add), "removed": len(remove), "held_from": source
        }  # fmt: skip
        try:
            self.change(add, remove)
        except NetlinkError:  # an element expired between the dump and the write: the sets whole
            self.replace_prefixes(prefixes)
            return dict(whole, why="refused")
        return done
