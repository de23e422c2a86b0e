"""The elements of one nf_tables set over netlink: read them (with the time each has
left), write a change in one batch.

Why not `nft -f` as for the rules: before any change to an interval set, nft fetches
every element of it to check for overlaps, so adding one ban to a set of 100,000
took 0.58 s here, and loading 100,000 took 0.99 s. One netlink batch
(NFNL_MSG_BATCH_BEGIN, NEWSETELEM/DELSETELEM messages, BATCH_END) is one kernel
transaction: all of it or nothing, 0.28 s for 100,000 elements with a flush in front
(docs/performance.md has the figures).

Interval sets hold a prefix as two elements: its first address (with the timeout) and,
flagged INTERVAL_END, the address after its last (none when it reaches the top of the
address space); as nft does, an add also carries the interval end at address 0, which
the kernel keeps as the set's lower bound. The kernel refuses overlapping intervals:
callers hand in prefixes that do not overlap (netlimit.bans.index keeps them so).

Works in the calling thread's network namespace, like netlink.py.
"""

from __future__ import annotations

import errno
import ipaddress
import operator
import os
import socket
import struct
import time
from dataclasses import dataclass

from .netlink import (
    NETLINK_NETFILTER,
    NFNL_SUBSYS_NFTABLES,
    NFPROTO,
    NLA_TYPE_MASK,
    NLM_F_ACK,
    NLM_F_REQUEST,
    NLMSG_ERROR,
    NetlinkError,
    Socket,
    attr,
    attr_list,
    cstr,
    walk,
)

IPNetwork = ipaddress.IPv4Network | ipaddress.IPv6Network

NFT_MSG_NEWSETELEM, NFT_MSG_GETSETELEM, NFT_MSG_DELSETELEM = 12, 13, 14
NFNL_MSG_BATCH_BEGIN, NFNL_MSG_BATCH_END = 16, 17
NLM_F_CREATE = 0x400
NLA_F_NESTED = 0x8000
NFTA_SET_ELEM_LIST_TABLE, NFTA_SET_ELEM_LIST_SET, NFTA_SET_ELEM_LIST_ELEMENTS = 1, 2, 3
NFTA_LIST_ELEM = 1
NFTA_SET_ELEM_KEY, NFTA_SET_ELEM_FLAGS, NFTA_SET_ELEM_TIMEOUT, NFTA_SET_ELEM_EXPIRATION = 1, 3, 4, 5
NFTA_DATA_VALUE = 1
NFT_SET_ELEM_INTERVAL_END = 0x1
#: elements per message (a message stays well under the 64 KiB an attribute length can say)
PER_MESSAGE = 1000
#: the longest timeout netlimit writes (the kernel takes more; ipset's limit, for both)
MAX_TIMEOUT_MS = 2_147_483_000
ACK_TIMEOUT_S = 10.0


def _nest(typ: int, payload: bytes) -> bytes:
    return attr(typ | NLA_F_NESTED, payload)


def elem(key: bytes, *, end: bool = False, timeout_ms: int | None = None) -> bytes:
    p = b""
    if end:
        p += attr(NFTA_SET_ELEM_FLAGS, struct.pack(">I", NFT_SET_ELEM_INTERVAL_END))
    if timeout_ms is not None:
        p += attr(NFTA_SET_ELEM_TIMEOUT, struct.pack(">Q", timeout_ms))
    return _nest(NFTA_LIST_ELEM, p + _nest(NFTA_SET_ELEM_KEY, attr(NFTA_DATA_VALUE, key)))


def _interval(net: IPNetwork, timeout_ms: int | None) -> list[bytes]:
    """The elements of one prefix in an interval set: its start, and its end unless the
    prefix reaches the top of the address space."""
    start = net.network_address.packed
    out = [elem(start, timeout_ms=timeout_ms)]
    after = int(net.broadcast_address) + 1
    if after < (1 << net.max_prefixlen):
        out.append(elem(after.to_bytes(len(start), "big"), end=True))
    return out


# An add of a whole list builds 200,000 elements: each from fixed bytes around its key
# (the same attributes _elem writes: LIST_ELEM { [FLAGS | TIMEOUT], KEY { DATA_VALUE } }).
def _fixed(width: int) -> tuple[bytes, bytes, bytes]:
    nest = struct.pack("=HH", 8 + width, NFTA_SET_ELEM_KEY | NLA_F_NESTED)
    key = nest + struct.pack("=HH", 4 + width, NFTA_DATA_VALUE)
    start = struct.pack("=HH", 4 + 12 + len(key) + width, NFTA_LIST_ELEM | NLA_F_NESTED) + struct.pack(
        "=HH", 12, NFTA_SET_ELEM_TIMEOUT
    )
    end = (
        struct.pack("=HH", 4 + 8 + len(key) + width, NFTA_LIST_ELEM | NLA_F_NESTED)
        + struct.pack("=HH", 8, NFTA_SET_ELEM_FLAGS)
        + struct.pack(">I", NFT_SET_ELEM_INTERVAL_END)
    )
    return start, end, key


FIXED = {4: _fixed(4), 16: _fixed(16)}
#: per key width, the bytes before the key of an element without a timeout (a start, an
#: address: what a removal names) and of an interval's end: elem() of a key is one of
#: these and the key (the key comes last and needs no padding at 4 or 16 bytes)
KEYS = {w: (elem(bytes(w))[:-w], elem(bytes(w), end=True)[:-w]) for w in (4, 16)}


def _intervals(nets: dict[IPNetwork, float]) -> list[bytes]:
    """_interval() of many prefixes, with their timeouts (byte for byte the same)."""
    out: list[bytes] = []
    add = out.append
    for net, left in nets.items():
        start = net.network_address.packed
        width = len(start)
        head, tail, key = FIXED[width]
        add(head + to_timeout_ms(left).to_bytes(8, "big") + key + start)
        after = int.from_bytes(start, "big") + (1 << (8 * width - net.prefixlen))
        if after < 1 << (8 * width):
            add(tail + key + after.to_bytes(width, "big"))
    return out


def to_timeout_ms(seconds: float) -> int:
    return max(1, min(MAX_TIMEOUT_MS, int(seconds * 1000)))


def _message(typ: int, flags: int, seq: int, family: int, payload: bytes) -> bytes:
    body = struct.pack("=BBH", family, 0, 0) + payload
    return struct.pack("=IHHII", 16 + len(body), (NFNL_SUBSYS_NFTABLES << 8) | typ, flags, seq, 0) + body


def _batch_marker(typ: int, seq: int) -> bytes:
    # nfgenmsg.res_id names the subsystem the batch is for (big-endian)
    body = struct.pack("=BBH", 0, 0, socket.htons(NFNL_SUBSYS_NFTABLES))
    return struct.pack("=IHHII", 16 + len(body), typ, NLM_F_REQUEST, seq, 0) + body


def _order(net: IPNetwork) -> tuple[int, int]:
    return net.version, int(net.network_address)


@dataclass
class Change:
    """One transaction on one set: `flush` first (every element goes), then `delete`,
    then `add` (prefix -> seconds left). `interval`: the set has `flags interval`."""

    table: str
    set: str
    interval: bool
    flush: bool = False
    add: dict[IPNetwork, float] | None = None
    delete: list[IPNetwork] | None = None
    elements: list[bytes] | None = None  # elements to add, made by the caller (banset.py), in order
    removals: list[bytes] | None = None  # elements to delete, made by the caller (KEYS), in order: after `delete`

    @property
    def empty(self) -> bool:
        return not self.flush and not self.add and not self.delete and not self.elements and not self.removals


def _messages(ch: Change, family: int, seq0: int) -> list[bytes]:
    head = attr(NFTA_SET_ELEM_LIST_TABLE, cstr(ch.table)) + attr(NFTA_SET_ELEM_LIST_SET, cstr(ch.set))
    msgs: list[bytes] = []
    flags = NLM_F_REQUEST | NLM_F_ACK

    def emit(typ: int, elems: list[bytes], extra_flags: int = 0) -> None:
        for i in range(0, len(elems), PER_MESSAGE):
            payload = head + _nest(NFTA_SET_ELEM_LIST_ELEMENTS, b"".join(elems[i : i + PER_MESSAGE]))
            msgs.append(_message(typ, flags | extra_flags, seq0 + len(msgs), family, payload))

    if ch.flush:  # DELSETELEM without elements: every element of the set goes
        msgs.append(_message(NFT_MSG_DELSETELEM, flags, seq0, family, head))
    # in ascending order: the kernel's interval tree takes 100,000 ascending prefixes in
    # 0.5 s, in random order in 1 s and in descending order in 500 s (6.18, performance.md)
    if ch.delete:
        dels: list[bytes] = []
        for net in sorted(ch.delete, key=_order):
            dels.extend(_interval(net, None) if ch.interval else [elem(net.network_address.packed)])
        emit(NFT_MSG_DELSETELEM, dels)
    if ch.removals:
        emit(NFT_MSG_DELSETELEM, ch.removals)
    if ch.add:
        adds: list[bytes] = []
        if ch.interval:
            width = 4 if next(iter(ch.add)).version == 4 else 16
            adds.append(elem(bytes(width), end=True))  # the set's lower bound, as nft writes it
        if ch.interval:
            adds.extend(_intervals(dict(sorted(ch.add.items(), key=lambda x: _order(x[0])))))
        else:
            adds.extend(
                elem(net.network_address.packed, timeout_ms=to_timeout_ms(left)) for net, left in ch.add.items()
            )
        emit(NFT_MSG_NEWSETELEM, adds, NLM_F_CREATE)
    if ch.elements:
        emit(NFT_MSG_NEWSETELEM, ch.elements, NLM_F_CREATE)
    return msgs


def write(changes: list[Change], family: str = "inet") -> int:
    """Run `changes` as ONE kernel transaction (all or nothing). Returns the bytes sent.
    Raises NetlinkError (errno set; ENOENT: a set or an element to delete is missing,
    EEXIST/ENOTEMPTY: an overlapping interval) and changes nothing."""
    fam = NFPROTO[family]
    body: list[bytes] = []
    seq = 1
    for ch in changes:
        if ch.empty:
            continue
        msgs = _messages(ch, fam, seq)
        seq += len(msgs)
        body.extend(msgs)
    if not body:
        return 0
    n = len(body)
    data = _batch_marker(NFNL_MSG_BATCH_BEGIN, 0) + b"".join(body) + _batch_marker(NFNL_MSG_BATCH_END, seq)
    sock = socket.socket(socket.AF_NETLINK, socket.SOCK_RAW, NETLINK_NETFILTER)
    try:
        try:  # the batch must be one send (one skb is one transaction): room for all of it
            sock.setsockopt(socket.SOL_SOCKET, 32, len(data) + 65536)  # SO_SNDBUFFORCE (root)
        except OSError:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, len(data) + 65536)
        try:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 1 << 20)
        except OSError:
            pass
        sock.settimeout(ACK_TIMEOUT_S)
        sock.bind((0, 0))
        sock.send(data)
        _acks(sock, n)
    finally:
        sock.close()
    return len(data)


def _acks(sock: socket.socket, n: int) -> None:
    """Wait for the answer to each of the `n` messages (seq 1..n); the first error raises."""
    seen = 0
    deadline = time.monotonic() + ACK_TIMEOUT_S
    first_error: int | None = None
    while seen < n:
        if time.monotonic() > deadline:
            raise NetlinkError(errno.ETIMEDOUT, f"the kernel answered {seen} of {n} messages")
        try:
            data = sock.recv(1 << 20)
        except TimeoutError:
            raise NetlinkError(errno.ETIMEDOUT, f"the kernel answered {seen} of {n} messages") from None
        i = 0
        while i + 16 <= len(data):
            ln, typ, _fl, seq, _pid = struct.unpack_from("=IHHII", data, i)
            if ln < 16:
                raise NetlinkError(errno.EPROTO, "a malformed netlink answer")
            if typ == NLMSG_ERROR and 1 <= seq <= n:
                seen += 1
                (code,) = struct.unpack_from("=i", data, i + 16)
                if code and first_error is None:
                    first_error = -code
            i += (ln + 3) & ~3
        if first_error is not None:  # the batch was aborted: the other answers say nothing more
            raise NetlinkError(first_error, os.strerror(first_error))


# --- reading ----------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Element:
    key: bytes
    end: bool  # an interval's end
    left_ms: int | None  # time until it expires (None: no timeout)


def _dump(table: str, set_name: str, family: str) -> list[bytes] | None:
    """The messages of one dump of the set's elements (None: no such set)."""
    payload = attr(NFTA_SET_ELEM_LIST_TABLE, cstr(table)) + attr(NFTA_SET_ELEM_LIST_SET, cstr(set_name))
    with Socket() as nl:
        try:
            return nl.request(NFT_MSG_GETSETELEM, NFPROTO[family], payload, dump=True)
        except NetlinkError as exc:
            if exc.errno == errno.ENOENT:
                return None
            raise


def read(table: str, set_name: str, family: str = "inet") -> list[Element] | None:
    """Every element of the set, as the kernel holds it (None: no such set)."""
    msgs = _dump(table, set_name, family)
    if msgs is None:
        return None
    out: list[Element] = []
    for buf in msgs:
        for typ, off, ln in walk(buf, 0, len(buf)):
            if typ != NFTA_SET_ELEM_LIST_ELEMENTS:
                continue
            for e in attr_list(buf[off : off + ln]):
                key = b""
                end = False
                left: int | None = None
                for t, o, n in walk(e, 0, len(e)):
                    if t == NFTA_SET_ELEM_KEY:
                        for t2, o2, n2 in walk(e, o, o + n):
                            if t2 & NLA_TYPE_MASK == NFTA_DATA_VALUE:
                                key = e[o2 : o2 + n2]
                    elif t == NFTA_SET_ELEM_FLAGS and n == 4:
                        end = bool(struct.unpack_from(">I", e, o)[0] & NFT_SET_ELEM_INTERVAL_END)
                    elif t == NFTA_SET_ELEM_EXPIRATION and n == 8:
                        left = struct.unpack_from(">Q", e, o)[0]
                if key:
                    out.append(Element(key, end, left))
    return out


def count(table: str, set_name: str, family: str = "inet") -> int | None:
    """How many elements the set holds, an interval's start and end counted once (None:
    no such set): `list` and `status` ask it of a set of 100,000 bans, so it reads only
    each element's flags (read() builds every element: several times slower)."""
    msgs = _dump(table, set_name, family)
    if msgs is None:
        return None
    unpack = struct.unpack_from
    n = 0
    for buf in msgs:
        for typ, off, ln in walk(buf, 0, len(buf)):
            if typ != NFTA_SET_ELEM_LIST_ELEMENTS:
                continue
            i, end = off, off + ln
            while i + 4 <= end:  # each NFTA_LIST_ELEM
                eln = unpack("=H", buf, i)[0]
                if eln < 4:
                    break
                j, stop = i + 4, i + eln
                is_end = False
                while j + 4 <= stop:
                    aln, atyp = unpack("=HH", buf, j)
                    if aln < 4:
                        break
                    if atyp & NLA_TYPE_MASK == NFTA_SET_ELEM_FLAGS and aln == 8:
                        is_end = bool(unpack(">I", buf, j + 4)[0] & NFT_SET_ELEM_INTERVAL_END)
                        break
                    j += (aln + 3) & ~3
                n += not is_end
                i += (eln + 3) & ~3
    return n


def prefixes(elements: list[Element], interval: bool) -> dict[IPNetwork, float | None]:
    """The prefixes a set's elements stand for, with seconds left (None: no timeout).
    An interval that is not one CIDR prefix (not written by netlimit) becomes the
    prefixes that cover it exactly."""
    out: dict[IPNetwork, float | None] = {}
    if not interval:
        for el in elements:
            out[ipaddress.ip_network(ipaddress.ip_address(el.key))] = None if el.left_ms is None else el.left_ms / 1000
        return out
    start: Element | None = None
    for el in sorted(elements, key=lambda el: (el.key, not el.end)):
        if not el.end:
            if start is not None:  # the previous interval reaches the top of the address space
                _cover(out, start, None)
            start = el
        elif start is not None:
            _cover(out, start, el)
            start = None
    if start is not None:
        _cover(out, start, None)
    return out


def _cover(out: dict[IPNetwork, float | None], start: Element, end: Element | None) -> None:
    width = len(start.key)
    first = ipaddress.ip_address(start.key)
    last = ipaddress.ip_address((int.from_bytes(end.key, "big") - 1) if end is not None else (1 << (8 * width)) - 1)
    if last.version != first.version:  # pragma: no cover - the kernel keeps keys of one width
        return
    if int(last) < int(first):
        return
    left = None if start.left_ms is None else start.left_ms / 1000
    for net in ipaddress.summarize_address_range(first, last):
        out[net] = left


# --- what an interval set of prefixes holds, fast (a restart's diff, issue 35) -------------


def _held_pattern(width: int):
    """One element of a dump as the kernel writes netlimit's (6.x: KEY, then FLAGS for an
    interval's end, TIMEOUT and EXPIRATION for its start), matched as bytes: the key, and
    the time left of a start."""
    import re

    key = struct.pack("=HH", 8 + width, NFTA_SET_ELEM_KEY) + struct.pack("=HH", 4 + width, NFTA_DATA_VALUE)
    flags = struct.pack("=HH", 8, NFTA_SET_ELEM_FLAGS) + struct.pack(">I", NFT_SET_ELEM_INTERVAL_END)
    end = struct.pack("=HH", 4 + len(key) + width + len(flags), NFTA_LIST_ELEM)
    start = struct.pack("=HH", 4 + len(key) + width + 24, NFTA_LIST_ELEM)
    tmo = struct.pack("=HH", 12, NFTA_SET_ELEM_TIMEOUT)
    exp = struct.pack("=HH", 12, NFTA_SET_ELEM_EXPIRATION)
    pat = (
        re.escape(end) + re.escape(key) + b"(.{%d})" % width + re.escape(flags) + b"|"
        + re.escape(start) + re.escape(key) + b"(.{%d})" % width + re.escape(tmo) + b".{8}" + re.escape(exp)
        + b"(.{8})"
    )  # fmt: skip
    return re.compile(pat, re.S), 4 + len(key) + width + len(flags), 4 + len(key) + width + 24


_first = operator.itemgetter(0)


def held_addresses(table: str, set_name: str, width: int, family: str = "inet") -> dict[tuple[int, int], int] | None:
    """held_prefixes() of a hash set of single addresses with timeouts (each element as
    an interval's start is: its key and its time left): (address, full length) ->
    milliseconds left. None when the set is missing or holds anything else."""
    msgs = _dump(table, set_name, family)
    if msgs is None:
        return None
    pat, _end_len, start_len = _held_pattern(width)
    bits = 8 * width
    out: dict[tuple[int, int], int] = {}
    for buf in msgs:
        for typ, off, ln in walk(buf, 0, len(buf)):
            if typ != NFTA_SET_ELEM_LIST_ELEMENTS:
                continue
            found = pat.findall(buf, off, off + ln)
            if len(found) * start_len != ln or any(map(_first, found)):
                return None  # not every element is of netlimit's form (an interval's end: not a hash set)
            for _e, a, left in found:
                out[(int.from_bytes(a, "big"), bits)] = int.from_bytes(left, "big")
    return out


def held_prefixes(table: str, set_name: str, width: int, family: str = "inet") -> dict[tuple[int, int], int] | None:
    """What an interval set of prefixes with timeouts holds: (first address, prefix
    length) -> milliseconds left, read with one dump and matched as bytes (read() makes
    an object per element: seconds for 100,000 prefixes). None when the set is missing
    or holds anything else (an element of another form, an interval that is not one CIDR
    prefix, one without a timeout): the caller then writes the set whole."""
    msgs = _dump(table, set_name, family)
    if msgs is None:
        return None
    pat, end_len, start_len = _held_pattern(width)
    every: list[tuple[bytes, bytes, bytes]] = []
    for buf in msgs:
        for typ, off, ln in walk(buf, 0, len(buf)):
            if typ != NFTA_SET_ELEM_LIST_ELEMENTS:
                continue
            found = pat.findall(buf, off, off + ln)
            n_end = len(found) - list(map(_first, found)).count(b"")  # C loops, not a Python one
            if n_end * end_len + (len(found) - n_end) * start_len != ln:
                return None  # not every element is of netlimit's form
            every += found
    out = _pair_in_order(every, 8 * width)
    if out is not None:
        return out
    starts: dict[int, int] = {}
    ends: list[int] = []
    for e, s, left in every:
        if e:
            ends.append(int.from_bytes(e, "big"))
        else:
            starts[int.from_bytes(s, "big")] = int.from_bytes(left, "big")
    return _pair(starts, ends, 8 * width)


def _pair_in_order(every: list[tuple[bytes, bytes, bytes]], bits: int) -> dict[tuple[int, int], int] | None:
    """_pair() of elements in the order the kernel's interval tree (6.x) dumps a set of
    prefixes: descending, each prefix's end just before its start (an end at the start of
    the prefix before it comes after that start), the set's lower bound (an end at 0)
    last. One pass, no sorting (a restart's 100,000 prefixes, issue 35). None where the
    elements are in any other order (one reaching the top of the address space, another
    kernel's order): _pair() then sorts them out."""
    out: dict[tuple[int, int], int] = {}
    end = -1  # the end seen last, waiting for its start
    floor = 1 << bits  # the lowest start so far: every later element lies below it
    for e, s, left in every:
        if e:
            if end >= 0:
                return None
            end = int.from_bytes(e, "big")
            if end > floor:  # equal: this prefix ends where the one after it starts
                return None
        else:
            if end < 0:
                return None
            a = int.from_bytes(s, "big")
            size = end - a
            if size <= 0 or size & (size - 1) or a & (size - 1):
                return None
            out[(a, bits - size.bit_length() + 1)] = int.from_bytes(left, "big")
            floor, end = a, -1
    return out if end == 0 else (out if end < 0 and not out else None)


def _pair(starts: dict[int, int], ends: list[int], bits: int) -> dict[tuple[int, int], int] | None:
    """Each start with the end after it, as (first, prefix length); None where one is not
    a CIDR prefix. The end at address 0 is the set's lower bound (no interval)."""
    out: dict[tuple[int, int], int] = {}
    top = 1 << bits
    order = sorted(starts)
    stops = sorted(e for e in ends if e)
    if len(stops) > len(order):
        return None
    j = 0
    for i, a in enumerate(order):
        nxt = order[i + 1] if i + 1 < len(order) else top
        if j < len(stops) and stops[j] <= a:
            return None  # an end without a start
        e = stops[j] if j < len(stops) and stops[j] <= nxt else None
        if e is None:
            if nxt != top or i + 1 != len(order):
                return None  # only the last interval may reach the top (no end)
            e = top
        else:
            j += 1
        size = e - a
        if size & (size - 1) or a & (size - 1):
            return None  # not one CIDR prefix
        out[(a, bits - size.bit_length() + 1)] = starts[a]
    return out if j == len(stops) else None
