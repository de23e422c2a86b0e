"""The elements of the kernel's ban sets: what netlimitd writes as the ban list changes.

The sets themselves are compiled objects (nft/compile.py: `bans4`/`bans6` in table inet
netlimit; compile.py: the ipsets `netlimit-bans4`/`-bans6`), created and repaired by
reconcile.py like every rule. Their *elements* are not part of the rule set: an apply
never touches them (a no-op apply leaves them, a changed rule keeps them); this module
is the only writer, and each element carries its own timeout, so a ban ends in the
kernel on time even while netlimitd is down.

* nftables (`NftBanSets`, nft/bansets.py): one netlink batch per change (nft/elements.py),
  one for a whole reload (flush + every element: no moment without bans);
* legacy x_tables (`IpsetBanSets`): `ipset restore` (xtables/ipset.py); a whole
  reload fills a fresh set and swaps it in.

Each backend hands out its own (`FilterBackend.ban_sets()`, registry.py).

Both also read the per-rule sets the packet path fills (a network rule's `escalate`),
so that netlimitd can hand those bans to the fleet. Every call works in the calling
thread's network namespace (netns.run_in_netns).
"""

from __future__ import annotations

import ipaddress
from typing import Protocol

IPNetwork = ipaddress.IPv4Network | ipaddress.IPv6Network


class BanSets(Protocol):
    key: str
    #: the set refuses overlapping prefixes (the caller hands in the outermost only)
    cover: bool

    def replace(self, bans: dict[IPNetwork, float]) -> None:
        """Make the sets hold exactly `bans` (prefix -> seconds left), atomically."""
        ...

    def change(self, add: dict[IPNetwork, float], remove: list[IPNetwork]) -> None:
        """Remove, then add or renew, in one transaction per family at most."""
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
    sets.replace({_network(v, a, p): left for v, a, p, left in prefixes})


def _network(version: int, first: int, plen: int) -> IPNetwork:
    if version == 4:
        return ipaddress.IPv4Network((first, plen))
    return ipaddress.IPv6Network((first, plen))
