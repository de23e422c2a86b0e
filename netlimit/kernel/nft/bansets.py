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

from ...prefixes import IPNetwork
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
#: at most this many elements in the one transaction that takes out of the sets what
#: netlimit does not write (foreign_clearing; more: the sets are written whole)
FOREIGN_MOST = FILL_STEP


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


Add = tuple[int, int, int, float]  # (version, first address, prefix length, seconds left)
Remove = tuple[int, int, int]  # (version, first address, prefix length)


def diff_steps(add_t: list[Add], remove_t: list[Remove], step: int) -> list[tuple[list[Add], list[Remove]]]:
    """Cut a difference between what the sets hold and the list into transactions of
    about `step` elements, such that no ban of the list is missing between two of them.
    A prefix written anew (its time far off) is removed and added in one step. An
    added prefix goes with the removal of every held prefix it overlaps: an interval
    set refuses an overlapping interval, and a removal in an earlier step would leave a
    gap. The steps that add go first, in the list's order, then those that only remove
    prefixes the list dropped. Between steps the sets hold every ban of the list they
    held before, those added so far, and the dropped ones not yet removed: a ban ends
    a moment late, never early."""
    n_add = len(add_t)
    parent = list(range(n_add + len(remove_t)))

    def root(i: int) -> int:
        while parent[i] != i:
            parent[i] = parent[parent[i]]
            i = parent[i]
        return i

    def join(i: int, j: int) -> None:
        a, b = root(i), root(j)
        if a != b:
            parent[max(a, b)] = min(a, b)  # the lower index leads: an add, where there is one

    index = {(v, a, p): i for i, (v, a, p, _left) in enumerate(add_t)}
    spans: dict[int, list[tuple[int, int, int]]] = {4: [], 6: []}  # the interval adds: (first, after, index)
    for i, (v, a, p, _left) in enumerate(add_t):
        bits = 32 if v == 4 else 128
        if p < bits:
            spans[v].append((a, a + (1 << (bits - p)), i))
    firsts = {}
    for v, sv in spans.items():
        sv.sort()
        firsts[v] = [f for f, _after, _i in sv]
    for j, (v, a, p) in enumerate(remove_t, n_add):
        same = index.get((v, a, p))
        if same is not None:  # written anew: the list's prefixes overlap no other
            join(same, j)
            continue
        bits = 32 if v == 4 else 128
        if p == bits:  # an address of a hash set: overlaps nothing
            continue
        after = a + (1 << (bits - p))
        sv = spans[v]
        k = bisect.bisect_left(firsts[v], a)
        if k and sv[k - 1][1] > a:  # an added prefix that holds it
            join(sv[k - 1][2], j)
        while k < len(sv) and sv[k][0] < after:  # added prefixes inside it
            join(sv[k][2], j)
            k += 1
    # a group is led by its lowest index: an add's (in the list's order) where it has one,
    # so ordering by the leader puts the steps that add first; a stable sort keeps each
    # group's members together. Plain ints only: 180,000 small containers cost seconds of
    # the garbage collector's time.
    total = len(parent)
    lead = [root(i) for i in range(total)]
    size = [0] * total  # elements per group (at its leader): an address is one, an interval two
    for i in range(total):
        v, _a, p = add_t[i][:3] if i < n_add else remove_t[i - n_add]
        size[lead[i]] += 1 if p == (32 if v == 4 else 128) else 2
    out: list[tuple[list[Add], list[Remove]]] = []
    adds: list[Add] = []
    removes: list[Remove] = []
    room, cur = step, -1
    for i in sorted(range(total), key=lead.__getitem__):
        g = lead[i]
        if g != cur:  # a group begins: cut before it if it does not fit
            cur = g
            if (adds or removes) and size[g] > room:
                out.append((adds, removes))
                adds, removes, room = [], [], step
            room -= size[g]
        if i < n_add:
            adds.append(add_t[i])
        else:
            removes.append(remove_t[i - n_add])
    if adds or removes:
        out.append((adds, removes))
    return out


Raw = list[nfelements.Element]  # one set's elements as the kernel holds them (nfelements.read)


Gone = tuple[int, bool, int, int]  # an element netlimit did not write: (version, interval set?, first, after)


def foreign_plan(prefixes: list[Add], held: dict[tuple[int, bool], Raw]) -> tuple[list[Add], list[Remove], list[Gone]]:
    """What to take out of the sets that netlimit does not write -- an element without a
    timeout (`nft add element` by hand), an address or a range that is no CIDR prefix in
    an interval set (netlimit before the hash sets, or a hand) -- and what to write with
    it so that no ban of the list is left out: each list prefix that overlaps such an
    element and is not held as netlimit writes it, with its time; a wider one takes
    out the held prefixes it overlaps too (the kernel refuses overlapping intervals, and
    the list holds no prefix inside another, so they are not on it), and with each of
    those the list's prefixes inside it are written too. `held`: (family,
    interval set?) -> its elements (nfelements.read). Returns (adds, removes, gone)."""
    add_t: list[Add] = []
    remove_t: list[Remove] = []
    gone: list[Gone] = []
    for v, width in ((4, 4), (6, 16)):
        bits = 8 * width
        top = 1 << bits
        ours_hosts: set[int] = set()
        ours_spans: list[tuple[int, int]] = []  # netlimit's prefixes in the interval set: (first, after)
        foreign: list[tuple[int, int]] = []  # what foreign elements ban: (first, after)
        for el in held.get((v, False), []):
            a = int.from_bytes(el.key, "big")
            if el.left_ms is None:
                foreign.append((a, a + 1))
                gone.append((v, False, a, a + 1))
            else:
                ours_hosts.add(a)
        els = sorted(held.get((v, True), []), key=lambda el: (el.key, not el.end))
        i = 0
        while i < len(els):
            first = els[i]
            i += 1
            if first.end:  # the set's lower bound (an end at 0): netlimit's, left alone
                continue
            a = int.from_bytes(first.key, "big")
            last = els[i] if i < len(els) and els[i].end else None  # none: it reaches the top
            after = top if last is None else int.from_bytes(last.key, "big")
            i += last is not None
            size = after - a
            if first.left_ms is not None and size > 1 and not size & (size - 1) and not a & (size - 1):
                ours_spans.append((a, after))
            else:  # no timeout, a single address, or a range no prefix
                foreign.append((a, after))
                gone.append((v, True, a, after))
        if not foreign:
            continue
        ours_spans.sort()
        firsts = [a for a, _after in ours_spans]
        ours_set = set(ours_spans)
        mine = [t for t in prefixes if t[0] == v]
        starts = [t[1] for t in mine]
        todo = [t for f, after in foreign for t in _overlapping(mine, starts, bits, f, after)]
        seen: set[tuple[int, int]] = set()
        dropped: set[tuple[int, int]] = set()
        while todo:
            t = todo.pop()
            _v, a, p, _left = t
            if (a, p) in seen:
                continue
            seen.add((a, p))
            if p == bits:
                if a not in ours_hosts:
                    add_t.append(t)
                continue
            after = a + (1 << (bits - p))
            if (a, after) in ours_set:
                continue
            add_t.append(t)
            k = max(0, bisect.bisect_right(firsts, a) - 1)
            while k < len(ours_spans) and ours_spans[k][0] < after:  # held prefixes it overlaps: not on the list
                f0, a0 = ours_spans[k]
                if a0 > a and (f0, a0) not in dropped:
                    dropped.add((f0, a0))
                    remove_t.append((v, f0, bits - (a0 - f0).bit_length() + 1))
                    todo += _overlapping(mine, starts, bits, f0, a0)  # the list's inside it: written with it
                k += 1
    return sorted(add_t), sorted(set(remove_t)), gone


def _overlapping(mine: list[Add], starts: list[int], bits: int, f: int, after: int) -> list[Add]:
    """The prefixes of `mine` (one family's, sorted, disjoint; `starts` their first
    addresses) that overlap [f, after)."""
    out = []
    k = max(0, bisect.bisect_right(starts, f) - 1)
    while k < len(mine) and mine[k][1] < after:
        t = mine[k]
        if t[1] + (1 << (bits - t[2])) > f:
            out.append(t)
        k += 1
    return out


def foreign_clearing(
    prefixes: list[Add], held: dict[tuple[int, bool], Raw], limit: int
) -> tuple[list[nfelements.Change], dict[str, int]] | None:
    """foreign_plan() as one transaction, so that held_prefixes() can read the sets
    again and the difference be written in steps (sync_prefixes) instead of the whole
    list in one transaction of over 1 GiB. None when nothing is foreign, or the
    transaction would pass `limit` elements (the caller writes the sets whole, as
    before). Returns the changes and their counts: "foreign" (what netlimit did not
    write: an address, a prefix or a range each), "added" and "removed" (the list's
    prefixes written with them, the held ones they overlapped)."""
    add_t, remove_t, gone = foreign_plan(prefixes, held)
    raw: dict[tuple[int, bool], list[bytes]] = {}
    for v, interval, a, after in gone:
        width = 4 if v == 4 else 16
        plain, end = nfelements.KEYS[width]
        els = raw.setdefault((v, interval), [])
        els.append(plain + a.to_bytes(width, "big"))  # an address, or an interval's start
        if interval and after < 1 << (8 * width):
            els.append(end + after.to_bytes(width, "big"))
    n_elements = sum(map(len, raw.values()))
    if not gone or n_elements + 2 * (len(add_t) + len(remove_t)) > limit:
        return None
    out = []
    for c in _tuple_changes(add_t, remove_t):
        v = 4 if c.set in (NFT_BAN_HOST_SETS[4], NFT_BAN_SETS[4]) else 6
        removals = (c.removals or []) + raw.get((v, c.interval), [])
        out.append(nfelements.Change(c.table, c.set, c.interval, elements=c.elements, removals=removals or None))
    return out, {"foreign": len(gone), "added": len(add_t), "removed": len(remove_t)}


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


def _difference(
    prefixes: list[Add], found: dict[int, dict[tuple[int, int], int]], age: float
) -> tuple[list[Add], list[Remove]]:
    """What to add and remove so that sets holding `found` (ms left, read `age` s ago)
    hold `prefixes`: a prefix held with its time about right stays untouched, one held
    too short (or far too long) is written anew (removed and added), one not in the
    list goes. Tuples only: 100,000 network objects cost more than a whole write."""
    add_t: list[Add] = []
    remove_t: list[Remove] = []
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
    return add_t, remove_t


def _add_elements(prefixes: list[Add], f: int, width: int) -> tuple[list[bytes], list[bytes], list[int]]:
    """The elements that add `prefixes` of family `f` (ascending), made from the integers,
    byte for byte what elements.py makes of network objects (_changes): the hash set's (an address's
    element is an interval's start) and the interval set's (the set's lower bound, as nft
    writes it, then a start and, below the top of the space, an end per prefix; none at
    all without a prefix), and the index in the latter where each prefix's elements begin
    (fill_in_steps cuts only there)."""
    head, tail, key = nfelements.FIXED[width]
    bits = 8 * width
    top = 1 << bits
    spans = [nfelements.elem(bytes(width), end=True)]
    add = spans.append
    hosts: list[bytes] = []
    host = hosts.append
    begins: list[int] = []
    begin = begins.append
    for v, a, p, left in prefixes:
        if v != f:
            continue
        start = head + nfelements.to_timeout_ms(left).to_bytes(8, "big") + key + a.to_bytes(width, "big")
        if p == bits:
            host(start)
            continue
        begin(len(spans))
        add(start)
        after = a + (1 << (bits - p))
        if after < top:
            add(tail + key + after.to_bytes(width, "big"))
    return hosts, spans if begins else [], begins


def _tuple_changes(add_t: list[Add], remove_t: list[Remove]) -> list[nfelements.Change]:
    """One Change per set of each family: `remove_t` deleted, then `add_t` added, in
    ascending order, every element byte for byte what elements.py makes of the prefixes
    as network objects (_changes)."""
    out: list[nfelements.Change] = []
    for f, width in ((4, 4), (6, 16)):
        plain, end = nfelements.KEYS[width]
        bits = 8 * width
        top = 1 << bits
        hosts, spans, _begins = _add_elements(sorted(t for t in add_t if t[0] == f), f, width)
        gone_hosts: list[bytes] = []
        gone_spans: list[bytes] = []
        for _v, a, p in sorted(t for t in remove_t if t[0] == f):
            if p == bits:
                gone_hosts.append(plain + a.to_bytes(width, "big"))
                continue
            gone_spans.append(plain + a.to_bytes(width, "big"))
            after = a + (1 << (bits - p))
            if after < top:
                gone_spans.append(end + after.to_bytes(width, "big"))
        for name, interval, els, gone in (
            (NFT_BAN_HOST_SETS[f], False, hosts, gone_hosts),
            (NFT_BAN_SETS[f], True, spans, gone_spans),
        ):
            out.append(nfelements.Change(NFT_TABLE, name, interval, elements=els or None, removals=gone or None))
    return out


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
        """Remove, then add or renew: one transaction for a change of up to about
        FILL_STEP elements (a ban, an unban, an expiry tick), steps of that size that
        never leave a ban out for a larger one (diff_steps: a reconnect to the list's
        store after a long outage may bring 100,000 at once, and one transaction of that
        size takes over 1 GiB of kernel memory). A refused step raises, leaving the steps
        before it: the caller's reload (sync_prefixes) writes what still differs."""
        add_t: list[Add] = [(n.version, int(n.network_address), n.prefixlen, left) for n, left in add.items()]
        remove_t: list[Remove] = [(n.version, int(n.network_address), n.prefixlen) for n in remove]
        add_t.sort()  # ascending across the steps too: the order the kernel's interval tree takes fastest
        for adds, removes in diff_steps(add_t, remove_t, FILL_STEP):
            self._change_t(adds, removes)

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
            hosts, spans, starts[NFT_BAN_SETS[f]] = _add_elements(prefixes, f, width)
            changes.append(
                nfelements.Change(NFT_TABLE, NFT_BAN_HOST_SETS[f], False, flush=True, elements=hosts or None)
            )
            changes.append(nfelements.Change(NFT_TABLE, NFT_BAN_SETS[f], True, flush=True, elements=spans or None))
        if empty:
            fill_in_steps(changes, starts)
        else:
            nfelements.write(changes, NFT_FAMILY)

    def sync_prefixes(
        self, prefixes: list[tuple[int, int, int, float]], held: Held | None = None
    ) -> dict[str, int | str]:
        """replace_prefixes() for sets that may hold the list already (a restart after
        on_stop: keep or a crash, issue 35; netlimitd's reload after an apply or drift):
        read what they hold (one dump, matched as bytes) and write only the difference
        (_difference): a prefix held with its time about right stays untouched, one held
        too short (or far too long) is written anew (removed and added in one
        transaction: never missing), one not in the list goes. It is written in steps of
        about FILL_STEP elements that never leave a ban of the list out (diff_steps; a
        small difference is one step): one transaction of 100,000 takes about 1 GiB of
        kernel memory (fill_in_steps). Empty sets are filled in steps. Sets holding
        what netlimit does not write (an element added by hand without a timeout, an
        address or a range in an interval set) have that taken out first, in one small
        transaction that keeps every ban (foreign_clearing); more of it than FOREIGN_MOST
        elements, or a write refused twice: the sets are written whole in one transaction
        (replace_prefixes). `held`: what the sets held a moment ago (held(), read
        beside the start's other work), used when no commit was made since (the
        ruleset's generation is the same), else the sets are read now.
        What was done: {"write": "diff"|"whole", "held", "added", "removed", "held_from":
        "prefetch"|"dump", and "why" (whole: "empty"|"unread"|"refused") or "steps" and
        "attempts" (a diff, and "foreign": what netlimit did not write, taken out first;
        it and what was written with it are counted in "added" and "removed")}."""
        found, age, source = self._held_now(held)
        cleared = {"foreign": 0, "added": 0, "removed": 0}
        if found is None:  # something netlimit does not write: taken out first, if it is a few
            cleared = self._clear_foreign(prefixes) or cleared
            if cleared["foreign"]:
                found, age, source = self._read_held(), 0.0, "dump"
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
        add_t, remove_t = _difference(prefixes, found, age)
        done: dict[str, int | str] = {
            "write": "diff", "held": n_held, "added": len(add_t) + cleared["added"],
            "removed": len(remove_t) + cleared["removed"] + cleared["foreign"], "held_from": source,
        }  # fmt: skip
        if cleared["foreign"]:
            done["foreign"] = cleared["foreign"]
        # in steps of about FILL_STEP elements that never leave a ban out (diff_steps; a
        # small difference is one step): one transaction of 100,000 takes about 1 GiB of
        # kernel memory. A refused step -- most often a dropped prefix that expired in the
        # kernel between the dump and its removal -- leaves the steps before it; the sets
        # are read again and what still differs is written in steps once more, then whole.
        for attempt in (1, 2):
            steps = diff_steps(add_t, remove_t, FILL_STEP)
            try:
                for adds, removes in steps:
                    self._change_t(adds, removes)
                return dict(done, steps=len(steps), attempts=attempt)
            except NetlinkError:
                found = self._read_held()
                if found is None or attempt == 2:
                    break
                add_t, remove_t = _difference(prefixes, found, 0.0)
        self.replace_prefixes(prefixes)
        return dict(whole, why="refused")

    def _clear_foreign(self, prefixes: list[Add]) -> dict[str, int] | None:
        """foreign_clearing() of what the sets hold now (read() of each: slower than the
        byte match, but only where that failed), written; its counts. None: nothing
        foreign found, too much of it, a set missing, or the transaction refused (the
        caller then writes the sets whole)."""
        held: dict[tuple[int, bool], Raw] = {}
        for v in (4, 6):
            for interval, name in ((False, NFT_BAN_HOST_SETS[v]), (True, NFT_BAN_SETS[v])):
                els = nfelements.read(NFT_TABLE, name, NFT_FAMILY)
                if els is None:
                    return None
                held[(v, interval)] = els
        plan = foreign_clearing(prefixes, held, FOREIGN_MOST)
        if plan is None:
            return None
        changes, counts = plan
        try:
            nfelements.write(changes, NFT_FAMILY)
        except NetlinkError:
            return None
        return counts

    def _change_t(self, add_t: list[Add], remove_t: list[Remove]) -> None:
        """change() from tuples (one transaction), its elements made from the integers as
        replace_prefixes makes them (100,000 network objects and their elements made one
        by one took 3 s of a 180,000-prefix difference)."""
        nfelements.write(_tuple_changes(add_t, remove_t), NFT_FAMILY)
