"""Writing HTTP/1.1 responses: status lines, the ``Date`` value, framing, and the
one place a decision becomes an HTTP answer, for every HTTP door.

Every response the sidecar writes itself is framed by this module (its own
``Content-Length``, or ``Transfer-Encoding: chunked`` for a relayed body of
unknown length), never by passing bytes through.

A decision's answer -- its status (200, or the deny status), the rate headers
(``X-RateLimit-*``, ``RateLimit``, ``RateLimit-Policy``, and ``Retry-After``
when denied: the engine's limit/headers.py says what they hold) and the
problem+json body naming the rule -- is built here for nginx ``auth_request``
and Envoy ``ext_authz`` (:func:`decision_reply`, :func:`ok_decision` for the
common admitted case), the JSON API (:func:`json_decision`) and the proxy's 429
(:func:`decision_reply`); the doors only count and choose.
"""

from __future__ import annotations

import json
import math
import time
from email.utils import formatdate
from http import HTTPStatus

from ..limit.headers import PROBLEM_HEADER, PROBLEM_TYPE, problem_body, rate_headers, simple_problem
from ..limit.limiter import OVER_LIMIT, CheckResult
from .json_api import result_json

PROBLEM_CT = PROBLEM_TYPE + "; charset=utf-8"
JSON_CT = "application/json; charset=utf-8"
REASONS = {s.value: s.phrase for s in HTTPStatus} | {
    413: "Content Too Large",
    422: "Unprocessable Content",
}  # RFC 9110's names
_STATUS = {c: f"HTTP/1.1 {c} {p}\r\n".encode("latin-1") for c, p in REASONS.items()}
#: the longest a leaky bucket in queue mode holds a request
MAX_DELAY = 60.0
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


#: per rule (limit, policy, name): the fixed bytes around an admitted decision's numbers
_RULE_TEXT: dict[tuple[int, str, str], tuple[bytes, bytes]] = {}
#: by keep * 2 + http10: what follows the numbers, with the ``Date`` of _tail_at
_TAIL: list[bytes | None] = [None] * 4
_tail_at = -1


def ok_decision(limit: int, remaining: int, reset: float, policy: str, sf_name: str, keep: bool, http10: bool) -> bytes:
    """The 200 of an admitted decision request: the same bytes :func:`response`
    writes with headers.rate_headers of that decision, without building them: the
    rule's fixed text is encoded once, the tail (framing, ``Date``) once a second,
    and only the two numbers are formatted per answer."""
    global _tail_at
    t = _ceil(reset - 1e-6) if reset > 0 else 0
    enc = _RULE_TEXT.get((limit, policy, sf_name))
    if enc is None:  # a rule's texts, encoded once
        if len(_RULE_TEXT) >= 4096:
            _RULE_TEXT.clear()
        enc = _RULE_TEXT[(limit, policy, sf_name)] = (
            b"HTTP/1.1 200 OK\r\nX-RateLimit-Limit: %d\r\nX-RateLimit-Remaining: " % limit,
            b"\r\nRateLimit-Policy: " + policy.encode("latin-1", "replace") + b"\r\nRateLimit: "
            + sf_name.encode("latin-1", "replace") + b";r=",
        )  # fmt: skip
    if int(_time()) != _tail_at:  # a new second: a new Date
        date = http_date()
        _TAIL[:] = (None, None, None, None)
        _tail_at = _date_at
    else:
        date = _date
    i = keep * 2 + http10
    tail = _TAIL[i]
    if tail is None:
        tail = _TAIL[i] = (
            b"\r\nContent-Length: 0\r\n" + _connection(keep, http10) + b"Server: netlimit\r\nDate: " + date
            + b"\r\n\r\n"
        )  # fmt: skip
    return b"%s%d%s%d;t=%d%s" % (enc[0], remaining, enc[1], remaining, t, tail)


class Reply:
    """A decision's answer, before it is written (a leaky bucket in queue mode
    answers after ``delay`` seconds, with the ``Date`` of then)."""

    __slots__ = ("status", "headers", "body", "delay")

    def __init__(self, status: int, headers: dict[str, str], body: str = "", delay: float = 0.0):
        self.status = status
        self.headers = headers
        self.body = body  # a problem+json document, or "" (no body)
        self.delay = delay  # leaky bucket queue mode: answer after this many seconds

    def encode(self, keep: bool, http10: bool, head_only: bool = False) -> bytes:
        if self.body:
            return response(
                self.status, self.headers, self.body.encode(), PROBLEM_CT, keep=keep, http10=http10,
                head_only=head_only,
            )  # fmt: skip
        return response(self.status, self.headers, keep=keep, http10=http10)


def decision_reply(result: CheckResult, deny_status: int = 429, *, nginx: bool = False) -> Reply:
    """The answer to a decision: 200 with the rate headers (after the queue delay
    of a leaky bucket), or ``deny_status`` with them, ``Retry-After`` and the
    problem body naming the rule.  ``nginx``: the body (as a 429's) also in
    ``X-Netlimit-Problem``, since auth_request cannot read the body of its
    subrequest."""
    headers = rate_headers(result)
    if result.code == OVER_LIMIT:
        body = problem_body(result, deny_status)
        if nginx:
            headers[PROBLEM_HEADER] = body if deny_status == 429 else problem_body(result, 429)
        return Reply(deny_status, headers, body)
    return Reply(200, headers, "", min(result.delay, MAX_DELAY))


def json_decision(result: CheckResult, *, keep: bool, http10: bool) -> bytes:
    """The JSON API's answer (json_api.py: Lyft's /json shape): 200 or 429, the rate headers."""
    return response(
        429 if result.code == OVER_LIMIT else 200,
        rate_headers(result),
        json.dumps(result_json(result), separators=(",", ":")).encode(),
        JSON_CT,
        keep=keep,
        http10=http10,
    )
