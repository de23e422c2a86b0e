"""A quick look at tc without pyroute2: is there anything of ours to read?

Importing pyroute2 costs 0.4 s (its package imports every module it has), a third of
a daemon start's budget (issue 35: READY within 1.5 s). Most hosts hold no tc object
of ours: two rtnetlink dumps (links, qdiscs) by hand tell so, and shaping.read_state
then needs nothing more. Anything of ours (a root qdisc 4e4c: htb, an ingress qdisc,
an nlifb-* link) and the full read through pyroute2 follows.
"""

from __future__ import annotations

import os
import socket
import struct

from ...errors import NetlimitError

RTM_NEWLINK, RTM_GETLINK, RTM_NEWQDISC, RTM_GETQDISC = 16, 18, 36, 38
NLMSG_ERROR, NLMSG_DONE = 2, 3
NLM_F_REQUEST, NLM_F_DUMP, NLM_F_DUMP_INTR = 0x1, 0x300, 0x10
IFLA_IFNAME, IFLA_LINKINFO, IFLA_INFO_KIND, TCA_KIND = 3, 18, 1, 1
#: bounds: the parts a dump may take, the seconds a read may wait
MAX_PARTS = 1 << 16
TIMEOUT = 5.0


class QuickReadError(NetlimitError):
    """The dump could not be read whole (the caller reads through pyroute2 instead)."""


def _attrs(data: bytes, off: int) -> dict[int, bytes]:
    out: dict[int, bytes] = {}
    while off + 4 <= len(data):
        ln, typ = struct.unpack_from("=HH", data, off)
        if ln < 4:
            break
        out[typ & 0x3FFF] = data[off + 4 : off + ln]
        off += (ln + 3) & ~3
    return out


def _dump(sock: socket.socket, msg_type: int, body: bytes, seq: int) -> list[tuple[int, bytes]]:
    """(type, payload) of every message a dump request answers."""
    sock.send(struct.pack("=IHHII", 16 + len(body), msg_type, NLM_F_REQUEST | NLM_F_DUMP, seq, 0) + body)
    out: list[tuple[int, bytes]] = []
    for _ in range(MAX_PARTS):
        data = sock.recv(1 << 20)
        off = 0
        while off + 16 <= len(data):
            ln, typ, flags, _seq, _pid = struct.unpack_from("=IHHII", data, off)
            if ln < 16:
                raise QuickReadError("a netlink message shorter than its header")
            if flags & NLM_F_DUMP_INTR:
                raise QuickReadError("the dump was interrupted by a change")
            if typ == NLMSG_DONE:
                return out
            if typ == NLMSG_ERROR:
                err = struct.unpack_from("=i", data, off + 16)[0]
                raise QuickReadError(f"rtnetlink: {os.strerror(-err)} (errno {-err})")
            out.append((typ, data[off + 16 : off + ln]))
            off += (ln + 3) & ~3
    raise QuickReadError(f"a dump of more than {MAX_PARTS} parts")


def look(
    ifb_prefix: str, ours: int, ingress: int, root: int
) -> tuple[dict[str, int], dict[str, tuple[str, int]]] | None:
    """(ifindex by name, foreign root qdiscs (kind, handle) by device) when the current
    namespace holds nothing of ours in tc; None when it may (read it through pyroute2).
    Raises QuickReadError/OSError where rtnetlink does not answer whole."""
    with socket.socket(socket.AF_NETLINK, socket.SOCK_RAW, socket.NETLINK_ROUTE) as sock:
        sock.settimeout(TIMEOUT)
        sock.bind((0, 0))
        names: dict[int, str] = {}
        for typ, p in _dump(sock, RTM_GETLINK, bytes(16), 1):
            if typ != RTM_NEWLINK or len(p) < 16:
                continue
            a = _attrs(p, 16)
            name = a.get(IFLA_IFNAME, b"").split(b"\0", 1)[0].decode("utf-8", "replace")
            info = _attrs(a[IFLA_LINKINFO], 0) if IFLA_LINKINFO in a else {}
            kind = info.get(IFLA_INFO_KIND, b"").split(b"\0", 1)[0]
            if kind == b"ifb" and name.startswith(ifb_prefix):
                return None
            names[struct.unpack_from("=i", p, 4)[0]] = name
        foreign: dict[str, tuple[str, int]] = {}
        for typ, p in _dump(sock, RTM_GETQDISC, bytes(20), 2):
            if typ != RTM_NEWQDISC or len(p) < 20:
                continue
            idx, handle, parent = struct.unpack_from("=iII", p, 4)
            dev = names.get(idx)
            if dev is None:
                continue
            qkind = _attrs(p, 20).get(TCA_KIND, b"").split(b"\0", 1)[0].decode("ascii", "replace")
            if (parent == root and handle == ours and qkind == "htb") or (parent == ingress and qkind == "ingress"):
                return None
            if parent == root and handle >> 16 != 0:
                foreign[dev] = (qkind, handle)
    return {n: i for i, n in names.items()}, foreign
