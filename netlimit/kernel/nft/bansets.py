"""The nftables family's ban-set writer: the elements of `bans4`/`bans6` in table inet
netlimit over netlink (elements.py), and the per-rule sets the packet path fills."""

from __future__ import annotations

import ipaddress

from ..banset import IPNetwork, by_family, list_by_family
from ..objects import NFT_BAN_SETS, NFT_FAMILY, NFT_KERNEL_BAN_PREFIX, NFT_TABLE
from . import elements as nfelements


class NftBanSets:
    key = "nftables"
    cover = True

    def replace(self, bans: dict[IPNetwork, float]) -> None:
        fam = by_family(bans)
        nfelements.write(
            [nfelements.Change(NFT_TABLE, NFT_BAN_SETS[f], True, flush=True, add=fam[f]) for f in (4, 6)], NFT_FAMILY
        )

    def change(self, add: dict[IPNetwork, float], remove: list[IPNetwork]) -> None:
        a, r = by_family(add), list_by_family(remove)
        nfelements.write(
            [nfelements.Change(NFT_TABLE, NFT_BAN_SETS[f], True, add=a[f], delete=r[f]) for f in (4, 6)], NFT_FAMILY
        )

    def read(self) -> dict[IPNetwork, float | None] | None:
        out: dict[IPNetwork, float | None] = {}
        for f in (4, 6):
            els = nfelements.read(NFT_TABLE, NFT_BAN_SETS[f], NFT_FAMILY)
            if els is None:
                return None
            out.update(nfelements.prefixes(els, interval=True))
        return out

    def count(self) -> int | None:
        total = 0
        for f in (4, 6):
            n = nfelements.count(NFT_TABLE, NFT_BAN_SETS[f], NFT_FAMILY)
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

    def replace_prefixes(self, prefixes: list[tuple[int, int, int, float]]) -> None:
        """replace() from (version, first address, prefix length, seconds left), ascending and
        none inside another: the elements are made from the integers, byte for byte what
        `add=` makes (banset.replace_prefixes)."""
        changes = []
        for f, width in ((4, 4), (6, 16)):
            head, tail, key = nfelements.FIXED[width]
            bits = 8 * width
            top = 1 << bits
            els = [nfelements.elem(bytes(width), end=True)]  # the set's lower bound, as nft writes it
            add = els.append
            for v, a, p, left in prefixes:
                if v != f:
                    continue
                add(head + nfelements.to_timeout_ms(left).to_bytes(8, "big") + key + a.to_bytes(width, "big"))
                after = a + (1 << (bits - p))
                if after < top:
                    add(tail + key + after.to_bytes(width, "big"))
            changes.append(
                nfelements.Change(NFT_TABLE, NFT_BAN_SETS[f], True, flush=True, elements=els if len(els) > 1 else None)
            )
        nfelements.write(changes, NFT_FAMILY)
