"""The XDP program's maps as Python sees them: byte layouts (mirroring the structs in
netlimit_xdp.c), rule encoding, and a small map handle with batched updates.

The encoding functions are pure (tested with hypothesis); BpfMap needs a map fd.
"""

from __future__ import annotations

import ctypes
import ipaddress
import os
import socket
import struct
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass

import netlimit.kernel.xdp.libbpf as bpf
from netlimit.kernel.xdp.libbpf import XdpError, check

MAX_RULES = 32  # netlimit_xdp.c MAX_RULES
STAT_BANNED, STAT_DENIED, STAT_EXEMPT, STAT_PASSED = range(MAX_RULES, MAX_RULES + 4)
NCOUNTERS = MAX_RULES + 4

RULE = struct.Struct("<IBBBBHHIQQQ")  # struct rule
BUCKET_KEY = struct.Struct("<II16s")  # struct bucket_key
COUNTER = struct.Struct("<QQ")  # struct counter (per CPU)
VALUE = struct.Struct("<Q")  # the tries' value: expiry (unix seconds, 0 = none)

# map name -> the family of its keys (LPM tries) — the program's prefix maps
PREFIX_MAPS = {"exempt4": 4, "exempt6": 6, "bans4": 4, "bans6": 6, "deny4": 4, "deny6": 6}
PROTOCOLS = {"tcp": 6, "udp": 17, "icmp": 1, "icmpv6": 58, "ipv6-icmp": 58}

Network = ipaddress.IPv4Network | ipaddress.IPv6Network


def parse_prefix(text: str | Network) -> Network:
    """A prefix ('192.0.2.0/24', '2001:db8::1', an ip_network); ValueError names it."""
    if isinstance(text, ipaddress.IPv4Network | ipaddress.IPv6Network):
        return text
    try:
        return ipaddress.ip_network(str(text).strip(), strict=False)
    except ValueError as exc:
        raise ValueError(f"not an address or prefix: {text!r} ({exc})") from None


def lpm_key(net: Network) -> bytes:
    """struct lpm4/lpm6: u32 prefixlen (host order) + the network address."""
    return struct.pack("<I", net.prefixlen) + net.network_address.packed


def lpm_key_decode(raw: bytes) -> Network:
    (plen,) = struct.unpack_from("<I", raw)
    addr = raw[4:]
    if len(addr) == 4:
        return ipaddress.IPv4Network((addr, plen))
    return ipaddress.IPv6Network((addr, plen))


_LEN = struct.Struct("<I")


def prefix_key(prefix: str | Network) -> tuple[int, bytes]:
    """(4 or 6, LPM key) of a prefix, host bits cleared. The fast path for strings
    (inet_pton, no ipaddress objects: 100k bans parse in ~0.1 s instead of ~1.9 s)."""
    if isinstance(prefix, ipaddress.IPv4Network | ipaddress.IPv6Network):
        return prefix.version, lpm_key(prefix)
    text = str(prefix).strip()
    addr, slash, plen = text.partition("/")
    six = ":" in addr
    bits = 128 if six else 32
    try:
        packed = socket.inet_pton(socket.AF_INET6 if six else socket.AF_INET, addr)
    except OSError:
        raise ValueError(f"not an address or prefix: {prefix!r}") from None
    if slash:
        if not plen.isdigit() or int(plen) > bits:
            raise ValueError(f"not an address or prefix: {prefix!r} (prefix length must be 0..{bits})")
        n = int(plen)
    else:
        n = bits
    if n < bits:
        v = int.from_bytes(packed, "big") & ~((1 << (bits - n)) - 1)
        packed = v.to_bytes(bits // 8, "big")
    return (6 if six else 4), _LEN.pack(n) + packed


def split_keys(prefixes: Iterable[str | Network]) -> tuple[list[bytes], list[bytes]]:
    """LPM keys of the prefixes, IPv4 and IPv6 apart; ValueError names a bad one."""
    v4: list[bytes] = []
    v6: list[bytes] = []
    for p in prefixes:
        fam, key = prefix_key(p)
        (v4 if fam == 4 else v6).append(key)
    return v4, v6


def split_families(prefixes: Iterable[str | Network]) -> tuple[list[Network], list[Network]]:
    v4: list[Network] = []
    v6: list[Network] = []
    for p in prefixes:
        net = parse_prefix(p)
        (v4 if net.version == 4 else v6).append(net)
    return v4, v6


@dataclass(frozen=True)
class XdpRule:
    """One early rule: a token bucket per (masked) source.

    limit packets per period_s, burst packets at once; protocol None = any; dports
    None = any, else an inclusive (low, high) range; prefix4/prefix6 the source prefix
    a bucket is keyed by (32/128 one per address, 24/64 one per /24 or /64, 0 one for
    everyone); family 0 = both, 4 or 6."""

    name: str
    limit: int
    period_s: float = 1.0
    burst: int = 1
    protocol: str | int | None = None
    dports: tuple[int, int] | None = None
    prefix4: int = 32
    prefix6: int = 128
    family: int = 0

    def encode(self) -> bytes:
        """The 40-byte struct rule; ValueError naming the rule when it cannot be expressed."""
        where = f"xdp rule {self.name!r}"
        if not (isinstance(self.limit, int) and self.limit >= 1):
            raise ValueError(f"{where}: limit must be a positive integer, got {self.limit!r}")
        if not self.period_s > 0:
            raise ValueError(f"{where}: period must be > 0 s, got {self.period_s!r}")
        if not (isinstance(self.burst, int) and self.burst >= 1):
            raise ValueError(f"{where}: burst must be an integer >= 1, got {self.burst!r}")
        if self.family not in (0, 4, 6):
            raise ValueError(f"{where}: family must be 0, 4 or 6, got {self.family!r}")
        if not 0 <= self.prefix4 <= 32:
            raise ValueError(f"{where}: source prefix (IPv4) must be 0..32, got {self.prefix4}")
        if not 0 <= self.prefix6 <= 128:
            raise ValueError(f"{where}: source prefix (IPv6) must be 0..128, got {self.prefix6}")
        proto = self.protocol
        if isinstance(proto, str):
            if proto.lower() not in PROTOCOLS:
                raise ValueError(f"{where}: protocol {proto!r} is not one of {', '.join(PROTOCOLS)}")
            proto = PROTOCOLS[proto.lower()]
        proto = proto or 0
        if not 0 <= proto <= 255:
            raise ValueError(f"{where}: protocol number {proto} out of 0..255")
        lo, hi = self.dports if self.dports is not None else (0, 0xFFFF)
        if not 0 <= lo <= hi <= 0xFFFF:
            raise ValueError(f"{where}: port range {lo}-{hi} is not within 0..65535 (low <= high)")
        if (lo, hi) != (0, 0xFFFF) and proto not in (6, 17):
            raise ValueError(f"{where}: ports need protocol tcp or udp (XDP reads ports only there)")
        interval = round(self.period_s * 1e9 / self.limit)
        if interval < 1:
            raise ValueError(f"{where}: {self.limit} per {self.period_s} s is over 1 packet per ns")
        tolerance = (self.burst - 1) * interval
        return RULE.pack(1, self.family, proto, self.prefix4, self.prefix6, lo, hi, 0, interval, tolerance, 0)


def decode_rule(raw: bytes) -> dict:
    enabled, fam, proto, p4, p6, lo, hi, _pad, interval, tol, _r = RULE.unpack(raw)
    return {
        "enabled": enabled,
        "family": fam,
        "protocol": proto,
        "prefix4": p4,
        "prefix6": p6,
        "dports": (lo, hi),
        "interval_ns": interval,
        "tolerance_ns": tol,
    }


def encode_rules(rules: Sequence[XdpRule]) -> list[bytes]:
    """MAX_RULES slots: the rules packed from 0, then disabled (zero) slots."""
    if len(rules) > MAX_RULES:
        raise ValueError(f"xdp: {len(rules)} early rules, the program holds at most {MAX_RULES}")
    names = [r.name for r in rules]
    dup = {n for n in names if names.count(n) > 1}
    if dup:
        raise ValueError(f"xdp: rule name(s) used twice: {', '.join(sorted(dup))}")
    out = [r.encode() for r in rules]
    return out + [bytes(RULE.size)] * (MAX_RULES - len(out))


class BpfMap:
    """A map by fd with fixed key/value sizes (value_size is per CPU for per-CPU maps)."""

    def __init__(self, name: str, fd: int, key_size: int, value_size: int, percpu: bool = False):
        self.name, self.fd, self.key_size, self.value_size, self.percpu = name, fd, key_size, value_size, percpu
        self._ncpu = bpf.num_cpus() if percpu else 1
        self._batch_ok: bool | None = None

    def close(self) -> None:
        if self.fd >= 0:
            os.close(self.fd)
            self.fd = -1

    def lookup(self, key: bytes) -> bytes | None:
        vbuf = ctypes.create_string_buffer(self.value_size * self._ncpu)
        rc = bpf.lib().bpf_map_lookup_elem(self.fd, key, vbuf)
        if rc < 0:
            if -rc == 2 or ctypes.get_errno() == 2:
                return None
            check(rc, f"lookup in map {self.name}")
        return vbuf.raw

    def update(self, key: bytes, value: bytes, flags: int = bpf.BPF_ANY) -> None:
        check(bpf.lib().bpf_map_update_elem(self.fd, key, value, flags), f"update of map {self.name}")

    def delete(self, key: bytes) -> bool:
        rc = bpf.lib().bpf_map_delete_elem(self.fd, key)
        if rc < 0 and -rc == 2:
            return False
        check(rc, f"delete from map {self.name}")
        return True

    def iter_keys(self, limit: int = 10_000_000) -> Iterator[bytes]:
        """Every key (bounded by `limit`, a guard against a map changing under us)."""
        cur: bytes | None = None
        nxt = ctypes.create_string_buffer(self.key_size)
        for _ in range(limit):
            rc = bpf.lib().bpf_map_get_next_key(self.fd, cur, nxt)
            if rc < 0:
                if -rc == 2:
                    return
                check(rc, f"iterating map {self.name}")
            cur = nxt.raw
            yield cur

    def update_many(self, items: Sequence[tuple[bytes, bytes]], chunk: int = 65536) -> str:
        """Write every (key, value); BPF_MAP_UPDATE_BATCH where the map type has it,
        else one syscall per element. Returns 'batch' or 'single' (what was used)."""
        if not items:
            return "batch" if self._batch_ok else "single"
        if self._batch_ok is not False:
            try:
                for i in range(0, len(items), chunk):
                    part = items[i : i + chunk]
                    keys = b"".join(k for k, _ in part)
                    vals = b"".join(v for _, v in part)
                    count = ctypes.c_uint32(len(part))
                    rc = bpf.lib().bpf_map_update_batch(self.fd, keys, vals, ctypes.byref(count), None)
                    check(rc, f"batch update of map {self.name}")
                self._batch_ok = True
                return "batch"
            except XdpError as exc:
                if exc.errno not in (22, 95, 524) or self._batch_ok:  # EINVAL/EOPNOTSUPP/ENOTSUPP
                    raise
                self._batch_ok = False
        upd = bpf.lib().bpf_map_update_elem
        for k, v in items:
            rc = upd(self.fd, k, v, 0)
            if rc < 0:
                check(rc, f"update of map {self.name}")
        return "single"

    def delete_many(self, keys: Iterable[bytes]) -> int:
        n = 0
        dele = bpf.lib().bpf_map_delete_elem
        for k in keys:
            rc = dele(self.fd, k)
            if rc == 0:
                n += 1
            elif -rc != 2:
                check(rc, f"delete from map {self.name}")
        return n

    def percpu_sum(self, key: bytes, fmt: struct.Struct) -> tuple[int, ...]:
        """A per-CPU value summed over CPUs (each CPU's slot rounded up to 8 bytes)."""
        raw = self.lookup(key)
        if raw is None:
            return tuple(0 for _ in range(len(fmt.unpack(bytes(fmt.size)))))
        step = (self.value_size + 7) & ~7
        sums = [0] * len(fmt.unpack(bytes(fmt.size)))
        for cpu in range(self._ncpu):
            for i, v in enumerate(fmt.unpack_from(raw, cpu * step)):
                sums[i] += v
        return tuple(sums)
