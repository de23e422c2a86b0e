"""``netlimit simulate`` and ``netlimit suggest``.

Only typer is imported at module level; the replay, rich's tables and
matplotlib load when a command runs.
"""

from __future__ import annotations

import os
import shutil
import sys
import tempfile
from pathlib import Path
from typing import Any

import typer

FORMAT_HELP = "auto | combined | common | json | envoy (auto: from each file's first lines)."
FIELD_HELP = (
    "JSON logs: ROLE=FIELD, comma-separated or repeated; roles ts, ip, method, path, request, or a header name "
    "(user-agent=ua, header:X-Api-Key=key). The usual nginx/Envoy names are found without it."
)
JOBS_HELP = (
    "Processes: 2 (the default with two cores or more) works out the per-client figures in a helper "
    "process beside the replay; 1 does everything in one."
)
TZ_HELP = "The zone of times written without one (UTC, local, +02:00, Europe/Paris); others keep their own."


def _fail(code: int, lines: list[str]) -> typer.Exit:
    from ..cliutil import err

    for line in lines:
        err(line)
    return typer.Exit(code)


def _load(config: Path) -> Any:
    from ..cliutil import EXIT_INVALID, load_checked
    from ..errors import ConfigError

    try:
        loaded = load_checked(config)
    except ConfigError as exc:
        raise _fail(EXIT_INVALID, [str(p) for p in exc.problems] + [f"{config}: not replayed"]) from None
    if loaded.config.http is None:
        raise _fail(EXIT_INVALID, [f"{config}:1:1: http: the file has no 'http:' section: there is nothing to replay"])
    return loaded


def _tz(name: str) -> Any:
    from ..cliutil import EXIT_USAGE
    from .logs import LogError, timezone

    try:
        return timezone(name)
    except LogError as exc:
        raise _fail(EXIT_USAGE, [f"--timezone: {exc}"]) from None


def _replay(loaded: Any, logs: list[str], fmt: str, field: list[str], tz: Any, **kw: Any) -> Any:
    from ..cliutil import EXIT_INVALID, EXIT_USAGE
    from .logs import FORMATS, LogError, parse_fields
    from .run import replay

    if fmt != "auto" and fmt not in FORMATS:
        raise _fail(EXIT_USAGE, [f"--format {fmt!r}: expected auto, {', '.join(FORMATS)}"])
    try:
        fields = parse_fields(field)
    except LogError as exc:
        raise _fail(EXIT_USAGE, [str(exc)]) from None
    try:
        res = replay(loaded, logs, fmt=fmt, fields=fields, tz=tz, **kw)
    except LogError as exc:
        raise _fail(EXIT_INVALID, [str(exc)]) from None
    if not res.requests:
        from .report import unreadable_lines

        raise _fail(EXIT_INVALID, [*unreadable_lines(res), f"no request could be read from {', '.join(logs)}"])
    return res


def _interruptible(fn: Any) -> Any:
    """Ctrl-C ends a long replay with exit 130 and a line, not a traceback."""
    import functools

    @functools.wraps(fn)
    def run(*args: Any, **kwargs: Any) -> Any:
        try:
            return fn(*args, **kwargs)
        except KeyboardInterrupt:
            typer.echo("interrupted", err=True)
            raise typer.Exit(130) from None

    return run


def register(app: typer.Typer) -> None:
    @app.command()
    @_interruptible
    def simulate(
        logs: list[str] = typer.Argument(..., help="Access logs (.gz too; - for stdin).", show_default=False),
        config: Path = typer.Option(
            ..., "--config", "-c", help="The netlimit YAML file (its http: section).", show_default=False
        ),
        fmt: str = typer.Option("auto", "--format", "-f", help=FORMAT_HELP),
        field: list[str] = typer.Option([], "--field", help=FIELD_HELP, show_default=False),
        timezone: str = typer.Option("UTC", "--timezone", help=TZ_HELP),
        as_json: bool = typer.Option(False, "--json", help="Print the figures as JSON instead of tables."),
        report: Path | None = typer.Option(
            None, "--report", help="Also write one self-contained HTML page with plots.", show_default=False
        ),
        top: int = typer.Option(10, "--top", min=1, max=1000, help="Most denied clients listed per rule."),
        max_clients: int = typer.Option(
            500_000, "--max-clients", min=1, help="Clients tracked one by one per rule (the rest are only counted)."
        ),
        progress: bool | None = typer.Option(
            None,
            "--progress/--no-progress",
            help="A progress bar on stderr (default: on a terminal).",
            show_default=False,
        ),
        jobs: int | None = typer.Option(None, "--jobs", min=1, max=2, help=JOBS_HELP, show_default=False),
    ) -> None:
        """Replay access logs through the file's http: rules -- the sidecar's engine, in the
        log's time -- and show per rule whom they would have denied, the clients' peak
        rates, and what each of the five algorithms would have done with the same limit.

        Exit 0 after a replay, 1 when the file or the logs cannot be used.
        """
        if report is not None:
            from ..cliutil import EXIT_USAGE
            from ..extras import missing

            if why := missing("report"):
                raise _fail(EXIT_USAGE, [why])
        loaded = _load(config)
        tz = _tz(timezone)
        res = _replay(loaded, logs, fmt, field, tz, top=top, max_clients=max_clients, progress=progress, jobs=jobs)
        from .report import print_summary, to_json, unreadable_lines

        for line in unreadable_lines(res) + [f"warning: {w}" for w in res.warnings]:
            typer.echo(line, err=True)
        if report is not None:
            from ..cliutil import EXIT_FAILED
            from .report import write_html

            try:
                write_html(res, report)
            except OSError as exc:
                raise _fail(EXIT_FAILED, [f"{report}: cannot write the report: {exc.strerror}"]) from None
        if as_json:
            import json

            typer.echo(json.dumps(to_json(res), indent=1))
        else:
            from rich.console import Console

            # a pipe or a file gets wide tables rather than 80 columns of wrapped cells
            print_summary(res, Console(width=None if sys.stdout.isatty() else 160))
            if report is not None:
                typer.echo(f"report: {report}")

    @app.command()
    @_interruptible
    def suggest(
        log: list[str] = typer.Option(
            ..., "--log", "-l", help="An access log (repeatable; .gz too; - for stdin).", show_default=False
        ),
        config: Path | None = typer.Option(
            None,
            "--config",
            "-c",
            help="A netlimit file: its descriptors and actions get the limits (default: one per remote_address).",
            show_default=False,
        ),
        deny_clients: str | None = typer.Option(
            None,
            "--deny-clients",
            help="Target: at most this share of clients ever denied, e.g. 0.1%.",
            show_default=False,
        ),
        headroom: str | None = typer.Option(
            None,
            "--headroom",
            help="Target: this factor over the --over percentile's peak (default 2x).",
            show_default=False,
        ),
        over: str | None = typer.Option(
            None, "--over", help="The percentile of clients --headroom applies to (default p99).", show_default=False
        ),
        unit: str = typer.Option("second", "--unit", help="Without --config: second, minute, hour or day."),
        domain: str = typer.Option("web", "--domain", help="Without --config: the http domain of the file."),
        fmt: str = typer.Option("auto", "--format", "-f", help=FORMAT_HELP),
        field: list[str] = typer.Option([], "--field", help=FIELD_HELP, show_default=False),
        timezone: str = typer.Option("UTC", "--timezone", help=TZ_HELP),
        progress: bool | None = typer.Option(
            None,
            "--progress/--no-progress",
            help="A progress bar on stderr (default: on a terminal).",
            show_default=False,
        ),
        jobs: int | None = typer.Option(None, "--jobs", min=1, max=2, help=JOBS_HELP, show_default=False),
    ) -> None:
        """Propose rate_limit, burst and algorithm per descriptor from a log and a target;
        print the whole rules file (YAML) on stdout and, on stderr, what it would have
        denied on the same log. Default target: 2x the peak of p99 of the clients.
        """
        from ..cliutil import EXIT_USAGE
        from .logs import LogError
        from .suggest import candidate, default_config, finish, header, parse_target, what_it_denies

        try:
            target = parse_target(deny_clients, headroom, over)
        except LogError as exc:
            raise _fail(EXIT_USAGE, [str(exc)]) from None
        if config is None and unit not in ("second", "minute", "hour", "day"):
            raise _fail(EXIT_USAGE, [f"--unit {unit!r}: expected second, minute, hour or day"])
        loaded = _load(config) if config is not None else default_config(unit, domain)
        tz = _tz(timezone)
        spool: str | None = None
        logs = list(log)
        try:
            if "-" in logs:  # read twice: keep stdin in a temporary file
                fd, spool = tempfile.mkstemp(prefix="netlimit-suggest-", suffix=".log")
                with os.fdopen(fd, "wb") as out:
                    shutil.copyfileobj(sys.stdin.buffer, out, 1 << 20)
                logs = [spool if n == "-" else n for n in logs]
            first = _replay(loaded, logs, fmt, field, tz, top=10, progress=progress, jobs=jobs)
            cand, proposals = candidate(loaded, first, target)
            second = _replay(cand, logs, fmt, field, tz, top=10, progress=progress, jobs=jobs)
        finally:
            if spool is not None:
                os.unlink(spool)
        text = finish(loaded, proposals, second)
        source = str(config) if config is not None else f"one limit per remote_address and {unit}"
        typer.echo(header(source, list(log), target, proposals, first) + text, nl=False)
        for line in what_it_denies(proposals):
            typer.echo(line, err=True)
