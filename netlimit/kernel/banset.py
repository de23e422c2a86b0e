"""The elements of the kernel's ban sets: what netlimitd writes as the ban list changes.

The sets themselves are compiled objects (nft/compile.py: `bans4`/`bans6` in table inet
netlimit; compile.py: the ipsets `netlimit-bans4`/`-bans6`), created and repaired by
reconcile.py like every rule. Their *elements* are not part of the rule set: an apply
never touches them (a no-op apply leaves them, a changed rule keeps them); this module
is the only writer, and each element carries its own timeout, so a ban ends in the
kernel on time even while netlimitd is down.

* nftables (`NftBanSets`, nft/bansets.py): netlink batches (nft/elements.py), one per
  change up to about 5,000 elements; a larger change and a whole write of the list
  (sync_prefixes: a start, a reload) go in steps of that size that never leave a ban out
  (one transaction of 100,000 takes over 1 GiB of kernel memory);
* legacy x_tables (`IpsetBanSets`): `ipset restore` (xtables/ipset.py); a whole
  reload fills a fresh set and swaps it in.

Each backend hands out its own (`FilterBackend.ban_sets()`, registry.py).

Both also read the per-rule sets the packet path fills (a network rule's `escalate`),
so that netlimitd can hand those bans to the fleet. Every call works in the calling
thread's network namespace (netns.run_in_netns).
"""

from __future__ import annotations

import time
from typing import Protocol

from ..prefixes import IPNetwork, network_of


class BanSets(Protocol):
    key: str
    #: the set refuses overlapping prefixes (the caller hands in the outermost only)
    cover: bool

    def replace(self, bans: dict[IPNetwork, float]) -> None:
        """Make the sets hold exactly `bans` (prefix -> seconds left), atomically."""
        ...

    def change(self, add: dict[IPNetwork, float], remove: list[IPNetwork]) -> None:
        """Remove, then add or renew: one transaction per family at most (nftables: a
        change of more than about 5,000 elements in steps, none leaving a ban out)."""
        ...

    def read(self) -> dict[IPNetwork, float | None] | None:
        """What the sets hold (seconds left); None when a set is missing."""
        ...

    def count(self) -> int | None:
        """How many prefixes the sets hold (cheaper than read); None when a set is missing."""
        ...

    def kernel_bans(self, rules: list[tuple[str, int, int]]) -> list[tuple[str, IPNetwork, float]]:
        """(rule, prefix, seconds left) of every source the rules' own escalation banned;
        `rules`: (name, prefix4, prefix6) of the escalating network rules."""
        ...


def by_family(nets: dict[IPNetwork, float]) -> dict[int, dict[IPNetwork, float]]:
    out: dict[int, dict[IPNetwork, float]] = {4: {}, 6: {}}
    for n, left in nets.items():
        out[n.version][n] = left
    return out


def list_by_family(nets: list[IPNetwork]) -> dict[int, list[IPNetwork]]:
    out: dict[int, list[IPNetwork]] = {4: [], 6: []}
    for n in nets:
        out[n.version].append(n)
    return out


def ban_sets(backend: str | None) -> BanSets:
    """The ban sets of a packet-filter backend (its key, registry.BACKENDS; None: the default)."""
    from .registry import backend as backend_of

    return backend_of(backend).ban_sets()


def replace_prefixes(sets: BanSets, prefixes: list[tuple[int, int, int, float]]) -> None:
    """sets.replace() from (version, first address, prefix length, seconds left) tuples
    in ascending order, none inside another where the sets refuse overlaps.  A backend
    whose sets can take the integers as they are (nftables: the elements are made from
    them, no network objects -- a restart writes 100,000 of them before READY=1, issue 35)
    has `replace_prefixes`; the others get networks."""
    fast = getattr(sets, "replace_prefixes", None)
    if fast is not None:
        fast(prefixes)
        return
    sets.replace({network_of(v, a, p): left for v, a, p, left in prefixes})


def sync_prefixes(
    sets: BanSets, prefixes: list[tuple[int, int, int, float]], held: object = None
) -> dict[str, int | str]:
    """replace_prefixes() writing only what the sets lack or hold in excess, where the
    backend can (nftables: NftBanSets.sync_prefixes; a restart finds the list in the
    kernel already); the others are written whole. `held`: what held_ahead() read (the
    backend checks it still stands). What was done ({"write": "diff" or "whole", ...})."""
    sync = getattr(sets, "sync_prefixes", None)
    if sync is not None:
        return sync(prefixes) if held is None else sync(prefixes, held=held)
    replace_prefixes(sets, prefixes)
    return {"write": "whole", "added": len(prefixes)}


def held_ahead(sets: BanSets) -> object:
    """What the sets hold, read ahead of a sync_prefixes() (a start: beside the first
    apply and the list's read, issue 35), where the backend can (nftables); else None."""
    held = getattr(sets, "held", None)
    return held() if held is not None else None


class XdpMirror:
    """A backend's ban sets with the XDP program's bans map beside them (a file with
    `xdp:`, docs/xdp.md): every write goes to both (a whole reload the sets first, a change
    the map first, so a new ban is dropped in XDP from its first packet); reads are the sets'.
    The map holds each prefix's expiry (unix seconds); netlimitd removes expired ones
    (`expire`), the program does not look at it. Where no XDP program is loaded in the
    namespace (before the first apply, after a flush) only the sets are written: the
    reload after the apply fills the map."""

    def __init__(self, inner: BanSets, netns: str | None):
        self.inner = inner
        self.netns = netns
        self.key = inner.key
        self.cover = inner.cover

    def _path(self):  # the XDP family, reached from this shared module only
        from .xdp import XdpPath

        p = XdpPath(self.netns)
        if p.loaded():
            return p
        p.close()
        return None

    def _xdp_replace(self, bans: dict[IPNetwork, float]) -> None:
        p = self._path()
        if p is None:
            return
        now = time.time()
        with p:
            stale = [n for n in p.prefixes("bans") if n not in bans]
            p.remove_prefixes("bans", stale)
            p.add_bans({n: now + left for n, left in bans.items()})

    def replace(self, bans: dict[IPNetwork, float]) -> None:
        self.inner.replace(bans)
        self._xdp_replace(bans)

    def replace_prefixes(self, prefixes: list[tuple[int, int, int, float]]) -> None:
        replace_prefixes(self.inner, prefixes)
        self._xdp_replace({network_of(v, a, p): left for v, a, p, left in prefixes})

    def sync_prefixes(self, prefixes: list[tuple[int, int, int, float]], held: object = None) -> dict[str, int | str]:
        done = sync_prefixes(self.inner, prefixes, held)
        self._xdp_replace({network_of(v, a, p): left for v, a, p, left in prefixes})
        return done

    def change(self, add: dict[IPNetwork, float], remove: list[IPNetwork]) -> None:
        p = self._path()
        if p is None:
            self.inner.change(add, remove)
            return
        now = time.time()
        with p:  # the map first: a new ban's packets are dropped in XDP, never first in the input chain
            p.remove_prefixes("bans", remove)
            p.add_bans({n: now + left for n, left in add.items()})
            self.inner.change(add, remove)

    def held(self) -> object:
        return held_ahead(self.inner)

    def read(self) -> dict[IPNetwork, float | None] | None:
        return self.inner.read()

    def count(self) -> int | None:
        return self.inner.count()

    def kernel_bans(self, rules: list[tuple[str, int, int]]) -> list[tuple[str, IPNetwork, float]]:
        return self.inner.kernel_bans(rules)

    def xdp_count(self) -> int | None:
        """Prefixes in the XDP bans map; None where no program is loaded."""
        p = self._path()
        if p is None:
            return None
        with p:
            return len(p.prefixes("bans"))

    def expire(self) -> int:
        """Remove the XDP map's expired bans (the sets' elements time out by themselves)."""
        p = self._path()
        if p is None:
            return 0
        with p:
            return len(p.expire_bans())


def xdp_mirror(sets: BanSets, netns: str | None) -> XdpMirror:
    return XdpMirror(sets, netns)
