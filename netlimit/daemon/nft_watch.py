"""Watch nftables change notifications for netlimit's table (as `nft monitor` does).

Someone else's `nft flush ruleset` (the first line of Debian's
/etc/nftables.conf, so every `systemctl restart nftables`), `nft delete table
inet netlimit` or an edit of one of its chains is announced by the kernel on
the NFNLGRP_NFTABLES multicast group of a NETLINK_NETFILTER socket. A thread
listens there (inside the daemon's namespace: a socket belongs to the namespace
of the thread that opens it) and calls ``on_change`` for every message about
the table -- the daemon's own applies included: the daemon answers with a
drift check, which finds nothing to do after its own work and repairs the rest
within a second instead of at the next --resync.

Set-element messages (the ban list's adds and removes) are left out: they are
the daemon's routine work, and the ban follower verifies elements itself.

Kept apart from the backends' read path (netlimit/kernel/nft/netlink.py):
this only listens, it never asks.
"""

from __future__ import annotations

import logging
import os
import socket
import struct
import threading
from collections.abc import Callable

from ..errors import NetlimitError

log = logging.getLogger("netlimit.daemon")

NETLINK_NETFILTER = 12
NFNLGRP_NFTABLES = 7
SOL_NETLINK = 270
NETLINK_ADD_MEMBERSHIP = 1
NFNL_SUBSYS_NFTABLES = 10
NFPROTO_INET = 1
#: message types that are not about one table's objects, or are routine
NFT_MSG_NEWSETELEM, NFT_MSG_GETSETELEM, NFT_MSG_DELSETELEM = 12, 13, 14
NFT_MSG_NEWGEN = 15
NFT_MSG_DESTROYSETELEM = 28
_SKIP = {NFT_MSG_NEWSETELEM, NFT_MSG_GETSETELEM, NFT_MSG_DELSETELEM, NFT_MSG_NEWGEN, NFT_MSG_DESTROYSETELEM}
NLMSG_ERROR, NLMSG_DONE = 2, 3
#: the receive buffer asked for; an overflow (ENOBUFS) is reported as a change
RCVBUF = 1 << 20


def tables_touched(data: bytes) -> list[tuple[int, str, int]]:
    """(family, table, message type) of every nftables object message in a
    datagram. For every object message (table, chain, rule, set, object,
    flowtable) attribute 1 is the table's name."""
    out: list[tuple[int, str, int]] = []
    off = 0
    while off + 16 <= len(data):
        length, mtype = struct.unpack_from("=IH", data, off)
        if length < 16 or off + length > len(data):
            break
        if mtype >> 8 == NFNL_SUBSYS_NFTABLES and (mtype & 0xFF) not in _SKIP and length >= 20:
            family = data[off + 16]
            a = off + 20
            end = off + length
            while a + 4 <= end:
                alen, atype = struct.unpack_from("=HH", data, a)
                if alen < 4:
                    break
                if atype & 0x3FFF == 1:
                    name = data[a + 4 : a + alen].split(b"\0", 1)[0].decode("utf-8", "replace")
                    out.append((family, name, mtype & 0xFF))
                    break
                a += (alen + 3) & ~3
        off += (length + 3) & ~3
    return out


class NftWatch:
    """A thread calling ``on_change(why)`` when the kernel announces a change to
    ``family table`` (default: inet netlimit) in namespace ``netns``."""

    def __init__(self, netns: str | None, on_change: Callable[[str], None], table: str = "netlimit"):
        self.netns = netns
        self.on_change = on_change
        self.table = table
        self.events = 0  # messages about the table seen (for tests and status)
        self._stop_r, self._stop_w = os.pipe2(os.O_CLOEXEC | os.O_NONBLOCK)
        self._ready = threading.Event()
        self.error: str | None = None
        self._thread = threading.Thread(target=self._run, name="nft-watch", daemon=True)

    def start(self, timeout: float = 5.0) -> bool:
        """Start listening; False (and ``error`` says why) if the socket could not be opened."""
        self._thread.start()
        self._ready.wait(timeout)
        return self.error is None and self._ready.is_set()

    def _open(self) -> socket.socket:
        if self.netns is not None:
            from ..kernel.netns import check_netns, setns

            setns(check_netns(self.netns))  # this thread only
        s = socket.socket(socket.AF_NETLINK, socket.SOCK_RAW, NETLINK_NETFILTER)
        try:
            s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, RCVBUF)
            s.bind((0, 0))
            s.setsockopt(SOL_NETLINK, NETLINK_ADD_MEMBERSHIP, NFNLGRP_NFTABLES)
        except OSError:
            s.close()
            raise
        return s

    def _run(self) -> None:
        import select

        try:
            sock = self._open()
        except (OSError, NetlimitError) as exc:  # the socket's OSError, or NetnsError from setns
            self.error = f"cannot listen to nftables notifications: {exc}"
            self._ready.set()
            return
        self._ready.set()
        try:
            while True:
                ready, _, _ = select.select([sock.fileno(), self._stop_r], [], [])
                if self._stop_r in ready:
                    return
                try:
                    data = sock.recv(65536)
                except BlockingIOError:
                    continue
                except OSError as exc:  # ENOBUFS: notifications were lost; check anyway
                    self.on_change(f"nftables notifications overflowed ({exc.strerror})")
                    continue
                touched = [t for t in tables_touched(data) if t[0] == NFPROTO_INET and t[1] == self.table]
                if touched:
                    self.events += len(touched)
                    self.on_change(f"nftables: table inet {self.table} changed (message type {touched[0][2]})")
        except Exception as exc:  # a watch must never take the daemon down; the resync remains
            log.warning(f"nft watch stopped: {exc!r}; drift is found at the next resync")
        finally:
            sock.close()

    def close(self) -> None:
        try:
            os.write(self._stop_w, b"x")
        except OSError:
            pass
        if self._thread.is_alive():
            self._thread.join(timeout=5)
        for fd in (self._stop_r, self._stop_w):
            try:
                os.close(fd)
            except OSError:
                pass
