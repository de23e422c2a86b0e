"""The elements of the kernel's ban sets: what netlimitd writes as the ban list changes.

The sets themselves are compiled objects (compile_nft.py: `bans4`/`bans6` in table inet
netlimit; compile.py: the ipsets `netlimit-bans4`/`-bans6`), created and repaired by
reconcile.py like every rule. Their *elements* are not part of the rule set: an apply
never touches them (a no-op apply leaves them, a changed rule keeps them); this module
is the only writer, and each element carries its own timeout, so a ban ends in the
kernel on time even while netlimitd is down.

* nftables (`NftBanSets`): one netlink batch per change (backends/nfelements.py), one
  for a whole reload (flush + every element: no moment without bans);
* legacy x_tables (`IpsetBanSets`): `ipset restore` (backends/ipset.py); a whole
  reload fills a fresh set and swaps it in.

Both also read the per-rule sets the packet path fills (a network rule's `escalate`),
so that netlimitd can hand those bans to the fleet. Every call works in the calling
thread's network namespace (netns.run_in_netns).
"""

from __future__ import annotations

import ipaddress
from typing import Protocol

from .objects import NFT_BAN_SETS, NFT_FAMILY, NFT_KERNEL_BAN_PREFIX, NFT_TABLE

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


class NftBanSets:
    key = "nftables"
    cover = True

    def replace(self, bans: dict[IPNetwork, float]) -> None:
        from .backends import nfelements

        fam = by_family(bans)
        nfelements.write(
            [nfelements.Change(NFT_TABLE, NFT_BAN_SETS[f], True, flush=True, add=fam[f]) for f in (4, 6)], NFT_FAMILY
        )

    def change(self, add: dict[IPNetwork, float], remove: list[IPNetwork]) -> None:
        from .backends import nfelements

        a, r = by_family(add), list_by_family(remove)
        nfelements.write(
            [nfelements.Change(NFT_TABLE, NFT_BAN_SETS[f], True, add=a[f], delete=r[f]) for f in (4, 6)], NFT_FAMILY
        )

    def read(self) -> dict[IPNetwork, float | None] | None:
        from .backends import nfelements

        out: dict[IPNetwork, float | None] = {}
        for f in (4, 6):
            els = nfelements.read(NFT_TABLE, NFT_BAN_SETS[f], NFT_FAMILY)
            if els is None:
                return None
            out.update(nfelements.prefixes(els, interval=True))
        return out

    def count(self) -> int | None:
        from .backends import nfelements

        total = 0
        for f in (4, 6):
            n = nfelements.count(NFT_TABLE, NFT_BAN_SETS[f], NFT_FAMILY)
            if n is None:
                return None
            total += n
        return total

    def kernel_bans(self, rules: list[tuple[str, int, int]]) -> list[tuple[str, IPNetwork, float]]:
        from .backends import nfelements

        out: list[tuple[str, IPNetwork, float]] = []
        for name, p4, p6 in rules:
            for f, plen in ((4, p4), (6, p6)):
                els = nfelements.read(NFT_TABLE, f"{NFT_KERNEL_BAN_PREFIX}{f}-{name}", NFT_FAMILY)
                for el in els or []:
                    net = ipaddress.ip_network(f"{ipaddress.ip_address(el.key)}/{plen}", strict=False)
                    if el.left_ms is not None and el.left_ms > 0:
                        out.append((name, net, el.left_ms / 1000))
        return out


def replace_prefixes(sets: BanSets, prefixes: list[tuple[int, int, int, float]]) -> None:
    """sets.replace() from (version, first address, prefix length, seconds left) tuples
    in ascending order, none inside another where the sets refuse overlaps: on nftables
    the elements are made from the integers (no network objects: a restart writes
    100,000 of them before READY=1, issue 35)."""
    if not isinstance(sets, NftBanSets):
        from ..bans.model import network_of

        sets.replace({network_of(v, a, p): left for v, a, p, left in prefixes})
        return
    from .backends import nfelements

    changes = []
    for f, width in ((4, 4), (6, 16)):
        head, tail, key = nfelements._FIXED[width]
        bits = 8 * width
        top = 1 << bits
        els = [nfelements._elem(bytes(width), end=True)]  # the set's lower bound, as nft writes it
        add = els.append
        for v, a, p, left in prefixes:
            if v != f:
                continue
            add(head + nfelements._timeout_ms(left).to_bytes(8, "big") + key + a.to_bytes(width, "big"))
            after = a + (1 << (bits - p))
            if after < top:
                add(tail + key + after.to_bytes(width, "big"))
        changes.append(
            nfelements.Change(NFT_TABLE, NFT_BAN_SETS[f], True, flush=True, elements=els if len(els) > 1 else None)
        )
    nfelements.write(changes, NFT_FAMILY)


def ban_sets(backend: str) -> BanSets:
    """The ban sets of a packet-filter backend (its key, backends.BACKENDS)."""
    if backend == "nftables":
        return NftBanSets()
    from .backends.ipset import IpsetBanSets

    return IpsetBanSets()
