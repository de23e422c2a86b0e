"""What every command module shares: exit codes, error printing, config loading,
and the JSON answer of a failed ``--json`` command.

The layers' command modules (``kernel/cli.py``, ``sidecar/cli.py``, ``daemon/cli.py``,
``simulate/cli.py``, ``bans/cli.py``, ``demo.py``) import this module; the command
registry (``netlimit/cli.py``) imports them and this module.  Nothing here imports a
layer's commands nor the registry, so the arrows point one way
(``tests/test_architecture.py``).
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import typer

# Exit codes shared by every command (0: done).
EXIT_INVALID = 1  # the file (or input) is invalid; nothing was changed
EXIT_FAILED = 2  # the operation failed (kernel refused, ...); previous state restored
EXIT_USAGE = 64  # wrong flags / not root / missing tool

#: what err() printed (bounded), for the JSON error object of a failed `--json` command
_said: list[str] = []
#: the config problems load_or_exit reported, as JSON (same purpose)
_problems: list[dict] = []
_SAID_MAX = 1000
#: set by a command that printed its own JSON answer to a failure (validate --json)
_json_answered: list[bool] = []


def err(message: str) -> None:
    """Print an error line to stderr (no colour, journal-friendly)."""
    if len(_said) < _SAID_MAX:
        _said.append(message)
    typer.echo(message, err=True)


def problem_json(p) -> dict:
    """A config problem as JSON: file, line, col, rule, message."""
    return {"file": p.file, "line": p.line, "col": p.col, "rule": p.rule, "message": p.message}


def answered_in_json() -> None:
    """The running command printed its own JSON answer (no error object after it)."""
    _json_answered.append(True)


def json_errors(run) -> None:
    """Run the command; when it was given --json and fails, print one JSON object on
    stdout: {"error": the last message, "messages": [...], "problems": [...], "exit_code": N}
    (the text stays on stderr for people)."""
    if "--json" not in sys.argv[1:]:
        run()
        return
    try:
        run()
    except SystemExit as exc:
        code = exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 1)
        if code and not _json_answered:
            doc = {
                "error": _said[-1] if _said else f"failed with exit code {code} (see stderr)",
                "messages": list(_said),
                "problems": list(_problems),
                "exit_code": code,
            }
            sys.stdout.write(json.dumps(doc, indent=2) + "\n")
            sys.stdout.flush()
        raise


def load_checked(path: Path):
    """Load a config file and check every section the way the component that
    runs it will (the ``http:`` rule tree as the sidecar builds it), so that
    ``validate`` and the sidecar never disagree.  Raises ConfigError."""
    from .config.validate import load_file

    loaded = load_file(path)
    if loaded.config.http is not None:
        from .limit.rules import from_loaded

        from_loaded(loaded)
    return loaded


def load_or_exit(path: Path):
    """Load + validate a config file, or print every problem and exit 1."""
    from .config.validate import ConfigError, load_file

    try:
        return load_file(path)
    except ConfigError as exc:
        for p in exc.problems:
            _problems.append(problem_json(p))
            err(str(p))
        err(f"{path}: {len(exc.problems)} problem{'s' if len(exc.problems) != 1 else ''}; nothing was changed")
        raise typer.Exit(EXIT_INVALID) from None
