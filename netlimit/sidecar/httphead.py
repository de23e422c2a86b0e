"""What the sidecar's HTTP fast paths (decision endpoints and proxy) do per
request besides deciding: parse the request head -- what they serve themselves
must be unambiguous HTTP/1.x, anything else goes to aiohttp whole -- and format
the common 200.

``parse_request(buf, hs=None)`` returns

* ``None`` while the head at the start of ``buf`` is incomplete;
* ``False`` when aiohttp must decide: a head longer than :data:`MAX_HEAD`, a bare
  CR or LF anywhere in it, a request line that is not ``METHOD TARGET HTTP/1.1``
  (or ``HTTP/1.0``), a field line that is not ``token: value`` (no colon, obsolete
  line folding, whitespace or any other non-token character in the name), or a
  repeated ``Content-Length`` / ``Transfer-Encoding`` / ``Host``, which is
  ambiguous about where the request ends (request smuggling; aiohttp refuses it
  with a 400);
* else ``(end, method, target, http10, fields)``: ``buf[end:end + 4]`` is the
  blank line, ``fields`` maps each lowercase field name to its first value (as
  ``CIMultiDict.get``), surrounding blanks and tabs stripped; when ``hs`` is a
  list, every field is appended to it as ``(name, value, lowercase name)``.

``parse_check(buf)`` is parse_request for the decision endpoints: ``False`` also
for anything they do not serve themselves (another path, ``/v1/check`` but not
GET or HEAD, a body, ``Transfer-Encoding``, ``Upgrade``), else ``(rest, kind,
method, target, query, keep, http10, fields)`` with ``rest`` the bytes after the
head, ``kind`` 0 for ``/v1/check`` and 1 for ``/v1/authz[/...]`` and ``keep``
whether the connection stays open (HTTP/1.1 unless ``Connection: close``,
HTTP/1.0 only with ``Connection: keep-alive``).

``ok_response(rule, decision, conn)`` is the whole 200 of an admitted decision
request, rate fields and ``Date`` included, as the general path (headers.py's
rate_headers and FastCheckProtocol._send) would write it; ``conn`` 0 for
HTTP/1.1 keep-alive, 1 for HTTP/1.0 keep-alive, 2 for close.  ``None`` for what
it does not format (a limit or remaining that is not an int, a reset that is not
a float or is too large, text that is not Latin-1): the caller takes the
general path.  ``http_date()`` is the ``Date`` value, formatted once a second.

Two implementations give the same answers: C (``_httphead.c``, built with the
package when a compiler is there; a decision request costs 39k instead of 65k
instructions with it, which is what lets one sidecar process answer half as many
decision requests as an nginx worker) and the ``py_*`` functions below.
``tests/sidecar/test_httphead.py`` holds them to the same answers on explicit,
generated and mutated input.  ``NETLIMIT_NO_EXTENSIONS=1`` forces the Python
ones; :data:`IMPLEMENTATION` says which are in use.
"""

from __future__ import annotations

import math
import os
import time
from email.utils import formatdate

__all__ = [
    "IMPLEMENTATION",
    "MAX_HEAD",
    "http_date",
    "ok_response",
    "parse_check",
    "parse_request",
    "py_http_date",
    "py_ok_response",
    "py_parse_check",
    "py_parse_request",
]

MAX_HEAD = 8190  # request line + fields, as aiohttp's default

_FRAMING = ("content-length", "transfer-encoding", "host")
_TCHAR = frozenset("!#$%&'*+-.^_`|~0123456789abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ")


def py_parse_request(buf: bytes, hs: list | None = None):
    """The Python implementation of :func:`parse_request`."""
    end = buf.find(b"\r\n\r\n")
    if end < 0:
        if len(buf) > MAX_HEAD or b"\n\n" in buf or b"\n\r\n" in buf:
            return False
        return None
    if end > MAX_HEAD:
        return False
    head = buf[:end].decode("latin-1")
    n = head.count("\r\n")
    if head.count("\n") != n or head.count("\r") != n:
        return False
    lines = head.split("\r\n")
    parts = lines[0].split(" ")
    if len(parts) != 3:
        return False
    method, target, version = parts
    if version == "HTTP/1.1":
        http10 = False
    elif version == "HTTP/1.0":
        http10 = True
    else:
        return False
    h: dict[str, str] = {}
    for i in range(1, len(lines)):
        line = lines[i]
        name, sep, value = line.partition(":")
        if not sep or not name or not _TCHAR.issuperset(name):
            return False
        k = name.lower()
        value = value.strip(" \t")
        if k not in h:  # the first occurrence wins, as CIMultiDict.get
            h[k] = value
        elif k in _FRAMING:
            return False
        if hs is not None:
            hs.append((name, value, k))
    return end, method, target, http10, h


def py_parse_check(buf: bytes):
    """The Python implementation of :func:`parse_check`."""
    r = py_parse_request(buf)
    if not r:
        return r
    end, method, target, http10, h = r
    q = target.find("?")
    path = target if q < 0 else target[:q]
    if path == "/v1/check":
        if method != "GET" and method != "HEAD":
            return False
        kind = 0
    elif path.startswith("/v1/authz") and (len(path) == 9 or path[9] == "/"):
        kind = 1
    else:
        return False
    if h.get("content-length", "0") != "0" or "transfer-encoding" in h or "upgrade" in h:
        return False
    conn = h.get("connection")
    if conn is None:
        keep = not http10
    elif http10:
        keep = "keep-alive" in conn.lower()
    else:
        keep = "close" not in conn.lower()
    return buf[end + 4 :], kind, method, target, "" if q < 0 else target[q + 1 :], keep, http10, h


_date_cache: list = [-1, ""]


def py_http_date() -> str:
    """The Python implementation of :func:`http_date`."""
    now = int(time.time())
    if now != _date_cache[0]:
        _date_cache[1] = formatdate(now, usegmt=True)
        _date_cache[0] = now
    return _date_cache[1]


_CONN = (
    "Content-Length: 0\r\nServer: netlimit\r\nDate: ",
    "Content-Length: 0\r\nConnection: keep-alive\r\nServer: netlimit\r\nDate: ",
    "Content-Length: 0\r\nConnection: close\r\nServer: netlimit\r\nDate: ",
)
_ceil = math.ceil


def py_ok_response(rule, decision, conn: int) -> bytes | None:
    """The Python implementation of :func:`ok_response`."""
    if not 0 <= conn <= 2:
        raise ValueError("ok_response(): conn must be 0, 1 or 2")
    policy, sf_name = rule.policy, rule.sf_name
    limit, remaining, reset = decision.limit, decision.remaining, decision.reset
    if (
        limit.__class__ is not int
        or remaining.__class__ is not int
        or reset.__class__ is not float
        or not isinstance(policy, str)
        or not isinstance(sf_name, str)
    ):
        return None
    t = 0
    if reset > 0:
        x = reset - 1e-6  # as headers.rate_headers
        if not x < 8.9e18:
            return None
        t = _ceil(x)
    try:
        return (
            f"HTTP/1.1 200 OK\r\nX-RateLimit-Limit: {limit}\r\nX-RateLimit-Remaining: {remaining}\r\n"
            f"RateLimit-Policy: {policy}\r\nRateLimit: {sf_name};r={remaining};t={t}\r\n"
            f"{_CONN[conn]}{py_http_date()}\r\n\r\n"
        ).encode("latin-1")
    except UnicodeEncodeError:
        return None


IMPLEMENTATION = "python"
parse_request = py_parse_request
parse_check = py_parse_check
ok_response = py_ok_response
http_date = py_http_date
if not os.environ.get("NETLIMIT_NO_EXTENSIONS"):
    try:
        from ._httphead import http_date, ok_response, parse_check, parse_request  # type: ignore[no-redef]

        IMPLEMENTATION = "c"
    except ImportError:  # not built (no compiler at install time): the Python ones
        pass
