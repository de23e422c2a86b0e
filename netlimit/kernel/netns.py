"""Network namespaces and the xtables lock.

`run_in_netns(name, fn)` runs `fn` in a dedicated thread that has joined the
namespace with setns(2) (Python 3.11 has no os.setns), so the calling thread —
and the rest of the process — never leave their own namespace. Namespaces are
per thread: sockets the worker opens (libiptc, netlink) live in the target
namespace, and /proc/thread-self/net shows its tables.

Never creates a namespace: pyroute2's IPRoute(netns=...) would silently do so
for a missing name; we check /run/netns/NAME first.
"""

from __future__ import annotations

import ctypes
import errno
import fcntl
import os
import re
import subprocess
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import TypeVar

from ..errors import NetlimitError

T = TypeVar("T")
CLONE_NEWNET = 0x40000000
NETNS_DIR = "/run/netns"
XTABLES_LOCK = "/run/xtables.lock"
_NAME_RE = re.compile(r"^[A-Za-z0-9_.-]{1,255}$")

_libc = ctypes.CDLL(None, use_errno=True)


class NetnsError(NetlimitError):
    pass


def prune_state_files(directory: str, prefix: str, suffix: str = ".json") -> None:
    """Remove ``directory/<prefix><ns><suffix>`` of every named namespace that no longer
    exists (`ip netns del` leaves netlimit's notes about it behind); ``_root`` stays."""
    try:
        entries = os.listdir(directory)
    except OSError:
        return
    for e in entries:
        if not (e.startswith(prefix) and e.endswith(suffix)):
            continue
        ns = e[len(prefix) : -len(suffix)]
        if ns != "_root" and not os.path.exists(os.path.join(NETNS_DIR, ns)):
            try:
                os.unlink(os.path.join(directory, e))
            except OSError:
                pass


def netns_path(name: str) -> str:
    if not _NAME_RE.match(name) or name in (".", ".."):
        raise NetnsError(f"invalid network namespace name {name!r}")
    return os.path.join(NETNS_DIR, name)


def check_netns(name: str) -> str:
    """The path of an existing namespace, or NetnsError (never creates one)."""
    path = netns_path(name)
    if not os.path.exists(path):
        raise NetnsError(
            f"network namespace {name!r} does not exist ({path} is missing); "
            f"create it with 'ip netns add {name}' or check the name with 'ip netns list'"
        )
    return path


def setns(path: str) -> None:
    fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    try:
        if _libc.setns(fd, CLONE_NEWNET) != 0:
            e = ctypes.get_errno()
            raise NetnsError(f"setns({path}) failed: {os.strerror(e)}")
    finally:
        os.close(fd)


def run_in_netns(name: str | None, fn: Callable[..., T], *args, **kwargs) -> T:
    """Call fn(*args, **kwargs) inside namespace `name` (None: the current one)."""
    if name is None:
        return fn(*args, **kwargs)
    path = check_netns(name)
    results: list[T] = []
    errors: list[BaseException] = []

    def worker() -> None:
        try:
            setns(path)
            results.append(fn(*args, **kwargs))
        except BaseException as exc:  # handed to the caller
            errors.append(exc)

    th = threading.Thread(target=worker, name=f"netns-{name}", daemon=True)
    th.start()
    th.join()
    if errors:
        raise errors[0]
    return results[0]


def proc_net(*parts: str) -> str:
    """A /proc/net path as the *calling thread's* namespace sees it."""
    return os.path.join("/proc/thread-self/net", *parts)


def exec_prefix(netns: str | None) -> list[str]:
    return ["ip", "netns", "exec", netns] if netns else []


def run(
    cmd: list[str], netns: str | None = None, *, check: bool = True, timeout: float = 30, **kw
) -> subprocess.CompletedProcess:
    return subprocess.run(exec_prefix(netns) + cmd, check=check, timeout=timeout, capture_output=True, text=True, **kw)


class LockTimeout(NetlimitError):
    pass


_writer_fds: list[int] = []  # the writer locks this process holds (see writer_lock_fds)


def writer_lock_fds() -> tuple[int, ...]:
    """The writer locks (writer_lock) this process holds, for `pass_fds` of a child that
    writes the kernel (nft, iptables-legacy-restore): a flock lasts while any process holds
    its file open, so if we are killed (kill -9) after starting the child, the next writer
    still waits until the orphan has written, instead of reading and writing beside it."""
    return tuple(_writer_fds)


@contextmanager
def _flock(path: str, timeout: float, busy: str, create: bool = True, hand_down: bool = False) -> Iterator[None]:
    """Hold an exclusive flock on `path`, waiting up to `timeout` s (then LockTimeout(busy)).
    hand_down: list the fd in writer_lock_fds() while held."""
    flags = (os.O_CREAT | os.O_RDWR) if create else os.O_RDONLY
    fd = os.open(path, flags | os.O_CLOEXEC, 0o600)
    try:
        deadline = time.monotonic() + timeout
        while True:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except OSError as exc:
                if exc.errno not in (errno.EAGAIN, errno.EACCES):
                    raise
                if time.monotonic() > deadline:
                    raise LockTimeout(busy) from None
                time.sleep(0.05)
        if hand_down:
            _writer_fds.append(fd)
        yield
    finally:
        if fd in _writer_fds:
            _writer_fds.remove(fd)
        os.close(fd)  # releases the lock (once no child holds it open either)


def xtables_lock(timeout: float = 10.0):
    """flock /run/xtables.lock as iptables-legacy does (python-iptables takes no lock)."""
    return _flock(
        XTABLES_LOCK,
        timeout,
        f"another program has held {XTABLES_LOCK} for {timeout:.0f} s "
        "(an iptables command still running?); nothing was changed",
    )


_process_lock = threading.RLock()
LOCK_DIR = "/run/netlimit"


@contextmanager
def kernel_lock(timeout: float | None = None) -> Iterator[None]:
    """Serialise netlimit's own kernel work inside this process (python-iptables
    Table objects are per-process singletons). With `timeout`, LockTimeout when this
    process's own apply holds it longer (a status read must not wait on an apply)."""
    if not _process_lock.acquire(timeout=-1 if timeout is None else timeout):
        raise LockTimeout(f"an apply of this process has been running for over {timeout:g} s; try again")
    try:
        yield
    finally:
        _process_lock.release()


def writer_lock(netns: str | None = None, timeout: float = 60.0):
    """One netlimit writer at a time per namespace across processes (CLI, daemon):
    read -> diff -> write must not interleave, or one writer's rollback could undo
    the other's work. Namespaces hold separate kernel state, so each has its own
    lock: the namespace's own /run/netns file (flock works on it, and it leaves no
    file behind); the host's is /run/netlimit/apply.lock. (The xtables lock, taken
    around each commit, orders us against iptables.)"""
    if netns:
        path = check_netns(netns)
        return _flock(
            path,
            timeout,
            f"another netlimit apply/flush in namespace {netns} has held its lock ({path}) "
            f"for {timeout:.0f} s; nothing was changed",
            create=False,
            hand_down=True,
        )
    os.makedirs(LOCK_DIR, exist_ok=True)
    path = os.path.join(LOCK_DIR, "apply.lock")
    return _flock(
        path,
        timeout,
        f"another netlimit apply/flush has held {path} for {timeout:.0f} s; nothing was changed",
        hand_down=True,
    )
