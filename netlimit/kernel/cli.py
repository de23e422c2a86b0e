"""`netlimit plan / apply / list / flush` (registered by netlimit/cli.py).

Importing this module is cheap: python-iptables and pyroute2 are imported by
the commands that touch the kernel, so `netlimit validate` and `netlimit plan`
stay fast and need no root.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import typer

from .registry import BACKENDS, help_text
from .registry import backend as backend_of

NETNS_HELP = "Run against this network namespace (/run/netns/NAME); it must exist."
BACKEND_HELP = help_text()


def _backend_option():
    return typer.Option(None, "--backend", metavar="|".join(("auto", *BACKENDS)), help=BACKEND_HELP)


def _choose(backend: str | None, config=None):
    """The backend (key and why) for this command, or exit 64 with why not."""
    from ..errors import ApplyError
    from .registry import choose

    try:
        return choose(backend, config.backend if config is not None else None)
    except ApplyError as exc:
        base = _cli()
        base.err(f"error: {exc}")
        raise typer.Exit(base.EXIT_USAGE) from None


def _backend_warnings(loaded, key: str) -> None:
    from .registry import backend

    for w in backend(key).warnings(loaded):
        _cli().err(str(w))


def _cli():
    from .. import cliutil as base  # the shared helpers: load_or_exit, err, exit codes

    return base


def _need_root(what: str) -> None:
    base = _cli()
    if os.geteuid() != 0:
        base.err(
            f"netlimit {what} changes or reads kernel tables: run it as root "
            "(or `netlimit plan FILE` to see what would be installed, without root)"
        )
        raise typer.Exit(base.EXIT_USAGE)


def _check_netns(netns: str | None) -> None:
    if netns is None:
        return
    from .netns import NetnsError, check_netns

    try:
        check_netns(netns)
    except NetnsError as exc:
        base = _cli()
        base.err(f"error: {exc}")
        raise typer.Exit(base.EXIT_USAGE) from None


def backend_note(key: str, netns: str | None = None) -> str | None:
    """A clear word about where `key`'s rules show up on this host (its `note`)."""
    from .registry import backend

    return backend(key).note(netns)


def _compile(loaded):
    from .compile import compile_config

    return compile_config(loaded.config)


def register(app: typer.Typer) -> None:  # each command calls its function below

    @app.command()
    def plan(
        file: Path = typer.Argument(..., help="The netlimit YAML file.", show_default=False),
        json_out: bool = typer.Option(False, "--json", help="Machine-readable output."),
        live: bool = typer.Option(False, "--live", help="Diff against the kernel (root); changes nothing."),
        netns: str | None = typer.Option(None, "--netns", help=NETNS_HELP + " Implies --live."),
        backend: str | None = _backend_option(),
    ) -> None:
        """Print what `apply` would install: the nft script (or iptables-restore input) and tc
        commands, grouped by rule, and which backend and why.

        Without --live no root is needed and the kernel is not touched.
        """
        plan_command(file, json_out, live, netns, backend)

    @app.command()
    def apply(
        file: Path = typer.Argument(..., help="The netlimit YAML file.", show_default=False),
        netns: str | None = typer.Option(None, "--netns", help=NETNS_HELP),
        json_out: bool = typer.Option(False, "--json", help="Machine-readable result."),
        quiet: bool = typer.Option(False, "--quiet", "-q", help="Print only errors and the summary."),
        confirm: float | None = typer.Option(
            None,
            "--confirm",
            metavar="SECONDS",
            min=1,
            help="Like iptables-apply: after applying, wait for Enter; without it (timeout or no terminal) "
            "the previous rules are restored. For changes to the port you are connected through.",
        ),
        backend: str | None = _backend_option(),
        socket_path: str = _socket_option(),
        allow_lockout: bool = typer.Option(
            False,
            "--allow-lockout",
            help="Apply even when a rule could cut off the SSH session running this command "
            "(SSH_CONNECTION); without it, or --confirm, such a file is refused.",
        ),
    ) -> None:
        """Make the kernel equal to FILE: print the diff, then write it atomically (root).

        Idempotent: a second apply of the same file writes nothing. On failure the
        previous state is restored and the exit code is 2. A file with a rule that could
        cut off this SSH session is refused (exit 1) unless --confirm or --allow-lockout.
        """
        apply_command(file, netns, json_out, quiet, confirm, backend, socket_path, allow_lockout)

    @app.command("list")
    def list_cmd(
        netns: str | None = typer.Option(None, "--netns", help=NETNS_HELP),
        json_out: bool = typer.Option(False, "--json", help="Machine-readable output."),
        file: Path | None = typer.Option(
            None,
            "--file",
            "-f",
            help="Name tc objects after this file's rules (default: what the last apply remembered).",
        ),
        backend: str | None = _backend_option(),
        verbose: bool = typer.Option(
            False, "--verbose", "-v", help="Every kernel object as read back (nft rule, iptables rule, tc command)."
        ),
    ) -> None:
        """Show netlimit's rules in the kernel, one line each: what it matches, its limit as the file
        writes it, packets, drops and tracked sources (root). --verbose: every object."""
        list_command(netns, json_out, file, backend, verbose)

    @app.command()
    def flush(
        netns: str | None = typer.Option(None, "--netns", help=NETNS_HELP),
        quiet: bool = typer.Option(False, "--quiet", "-q", help="Print nothing on success."),
        backend: str | None = _backend_option(),
        socket_path: str = _socket_option(),
    ) -> None:
        """Remove everything netlimit owns (nftables table, iptables/ip6tables chains, tc trees,
        ingress redirects, IFBs) and nothing else.

        With a netlimitd running for the namespace, it is asked to stand down: it removes its
        objects and stays down (no reloads, no repairs) until `netlimit resume` or a restart."""
        flush_command(netns, quiet, backend, socket_path)


def plan_command(file: Path, json_out: bool, live: bool, netns: str | None, backend: str | None) -> None:
    """`netlimit plan` (registered by `register`)."""
    base = _cli()
    loaded = base.load_or_exit(file)
    desired = _compile(loaded)
    choice = _choose(backend, loaded.config)
    _backend_warnings(loaded, choice.key)
    for w in lockout_warnings(loaded, netns):
        base.err(str(w))
    if not live and netns is None:
        from .render import plan_dict, plan_text

        if json_out:
            doc = plan_dict(desired, source=str(file), sha256=loaded.sha256, backend=choice.key)
            doc["backend"], doc["backend_reason"] = choice.key, choice.why
            typer.echo(json.dumps(doc, indent=2))
        else:
            text = plan_text(desired, source=str(file), sha256=loaded.sha256, backend=choice.key, why=choice.why)
            typer.echo(text, nl=False)
        return
    _need_root("plan --live")
    _check_netns(netns)
    from .reconcile import ApplyError
    from .reconcile import apply as do_apply

    try:
        res = do_apply(desired, netns, dry_run=True, backend=choice.key)
    except ApplyError as exc:
        base.err(f"error: {exc}")
        raise typer.Exit(base.EXIT_FAILED) from None
    lines = res.changes.lines()
    if json_out:
        typer.echo(
            json.dumps(
                {
                    "file": str(file),
                    "netns": netns,
                    "backend": choice.key,
                    "backend_reason": choice.why,
                    "changed": bool(lines),
                    "changes": lines,
                    "counts": res.changes.counts(),
                    "found": res.before.count(),
                },
                indent=2,
            )
        )
        return
    typer.echo(f"# backend: {choice.key} ({choice.why})")
    where = f" in netns {netns}" if netns else ""
    found = res.before.count()
    if not lines:
        typer.echo(f"no changes: the kernel{where} already matches {file} ({found} owned objects)")
        return
    typer.echo(f"# changes apply would make{where} (+ add, - remove, ~ reorder):")
    for line in lines:
        typer.echo(line)
    c = res.changes.counts()
    typer.echo(f"# {c['add']} to add, {c['remove']} to remove; nothing was changed")


def apply_command(
    file: Path,
    netns: str | None,
    json_out: bool,
    quiet: bool,
    confirm: float | None,
    backend: str | None,
    socket_path: str,
    allow_lockout: bool,
) -> None:
    """`netlimit apply` (registered by `register`)."""
    base = _cli()
    loaded = base.load_or_exit(file)
    desired = _compile(loaded)
    _need_root("apply")
    _check_netns(netns)
    _lockout_guard(loaded, netns, confirm is not None or allow_lockout)
    if _daemon_apply(file, netns, socket_path):
        return
    choice = _choose(backend, loaded.config)
    from .reconcile import ApplyError
    from .reconcile import apply as do_apply

    note = backend_note(choice.key, netns)
    if note and not quiet and not json_out:
        base.err(note)
    try:
        res = do_apply(desired, netns, backend=choice.key)
    except ApplyError as exc:
        base.err(f"error: {exc}")
        raise typer.Exit(base.EXIT_FAILED) from None
    lines = res.changes.lines()
    if json_out:
        typer.echo(
            json.dumps(
                {
                    "file": str(file),
                    "netns": netns,
                    "backend": choice.key,
                    "changed": bool(lines),
                    "changes": lines,
                    "counts": res.changes.counts(),
                    "found": res.before.count(),
                    "timings_s": {k: round(v, 4) for k, v in res.timings.items()},
                },
                indent=2,
            )
        )
        return
    where = f" in netns {netns}" if netns else ""
    found = res.before.count()
    if not lines:
        typer.echo(f"no changes: the kernel{where} already matches {file} ({found} owned objects)")
        return
    if not quiet:
        for line in lines:
            typer.echo(line)
    c = res.changes.counts()
    t = res.timings
    layer = backend_of(choice.key).layer
    typer.echo(
        f"applied {file}{where}: {c['add']} added, {c['remove']} removed, adopting {found} owned objects "
        f"found in the kernel, in {t.get('total', 0):.2f} s ({layer} {t.get('filter', 0):.2f} s, "
        f"tc {t.get('tc', 0):.2f} s" + (f", xdp {t['xdp']:.2f} s)" if "xdp" in t else ")")
    )
    if confirm is not None and (why := _not_confirmed(confirm)) is not None:
        from .reconcile import restore

        restore(res.before, netns)
        base.err(f"{why}: the previous rules were restored")
        raise typer.Exit(base.EXIT_FAILED)


def list_command(netns: str | None, json_out: bool, file: Path | None, backend: str | None, verbose: bool) -> None:
    """`netlimit list` (registered by `register`)."""
    base = _cli()
    loaded = base.load_or_exit(file) if file else None
    desired = _compile(loaded) if loaded else None
    _need_root("list")
    _check_netns(netns)
    choice = _choose(backend, loaded.config if loaded else None)
    from .reconcile import ApplyError, list_owned

    try:
        rows = list_owned(netns, desired, backend=choice.key)
    except ApplyError as exc:
        base.err(f"error: {exc}")
        raise typer.Exit(base.EXIT_FAILED) from None
    from . import listing

    rules = list(desired.summary) if desired is not None else listing.load(netns).get("rules", [])
    lines = listing.rule_lines(rows, rules, choice.key) if rows else []
    if json_out:
        doc = {"netns": netns, "backend": choice.key, "backend_reason": choice.why, "rules": lines, "objects": rows}
        typer.echo(json.dumps(doc, indent=2))
        return
    typer.echo(f"backend: {choice.key} ({choice.why})")
    if not rows:
        typer.echo("netlimit owns nothing here" + (f" (netns {netns})" if netns else ""))
        return
    if verbose:
        typer.echo(format_list(rows))
        return
    typer.echo(listing.format_lines(lines))
    if not rules:
        typer.echo("(what each rule matches: run `netlimit list --file FILE`; the last apply left no description)")


def flush_command(netns: str | None, quiet: bool, backend: str | None, socket_path: str) -> None:
    """`netlimit flush` (registered by `register`)."""
    base = _cli()
    _need_root("flush")
    _check_netns(netns)
    if _daemon_flush(netns, socket_path, quiet):
        return
    choice = _choose(backend)
    from .reconcile import flush as do_flush

    try:
        res = do_flush(netns, backend=choice.key)
    except Exception as exc:  # any backend's failure (netlink, iptables, pyroute2): exit 2 saying why
        base.err(f"error: flush failed: {exc}")
        raise typer.Exit(base.EXIT_FAILED) from None
    if not quiet:
        typer.echo(describe_flush(res, netns))


def _socket_option():
    from ..statusclient import DEFAULT_SOCKET

    return typer.Option(
        DEFAULT_SOCKET, "--socket", help="A running netlimitd's status socket: apply and flush work through it."
    )


def _daemon_for(netns: str | None, socket_path: str) -> dict | None:
    """The status of a netlimitd that keeps this namespace (None: none runs for it)."""
    from ..statusclient import find_daemon

    st = find_daemon(socket_path)
    if st is None or st.get("netns") != netns:
        return None
    return st


def _daemon_apply(file: Path, netns: str | None, socket_path: str) -> bool:
    """With a netlimitd keeping this namespace: its own file is reloaded through it
    (True: done, its result printed); another file is refused (exit 1), since the
    daemon would put its own file back at its next resync. False: no daemon."""
    from ..statusclient import control

    st = _daemon_for(netns, socket_path)
    if st is None:
        return False
    base = _cli()
    theirs = st.get("config_realpath") or st.get("config_path", "")
    pid = st.get("pid")
    if os.path.realpath(file) != theirs:
        where = f" --netns {netns}" if netns else ""
        base.err(
            f"{file}: refused: netlimitd (pid {pid}) keeps the kernel{where} equal to {theirs} and would revert "
            f"this apply at its next resync. Change the rules by editing {theirs} (netlimitd reloads it), or "
            f"`netlimit apply {theirs}`; for another file, stop it first (`systemctl stop netlimitd`); "
            "nothing was changed"
        )
        raise typer.Exit(base.EXIT_INVALID)
    res = control(socket_path, "reload", by="netlimit apply")
    if not res.get("ok"):
        base.err(f"{file}: netlimitd (pid {pid}) did not apply it: {res.get('error', '?')}")
        raise typer.Exit(base.EXIT_INVALID if res.get("invalid") else base.EXIT_FAILED)
    typer.echo(f"netlimitd (pid {pid}) reloaded {theirs}: {res.get('summary', '')} (last apply: {res.get('result')})")
    return True


def _daemon_flush(netns: str | None, socket_path: str, quiet: bool) -> bool:
    """With a netlimitd keeping this namespace: ask it to stand down (True: done)."""
    from ..statusclient import control

    st = _daemon_for(netns, socket_path)
    if st is None:
        return False
    base = _cli()
    res = control(socket_path, "standdown", by="netlimit flush")
    if not res.get("ok"):
        base.err(f"error: netlimitd (pid {st.get('pid')}) did not stand down: {res.get('error', '?')}")
        raise typer.Exit(base.EXIT_FAILED)
    if not quiet:
        typer.echo(
            f"netlimitd (pid {st.get('pid')}) stood down: {res.get('summary', '')}. It stays down "
            "until `netlimit resume` (or a restart)"
        )
    return True


def lockout_warnings(loaded, netns: str | None, env=None) -> list:
    """Warnings (Problem) for the rules that could cut off SSH here (lockout.py)."""
    from .lockout import lockout_hits, problems, ssh_targets

    return problems(loaded, lockout_hits(loaded.config, ssh_targets(env, netns)))


def _lockout_guard(loaded, netns: str | None, allowed: bool) -> None:
    """apply: refuse (exit 1) a file whose rules could cut off the SSH session that
    runs the command, unless --confirm (rolled back without an answer) or
    --allow-lockout; warn (on stderr, even with --quiet) about what it lets through."""
    from .lockout import lockout_hits, problems, ssh_targets

    base = _cli()
    hits = lockout_hits(loaded.config, ssh_targets(None, netns))
    session = [h for h in hits if h.target.session]
    if session and not allowed:
        for p in problems(loaded, session):
            base.err(str(p).replace(": warning: ", ": ", 1))
        client = session[0].target.client
        base.err(
            f"{loaded.path}: refused: {len(session)} rule{'s' if len(session) != 1 else ''} could cut off "
            f"the SSH session running this command. Add {client} (or its network) to `exempt:`, or apply with "
            "--confirm SECONDS (rolled back unless you answer) or --allow-lockout; nothing was changed"
        )
        raise typer.Exit(base.EXIT_INVALID)
    for p in problems(loaded, hits):
        base.err(str(p))


def describe_flush(res, netns: str | None) -> str:
    """What a flush removed, counted from the kernel read back after it."""
    removed = res.removed()
    where = f" in netns {netns}" if netns else ""
    if not removed:
        return f"nothing to flush{where}"
    n_tc = removed.pop("tc", 0)
    n_xdp = removed.pop("xdp", 0)  # the XDP program and its attachments (kernel/xdp/stage.py)
    from .registry import backend

    what = ", ".join(f"{n} {backend(k).kind} objects" for k, n in removed.items())
    xdp = f", {n_xdp} XDP objects (program and attachments, unpinned)" if n_xdp else ""
    return f"flushed{where}: {what or 'no packet-filter objects'}, {n_tc} tc objects{xdp}; none remain"


def _not_confirmed(seconds: float) -> str | None:
    """None if the operator pressed Enter (or typed y) within `seconds`, else why not:
    no terminal to confirm on (stdin closed, at its end, or not a terminal and silent),
    the time ran out, or another answer."""
    import select
    import sys

    tty = sys.stdin is not None and not sys.stdin.closed and sys.stdin.isatty()
    no_tty = "no terminal to confirm on (stdin is not a terminal)"
    typer.echo(f"keep these rules? press Enter within {seconds:g} s, or they are rolled back ...", err=True)
    try:
        ready, _, _ = select.select([sys.stdin], [], [], seconds)
    except (OSError, ValueError, TypeError):
        return no_tty
    if not ready:
        return f"not confirmed within {seconds:g} s" if tty else no_tty
    line = sys.stdin.readline()
    if line == "":
        return no_tty if not tty else "stdin closed (Ctrl-D) before the rules were confirmed"
    if line.strip().lower() in ("", "y", "yes"):
        return None
    return f"answered {line.strip()[:20]!r}, not Enter or y"


def _human(n: int) -> str:
    for unit, div in (("G", 10**9), ("M", 10**6), ("k", 10**3)):
        if n >= div:
            return f"{n / div:.1f}{unit}"
    return str(n)


def format_list(rows: list[dict]) -> str:
    out: list[str] = []
    header = f"{'RULE':<20} {'LAYER':<9} {'PACKETS':>8} {'BYTES':>8} {'DROPPED':>8}  OBJECT"
    out.append(header)
    order: dict[str, int] = {}
    for r in rows:
        order.setdefault(r["rule"] or "(netlimit)", len(order))
    for r in sorted(rows, key=lambda r: order[r["rule"] or "(netlimit)"]):
        extra = ""
        if r.get("table"):
            n = r.get("table_entries")
            extra = f"  [{r['table']}: {n if n is not None else '?'} entries]"
        if r["layer"] == "tc" and r.get("overlimits"):
            extra += f"  [overlimits {r['overlimits']}]"
        out.append(
            f"{(r['rule'] or '(netlimit)')[:20]:<20} {r['layer']:<9} {_human(r['packets']):>8} "
            f"{_human(r['bytes']):>8} {_human(r['dropped']):>8}  {r['object']}{extra}"
        )
    return "\n".join(out)
