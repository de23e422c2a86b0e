"""`netlimit top`: a live view of one host, refreshed every second.

From netlimitd's status socket: per network rule packets/s and drops/s, per
bandwidth rule bytes/s against its configured rate, and the busiest per-source
entries of the kernel's tables (hashlimit buckets, recent lists, nftables sets).
From each sidecar's admin listener (GET /v1/top): HTTP hits/s and denials/s per
rule and the most denied descriptors. Rates are differences of counters between
two samples, so the first screen shows counts and the next ones rates.

On a terminal it is a rich Live view that quits on `q` or Ctrl-C; otherwise (a
pipe, a log) it prints plain lines once per interval.
"""

from __future__ import annotations

import json
import os
import select
import sys
import time
import urllib.request
from dataclasses import dataclass, field
from typing import Any

import typer

from .statusclient import DEFAULT_SOCKET, query_status

MAX_ROWS = 15  # rows per table: the busiest


@dataclass
class Sample:
    t: float
    rules: dict[tuple[str, str], tuple[int, int]] = field(default_factory=dict)  # (rule, layer) -> packets, drops
    tc: dict[str, int] = field(default_factory=dict)  # bandwidth rule -> bytes
    limits: dict[str, float] = field(default_factory=dict)  # bandwidth rule -> configured bytes/s
    hot: list[dict[str, Any]] = field(default_factory=list)
    http: dict[tuple[str, str], tuple[int, int]] = field(default_factory=dict)  # (sidecar, rule) -> hits, over
    denied: list[dict[str, Any]] = field(default_factory=list)
    problems: list[str] = field(default_factory=list)


def _tc_bytes(rows: list[dict[str, Any]]) -> dict[str, int]:
    """Bytes per bandwidth rule: its classes' counters (HTB), else its qdiscs' (TBF)."""
    by: dict[str, dict[str, int]] = {}
    for r in rows:
        if r.get("layer") == "tc" and r.get("rule") and r.get("kind") in ("class", "qdisc"):
            k = by.setdefault(r["rule"], {"class": 0, "qdisc": 0})
            k[r["kind"]] += int(r.get("bytes") or 0)
    return {rule: k["class"] or k["qdisc"] for rule, k in by.items()}


def take(socket_path: str, sidecars: list[str], token: bytes | None = None) -> Sample:
    s = Sample(time.monotonic())
    try:
        st = query_status(socket_path, timeout=3.0)
    except (OSError, ValueError) as exc:
        st = None
        s.problems.append(f"netlimitd on {socket_path}: {exc or 'no answer'}")
    if st is None and not any("netlimitd" in p for p in s.problems) and not sidecars:
        s.problems.append(f"no netlimitd answers on {socket_path}")
    if st:
        for r in st.get("counters", []):
            if r.get("layer") == "tc":
                continue
            k = (r.get("rule") or "(jump)", r["layer"])
            p, d = s.rules.get(k, (0, 0))
            s.rules[k] = (p + int(r.get("packets") or 0), d + int(r.get("dropped") or 0))
        s.tc = _tc_bytes(st.get("counters", []))
        s.limits = st.get("bandwidth", {})
        s.hot = st.get("hot", [])
        if st.get("counters_error"):
            s.problems.append(f"netlimitd: {st['counters_error']}")
    for url in sidecars:
        try:
            req = urllib.request.Request(url.rstrip("/") + "/v1/top")
            if token is not None:  # the sidecar's --admin-token-file
                req.add_header("Authorization", "Bearer " + token.decode("ascii"))
            with urllib.request.urlopen(req, timeout=3.0) as resp:
                doc = json.loads(resp.read(1 << 20))
        except (OSError, ValueError) as exc:
            s.problems.append(f"sidecar {url}: {exc}")
            continue
        name = url.split("//", 1)[-1].rstrip("/")
        for r in doc.get("rules", []):
            s.http[(name, f"{r['domain']}/{r['rule']}")] = (int(r["hits"]), int(r["over"]))
        s.denied += [d | {"sidecar": name} for d in doc.get("denied", [])]
    return s


def _rate(cur: int, prev: int | None, dt: float) -> float | None:
    return None if prev is None or dt <= 0 else max(0, cur - prev) / dt


@dataclass
class View:
    """What one screen shows: rows of each table, rates where a previous sample exists."""

    rules: list[tuple[str, str, float | None, float | None, int, int]]  # rule, layer, pps, drops/s, packets, drops
    bandwidth: list[tuple[str, float | None, float | None]]  # rule, bytes/s, configured bytes/s
    http: list[tuple[str, str, float | None, float | None, int, int]]  # sidecar, rule, hits/s, denied/s, hits, over
    hot: list[dict[str, Any]]
    denied: list[dict[str, Any]]
    problems: list[str]


def view(prev: Sample | None, cur: Sample) -> View:
    dt = cur.t - prev.t if prev else 0.0
    rules = []
    for (rule, layer), (p, d) in cur.rules.items():
        pp = prev.rules.get((rule, layer)) if prev else None
        rules.append((rule, layer, _rate(p, pp[0] if pp else None, dt), _rate(d, pp[1] if pp else None, dt), p, d))
    rules.sort(key=lambda r: (-(r[3] or 0), -(r[2] or 0), r[0]))
    bw = [
        (rule, _rate(b, prev.tc.get(rule) if prev else None, dt), cur.limits.get(rule))
        for rule, b in sorted(cur.tc.items())
    ]
    http = []
    for (sc, rule), (h, o) in cur.http.items():
        ph = prev.http.get((sc, rule)) if prev else None
        http.append((sc, rule, _rate(h, ph[0] if ph else None, dt), _rate(o, ph[1] if ph else None, dt), h, o))
    http.sort(key=lambda r: (-(r[3] or 0), -(r[2] or 0), r[1]))
    denied = sorted(cur.denied, key=lambda d: -d["count"])
    return View(rules[:MAX_ROWS], bw[:MAX_ROWS], http[:MAX_ROWS], cur.hot[:MAX_ROWS], denied[:MAX_ROWS], cur.problems)


def _num(x: float | None, unit: str = "/s") -> str:
    if x is None:
        return "…"
    for div, suffix in ((1e9, "G"), (1e6, "M"), (1e3, "k")):
        if x >= div:
            return f"{x / div:.1f}{suffix}{unit}"
    return f"{x:.0f}{unit}" if x >= 10 or x == 0 else f"{x:.1f}{unit}"


def render(v: View, interval: float):
    from rich import box
    from rich.console import Group
    from rich.table import Table as _Table
    from rich.text import Text

    def Table(**kw):  # noqa: N802 - compact: a header rule only, so more rows fit a small terminal
        return _Table(box=box.SIMPLE_HEAD, **kw)

    parts: list[Any] = [
        Text(f"netlimit top — {time.strftime('%H:%M:%S')} — every {interval:g} s — q quits", style="bold")
    ]
    for problem in v.problems:
        parts.append(Text(problem, style="red"))
    t = Table(title="network rules (kernel)", title_justify="left")
    for c in ("rule", "layer", "packets/s", "drops/s", "packets", "drops"):
        t.add_column(c, justify="left" if c in ("rule", "layer") else "right")
    for rule, layer, pps, dps, p, d in v.rules:
        t.add_row(rule, layer, _num(pps), _num(dps), str(p), str(d), style="red" if dps else None)
    parts.append(t)
    if v.bandwidth:
        t = Table(title="bandwidth (tc)", title_justify="left")
        for c in ("rule", "sent", "configured", "use"):
            t.add_column(c, justify="left" if c == "rule" else "right")
        for rule, bps, lim in v.bandwidth:
            use = f"{bps / lim:.0%}" if bps is not None and lim else "…"
            t.add_row(rule, _num(None if bps is None else bps * 8, "bit/s"), _num(lim and lim * 8, "bit/s"), use)
        parts.append(t)
    if v.http:
        t = Table(title="HTTP rules (sidecars)", title_justify="left")
        for c in ("sidecar", "rule", "hits/s", "denied/s", "hits", "denied"):
            t.add_column(c, justify="left" if c in ("sidecar", "rule") else "right")
        for sc, rule, hps, ops, h, o in v.http:
            t.add_row(sc, rule, _num(hps), _num(ops), str(h), str(o), style="red" if ops else None)
        parts.append(t)
    if v.hot:
        t = Table(title="busiest sources in the kernel's tables", title_justify="left")
        for c in ("rule", "table", "source", "state"):
            t.add_column(c)
        for entry in v.hot:
            t.add_row(entry["rule"], entry["table"], entry["source"], entry["detail"])
        parts.append(t)
    if v.denied:
        t = Table(title="most denied HTTP clients (approximate counts)", title_justify="left")
        for c in ("sidecar", "rule", "descriptor", "denied"):
            t.add_column(c, justify="right" if c == "denied" else "left")
        for den in v.denied:
            t.add_row(den["sidecar"], den["rule"], den["key"], str(den["count"]))
        parts.append(t)
    return Group(*parts)


def plain(v: View) -> list[str]:
    """One line per row, for a pipe or a log."""
    ts = time.strftime("%H:%M:%S")
    out = [f"{ts} problem: {p}" for p in v.problems]
    out += [f"{ts} rule {r} {ly}: {_num(pps)} packets, {_num(dps)} drops" for r, ly, pps, dps, _p, _d in v.rules]
    for r, b, lim in v.bandwidth:
        out.append(f"{ts} bandwidth {r}: {_num(b and b * 8, 'bit/s')} of {_num(lim and lim * 8, 'bit/s')}")
    out += [f"{ts} http {sc} {r}: {_num(h)} hits, {_num(o)} denied" for sc, r, h, o, _h, _o in v.http]
    out += [f"{ts} hot {h['rule']} {h['table']} {h['source']}: {h['detail']}" for h in v.hot]
    out += [f"{ts} denied {d['sidecar']} {d['rule']} {d['key']}: {d['count']}" for d in v.denied]
    return out


def _wait_key(interval: float) -> str:
    """Wait up to `interval` s for a key on stdin (cbreak mode); '' if none."""
    r, _, _ = select.select([sys.stdin], [], [], interval)
    return os.read(sys.stdin.fileno(), 16).decode(errors="replace") if r else ""


def run(socket_path: str, sidecars: list[str], interval: float, count: int | None, token: bytes | None = None) -> int:
    prev: Sample | None = None
    n = 0
    if not sys.stdout.isatty():
        try:
            while count is None or n < count:
                cur = take(socket_path, sidecars, token)
                for line in plain(view(prev, cur)):
                    print(line, flush=True)
                prev, n = cur, n + 1
                if count is None or n < count:
                    time.sleep(interval)
        except KeyboardInterrupt:  # Ctrl-C ends a piped view as it ends the live one: quietly
            pass
        except BrokenPipeError:  # `netlimit top | head`: the reader is gone
            sys.stderr.close()
        return 0
    import termios
    import tty

    from rich.console import Console
    from rich.live import Live

    fd = sys.stdin.fileno()
    old = termios.tcgetattr(fd) if sys.stdin.isatty() else None
    try:
        if old is not None:
            tty.setcbreak(fd)
        with Live(console=Console(), screen=True, auto_refresh=False) as live:
            while count is None or n < count:
                cur = take(socket_path, sidecars, token)
                live.update(render(view(prev, cur), interval), refresh=True)
                prev, n = cur, n + 1
                deadline = time.monotonic() + interval
                while (left := deadline - time.monotonic()) > 0:
                    if old is None:
                        time.sleep(left)
                        continue
                    key = _wait_key(left)
                    if "q" in key.lower():
                        return 0
    except KeyboardInterrupt:
        return 0
    finally:
        if old is not None:
            termios.tcsetattr(fd, termios.TCSADRAIN, old)
    return 0


def register(app: typer.Typer) -> None:
    @app.command()
    def top(
        socket_path: str = typer.Option(DEFAULT_SOCKET, "--socket", help="netlimitd's status socket (as `status`)."),
        sidecar: list[str] = typer.Option(
            [], "--sidecar", help="A sidecar's admin URL, e.g. http://127.0.0.1:8182 (repeatable)."
        ),
        interval: float = typer.Option(1.0, "--interval", min=0.2, max=60.0, help="Seconds between refreshes."),
        count: int | None = typer.Option(None, "--count", min=1, help="Stop after this many refreshes."),
        admin_token_file: str | None = typer.Option(
            None, "--admin-token-file", help="The sidecars' --admin-token-file (sent as a bearer token)."
        ),
    ) -> None:
        """A live view of this host: rules' packets, drops and bandwidth, HTTP denials,
        the busiest sources. Quits on q or Ctrl-C; plain lines when not on a terminal."""
        token = None
        if admin_token_file is not None:  # the sidecar checked the file's contents at its start
            try:
                with open(admin_token_file, "rb") as f:
                    token = f.read(4096).strip()
                token.decode("ascii")
            except (OSError, UnicodeDecodeError) as exc:
                typer.echo(f"netlimit top: --admin-token-file {admin_token_file}: {exc}", err=True)
                raise typer.Exit(64) from None
        raise typer.Exit(run(socket_path, sidecar, interval, count, token))
