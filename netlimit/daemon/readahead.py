"""Reads begun before their result is needed (issue 35: READY=1 with 100,000 bans in the
kernel within 1.5 s of the start).

`ReadAhead` runs one call in a thread of its own; the taker gets its result later, or None
when it failed or was not done in time (the taker then does the work itself).

The earliest of them, `begin_early`: netlimitd (daemon/main.py) starts the read of what
the ban sets hold (of the backend --backend or $NETLIMIT_BACKEND names, else nftables, the
default) before it imports the config's models and the service (about 0.2 s of Python),
so that the dump's kernel part (about 0.35 s for 100,000 prefixes, spent in recvmsg,
without the GIL) runs beside those imports instead of beside the first apply. It is a
guess made before the file is read: the file may choose another backend or have no bans,
and the first apply may commit (the read is then out of date). A wrong guess costs one
read: a read for another namespace or backend is never taken (`take_early`), one nobody
took is let go at READY=1 (`discard_early`), and a taken one is used only if the
ruleset's generation has not moved since it was made (kernel/nft's sync_prefixes checks
it), else the sets are read again. The legacy backends cannot read ahead: nothing is read.
"""

from __future__ import annotations

import logging
import sys
import threading
from collections.abc import Callable
from typing import Any

log = logging.getLogger("netlimit.daemon")

#: the interpreter's switch interval while a read runs: the dump comes in ~200 messages
#: of 32 KiB (the most a netlink dump gives), each returned by a recvmsg that must take the
#: GIL again from the imports, the apply and the list's read (5 ms each at the default 5 ms)
AHEAD_SWITCH = 0.0005
#: the longest the start waits for the early read (begun before the imports) when it is
#: taken; after that the sets are read again (as bans.AHEAD_WAIT, which bounds the same wait)
EARLY_WAIT = 15.0


class ReadAhead:
    """One call run in a thread of its own from now on; its result taken later (None
    when it failed or is not done in time: the taker then does the work itself)."""

    _lock = threading.Lock()
    _running = 0  # reads with a lowered switch interval
    _before = 0.0  # the interval before the first of them

    def __init__(self, fn: Callable[[], Any], switch: float | None = None):
        self.result: Any = None
        self.error: str | None = None  # why the call failed (status: why a read was not used)
        self.done = threading.Event()
        if switch is not None:
            self._lower(switch)

        def run() -> None:
            try:
                self.result = fn()
            except Exception as exc:  # only a read ahead: the taker reads the sets itself, nothing is lost
                self.error = f"{type(exc).__name__}: {exc}"[:200]
                log.debug("bans: reading the kernel's sets ahead failed: %s", exc)
            finally:
                if switch is not None:
                    self._restore()
                self.done.set()

        threading.Thread(target=run, name="bans-read-ahead", daemon=True).start()

    def take(self, bound: float) -> Any:
        return self.result if self.done.wait(bound) else None

    def why_none(self, bound: float) -> str:
        """Why take(bound) gave None (for status and the ready line)."""
        if not self.done.is_set():
            return f"not done in {bound:g} s"
        return self.error or "nothing read: the ruleset changed during the read, or the backend cannot read ahead"

    @classmethod
    def _lower(cls, switch: float) -> None:
        with cls._lock:
            if cls._running == 0:
                cls._before = sys.getswitchinterval()
            cls._running += 1
            sys.setswitchinterval(min(cls._before, switch))

    @classmethod
    def _restore(cls) -> None:
        """The last read running puts the interval back (reads may overlap)."""
        with cls._lock:
            cls._running -= 1
            if cls._running == 0:
                sys.setswitchinterval(cls._before)


#: the early read: (namespace, backend key, the read), until taken
_early: tuple[str | None, str, ReadAhead] | None = None
_early_lock = threading.Lock()


def begin_early(netns: str | None, backend: str) -> None:
    """Begin reading what `backend`'s ban sets in `netns` hold (netlimitd, before its
    imports). The kernel modules are imported in the read's thread."""
    global _early

    def read() -> Any:
        from ..kernel.banset import ban_sets, held_ahead
        from ..kernel.netns import run_in_netns

        return run_in_netns(netns, held_ahead, ban_sets(backend))

    with _early_lock:
        _early = (netns, backend, ReadAhead(read, switch=AHEAD_SWITCH))


def take_early(netns: str | None, backend: str) -> ReadAhead | None:
    """The early read if it was begun for this namespace and backend; once (a later
    read must not get a list of the sets from before the start's writes)."""
    global _early
    with _early_lock:
        early, _early = _early, None
    if early is None or early[:2] != (netns, backend):
        return None
    return early[2]


def discard_early() -> None:
    """Let an early read nobody took go (a file without bans, a memory store, another
    backend): what it read is not kept for the daemon's life. At READY=1, when the start
    has taken it if it wanted it."""
    global _early
    with _early_lock:
        _early = None
