"""Ethernet frames for BPF_PROG_TEST_RUN (bench/xdp_bench.py, tests): no checksums,
XDP does not read them."""

from __future__ import annotations

import ipaddress
import struct

_MACS = bytes.fromhex("020000000001") + bytes.fromhex("020000000002")


def frame(src: str, dst: str, proto: int = 17, dport: int = 5000, sport: int = 40000, payload: int = 18) -> bytes:
    """One frame from src to dst (IPv4 or IPv6 by the address), UDP/TCP ports."""
    s, d = ipaddress.ip_address(src), ipaddress.ip_address(dst)
    if s.version != d.version:
        raise ValueError(f"{src} and {dst} are not of one family")
    if proto == 6:
        l4 = struct.pack("!HHIIBBHHH", sport, dport, 0, 0, 5 << 4, 0x02, 65535, 0, 0)
    else:
        l4 = struct.pack("!HHHH", sport, dport, 8 + payload, 0)
    l4 += bytes(payload)
    if s.version == 4:
        ip = struct.pack("!BBHHHBBH4s4s", 0x45, 0, 20 + len(l4), 0, 0, 64, proto, 0, s.packed, d.packed)
        return _MACS + b"\x08\x00" + ip + l4
    ip6 = struct.pack("!IHBB16s16s", 6 << 28, len(l4), proto, 64, s.packed, d.packed)
    return _MACS + b"\x86\xdd" + ip6 + l4
