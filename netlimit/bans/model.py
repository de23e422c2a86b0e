"""A ban: an address or prefix dropped at L3 until it expires, with who and why.

Pure data and parsing; no store, no kernel.  Times are seconds: `expires` on the
clock of whoever holds the list (Redis's TIME for the Redis store, the process's
for the memory one); a holder hands out time *left*, so hosts with skewed clocks
agree on when a ban ends.
"""

from __future__ import annotations

import ipaddress
import json
import re
from bisect import bisect_left
from dataclasses import dataclass
from typing import Any

from ..prefixes import IPNetwork, fast_network

#: bounds of the text a ban carries (it comes from operators, rules and the kernel)
MAX_REASON = 200
MAX_BY = 100
MAX_RULE = 100
#: `origin` of a ban: the layer that added it
ORIGINS = ("http", "network", "manual")

_CTRL = re.compile(r"[\x00-\x1f\x7f]")


def clean(text: str, limit: int) -> str:
    """`text` without control characters, at most `limit` characters."""
    return _CTRL.sub("?", text)[:limit]


def parse_target(text: str) -> IPNetwork:
    """ADDR or ADDR/LEN as typed by an operator; ValueError with what to type instead."""
    t = text.strip()
    try:
        return ipaddress.ip_network(t, strict=True)
    except ValueError:
        try:
            net = ipaddress.ip_network(t, strict=False)
        except ValueError:
            raise ValueError(
                f"{text!r} is not an IP address or CIDR prefix (e.g. 203.0.113.7 or 2001:db8::/64)"
            ) from None
        raise ValueError(f"{text!r} has host bits set: did you mean {net}?") from None


def client_prefix(address: str, prefix4: int, prefix6: int) -> IPNetwork | None:
    """The /prefix4 or /prefix6 holding the client `address` (None: not an address).
    An IPv4-mapped IPv6 address counts as the IPv4 one.  A network (a
    ``remote_address`` key under http.client_prefix, e.g. ``2001:db8::/64``) is
    the client: banned whole when it is wider than the prefix."""
    text = address.strip().split("%", 1)[0]
    if "/" in text:
        try:
            net = ipaddress.ip_network(text, strict=False)
        except ValueError:
            return None
        plen = prefix4 if net.version == 4 else prefix6
        return net if net.prefixlen <= plen else net.supernet(new_prefix=plen)
    try:
        ip = ipaddress.ip_address(text)
    except ValueError:
        return None
    if isinstance(ip, ipaddress.IPv6Address) and ip.ipv4_mapped is not None:
        ip = ip.ipv4_mapped
    plen = prefix4 if ip.version == 4 else prefix6
    return ipaddress.ip_network(f"{ip}/{plen}", strict=False)


class Protected:
    """Who is never banned: exempt networks and trusted proxies, as integer ranges (a
    whole list of bans is checked at once)."""

    def __init__(self, exempt: list[IPNetwork], proxies: list[IPNetwork]):
        self.exempt = [(n.version, int(n.network_address), int(n.broadcast_address), n) for n in exempt]
        self.proxies = [(n.version, int(n.network_address), int(n.broadcast_address), n) for n in proxies]

    def reason(self, net: IPNetwork) -> str | None:
        """Why `net` must never be banned (None: it may be): it lies inside an exempt
        network, or it holds a trusted proxy (banning it would cut off every client
        behind the proxy). A ban that merely holds an exempt address is fine: the kernel
        matches exempt first."""
        if not self.exempt and not self.proxies:
            return None
        v = net.version
        lo = int(net.network_address)
        hi = lo + (1 << (net.max_prefixlen - net.prefixlen)) - 1
        for ev, elo, ehi, e in self.exempt:
            if ev == v and elo <= lo and hi <= ehi:
                return f"{net} is exempt ({e})"
        for pv, plo, phi, p in self.proxies:
            if pv == v and lo <= phi and plo <= hi:
                return f"{net} holds the trusted proxy {p}"
        return None

    def drop_sorted(self, items: list[tuple[Any, ...]]) -> list[tuple[Any, ...]]:
        """`items`, (version, first address, prefix length, ...) in ascending order, less
        those allows() refuses. Only a prefix that overlaps an exempt network or a trusted
        proxy can be refused: those are found by bisection (each starts inside one, or holds
        its first address: one look-up per prefix length), not by a check of every item (a
        whole list of 100,000 at start, issue 35)."""
        if not self.exempt and not self.proxies:
            return items
        bad: set[int] = set()
        n = len(items)
        for v, lo, hi, _net in self.exempt + self.proxies:
            bits = 32 if v == 4 else 128
            suspects = range(bisect_left(items, (v, lo)), bisect_left(items, (v, hi, bits + 1)))
            holders = []
            for q in range(bits + 1):  # the prefixes that hold `lo` and start before it
                first = lo >> (bits - q) << (bits - q)
                if first < lo:
                    k = bisect_left(items, (v, first, q))
                    while k < n and items[k][:3] == (v, first, q):
                        holders.append(k)
                        k += 1
            for k in (*suspects, *holders):
                _v, a, plen = items[k][:3]
                if not self.allows(v, a, a + (1 << (bits - plen)) - 1):
                    bad.add(k)
        return [it for k, it in enumerate(items) if k not in bad] if bad else items

    def allows(self, version: int, lo: int, hi: int) -> bool:
        """reason() is None for the prefix of addresses lo..hi (integers, no objects)."""
        for ev, elo, ehi, _e in self.exempt:
            if ev == version and elo <= lo and hi <= ehi:
                return False
        return not any(pv == version and lo <= phi and plo <= hi for pv, plo, phi, _p in self.proxies)


def skip_reason(net: IPNetwork, exempt: list[IPNetwork], proxies: list[IPNetwork]) -> str | None:
    """Protected(exempt, proxies).reason(net), for one prefix."""
    return Protected(exempt, proxies).reason(net)


@dataclass(frozen=True, slots=True)
class Ban:
    net: IPNetwork
    expires: float  # on the holder's clock (seconds)
    rule: str = ""  # the rule that escalated ("" for a manual ban)
    reason: str = ""
    by: str = ""  # who added it: "sidecar@host", "netlimitd@host (kernel)", "root@host (cli)"
    added: float = 0.0  # on the holder's clock
    origin: str = "manual"  # http | network | manual

    @property
    def key(self) -> str:
        return str(self.net)

    def left(self, now: float) -> float:
        return self.expires - now

    def details(self) -> str:
        """What the store keeps beside the expiry, as compact JSON."""
        return json.dumps(
            {
                "rule": self.rule,
                "reason": self.reason,
                "by": self.by,
                "added": round(self.added, 3),
                "origin": self.origin,
            },
            separators=(",", ":"),
        )

    @classmethod
    def make(
        cls, net: IPNetwork, expires: float, *, rule: str = "", reason: str = "", by: str = "", added: float = 0.0,
        origin: str = "manual",
    ) -> Ban:  # fmt: skip
        return cls(
            net,
            float(expires),
            clean(rule, MAX_RULE),
            clean(reason, MAX_REASON),
            clean(by, MAX_BY),
            float(added),
            origin if origin in ORIGINS else "manual",
        )

    @classmethod
    def from_store(cls, member: str | bytes, expires: float, details: str | bytes | None) -> Ban | None:
        """A ban as a store holds it (None: a member that is not a prefix)."""
        if isinstance(member, bytes):
            member = member.decode("ascii", "replace")
        try:
            net = fast_network(member)
        except ValueError:
            return None
        d: dict[str, Any] = {}
        if details:
            try:
                loaded = json.loads(details)
                d = loaded if isinstance(loaded, dict) else {}
            except ValueError:
                d = {}

        def text(k: str) -> str:
            v = d.get(k)
            return v if isinstance(v, str) else ""

        added = d.get("added")
        return cls.make(
            net,
            expires,
            rule=text("rule"),
            reason=text("reason"),
            by=text("by"),
            added=float(added) if isinstance(added, (int, float)) else 0.0,
            origin=text("origin") or "manual",
        )

    def as_json(self, now: float) -> dict[str, Any]:
        """`ban list --json` / the status socket: times left, not clock values."""
        return {
            "net": str(self.net),
            "left": round(max(0.0, self.expires - now), 3),
            "rule": self.rule,
            "reason": self.reason,
            "by": self.by,
            "age": round(max(0.0, now - self.added), 3) if self.added else None,
            "origin": self.origin,
        }
