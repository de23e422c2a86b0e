"""IP prefixes as a ban list and the kernel's ban sets hold them: read from their
canonical text, made into `ipaddress` networks, or kept as (version, first address,
prefix length) integers, with less CPU than `ipaddress` spends (issue 35: a restart
handles 100,000 of them before READY=1). Shared by the ban list (netlimit.bans) and the
kernel's ban sets (netlimit.kernel.banset), which may not import each other."""

from __future__ import annotations

import ipaddress
import socket
from itertools import islice
from typing import Any

IPNetwork = ipaddress.IPv4Network | ipaddress.IPv6Network

_pton = socket.inet_pton
_AF4, _AF6 = socket.AF_INET, socket.AF_INET6
_new = object.__new__
_ipa: Any = ipaddress  # its private parts, untyped
_mask4 = _ipa.IPv4Network._make_netmask  # cached per prefix length by ipaddress
_mask6 = _ipa.IPv6Network._make_netmask


def _raw_network(a: int, p: int, v6: bool) -> IPNetwork:
    """The network a/p, built as ipaddress's constructor leaves it (its attributes set
    directly: no text parsed again, no checks already made). _RAW_OK says whether it
    matches ipaddress on this Python; if not, the constructor is used instead."""
    if not _RAW_OK:
        return ipaddress.IPv6Network((a, p)) if v6 else ipaddress.IPv4Network((a, p))
    n: Any
    ad: Any
    if v6:
        n = _new(ipaddress.IPv6Network)
        ad = _new(ipaddress.IPv6Address)
        ad._ip = a
        ad._scope_id = None
        n.netmask, n._prefixlen = _mask6(p)
    else:
        n = _new(ipaddress.IPv4Network)
        ad = _new(ipaddress.IPv4Address)
        ad._ip = a
        n.netmask, n._prefixlen = _mask4(p)
    n.network_address = ad
    if p == n._max_prefixlen - 1:  # as ipaddress does for /31 and /127, /32 and /128
        n.hosts = n.__iter__
    elif p == n._max_prefixlen:
        n.hosts = lambda: [ad]
    return n


def fast_network(text: str) -> IPNetwork:
    """`ipaddress.ip_network(text)` (strict) for the canonical text a store holds
    ("198.51.100.0/24", "2001:db8::/64"), 1.6x less CPU on a list of 100,000 (issue 35: a
    restart spent seconds building them): the address is read by inet_pton (C) and
    the network object made without ipaddress parsing it again. Any other text goes the
    ipaddress way (the same network, or its ValueError)."""
    addr, sep, plen = text.partition("/")
    v6 = ":" in addr
    try:
        packed = _pton(_AF6 if v6 else _AF4, addr)
    except (OSError, ValueError):
        return ipaddress.ip_network(text)
    bits = 128 if v6 else 32
    if sep and not (plen.isascii() and plen.isdigit() and len(plen) <= 3):
        return ipaddress.ip_network(text)
    p = int(plen) if sep else bits
    a = int.from_bytes(packed, "big")
    if p > bits or a & ((1 << (bits - p)) - 1):
        return ipaddress.ip_network(text)  # out of range or host bits set: its ValueError
    return _raw_network(a, p, v6)


def prefix_ints(text: str) -> tuple[int, int, int] | None:
    """(version, first address, prefix length) of the prefix `fast_network(text)` is,
    without making it (a restart's kernel write needs only these for 100,000 bans);
    None where fast_network raises (not a prefix, host bits set)."""
    addr, sep, plen = text.partition("/")
    v6 = ":" in addr
    bits = 128 if v6 else 32
    try:
        a = int.from_bytes(_pton(_AF6 if v6 else _AF4, addr), "big")
        if not sep:
            return (6 if v6 else 4), a, bits
        if plen.isascii() and plen.isdigit() and len(plen) <= 3:
            p = int(plen)
            if p <= bits and not a & ((1 << (bits - p)) - 1):
                return (6 if v6 else 4), a, p
            return None
    except (OSError, ValueError):
        pass
    try:  # any other text ipaddress takes (as fast_network does)
        n = ipaddress.ip_network(text)
    except ValueError:
        return None
    return n.version, int(n.network_address), n.prefixlen


def network_of(version: int, first: int, plen: int) -> IPNetwork:
    """The network prefix_ints() describes."""
    return _raw_network(first, plen, version == 6)


def _raw_matches() -> bool:
    global _RAW_OK
    _RAW_OK = True
    try:
        for t in ("203.0.113.7/32", "198.51.100.0/24", "10.0.0.0/31", "0.0.0.0/0", "2001:db8::7/128", "2001:db8::/64"):
            want, got = ipaddress.ip_network(t), fast_network(t)
            if (
                want != got
                or hash(want) != hash(got)
                or str(want) != str(got)
                or want.broadcast_address != got.broadcast_address
                or list(islice(want.hosts(), 2)) != list(islice(got.hosts(), 2))
                or want.num_addresses != got.num_addresses
            ):
                return False
    except Exception:  # an ipaddress whose internals differ: use its constructor
        return False
    return True


_RAW_OK = False
_RAW_OK = _raw_matches()
