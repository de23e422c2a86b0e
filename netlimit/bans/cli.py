"""`netlimit ban add|del|list|flush`: the ban list the file's `bans:` names (Redis, or
this host's netlimitd with `store: memory`)."""

from __future__ import annotations

import getpass
import json
import socket
import sys
from pathlib import Path
from typing import Any

import typer

DEFAULT_CONFIG = Path("/etc/netlimit/netlimit.yaml")

ban_app = typer.Typer(
    name="ban",
    help="The shared ban list every netlimitd enforces in the kernel (README: Escalation and bans).",
    no_args_is_help=True,
)

_CONFIG = typer.Option(DEFAULT_CONFIG, "--config", "-c", help="The file whose `bans:` names the list (the daemon's).")


def _open(config: Path) -> tuple[Any, Any]:
    """(the loaded file, its ban list) or exit with why."""
    from ..cliutil import EXIT_FAILED, EXIT_INVALID, err, load_or_exit

    loaded = load_or_exit(config)
    c = loaded.config
    if not c.bans_on:
        err(f"{config}: the file uses no bans: add a `bans:` section (netlimitd then enforces the list)")
        raise typer.Exit(EXIT_INVALID)
    store = c.ban_store
    try:
        if store == "memory":
            from .socket_client import SocketBanList

            path = c.bans.socket if c.bans is not None else "/run/netlimit/netlimitd.sock"
            return loaded, SocketBanList(path)
        from .redis_store import RedisBanList

        prefix = c.bans.key_prefix if c.bans is not None else "netlimit"
        return loaded, RedisBanList(store, key_prefix=prefix, max_entries=c.max_bans)
    except Exception as exc:  # a URL redis-py cannot use
        err(f"cannot open the ban list at {store}: {exc}")
        raise typer.Exit(EXIT_FAILED) from None


def _failed(exc: Exception, store: str) -> None:
    from ..cliutil import EXIT_FAILED, EXIT_INVALID, EXIT_USAGE, err
    from .socket_client import BanRefused

    if isinstance(exc, PermissionError):  # netlimitd's socket is root-only (0600)
        err("netlimit ban: netlimitd's status socket is root-only (0600): run as root")
        raise typer.Exit(EXIT_USAGE)
    if isinstance(exc, BanRefused):
        err(f"netlimit ban: {exc}")
        raise typer.Exit(EXIT_INVALID)
    err(f"netlimit ban: the ban list at {store} failed: {exc}")
    raise typer.Exit(EXIT_FAILED)


def _target(text: str):
    from ..cliutil import EXIT_INVALID, err
    from .model import parse_target

    try:
        return parse_target(text)
    except ValueError as exc:
        err(f"netlimit ban: {exc}")
        raise typer.Exit(EXIT_INVALID) from None


_YES = typer.Option(False, "--yes", "-y", help="Do it without asking (needed when not on a terminal).")


def _confirm(question: str, yes: bool, flag_hint: str) -> None:
    """Lifting bans acts on every host: ask on a terminal, insist on --yes elsewhere."""
    from ..cliutil import EXIT_INVALID, EXIT_USAGE, err

    if yes:
        return
    if not sys.stdin.isatty():
        err(f"netlimit ban: {flag_hint} lifts bans on every host: no terminal to confirm on, pass --yes")
        raise typer.Exit(EXIT_USAGE)
    if not typer.confirm(question, default=False, err=True):
        err("netlimit ban: not confirmed; nothing was changed")
        raise typer.Exit(EXIT_INVALID)


@ban_app.command("add")
def add(
    target: str = typer.Argument(..., metavar="ADDR[/LEN]", help="An address or a prefix, IPv4 or IPv6."),
    ttl: str = typer.Option(..., "--ttl", help="How long: 30s, 15m, 1h, 2d (at most 24 days)."),
    reason: str = typer.Option("", "--reason", help="Shown in `ban list`."),
    config: Path = _CONFIG,
) -> None:
    """Ban an address or prefix on every host for --ttl (exempt addresses and trusted proxies are refused)."""
    from ..cliutil import EXIT_INVALID, err
    from ..config.model import BAN_MAX_SECONDS
    from ..config.units import format_duration, parse_duration
    from .model import MAX_REASON, skip_reason

    net = _target(target)
    try:
        seconds = parse_duration(ttl)
    except ValueError as exc:
        err(f"netlimit ban: --ttl: {exc}")
        raise typer.Exit(EXIT_INVALID) from None
    if seconds > BAN_MAX_SECONDS:
        err(f"netlimit ban: --ttl {ttl} is longer than the kernel keeps a ban (24 days)")
        raise typer.Exit(EXIT_INVALID)
    if len(reason) > MAX_REASON:
        err(f"netlimit ban: --reason is {len(reason)} characters; at most {MAX_REASON}")
        raise typer.Exit(EXIT_INVALID)
    loaded, bans = _open(config)
    c = loaded.config
    why = skip_reason(net, list(c.exempt), list(c.http.trusted_proxies) if c.http is not None else [])
    if why is not None:
        err(f"netlimit ban: refused: {why}; exempt addresses and trusted proxies are never banned ({config})")
        raise typer.Exit(EXIT_INVALID)
    by = f"{getpass.getuser()}@{socket.gethostname()} (cli)"
    try:
        res = bans.add(net, float(seconds), reason=reason, by=by, origin="manual")
    except Exception as exc:  # the list is redis-py or netlimitd's socket: _failed reports any failure as an exit code
        _failed(exc, c.ban_store)
    finally:
        bans.close()
    typer.echo(f"banned {net} for {format_duration(seconds)}" + (f": {reason}" if reason else ""))
    for n in res.evicted:
        typer.echo(f"  (the list was full: {n}, the ban closest to its end, was dropped)")


@ban_app.command("del")
def delete(
    target: str = typer.Argument(..., metavar="ADDR[/LEN]", help="Exactly as it is listed."),
    config: Path = _CONFIG,
    yes: bool = _YES,
) -> None:
    """Lift a ban now, on every host (asks first; --yes when not on a terminal)."""
    from ..cliutil import EXIT_INVALID, err

    net = _target(target)
    loaded, bans = _open(config)
    try:
        _confirm(f"lift the ban of {net} on every host ({loaded.config.ban_store})?", yes, f"ban del {net}")
        gone = bans.delete(net)
    except typer.Exit:
        raise
    except Exception as exc:  # the list is redis-py or netlimitd's socket: _failed reports any failure as an exit code
        _failed(exc, loaded.config.ban_store)
    finally:
        bans.close()
    if not gone:
        err(f"netlimit ban: {net} is not banned (`netlimit ban list` shows the list)")
        raise typer.Exit(EXIT_INVALID)
    typer.echo(f"lifted the ban of {net}")


@ban_app.command("list")
def list_(
    as_json: bool = typer.Option(False, "--json", help="Machine-readable output."),
    config: Path = _CONFIG,
) -> None:
    """Every ban with its time left, the rule or person that added it and why."""
    from ..config.units import format_left

    loaded, bans = _open(config)
    try:
        snap = bans.snapshot()
    except Exception as exc:  # the list is redis-py or netlimitd's socket: _failed reports any failure as an exit code
        _failed(exc, loaded.config.ban_store)
    finally:
        bans.close()
    rows = sorted(((b, left) for b, left in snap.bans), key=lambda x: x[1])
    if as_json:
        doc = {
            "store": loaded.config.ban_store,
            "evicted": snap.evicted,
            "bans": [b.as_json(b.expires - left) for b, left in rows],
        }
        typer.echo(json.dumps(doc, indent=2))
        return
    if not rows:
        typer.echo(f"no bans ({loaded.config.ban_store})")
        return
    typer.echo(f"{len(rows)} bans ({loaded.config.ban_store})")
    typer.echo(f"  {'PREFIX':<24} {'LEFT':>8}  {'ORIGIN':<8} {'RULE':<20} {'BY':<28} REASON")
    for b, left in rows:
        typer.echo(
            f"  {b.net!s:<24} {format_left(left):>8}  {b.origin:<8} {b.rule or '-':<20} {b.by or '-':<28} {b.reason}"
        )


@ban_app.command("flush")
def flush(config: Path = _CONFIG, yes: bool = _YES) -> None:
    """Lift every ban, on every host (asks first; --yes when not on a terminal)."""
    loaded, bans = _open(config)
    try:
        if not yes and sys.stdin.isatty():
            n = len(bans.snapshot().bans)
            what = f"{n} ban{'s' if n != 1 else ''}"
        else:
            what = "every ban"
        _confirm(f"lift {what} on every host ({loaded.config.ban_store})?", yes, "ban flush")
        n = bans.flush()
    except typer.Exit:
        raise
    except Exception as exc:  # the list is redis-py or netlimitd's socket: _failed reports any failure as an exit code
        _failed(exc, loaded.config.ban_store)
    finally:
        bans.close()
    typer.echo(f"lifted {n} bans")


def register(app: typer.Typer) -> None:
    app.add_typer(ban_app, name="ban")
