"""Access-log lines for the simulate tests, written from known events."""

from __future__ import annotations

import datetime as dt
import gzip
import json
from collections.abc import Iterable
from pathlib import Path

#: 2023-11-14T22:13:20Z
T0 = 1_700_000_000

MONTHS = ("Jan", "Feb", "Mar", "Apr", "May", "Jun", "Jul", "Aug", "Sep", "Oct", "Nov", "Dec")


def clf_time(t: float, offset_minutes: int = 0) -> str:
    """``14/Nov/2023:22:13:20 +0000`` for unix time ``t`` written in a zone ``offset_minutes`` east of UTC."""
    d = dt.datetime.fromtimestamp(int(t), dt.timezone(dt.timedelta(minutes=offset_minutes)))
    sign = "+" if offset_minutes >= 0 else "-"
    off = abs(offset_minutes)
    return f"{d.day:02d}/{MONTHS[d.month - 1]}/{d.year}:{d:%H:%M:%S} {sign}{off // 60:02d}{off % 60:02d}"


def combined(
    ip: str,
    t: float,
    path: str = "/",
    method: str = "GET",
    *,
    ua: str = "test-agent/1.0",
    referer: str = "-",
    status: int = 200,
    offset: int = 0,
    xff: str | None = None,
) -> str:
    line = f'{ip} - - [{clf_time(t, offset)}] "{method} {path} HTTP/1.1" {status} 512 "{referer}" "{ua}"'
    if xff is not None:
        line += f' "{xff}"'
    return line


def common(ip: str, t: float, path: str = "/", method: str = "GET", *, offset: int = 0) -> str:
    return f'{ip} - - [{clf_time(t, offset)}] "{method} {path} HTTP/1.1" 200 512'


def envoy(xff: str, t: float, path: str = "/", method: str = "GET", *, ua: str = "test-agent/1.0") -> str:
    stamp = dt.datetime.fromtimestamp(t, dt.UTC).strftime("%Y-%m-%dT%H:%M:%S.") + f"{int(t * 1000) % 1000:03d}Z"
    return (
        f'[{stamp}] "{method} {path} HTTP/1.1" 200 - 0 12 3 2 "{xff}" "{ua}" '
        f'"0f6c3a5e-aaaa-bbbb-cccc-123456789abc" "api.example" "10.1.2.3:8080"'
    )


def jsonl(**fields: object) -> str:
    return json.dumps(fields)


def write(path: Path, lines: Iterable[str], *, gz: bool = False) -> Path:
    data = "".join(line + "\n" for line in lines).encode()
    path.write_bytes(gzip.compress(data) if gz else data)
    return path


def three_abusers(seconds: int = 60) -> list[tuple[float, str]]:
    """(time, client): three clients at 50 requests/s (all in each second's first
    instant, as a 1-second log stamps them) among a thousand at 0.1 requests/s."""
    ev: list[tuple[float, str]] = []
    for s in range(seconds):
        for a in range(3):
            ev += [(T0 + s, f"203.0.113.{a + 1}")] * 50
    for c in range(1000):
        for k in range(seconds // 10):
            ev.append((T0 + (c % 10) + 10 * k, f"10.0.{c // 256}.{c % 256}"))
    ev.sort(key=lambda e: e[0])
    return ev


def config(path: Path, body: str, domain: str = "t") -> Path:
    """A rules file: ``body`` is the http section after the domain line (indented 2)."""
    path.write_text(f"version: 1\nhttp:\n  domain: {domain}\n{body}")
    return path
