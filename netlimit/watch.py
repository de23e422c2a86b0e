"""Watch one file for changes with inotify, surviving editors that replace it.

We watch the file's DIRECTORY (a watch on the file itself dies when an editor
writes a new file and renames it over the old one) and report events whose
name is the file's: written and closed, moved in, created, deleted. Falls back
to polling (mtime, size, inode) where inotify is unavailable.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import errno
import os
from pathlib import Path

IN_MODIFY = 0x002
IN_CLOSE_WRITE = 0x008
IN_MOVED_FROM = 0x040
IN_MOVED_TO = 0x080
IN_CREATE = 0x100
IN_DELETE = 0x200
IN_NONBLOCK = 0o4000
IN_CLOEXEC = 0o2000000
_MASK = IN_CLOSE_WRITE | IN_MOVED_TO | IN_MOVED_FROM | IN_CREATE | IN_DELETE | IN_MODIFY


class FileWatch:
    """`fileno()` becomes readable when something happened; `changed()` says if it was our file."""

    def __init__(self, path: str | os.PathLike):
        self.path = Path(path).absolute()
        self.fd = -1
        self._sig = self._signature()
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

    def _signature(self) -> tuple[int, int, int] | None:
        try:
            st = os.stat(self.path)
        except OSError:
            return None
        return (st.st_mtime_ns, st.st_size, st.st_ino)

    def changed(self) -> bool:
        """Drain pending events; True if the file's content may have changed."""
        if self.fd >= 0:
            while True:
                try:
                    buf = os.read(self.fd, 65536)
                except OSError as exc:
                    if exc.errno in (errno.EAGAIN, errno.EWOULDBLOCK):
                        break
                    raise
                if not buf:
                    break
                # The events only wake us; what changed is judged below by the
                # file's signature, which also covers renames over the file.
        sig = self._signature()
        if sig != self._sig:
            self._sig = sig
            return True
        return False

    def close(self) -> None:
        if self.fd >= 0:
            os.close(self.fd)
            self.fd = -1
