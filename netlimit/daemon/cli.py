"""The daemon's commands: `netlimit daemon` (= netlimitd), `status`, `install-service`."""

from __future__ import annotations

import json
import os
import time
from pathlib import Path
from typing import Any

import typer

from ..statusclient import DEFAULT_SOCKET, query_status
from .kernel_ops import KernelOps


def _fmt_time(t: float) -> str:
    return time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(t)) if t else "never"


def register(app: typer.Typer) -> None:
    from ..cliutil import EXIT_FAILED, EXIT_USAGE, err

    @app.command()
    def daemon(
        config: Path = typer.Option(
            Path("/etc/netlimit/netlimit.yaml"), "--config", "-c", help="The file that is the truth."
        ),
        resync: float = typer.Option(30.0, "--resync", min=0.2, help="Seconds between drift checks (kernel vs file)."),
        metrics: str = typer.Option(
            None, "--metrics", metavar="HOST:PORT", help="Serve Prometheus metrics here (e.g. 127.0.0.1:9732)."
        ),
        netns: str = typer.Option(None, "--netns", help="Manage this network namespace instead of the host's."),
        socket_path: str = typer.Option(DEFAULT_SOCKET, "--socket", help="Status socket (0600)."),
        backend: str = typer.Option(
            None,
            "--backend",
            metavar="auto|nftables|restore|python-iptables",
            help="Packet-filter backend; default: $NETLIMIT_BACKEND, else the file's `backend:`, else auto.",
        ),
        log_level: str = typer.Option(
            "info", "--log-level", envvar="NETLIMIT_LOG_LEVEL", help="debug | info | warning | error."
        ),
        log_format: str = typer.Option(
            "text",
            "--log-format",
            envvar="NETLIMIT_LOG_FORMAT",
            help="text (a level on every line; sd-daemon <N> prefixes under journald) | json (one object a line).",
        ),
    ) -> None:
        """Run netlimitd: apply the file, reload on change or SIGHUP, repair drift (systemd Type=notify)."""
        from .main import run  # the body netlimitd (daemon/main.py) runs without typer

        raise typer.Exit(run(config, resync, metrics, netns, socket_path, backend, log_level, log_format, err=err))

    @app.command()
    def status(
        socket_path: str = typer.Option(DEFAULT_SOCKET, "--socket", help="The daemon's status socket."),
        as_json: bool = typer.Option(False, "--json", help="Machine-readable output."),
        netns: str = typer.Option(None, "--netns", help="Without a daemon: read this namespace's kernel."),
    ) -> None:
        """Ask the running daemon how it is; without one, read the kernel."""
        try:
            payload = query_status(socket_path)
        except PermissionError:
            err(f"netlimit status: {socket_path} is root-only (0600): run as root")
            raise typer.Exit(EXIT_USAGE) from None
        except (TimeoutError, OSError, ValueError) as exc:
            err(f"netlimit status: the daemon on {socket_path} did not answer properly: {exc or 'timed out'}")
            raise typer.Exit(EXIT_FAILED) from None
        if payload is None and os.geteuid() != 0:
            err(f"netlimit status: no daemon answers on {socket_path}, and reading the kernel needs root: run as root")
            raise typer.Exit(EXIT_USAGE)
        if payload is None:
            if as_json:
                out: dict[str, Any] = {"daemon": None}
                try:
                    out["counters"] = KernelOps(netns).counters()
                except Exception as exc:  # any failure of the kernel read goes into the JSON answer
                    out["error"] = str(exc)
                typer.echo(json.dumps(out, indent=2))
                return
            typer.echo(f"no daemon answers on {socket_path}; reading the kernel instead")
            try:
                rows = KernelOps(netns).counters()
            except Exception as exc:  # any failure of the kernel read: exit 2 saying why, not a traceback
                err(f"cannot read the kernel: {exc}")
                raise typer.Exit(EXIT_FAILED) from None
            _print_counters(rows)
            return
        if as_json:
            typer.echo(json.dumps(payload, indent=2))
            return
        s = payload
        typer.echo(f"netlimitd pid {s['pid']}, up since {_fmt_time(s['started'])}")
        if s.get("stood_down"):
            typer.echo(f"  {s['stood_down']}")
        typer.echo(
            f"  config:      {s['config_path']} sha256 {s['config_sha256'][:16]}…"
            f" loaded {_fmt_time(s['config_loaded_at'])}"
        )
        typer.echo(
            f"  last apply:  {_fmt_time(s['last_apply_time'])}: {s['last_apply_result']}"
            f" ({s['last_apply_duration'] * 1000:.0f} ms, {s['last_apply_changes']} changes)"
        )
        if s.get("backend"):
            typer.echo(f"  backend:     {s['backend']} ({s.get('backend_reason', '')})")
        if s.get("rejected"):
            typer.echo("  running old config, new config rejected:")
            for line in s["rejected"].splitlines():
                typer.echo(f"    {line}")
        typer.echo(f"  reloads:     {s['reloads_ok']} ok, {s['reloads_rejected']} rejected")
        typer.echo(f"  drift:       {s['drift_repairs']} repairs (resync every {s['resync_interval']:g} s)")
        if s.get("nft_repairs"):
            typer.echo(f"               {s['nft_repairs']} of them at once, on nftables notifications")
        b = s.get("bans")
        if b:
            state = "connected" if b.get("connected") else f"UNREACHABLE ({b.get('last_error') or '?'})"
            typer.echo(
                f"  bans:        {b['active']} active, {b['in_kernel']} prefixes in the kernel's ban sets; "
                f"list {b['store']} {state}"
            )
        for d in s.get("last_drift", [])[:10]:
            typer.echo(f"    last: {d}")
        _print_counters(s.get("counters", []))

    @app.command()
    def resume(
        socket_path: str = typer.Option(DEFAULT_SOCKET, "--socket", help="The daemon's status socket."),
    ) -> None:
        """Bring a netlimitd that `netlimit flush` stood down back: it reads its file and applies it.

        Exit 0 when the rules are back, 1 when no daemon answers or its file is invalid,
        2 when the kernel refused them.
        """
        from ..statusclient import control, find_daemon

        st = find_daemon(socket_path)
        if st is None:
            err(f"netlimit resume: no netlimitd answers on {socket_path} (as root; --socket PATH)")
            raise typer.Exit(1)
        res = control(socket_path, "resume", by="netlimit resume")
        if not res.get("ok"):
            err(f"netlimit resume: netlimitd (pid {st['pid']}) did not resume: {res.get('error', '?')}")
            raise typer.Exit(1 if res.get("invalid") else EXIT_FAILED)
        typer.echo(f"netlimitd (pid {st['pid']}) resumed: {res.get('summary', '')}")

    @app.command("install-service")
    def install_service(
        enable: bool = typer.Option(False, "--enable", help="Also `systemctl enable --now netlimitd`."),
        root: Path = typer.Option(Path("/"), "--root", help="Install into this root file system (staging)."),
    ) -> None:
        """Install the systemd units and a starter /etc/netlimit/netlimit.yaml, then daemon-reload."""
        from ..install import install

        if os.geteuid() != 0 and root == Path("/"):
            err("netlimit install-service: run as root (it writes /etc/systemd/system)")
            raise typer.Exit(EXIT_USAGE)
        raise typer.Exit(install(root=root, enable=enable, echo=typer.echo))


def _print_counters(rows: list[dict[str, Any]]) -> None:
    if not rows:
        typer.echo("  no objects owned by netlimit")
        return
    typer.echo(f"  {'rule':<24} {'layer':<9} {'packets':>12} {'bytes':>14} {'dropped':>10}  per-source entries")
    agg: dict[tuple[str, str], list[int]] = {}
    tables: dict[tuple[str, str], dict[str, int | None]] = {}
    for r in rows:
        key = (r["rule"], r["layer"])
        a = agg.setdefault(key, [0, 0, 0])
        a[0] += int(r.get("packets") or 0)
        a[1] += int(r.get("bytes") or 0)
        a[2] += int(r.get("dropped") or 0)
        if r.get("table"):  # a hashlimit / recent table or an nftables set: how many sources it tracks
            tables.setdefault(key, {})[r["table"]] = r.get("table_entries")
    for (rule, layer), (p, b, d) in agg.items():
        t = tables.get((rule, layer), {})
        entries = ", ".join(f"{name}: {'?' if n is None else n}" for name, n in t.items())
        typer.echo(f"  {rule:<24} {layer:<9} {p:>12} {b:>14} {d:>10}  {entries}".rstrip())
