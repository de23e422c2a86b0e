"""One logging set-up for the long-running commands (netlimitd, the sidecar).

Every package logs to its own logger under ``netlimit`` (netlimit.kernel,
netlimit.limit, netlimit.sidecar, netlimit.rls, netlimit.daemon); this sends
them to stderr, one line each.  Under systemd (journald sets JOURNAL_STREAM) the
journal adds the time and the unit, so the line carries neither; elsewhere it
starts with the time.
"""

from __future__ import annotations

import logging
import os
import sys

LEVELS = ("debug", "info", "warning", "error")


def setup(level: str = "info", prefix: str = "", *, quiet: tuple[str, ...] = ()) -> logging.Handler:
    """Route the ``netlimit`` loggers (and ``quiet`` third-party ones, at WARNING)
    to stderr.  ``prefix`` starts every message, e.g. "netlimitd: "."""
    if level.lower() not in LEVELS:
        raise ValueError(f"log level {level!r}: expected one of {', '.join(LEVELS)}")
    head = "" if os.environ.get("JOURNAL_STREAM") else "%(asctime)s "
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(
        logging.Formatter(f"{head}{prefix}%(message)s" if prefix else f"{head}%(levelname)s %(message)s")
    )
    root = logging.getLogger("netlimit")
    root.handlers[:] = [handler]
    root.setLevel(getattr(logging, level.upper()))
    root.propagate = False
    for name in quiet:
        lg = logging.getLogger(name)
        lg.handlers[:] = [handler]
        lg.setLevel(logging.WARNING)
        lg.propagate = False
    return handler
