"""The `netlimit` command line (typer): the command registry.

This module holds the frame and the config commands (validate, schema).
Each layer adds its own commands through a `register(app)` function in its
package (netlimit.kernel.cli, netlimit.sidecar.cli, netlimit.daemon, ... in
_LAYERS below), so heavy imports (python-iptables, pyroute2, httptools, grpc)
happen only when a command runs.  What those command modules share (exit codes,
err(), load_or_exit, the --json error object) lives in netlimit/cliutil.py:
this registry imports the layers, a layer never imports this registry.
"""

from __future__ import annotations

import importlib
import json
import sys
from pathlib import Path

import typer
import typer.core

from . import __version__
from .cliutil import (  # the shared helpers; also importable from here, as before
    EXIT_FAILED,
    EXIT_INVALID,
    EXIT_USAGE,
    answered_in_json,
    err,
    json_errors,
    load_checked,
    load_or_exit,
    problem_json,
)
from .errors import ConfigError, NetlimitError

# click's UsageError (typer vendors click in recent versions): BadParameter's base.
__all__ = [
    "EXIT_FAILED",
    "EXIT_INVALID",
    "EXIT_USAGE",
    "app",
    "daemon_main",
    "err",
    "load_checked",
    "load_or_exit",
    "main",
    "problem_json",
]

_UsageError = importlib.import_module(typer.BadParameter.__module__).UsageError


class _Group(typer.core.TyperGroup):
    """The root group: a usage error anywhere below it (unknown command, bad flag, bad
    value, missing argument) exits 64 as README says, not click's 2, which is netlimit's
    "the operation failed, previous state restored"."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        _metavars(self)

    def get_params(self, ctx):
        params = super().get_params(ctx)
        for p in params:  # typer adds --install-completion / --show-completion after __init__
            if p.metavar is None and getattr(p, "is_flag", False):
                p.metavar = ""
        return params

    def make_context(self, info_name, args, parent=None, **extra):
        try:
            return super().make_context(info_name, args, parent=parent, **extra)
        except _UsageError as exc:
            exc.exit_code = EXIT_USAGE
            raise

    def invoke(self, ctx):
        try:
            return super().invoke(ctx)
        except _UsageError as exc:
            exc.exit_code = EXIT_USAGE
            raise


_TYPE_WORDS = {int: "N", float: "NUMBER"}


def _metavars(cmd) -> None:
    """Words for the values in --help instead of Python types (`<list[Path]>`, `<bool>`):
    flags show none, arguments their name (FILE..., LOGS...), options PATH, N, NUMBER
    or TEXT; a metavar a command sets itself stays."""
    for sub in getattr(cmd, "commands", {}).values():
        _metavars(sub)
    help_option = getattr(cmd, "get_help_option", None)
    if help_option is not None:  # made per command on demand: a flag, no word

        def get_help_option(ctx, _made=help_option):
            opt = _made(ctx)
            if opt is not None and opt.metavar is None:
                opt.metavar = ""
            return opt

        cmd.get_help_option = get_help_option
    for p in getattr(cmd, "params", []):
        if getattr(p, "param_type_name", "") == "argument":
            # the name column says what it is (FILE); no Python type beside it
            p.display_type_rich = lambda ctx=None: None
            if p.metavar is None:
                name = (p.name or "value").upper()
                p.metavar = name.removesuffix("S") if p.nargs != 1 else name
            continue
        if p.metavar is not None:
            continue
        if getattr(p, "is_flag", False):
            p.metavar = ""
            continue
        desc = getattr(p, "type_descriptor", None)
        if desc is not None and getattr(desc, "is_path", False):
            p.metavar = "PATH"
            continue
        base = getattr(desc, "annotation", None)
        if getattr(desc, "is_list", False) and base is not None:
            base = (getattr(base, "__args__", None) or (str,))[0]
        p.metavar = _TYPE_WORDS.get(base, "PATH" if base is Path else "TEXT")  # type: ignore[arg-type]


app = typer.Typer(
    cls=_Group,
    name="netlimit",
    help="Rate limits at L3/L4 (nftables, or legacy iptables; tc) and L7 (HTTP sidecar) from one YAML file.",
    no_args_is_help=True,
    add_completion=True,  # netlimit --install-completion / --show-completion (bash, zsh, fish)
    pretty_exceptions_enable=False,
    context_settings={"help_option_names": ["-h", "--help"]},
)


def _backend_warnings(loaded, backend: str | None) -> list:
    """Warnings about the file under the backend `apply` would use (none if none is usable)."""
    if not loaded.config.network:
        return []
    from .kernel.registry import backend as backend_of
    from .kernel.registry import choose

    try:
        key = choose(backend, loaded.config.backend).key
    except NetlimitError as exc:
        err(f"warning: {exc}")
        return []
    return backend_of(key).warnings(loaded)


def _version(value: bool) -> None:
    if value:
        typer.echo(f"netlimit {__version__}")
        raise typer.Exit()


@app.callback()
def _root(
    version: bool = typer.Option(
        False, "--version", callback=_version, is_eager=True, help="Print the version and exit."
    ),
) -> None:
    """netlimit: one declarative file, limits at three layers."""


@app.command()
def validate(
    files: list[Path] = typer.Argument(..., help="Config files to check.", show_default=False),
    quiet: bool = typer.Option(False, "--quiet", "-q", help="Print nothing when valid."),
    backend: str | None = typer.Option(
        None,
        "--backend",
        metavar="auto|nftables|restore|python-iptables",
        help="Warn about what the file means under this kernel backend (default: as `apply` would choose).",
    ),
    as_json: bool = typer.Option(
        False, "--json", help="One JSON object: per file valid or not, problems and warnings with file/line/col/rule."
    ),
) -> None:
    """Check files without root: print every problem as FILE:LINE:COL: RULE: MESSAGE.

    Exit 0 when every file is valid, 1 otherwise.
    """
    bad = 0
    report: list[dict] = []
    for path in files:
        try:
            loaded = load_checked(path)
        except ConfigError as exc:
            bad += 1
            report.append({"file": str(path), "valid": False, "problems": [problem_json(p) for p in exc.problems]})
            if not as_json:
                for p in exc.problems:
                    typer.echo(str(p))
            continue
        from .config.validate import secret_warnings
        from .kernel.lockout import lockout_hits, problems, ssh_targets

        warnings = loaded.warnings + _backend_warnings(loaded, backend) + secret_warnings(loaded)
        lockout = problems(loaded, lockout_hits(loaded.config, ssh_targets(None, None)))
        c = loaded.config
        entry: dict = {
            "file": str(path),
            "valid": True,
            "problems": [],
            "warnings": [problem_json(w) for w in warnings + lockout],
        }
        entry |= {"sha256": loaded.sha256, "included": [p for p, _ in loaded.included]}
        entry |= {"network": len(c.network), "bandwidth": len(c.bandwidth)}
        report.append(entry)
        if as_json:
            continue
        for w in warnings:
            typer.echo(str(w))
        if not quiet:
            parts = [f"{len(c.network)} network", f"{len(c.bandwidth)} bandwidth"]
            if c.http is not None:  # with its lyft_config_dir's
                domains = list(
                    dict.fromkeys([c.http.domain] * bool(c.http.domain) + [f.config.domain for f in loaded.lyft])
                )
                parts.append(f"http domain{'s' if len(domains) != 1 else ''} {', '.join(map(repr, domains))}")
            if loaded.included:
                parts.append(f"{len(loaded.included)} included file{'s' if len(loaded.included) != 1 else ''}")
            typer.echo(f"{path}: valid ({', '.join(parts)})")
        # after the verdict: they are about this host (its SSH session, its sshd), not the file
        for w in lockout:
            typer.echo(str(w))
    if as_json:
        typer.echo(json.dumps({"valid": not bad, "files": report}, indent=2))
        answered_in_json()
    if bad:
        raise typer.Exit(EXIT_INVALID)


@app.command()
def schema(
    indent: int = typer.Option(2, help="JSON indentation."),
) -> None:
    """Print the JSON Schema of the config file (for editor completion)."""
    from .config.model import Config

    s = Config.model_json_schema(mode="validation")
    s["$schema"] = "https://json-schema.org/draft/2020-12/schema"
    s["$id"] = "https://netlimit.invalid/schema/v1.json"
    typer.echo(json.dumps(s, indent=indent, sort_keys=False))


# Layers register their commands here (each import is cheap: heavy modules
# are imported inside the command functions).
_LAYERS = (
    "netlimit.kernel.cli",
    "netlimit.demo",
    "netlimit.sidecar.cli",
    "netlimit.daemon",
    "netlimit.top",
    "netlimit.simulate.cli",
    "netlimit.bans.cli",
    "netlimit.assets",
)
for _mod in _LAYERS:
    try:
        _m = importlib.import_module(_mod)
    except ModuleNotFoundError as _exc:  # layer not built yet
        if _exc.name != _mod:
            raise
        continue
    _m.register(app)


def main() -> None:
    json_errors(lambda: app(prog_name="netlimit"))


def daemon_main() -> None:
    """`netlimitd` = `netlimit daemon`."""
    sys.argv = ["netlimit", "daemon", *sys.argv[1:]]
    app(prog_name="netlimit")


if __name__ == "__main__":
    main()
