"""Reading a config file's text: bounded in size, UTF-8, every failure a Problem."""

from __future__ import annotations

import os
from pathlib import Path as FsPath

from ..errors import ConfigError
from .loader import Problem

MAX_FILE_BYTES = 1024 * 1024


def read_text(path: str | FsPath) -> str:
    """A config file's text; ConfigError when it cannot be read or is not UTF-8 text."""
    name = str(path)
    try:
        # never more than the cap in memory: a 50 MB file (or /dev/zero) is
        # refused after reading MAX_FILE_BYTES + 1 bytes at most
        with open(path, "rb") as f:
            size = os.fstat(f.fileno()).st_size
            if size > MAX_FILE_BYTES:
                raise ConfigError([Problem(name, 1, 1, "file", f"file is {size} bytes; the limit is {MAX_FILE_BYTES}")])
            raw = f.read(MAX_FILE_BYTES + 1)
    except FileNotFoundError:
        raise ConfigError([Problem(name, 0, 0, "file", "no such file")]) from None
    except IsADirectoryError:
        raise ConfigError([Problem(name, 0, 0, "file", "is a directory, expected a YAML file")]) from None
    except OSError as exc:
        raise ConfigError([Problem(name, 0, 0, "file", f"cannot read: {exc.strerror}")]) from None
    if len(raw) > MAX_FILE_BYTES:
        raise ConfigError([Problem(name, 1, 1, "file", f"file is over {MAX_FILE_BYTES} bytes, the limit")])
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise ConfigError([Problem(name, 1, 1, "file", f"not UTF-8 text (byte {exc.start})")]) from None
    return text
