"""One logging set-up for the long-running commands (netlimitd, the sidecar).

Every package logs to its own logger under ``netlimit`` (netlimit.kernel,
netlimit.limit, netlimit.sidecar, netlimit.rls, netlimit.daemon); this sends
them to stderr, one line each, every line carrying its level:

- ``text`` (the default) on a terminal or a file:
  ``2026-11-27 16:48:34,123 WARNING netlimitd: drift: ...`` (local time);
- ``text`` under journald (``$JOURNAL_STREAM`` names stderr's device:inode):
  ``<4>netlimitd: drift: ...`` -- the sd-daemon priority prefix, which journald
  strips and keeps as PRIORITY (``journalctl -p warning``), and no time (the
  journal adds its own);
- ``json``: one JSON object per line, ``{"time", "level", "logger",
  "message", ...}`` plus the record's extra fields (``rule``, ``client``,
  ``file``, ...) and ``exception`` for a traceback; under journald the same
  ``<N>`` prefix comes first, so the journal stores the bare object.

A message of several lines (a traceback in text) is written as several lines,
each with the same head, so that no line reaches the journal without a level.
"""

from __future__ import annotations

import json
import logging
import os
import sys
import time
from typing import IO, Any

LEVELS = ("debug", "info", "warning", "error")
FORMATS = ("text", "json")
#: environment variables the commands read when the flag is not given
ENV_FORMAT = "NETLIMIT_LOG_FORMAT"
ENV_LEVEL = "NETLIMIT_LOG_LEVEL"

#: syslog priorities (sd-daemon(3)): what journald makes of a ``<N>`` line head
PRIORITY = {
    logging.DEBUG: 7,
    logging.INFO: 6,
    logging.WARNING: 4,
    logging.ERROR: 3,
    logging.CRITICAL: 2,
}

#: the attributes every LogRecord has; anything else on a record came from ``extra=``
_STANDARD = frozenset(logging.makeLogRecord({}).__dict__) | {"message", "asctime", "taskName"}

#: a JSON line is cut to this many characters of message (a log line has a bound)
MAX_MESSAGE = 16 * 1024


def priority(levelno: int) -> int:
    """The syslog priority of a logging level (levels between two take the lower's)."""
    for lv in sorted(PRIORITY, reverse=True):
        if levelno >= lv:
            return PRIORITY[lv]
    return 7


def under_journald(stream: IO[Any] | None = None) -> bool:
    """True when ``stream`` (stderr) is connected to journald: ``$JOURNAL_STREAM``
    is ``DEVICE:INODE`` of the stream systemd connected, and it must be this one
    (a child whose stderr was redirected inherits the variable, not the journal)."""
    value = os.environ.get("JOURNAL_STREAM", "")
    dev, sep, ino = value.partition(":")
    if not (sep and dev.isdigit() and ino.isdigit()):
        return False
    try:
        st = os.fstat((stream or sys.stderr).fileno())
    except (OSError, ValueError, AttributeError):
        return False
    return st.st_dev == int(dev) and st.st_ino == int(ino)


def extra_fields(record: logging.LogRecord) -> dict[str, Any]:
    """The fields a log call added with ``extra={...}``."""
    return {k: v for k, v in record.__dict__.items() if k not in _STANDARD and not k.startswith("_")}


class TextFormatter(logging.Formatter):
    """``TIME LEVEL PREFIXmessage`` per line; under journald ``<N>PREFIXmessage``."""

    def __init__(self, prefix: str = "", journal: bool = False):
        super().__init__()
        self.prefix = prefix
        self.journal = journal

    def format(self, record: logging.LogRecord) -> str:
        text = record.getMessage()
        if record.exc_info:
            text = f"{text}\n{self.formatException(record.exc_info)}"
        if record.stack_info:
            text = f"{text}\n{self.formatStack(record.stack_info)}"
        if self.journal:
            head = f"<{priority(record.levelno)}>{self.prefix}"
        else:
            head = f"{self.formatTime(record)} {record.levelname} {self.prefix}"
        return "\n".join(head + line for line in text.split("\n"))


def iso_time(t: float) -> str:
    """``2026-11-27T16:48:34.123+00:00``: local time with its offset, to the millisecond."""
    lt = time.localtime(t)
    off = time.strftime("%z", lt)
    return time.strftime("%Y-%m-%dT%H:%M:%S", lt) + f".{int(t * 1000) % 1000:03d}{off[:3]}:{off[3:]}"


class JsonFormatter(logging.Formatter):
    """One JSON object per record: time, level, logger, message, extra fields."""

    def __init__(self, journal: bool = False):
        super().__init__()
        self.journal = journal

    def format(self, record: logging.LogRecord) -> str:
        message = record.getMessage()
        if len(message) > MAX_MESSAGE:
            message = message[:MAX_MESSAGE] + f"... ({len(message) - MAX_MESSAGE} more characters)"
        obj: dict[str, Any] = {
            "time": iso_time(record.created),
            "level": record.levelname.lower(),
            "logger": record.name,
            "message": message,
        }
        for k, v in extra_fields(record).items():
            obj.setdefault(k, v)
        if record.exc_info:
            obj["exception"] = self.formatException(record.exc_info)
        line = json.dumps(obj, default=str, ensure_ascii=False)
        return f"<{priority(record.levelno)}>{line}" if self.journal else line


class _Handler(logging.StreamHandler):
    """Ours: a later setup() replaces it (and only it) on the loggers it touched."""


def check(level: str, fmt: str) -> str | None:
    """What is wrong with a --log-level / --log-format pair, or None."""
    if level.lower() not in LEVELS:
        return f"--log-level {level!r}: expected one of {', '.join(LEVELS)}"
    if fmt.lower() not in FORMATS:
        return f"--log-format {fmt!r} (or ${ENV_FORMAT}): expected one of {', '.join(FORMATS)}"
    return None


def setup(
    level: str = "info",
    prefix: str = "",
    *,
    fmt: str = "text",
    quiet: tuple[str, ...] = (),
    stream: IO[str] | None = None,
) -> logging.Handler:
    """Route the ``netlimit`` loggers (and ``quiet`` third-party ones, at WARNING)
    to stderr.  ``prefix`` starts every text message, e.g. "netlimitd: ".
    Other libraries' warnings (asyncio, Python warnings) reach the same handler
    through the root logger, so they carry a level too."""
    problem = check(level, fmt)
    if problem:
        raise ValueError(problem)
    out = stream if stream is not None else sys.stderr
    journal = under_journald(out)
    handler = _Handler(out)
    if fmt.lower() == "json":
        handler.setFormatter(JsonFormatter(journal))
    else:
        handler.setFormatter(TextFormatter(prefix, journal))
    root = logging.getLogger("netlimit")
    root.handlers[:] = [handler]
    root.setLevel(getattr(logging, level.upper()))
    root.propagate = False
    for name in quiet:
        lg = logging.getLogger(name)
        lg.handlers[:] = [handler]
        lg.setLevel(logging.WARNING)
        lg.propagate = False
    top = logging.getLogger()
    top.handlers[:] = [h for h in top.handlers if not isinstance(h, _Handler)] + [handler]
    if top.level == logging.NOTSET or top.level < logging.WARNING:
        top.setLevel(logging.WARNING)
    logging.captureWarnings(True)
    _route_uncaught(root)
    return handler


def _route_uncaught(log: logging.Logger) -> None:
    """An exception nothing caught (in the main thread or another) is logged at
    critical, so even the traceback of a crash carries a level on every line."""
    import threading

    def hook(kind: type[BaseException], exc: BaseException, tb: Any) -> None:
        if issubclass(kind, KeyboardInterrupt):
            sys.__excepthook__(kind, exc, tb)
            return
        log.critical("uncaught %s: %s", kind.__name__, exc, exc_info=(kind, exc, tb))

    def thread_hook(args: Any) -> None:
        if args.exc_type is SystemExit or args.exc_value is None:
            return
        name = args.thread.name if args.thread is not None else "?"
        log.critical(
            "uncaught %s in thread %s: %s",
            args.exc_type.__name__,
            name,
            args.exc_value,
            exc_info=(args.exc_type, args.exc_value, args.exc_traceback),
        )

    sys.excepthook = hook
    threading.excepthook = thread_hook


def problem_fields(p: Any) -> dict[str, Any]:
    """A config problem's position as log fields (``extra=``): file, line, col, rule."""
    return {"file": p.file, "line": p.line, "col": p.col, "rule": p.rule}
