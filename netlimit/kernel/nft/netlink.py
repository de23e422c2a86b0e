"""Read one nf_tables table over netlink: its chains, named sets and rules, in one dump each.

Why not `nft -j list table`: nft fetches the elements of every set in the table,
one dump per set, and the kernel finds each set by walking the table's list of
sets, so listing a table with 2,000 sets took 0.28 s on this kernel, most of it
there. netlimit only needs what a dump of chains, sets and rules says (names,
handles, comments, counters, which sets a rule uses): 3 dumps, a few ms.
Element counts (for `list`) are one more dump per set, asked only by `list`.

Works in the calling thread's network namespace (the socket is opened there).
Only reads; writes go through `nft -f` (nft/backend.py).

One generation: the three dumps are separate requests, and another tool (kube-proxy,
a CrowdSec bouncer) may commit between them; each dump's NLM_F_DUMP_INTR only says
that one dump was torn. `read_table` asks the ruleset's generation (NFT_MSG_GETGEN)
before and after the dumps and keeps a read only when both are the same and no dump
was interrupted; otherwise it reads again, for at most READ_BOUND_S seconds, and then
fails (EAGAIN) rather than return a table no generation ever had (issue 35).
"""

from __future__ import annotations

import errno
import os
import socket
import struct
import time
from dataclasses import dataclass, field

from ...errors import NetlimitError

NETLINK_NETFILTER = 12
NFNL_SUBSYS_NFTABLES = 10
NFT_MSG_GETTABLE, NFT_MSG_GETCHAIN, NFT_MSG_GETRULE, NFT_MSG_GETSET, NFT_MSG_GETSETELEM = 1, 4, 7, 10, 13
NFT_MSG_GETGEN = 16
NFTA_GEN_ID = 1
NLM_F_REQUEST, NLM_F_ACK, NLM_F_DUMP, NLM_F_DUMP_INTR = 0x1, 0x4, 0x300, 0x10
NLMSG_ERROR, NLMSG_DONE = 2, 3
NLA_TYPE_MASK = 0x3FFF
NFPROTO = {"inet": 1, "ip": 2, "ip6": 10}
HOOKS = {0: "prerouting", 1: "input", 2: "forward", 3: "output", 4: "postrouting", 5: "ingress"}

# attribute numbers (linux/netfilter/nf_tables.h)
NFTA_TABLE_NAME = 1
NFTA_CHAIN_TABLE, NFTA_CHAIN_HANDLE, NFTA_CHAIN_NAME, NFTA_CHAIN_HOOK = 1, 2, 3, 4
NFTA_CHAIN_POLICY, NFTA_CHAIN_TYPE = 5, 7
NFTA_HOOK_HOOKNUM, NFTA_HOOK_PRIORITY, NFTA_HOOK_DEV, NFTA_HOOK_DEVS = 1, 2, 3, 4
NFTA_SET_TABLE, NFTA_SET_NAME, NFTA_SET_FLAGS, NFTA_SET_USERDATA, NFTA_SET_HANDLE = 1, 2, 3, 13, 16
NFT_SET_ANONYMOUS = 0x1
NFTA_RULE_TABLE, NFTA_RULE_CHAIN, NFTA_RULE_HANDLE, NFTA_RULE_EXPRESSIONS, NFTA_RULE_USERDATA = 1, 2, 3, 4, 7
# an expression: NFTA_LIST_ELEM { NFTA_EXPR_NAME (1), NFTA_EXPR_DATA (2) }, in that order
NFTA_COUNTER_BYTES, NFTA_COUNTER_PACKETS = 1, 2
NFTA_LOOKUP_SET = 1  # NFTA_DYNSET_SET_NAME has the same number
NFTA_SET_ELEM_LIST_TABLE, NFTA_SET_ELEM_LIST_SET, NFTA_SET_ELEM_LIST_ELEMENTS = 1, 2, 3
UDATA_RULE_COMMENT = 0  # libnftnl's NFTNL_UDATA_RULE_COMMENT
UDATA_SET_COMMENT = 7  # NFTNL_UDATA_SET_COMMENT
RECV_BUF = 1 << 20
TIMEOUT_S = 10.0
READ_BOUND_S = 2.0  # how long read_table / request retry torn reads (a bound in time, not in count)


class NetlinkError(NetlimitError, OSError):
    pass


@dataclass(slots=True)
class Chain:
    name: str
    handle: int
    type: str = ""
    hook: str | None = None  # None: a regular chain
    priority: int | None = None
    policy: str | None = None
    devices: tuple[str, ...] = ()  # an ingress chain's devices, sorted


@dataclass(slots=True)
class Set:
    name: str
    handle: int
    comment: str = ""


@dataclass(slots=True)
class Rule:
    chain: str
    handle: int
    comment: str = ""
    table: str = ""
    raw: bytes = field(default=b"", repr=False)  # the dumped message: its expressions are read when asked
    _details: tuple[int, int, tuple[str, ...], bool] | None = field(default=None, repr=False)

    def _expr(self) -> tuple[int, int, tuple[str, ...], bool]:
        if self._details is None:
            self._details = _expressions(self.raw)
        return self._details

    @property
    def packets(self) -> int:
        return self._expr()[0]

    @property
    def bytes(self) -> int:
        return self._expr()[1]

    @property
    def sets(self) -> tuple[str, ...]:
        """The named sets it looks up or writes, in the rule's order."""
        return self._expr()[2]

    @property
    def drops(self) -> bool:
        """Its verdict drops the packet (drop or reject)."""
        return self._expr()[3]


@dataclass
class Table:
    chains: dict[str, Chain] = field(default_factory=dict)
    sets: dict[str, Set] = field(default_factory=dict)  # named sets (not the anonymous ones rules carry)
    rules: dict[str, list[Rule]] = field(default_factory=dict)  # chain -> its rules in order


# --- netlink framing -------------------------------------------------------------------


def _attrs(buf: bytes, start: int = 0, end: int | None = None) -> dict[int, bytes]:
    """Attributes of one level, type -> payload (the last one wins; lists use _list)."""
    out: dict[int, bytes] = {}
    end = len(buf) if end is None else end
    i = start
    while i + 4 <= end:
        ln, typ = struct.unpack_from("=HH", buf, i)
        if ln < 4:
            break
        out[typ & NLA_TYPE_MASK] = buf[i + 4 : i + ln]
        i += (ln + 3) & ~3
    return out


def attr_list(buf: bytes) -> list[bytes]:
    """The payloads of a nested list (NFTA_LIST_ELEM ...)."""
    out = []
    i = 0
    while i + 4 <= len(buf):
        ln, _typ = struct.unpack_from("=HH", buf, i)
        if ln < 4:
            break
        out.append(buf[i + 4 : i + ln])
        i += (ln + 3) & ~3
    return out


def _devices(hook: dict[int, bytes]) -> tuple[str, ...]:
    """An ingress chain's devices: one NFTA_HOOK_DEV, or a list of names in NFTA_HOOK_DEVS."""
    if NFTA_HOOK_DEV in hook:
        return (_str(hook[NFTA_HOOK_DEV]),)
    devs = hook.get(NFTA_HOOK_DEVS)
    names: list[str] = []
    i = 0
    while devs and i + 4 <= len(devs):
        ln = struct.unpack_from("=H", devs, i)[0]
        if ln < 4:
            break
        names.append(_str(devs[i + 4 : i + ln]))
        i += (ln + 3) & ~3
    return tuple(sorted(names))


def _str(b: bytes | None) -> str:
    return b.split(b"\0", 1)[0].decode("utf-8", "replace") if b else ""


def _be(b: bytes | None) -> int:
    return int.from_bytes(b, "big") if b else 0


def _udata(b: bytes | None, want: int) -> str:
    """A comment from libnftnl's user data (type, length, value triples)."""
    i = 0
    while b and i + 2 <= len(b):
        typ, ln = b[i], b[i + 1]
        if typ == want:
            return _str(b[i + 2 : i + 2 + ln])
        i += 2 + ln
    return ""


def attr(typ: int, payload: bytes) -> bytes:
    ln = 4 + len(payload)
    return struct.pack("=HH", ln, typ) + payload + b"\0" * ((4 - ln % 4) % 4)


def cstr(s: str) -> bytes:
    return s.encode() + b"\0"


class Socket:
    """One NETLINK_NETFILTER socket; opened in (and so reading) the calling thread's namespace."""

    def __init__(self) -> None:
        self.sock = socket.socket(socket.AF_NETLINK, socket.SOCK_RAW, NETLINK_NETFILTER)
        self.sock.settimeout(TIMEOUT_S)
        try:
            self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, RECV_BUF)
        except OSError:
            pass
        self.sock.bind((0, 0))
        self.seq = 0

    def close(self) -> None:
        self.sock.close()

    def __enter__(self) -> Socket:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def request(self, msg: int, family: int, payload: bytes, dump: bool, bound: float = READ_BOUND_S) -> list[bytes]:
        """Send one request; the payloads (after nfgenmsg) of every answer. Raises
        NetlinkError (errno set) on an error answer; a dump interrupted by a
        concurrent change is asked again, for at most `bound` seconds."""
        deadline = time.monotonic() + bound
        while True:
            out, interrupted = self._request(msg, family, payload, dump)
            if not interrupted:
                return out
            if time.monotonic() >= deadline:
                raise NetlinkError(errno.EAGAIN, f"the ruleset kept changing while it was read (for {bound:g} s)")

    def generation(self) -> int:
        """The ruleset's generation in this namespace (every commit moves it on)."""
        msgs, _ = self._request(NFT_MSG_GETGEN, socket.AF_UNSPEC, b"", dump=False)
        for buf in msgs:
            gen = _attrs(buf).get(NFTA_GEN_ID)
            if gen is not None:
                return _be(gen)
        raise NetlinkError(errno.EPROTO, "no generation in the answer to NFT_MSG_GETGEN")

    def _request(self, msg: int, family: int, payload: bytes, dump: bool) -> tuple[list[bytes], bool]:
        self.seq += 1
        seq = self.seq
        flags = NLM_F_REQUEST | (NLM_F_DUMP if dump else NLM_F_ACK)
        body = struct.pack("=BBH", family, 0, 0) + payload
        self.sock.send(struct.pack("=IHHII", 16 + len(body), (NFNL_SUBSYS_NFTABLES << 8) | msg, flags, seq, 0) + body)
        out: list[bytes] = []
        interrupted = False
        while True:
            data = self.sock.recv(RECV_BUF)
            i = 0
            while i + 16 <= len(data):
                ln, typ, fl, mseq, _pid = struct.unpack_from("=IHHII", data, i)
                if ln < 16:
                    raise NetlinkError(errno.EPROTO, "a malformed netlink answer")
                if mseq == seq:
                    if fl & NLM_F_DUMP_INTR:
                        interrupted = True
                    if typ == NLMSG_DONE:
                        return out, interrupted
                    if typ == NLMSG_ERROR:
                        (code,) = struct.unpack_from("=i", data, i + 16)
                        if code == 0:  # the ACK of a non-dump request
                            return out, interrupted
                        raise NetlinkError(-code, os.strerror(-code))
                    out.append(data[i + 20 : i + ln])  # after nlmsghdr (16) and nfgenmsg (4)
                i += (ln + 3) & ~3


# --- reading a table ----------------------------------------------------------------------


_HDR = struct.Struct("=HH")
_U64 = struct.Struct(">Q")
NFTA_IMMEDIATE_DATA, NFTA_DATA_VERDICT, NFTA_VERDICT_CODE = 2, 2, 1
NF_DROP = 0


def _rule(buf: bytes) -> Rule:
    """One rule message: table, chain, handle, comment. A walk over the top level only
    (3,000 rules in 15 ms); the expressions wait until asked for."""
    unpack = _HDR.unpack_from
    chain = table = comment = ""
    handle = 0
    i, n = 0, len(buf)
    while i + 4 <= n:
        ln, typ = unpack(buf, i)
        if ln < 4:
            break
        typ &= NLA_TYPE_MASK
        if typ == NFTA_RULE_CHAIN:
            chain = buf[i + 4 : i + ln].rstrip(b"\0").decode()
        elif typ == NFTA_RULE_HANDLE:
            handle = _U64.unpack_from(buf, i + 4)[0]
        elif typ == NFTA_RULE_USERDATA:
            comment = _udata(buf[i + 4 : i + ln], UDATA_RULE_COMMENT)
        elif typ == NFTA_RULE_TABLE:
            table = buf[i + 4 : i + ln].rstrip(b"\0").decode()
        i += (ln + 3) & ~3
    return Rule(chain, handle, comment, table, buf)


def _set(buf: bytes, table: str) -> Set | None:
    """A named set of `table` from a set message (None: anonymous, or another table's)."""
    unpack = _HDR.unpack_from
    name = owner = comment = ""
    handle = flags = 0
    i, n = 0, len(buf)
    while i + 4 <= n:
        ln, typ = unpack(buf, i)
        if ln < 4:
            break
        typ &= NLA_TYPE_MASK
        if typ == NFTA_SET_NAME:
            name = buf[i + 4 : i + ln].rstrip(b"\0").decode()
        elif typ == NFTA_SET_HANDLE:
            handle = _U64.unpack_from(buf, i + 4)[0]
        elif typ == NFTA_SET_USERDATA:
            comment = _udata(buf[i + 4 : i + ln], UDATA_SET_COMMENT)
        elif typ == NFTA_SET_FLAGS:
            flags = int.from_bytes(buf[i + 4 : i + ln], "big")
        elif typ == NFTA_SET_TABLE:
            owner = buf[i + 4 : i + ln].rstrip(b"\0").decode()
        i += (ln + 3) & ~3
    return Set(name, handle, comment) if owner == table and not flags & NFT_SET_ANONYMOUS else None


def _expressions(buf: bytes) -> tuple[int, int, tuple[str, ...], bool]:
    """(packets, bytes, named sets, drops) from a rule message's expressions."""
    unpack = _HDR.unpack_from
    packets = nbytes = 0
    sets: list[str] = []
    drops = False
    for typ, off, alen in walk(buf, 0, len(buf)):
        if typ != NFTA_RULE_EXPRESSIONS:
            continue
        j, end = off, off + alen
        while j + 8 <= end:  # NFTA_LIST_ELEM { NFTA_EXPR_NAME, NFTA_EXPR_DATA }
            ln = unpack(buf, j)[0]
            if ln < 4:
                break
            name_len = unpack(buf, j + 4)[0]
            k = j + 4 + ((name_len + 3) & ~3)  # NFTA_EXPR_DATA
            data = list(walk(buf, k + 4, k + unpack(buf, k)[0])) if k + 4 <= j + ln else []
            if buf.startswith(b"counter\0", j + 8):
                for t, o, n in data:
                    if t == NFTA_COUNTER_PACKETS and n == 8:
                        packets += _U64.unpack_from(buf, o)[0]
                    elif t == NFTA_COUNTER_BYTES and n == 8:
                        nbytes += _U64.unpack_from(buf, o)[0]
            elif buf.startswith((b"lookup\0", b"dynset\0"), j + 8):
                for t, o, n in data:
                    if t == NFTA_LOOKUP_SET:  # NFTA_DYNSET_SET_NAME has the same number
                        name = _str(buf[o : o + n])
                        if not name.startswith("__"):  # anonymous sets: __set0 ...
                            sets.append(name)
            elif buf.startswith(b"reject\0", j + 8):
                drops = True
            elif buf.startswith(b"immediate\0", j + 8):
                for t, o, n in data:
                    if t == NFTA_IMMEDIATE_DATA:
                        for t2, o2, n2 in walk(buf, o, o + n):
                            if t2 == NFTA_DATA_VERDICT:
                                for t3, o3, _n3 in walk(buf, o2, o2 + n2):
                                    if t3 == NFTA_VERDICT_CODE:
                                        drops = drops or struct.unpack_from(">i", buf, o3)[0] == NF_DROP
            j += (ln + 3) & ~3
    return packets, nbytes, tuple(dict.fromkeys(sets)), drops


def walk(buf: bytes, start: int, end: int):
    """(type, payload offset, payload length) of each attribute in [start, end)."""
    i = start
    while i + 4 <= end:
        ln, typ = _HDR.unpack_from(buf, i)
        if ln < 4:
            return
        yield typ & NLA_TYPE_MASK, i + 4, ln - 4
        i += (ln + 3) & ~3


class TornRead(NetlimitError):
    """A read that saw more than one generation (a dump interrupted, or a commit between
    the dumps): it is thrown away and read again."""


def read_table(name: str, family: str = "inet", bound: float = READ_BOUND_S) -> Table | None:
    """The table's chains, named sets and rules, all of one generation of the ruleset;
    None when it does not exist. Raises NetlinkError(EAGAIN) when another tool's commits
    tore every read for `bound` seconds."""
    deadline = time.monotonic() + bound
    reads = 0
    with Socket() as nl:
        while True:
            reads += 1
            before = nl.generation()
            try:
                t = _read_once(nl, name, family)
            except TornRead:
                after = None
            else:
                after = nl.generation()
                if after == before:
                    return t
            if time.monotonic() >= deadline:
                raise NetlinkError(
                    errno.EAGAIN,
                    f"nftables table {family} {name}: another tool committed during each of {reads} reads "
                    f"in {bound:g} s (generation {before} -> {after if after is not None else 'a torn dump'}); "
                    "no consistent read to plan from",
                )


def _dump(nl: Socket, msg: int, family: int, payload: bytes) -> list[bytes]:
    out, interrupted = nl._request(msg, family, payload, True)
    if interrupted:
        raise TornRead
    return out


def _read_once(nl: Socket, name: str, family: str) -> Table | None:
    fam = NFPROTO[family]
    tname = cstr(name)
    try:
        nl.request(NFT_MSG_GETTABLE, fam, attr(NFTA_TABLE_NAME, tname), dump=False)
    except NetlinkError as exc:
        if exc.errno == errno.ENOENT:
            return None
        raise
    t = Table()
    for buf in _dump(nl, NFT_MSG_GETCHAIN, fam, attr(NFTA_CHAIN_TABLE, tname)):
        a = _attrs(buf)
        if _str(a.get(NFTA_CHAIN_TABLE)) != name:
            continue  # older kernels dump every table's chains
        c = Chain(_str(a.get(NFTA_CHAIN_NAME)), _be(a.get(NFTA_CHAIN_HANDLE)), _str(a.get(NFTA_CHAIN_TYPE)))
        if NFTA_CHAIN_HOOK in a:
            h = _attrs(a[NFTA_CHAIN_HOOK])
            c.hook = HOOKS.get(_be(h.get(NFTA_HOOK_HOOKNUM)), str(_be(h.get(NFTA_HOOK_HOOKNUM))))
            c.priority = struct.unpack(">i", h.get(NFTA_HOOK_PRIORITY, b"\0\0\0\0"))[0]
            c.policy = "accept" if _be(a.get(NFTA_CHAIN_POLICY)) == 1 else "drop"
            c.devices = _devices(h)
        t.chains[c.name] = c
        t.rules[c.name] = []
    for buf in _dump(nl, NFT_MSG_GETSET, fam, attr(NFTA_SET_TABLE, tname)):
        s = _set(buf, name)
        if s is not None:
            t.sets[s.name] = s
    rules = t.rules
    for buf in _dump(nl, NFT_MSG_GETRULE, fam, attr(NFTA_RULE_TABLE, tname)):
        r = _rule(buf)
        if r.table == name:
            lst = rules.get(r.chain)
            if lst is None:
                lst = rules[r.chain] = []
            lst.append(r)
    return t


def set_sizes(name: str, sets: list[str], family: str = "inet") -> dict[str, int]:
    """How many elements each named set of the table holds now (one dump per set)."""
    fam = NFPROTO[family]
    out: dict[str, int] = {}
    with Socket() as nl:
        for s in sets:
            payload = attr(NFTA_SET_ELEM_LIST_TABLE, cstr(name)) + attr(NFTA_SET_ELEM_LIST_SET, cstr(s))
            try:
                msgs = nl.request(NFT_MSG_GETSETELEM, fam, payload, dump=True)
            except NetlinkError as exc:
                if exc.errno == errno.ENOENT:
                    continue
                raise
            n = 0
            for buf in msgs:
                elems = _attrs(buf).get(NFTA_SET_ELEM_LIST_ELEMENTS)
                n += len(attr_list(elems)) if elems else 0
            out[s] = n
    return out
