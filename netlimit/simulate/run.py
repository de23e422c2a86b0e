"""Open logs, replay them, with a progress bar: what both commands run."""

from __future__ import annotations

import datetime as dt
import sys
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from ..config.validate import Loaded
from .logs import DETECT_LINES, FORMATS, LogError, Needs, OpenLog, Source, detect, make_parser, open_log
from .replay import Replay
from .results import SimResult


def open_logs(
    names: Sequence[str],
    fmt: str,
    needs: Needs,
    tz: dt.tzinfo,
    fields: Mapping[str, str] | None = None,
) -> list[tuple[OpenLog, Callable[[str], Any], str]]:
    """Open every log, find its format (``fmt`` or, for ``auto``, from its first
    lines) and order them by their first time (rotated logs named in any order
    replay oldest first).  LogError names the file that cannot be used."""
    if fmt != "auto" and fmt not in FORMATS:
        raise LogError(f"unknown --format {fmt!r}; expected auto, {', '.join(FORMATS)}")
    if list(names).count("-") > 1:
        raise LogError("stdin ('-') can be read once")
    opened: list[tuple[float, int, OpenLog, Callable[[str], Any], str]] = []
    try:
        for i, name in enumerate(names):
            log = open_log(Source(name))
            head = log.read_head(DETECT_LINES)
            f = fmt
            if f == "auto":
                found = detect(head, tz, fields)
                if found is None:
                    first = next((ln for ln in head if ln.strip()), "")
                    log.close()
                    raise LogError(
                        f"{log.source.label}: cannot tell the log format from its first lines"
                        + (f" (the first: {first[:100]!r})" if first else " (it is empty)")
                        + f"; say --format {'|'.join(FORMATS)}"
                    )
                f = found
            # the first time in the file (for the order); its parser is made anew for the replay
            probe = make_parser(f, Needs(peer=False), tz, fields)
            t0 = next((r[0] for r in map(probe, head) if not isinstance(r, str)), float("inf"))
            opened.append((t0, i, log, make_parser(f, needs, tz, fields), f))
    except BaseException:  # re-raised: the logs opened so far are closed on any failure, Ctrl-C included
        for _, _, log, _, _ in opened:
            log.close()
        raise
    opened.sort(key=lambda o: (o[0], o[1]))
    return [(log, parse, f) for _, _, log, parse, f in opened]


def replay(
    loaded: Loaded,
    names: Sequence[str],
    *,
    fmt: str = "auto",
    fields: Mapping[str, str] | None = None,
    tz: dt.tzinfo = dt.UTC,
    top: int = 10,
    max_clients: int = 500_000,
    progress: bool | None = None,
    jobs: int | None = None,
) -> SimResult:
    """Replay the logs through the file's ``http:`` rules.  ``progress``: a bar on
    stderr (None: when stderr is a terminal); ``jobs``: see :class:`Replay`."""
    needs = Replay.needs_of(loaded)
    logs = open_logs(names, fmt, needs, tz, fields)
    rp = None
    try:
        rp = Replay(loaded, max_clients=max_clients, top=top, jobs=jobs)
        if progress is None:
            progress = sys.stderr.isatty()
        for log, _, f in logs:
            _warn_headers(rp, f, log.source.label)
        if not progress:
            for log, parse, f in logs:
                rp.feed(log, parse, f)
        else:
            _with_progress(rp, logs)
        for log, parse, _ in logs:
            found = getattr(parse, "found_headers", None)
            if found is not None:  # JSON: the headers no line held
                missing = set(rp.plan.header_names) - found()
                for h in sorted(missing):
                    rp.warnings.append(
                        f"{log.source.label}: the actions read header {h!r}, and no field of the log holds it "
                        f"(say --field {h}=NAME): descriptors with it were never made"
                    )
        return rp.result()
    finally:
        if rp is not None:
            rp.close()
        for log, _, _ in logs:
            log.close()


def _warn_headers(rp: Replay, fmt: str, label: str) -> None:
    from .logs import recorded_headers

    have = recorded_headers(fmt)
    if have is None:
        return
    for h in sorted(set(rp.plan.header_names) - have):
        rp.warnings.append(
            f"{label}: the actions read header {h!r}, which the {fmt} format does not record: descriptors with "
            "it are never made (as for requests without the header); use a JSON log with that field"
        )


def _with_progress(rp: Replay, logs: list[tuple[OpenLog, Callable[[str], Any], str]]) -> None:
    from rich.console import Console
    from rich.progress import BarColumn, DownloadColumn, Progress, TextColumn, TimeRemainingColumn

    sizes = [log.size for log, _, _ in logs]
    total = sum(s for s in sizes if s) if all(sizes) else None
    columns = [TextColumn("[progress.description]{task.description}"), BarColumn(), DownloadColumn()]
    if total:
        columns.append(TimeRemainingColumn())
    with Progress(*columns, console=Console(stderr=True), transient=True) as bar:
        task = bar.add_task("replaying", total=total)
        base = 0
        for log, parse, f in logs:
            bar.update(task, description=f"replaying {log.source.label}")

            def advance(done: int, _base: int = base) -> None:
                bar.update(task, completed=_base + done)

            rp.feed(log, parse, f, advance)
            base += log.size or log.done()
