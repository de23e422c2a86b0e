"""Writing HTTP/1.1 responses: status lines, the ``Date`` value, framing, and the
answers of the decision endpoints.

Every response the sidecar writes itself is framed by this module (its own
``Content-Length``, or ``Transfer-Encoding: chunked`` for a relayed body of
unknown length), never by passing bytes through.
"""

from __future__ import annotations

import json
import math
import time
from email.utils import formatdate
from http import HTTPStatus

from ..limit.headers import PROBLEM_TYPE, simple_problem

PROBLEM_CT = PROBLEM_TYPE + "; charset=utf-8"
JSON_CT = "application/json; charset=utf-8"
REASONS = {s.value: s.phrase for s in HTTPStatus} | {
    413: "Content Too Large",
    422: "Unprocessable Content",
}  # RFC 9110's names
_STATUS = {c: f"HTTP/1.1 {c} {p}\r\n".encode("latin-1") for c, p in REASONS.items()}
_ceil = math.ceil
_time = time.time

_date_at = 0
_date = b""


def http_date() -> bytes:
    """The ``Date`` value (RFC 9110 IMF-fixdate), formatted at most once a second."""
    global _date_at, _date
    now = int(_time())
    if now != _date_at:
        _date_at = now
        _date = formatdate(now, usegmt=True).encode("latin-1")
    return _date


def status_line(status: int) -> bytes:
    line = _STATUS.get(status)
    if line is None:
        line = f"HTTP/1.1 {status} {REASONS.get(status, 'Unknown')}\r\n".encode("latin-1")
    return line


def _connection(keep: bool, http10: bool) -> bytes:
    if not keep:
        return b"Connection: close\r\n"
    return b"Connection: keep-alive\r\n" if http10 else b""


def encode_headers(headers: dict[str, str] | list[tuple[str, str]]) -> bytes:
    """Header fields as bytes.  Characters outside Latin-1 become '?', and CR or LF
    in a value become spaces, so no field can end early (the values are ours or
    were parsed by llhttp, which refuses both; this is the last guard)."""
    items = headers.items() if isinstance(headers, dict) else headers
    out = []
    for k, v in items:
        if "\r" in v or "\n" in v:
            v = v.replace("\r", " ").replace("\n", " ")
        out.append(f"{k}: {v}\r\n".encode("latin-1", "replace"))
    return b"".join(out)


def response(
    status: int,
    headers: dict[str, str] | list[tuple[str, str]] | None = None,
    body: bytes = b"",
    content_type: str | None = None,
    *,
    keep: bool = True,
    http10: bool = False,
    head_only: bool = False,
) -> bytes:
    """A complete response with a body of known length (``Content-Length``)."""
    parts = [status_line(status)]
    if headers:
        parts.append(encode_headers(headers))
    if content_type and body:
        parts.append(f"Content-Type: {content_type}\r\n".encode("latin-1"))
    parts.append(b"Content-Length: %d\r\n" % len(body))
    parts.append(_connection(keep, http10))
    parts.append(b"Server: netlimit\r\nDate: " + http_date() + b"\r\n\r\n")
    if body and not head_only:
        parts.append(body)
    return b"".join(parts)


def problem(status: int, title: str, detail: str, headers: dict[str, str] | None = None, **kw: bool) -> bytes:
    """An RFC 9457 problem+json response."""
    return response(status, headers, simple_problem(status, title, detail).encode(), PROBLEM_CT, **kw)


def json_response(status: int, doc: object, headers: dict[str, str] | None = None, **kw: bool) -> bytes:
    return response(status, headers, json.dumps(doc, separators=(",", ":")).encode(), JSON_CT, **kw)


_RULE_TEXT: dict[tuple[str, str], tuple[bytes, bytes]] = {}
_OK_200 = (
    b"HTTP/1.1 200 OK\r\nX-RateLimit-Limit: %d\r\nX-RateLimit-Remaining: %d\r\nRateLimit-Policy: %s\r\n"
    b"RateLimit: %s;r=%d;t=%d\r\nContent-Length: 0\r\n%sServer: netlimit\r\nDate: %s\r\n\r\n"
)


def ok_decision(limit: int, remaining: int, reset: float, policy: str, sf_name: str, keep: bool, http10: bool) -> bytes:
    """The 200 of an admitted decision request: the same bytes :func:`response`
    writes with headers.rate_headers of that decision, without building them."""
    t = _ceil(reset - 1e-6) if reset > 0 else 0
    enc = _RULE_TEXT.get((policy, sf_name))
    if enc is None:  # a rule's texts, encoded once
        if len(_RULE_TEXT) >= 4096:
            _RULE_TEXT.clear()
        enc = _RULE_TEXT[(policy, sf_name)] = (
            policy.encode("latin-1", "replace"),
            sf_name.encode("latin-1", "replace"),
        )
    return _OK_200 % (
        limit,
        remaining,
        enc[0],
        enc[1],
        remaining,
        t,
        b"" if keep and not http10 else _connection(keep, http10),
        _date if int(_time()) == _date_at else http_date(),  # http_date's check, without its call
    )
