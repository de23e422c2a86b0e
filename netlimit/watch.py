"""Watch one file (:class:`FileWatch`) or a directory's config files
(:class:`DirWatch`) for changes with inotify, surviving editors that replace them.

We watch the file's DIRECTORY (a watch on the file itself dies when an editor
writes a new file and renames it over the old one) and wake on what ends a
change: a write closed (IN_CLOSE_WRITE), a rename into place (IN_MOVED_TO),
an attribute change (IN_ATTRIB: a chmod that makes an unreadable file readable),
a removal.  Never on IN_MODIFY: a file caught half-written must not be read.
An event that names our file is a change; events about other files in the
directory are not.

Where inotify is unavailable the watch polls the signature, and then only
reports a change once the signature has stayed the same for ``settle`` seconds.
``fileno()`` suits select() (netlimitd) and ``loop.add_reader`` (the sidecar).
"""

from __future__ import annotations

import ctypes
import ctypes.util
import errno
import os
import struct
import time
from pathlib import Path

IN_ATTRIB = 0x004
IN_CLOSE_WRITE = 0x008
IN_MOVED_FROM = 0x040
IN_MOVED_TO = 0x080
IN_DELETE = 0x200
IN_NONBLOCK = 0o4000
IN_CLOEXEC = 0o2000000
_MASK = IN_CLOSE_WRITE | IN_MOVED_TO | IN_MOVED_FROM | IN_DELETE | IN_ATTRIB

Signature = tuple[int, int, int, int] | None
_EVENT = struct.Struct("iIII")  # wd, mask, cookie, len


class FileWatch:
    """``fileno()`` becomes readable when something happened; ``changed()`` says if
    it was our file."""

    def __init__(self, path: str | os.PathLike, *, settle: float = 1.0):
        self.path = Path(path).absolute()
        self.settle = settle
        self.fd = -1
        self._sig = self._signature()
        self._seen: Signature = self._sig  # polling: the newest signature and since when
        self._seen_at = time.monotonic()
        libc_name = ctypes.util.find_library("c") or "libc.so.6"
        try:
            libc = ctypes.CDLL(libc_name, use_errno=True)
            fd = libc.inotify_init1(IN_NONBLOCK | IN_CLOEXEC)
            if fd < 0:
                raise OSError(ctypes.get_errno(), "inotify_init1")
            wd = libc.inotify_add_watch(fd, str(self.path.parent).encode(), _MASK)
            if wd < 0:
                os.close(fd)
                raise OSError(ctypes.get_errno(), "inotify_add_watch")
            self.fd = fd
        except (OSError, AttributeError):
            self.fd = -1  # polling fallback

    @property
    def uses_inotify(self) -> bool:
        return self.fd >= 0

    def fileno(self) -> int:
        return self.fd

    def _signature(self) -> Signature:
        try:
            st = os.stat(self.path)
        except OSError:
            return None
        return (st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns)

    def _drain(self) -> bool:
        """Read every pending event; True if one names our file."""
        ours = False
        name = os.fsencode(self.path.name)
        while True:
            try:
                buf = os.read(self.fd, 65536)
            except OSError as exc:
                if exc.errno in (errno.EAGAIN, errno.EWOULDBLOCK):
                    return ours
                raise
            if not buf:
                return ours
            i = 0
            while i + _EVENT.size <= len(buf):  # struct inotify_event, then its NUL-padded name
                _wd, _mask, _cookie, n = _EVENT.unpack_from(buf, i)
                i += _EVENT.size
                if buf[i : i + n].rstrip(b"\0") == name:
                    ours = True
                i += n

    def changed(self) -> bool:
        """Drain pending events; True if the file may have changed since the last True."""
        if self.fd >= 0:
            if self._drain():
                self._sig = self._signature()
                return True
            return False
        else:
            sig = self._signature()
            now = time.monotonic()
            if sig != self._seen:  # still moving: wait until it stays put for `settle` seconds
                self._seen, self._seen_at = sig, now
                return False
            if now - self._seen_at < self.settle:
                return False
        if sig != self._sig:
            self._sig = sig
            return True
        return False

    def close(self) -> None:
        if self.fd >= 0:
            os.close(self.fd)
            self.fd = -1


#: directory entries a DirWatch looks at, at most (a runtime directory holds a few files)
MAX_DIR_ENTRIES = 10_000


class DirWatch:
    """Watch the config files of one directory (``*.yaml``, ``*.yml``, not dot
    files: envoyproxy/ratelimit's runtime directory, ``http.lyft_config_dir``).

    Any event in the directory (a write closed, a rename in or out, a removal,
    an attribute change -- never IN_MODIFY) makes ``changed()`` compare the
    files' signature (name, and inode, size, times of what it points to: a
    Kubernetes ConfigMap swaps a ``..data`` symlink) with the last one; where
    inotify is unavailable the signature is polled and must stay the same for
    ``settle`` seconds.  ``fileno()`` suits ``loop.add_reader``."""

    def __init__(self, path: str | os.PathLike, *, settle: float = 1.0):
        self.path = Path(path).absolute()
        self.settle = settle
        self.fd = -1
        self._sig = self._signature()
        self._seen = self._sig
        self._seen_at = time.monotonic()
        libc_name = ctypes.util.find_library("c") or "libc.so.6"
        try:
            libc = ctypes.CDLL(libc_name, use_errno=True)
            fd = libc.inotify_init1(IN_NONBLOCK | IN_CLOEXEC)
            if fd < 0:
                raise OSError(ctypes.get_errno(), "inotify_init1")
            wd = libc.inotify_add_watch(fd, str(self.path).encode(), _MASK)
            if wd < 0:
                os.close(fd)
                raise OSError(ctypes.get_errno(), "inotify_add_watch")
            self.fd = fd
        except (OSError, AttributeError):
            self.fd = -1  # polling fallback

    @property
    def uses_inotify(self) -> bool:
        return self.fd >= 0

    def fileno(self) -> int:
        return self.fd

    def _signature(self) -> tuple[tuple[str, int, int, int, int], ...] | None:
        try:
            with os.scandir(self.path) as it:
                out = []
                for i, e in enumerate(it):
                    if i >= MAX_DIR_ENTRIES:
                        break
                    if e.name.startswith(".") or not e.name.endswith((".yaml", ".yml")):
                        continue
                    try:
                        st = os.stat(e.path)  # through a symlink
                    except OSError:
                        continue
                    out.append((e.name, st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns))
        except OSError:
            return None
        return tuple(sorted(out))

    def _drain(self) -> bool:
        """Read every pending event; True if there was one."""
        seen = False
        while True:
            try:
                buf = os.read(self.fd, 65536)
            except OSError as exc:
                if exc.errno in (errno.EAGAIN, errno.EWOULDBLOCK):
                    return seen
                raise
            if not buf:
                return seen
            seen = True

    def changed(self) -> bool:
        """Drain pending events; True if the files may have changed since the last True."""
        if self.fd >= 0:
            if not self._drain():
                return False
            sig = self._signature()
        else:
            sig = self._signature()
            now = time.monotonic()
            if sig != self._seen:  # still moving: wait until it stays put for `settle` seconds
                self._seen, self._seen_at = sig, now
                return False
            if now - self._seen_at < self.settle:
                return False
        if sig != self._sig:
            self._sig = sig
            return True
        return False

    def forget(self) -> None:
        """Take the files as they are now as seen (after a reload that read them)."""
        self._sig = self._seen = self._signature()
        self._seen_at = time.monotonic()

    def close(self) -> None:
        if self.fd >= 0:
            os.close(self.fd)
            self.fd = -1
