"""The request head: what llhttp parsed (:class:`Request`), the field tables
its callbacks consult, and what nginx refuses that llhttp lets through
(:func:`check_head`: one Host, HTTP/1.x, Transfer-Encoding, the form of the
target, the escapes and dot segments of the path).  A refusal is a
:class:`ClientError`."""

from __future__ import annotations

import re
from typing import TYPE_CHECKING
from urllib.parse import unquote

from .limits import ClientError

if TYPE_CHECKING:
    from .body import Body

#: field names as sent -> (lower-case text, what on_header checks: see SPECIAL);
#: names repeat, so each is decoded and looked up once
NAMES: dict[bytes, tuple[str, tuple[int, bool, int] | None]] = {}


def field_name(raw: bytes) -> tuple[str, tuple[int, bool, int] | None]:
    """A field name's lower-case text and its SPECIAL entry, remembered in NAMES."""
    if len(NAMES) >= 4096:  # clients choose names: bounded
        NAMES.clear()
    lname = raw.decode("latin-1").lower()
    info = NAMES[raw] = (lname, SPECIAL.get(lname))
    return info


#: per set of wanted names (Handler.wanted): field names as sent that on_header only
#: collects (no SPECIAL entry) -> their lower-case text if wanted, "" if not; learnt
#: by on_header's general path, so the usual field costs one lookup
_PLAIN: dict[frozenset[str], dict[bytes, str]] = {}


def plain_names(wanted: frozenset[str] | None) -> dict[bytes, str]:
    """The table of plain field names for ``wanted`` (None, every field collected
    as sent: an empty table, never learnt into)."""
    if wanted is None:
        return {}
    table = _PLAIN.get(wanted)
    if table is None:
        if len(_PLAIN) >= 64:  # one per reload at most: bounded anyway
            _PLAIN.clear()
        table = _PLAIN[wanted] = {}
    return table


class Request:
    """One parsed request head (and its body, if any)."""

    __slots__ = (
        "method",
        "target",
        "path",
        "query",
        "http10",
        "headers",
        "fields",
        "keep",
        "expect_continue",
        "continued",
        "body",
        "error",
        "_url",
        "_size",
        "_seen",
        "_dup",
        "xff",
    )

    def __init__(self) -> None:
        self.method = ""
        self.target = ""
        self.path = ""  # origin-form path (absolute-form: its path), without the query
        self.query = ""
        self.http10 = False
        self.headers: list[tuple[str, str]] = []  # every field as sent (when the handler wants them all)
        #: lower-case name -> the value of its FIRST field line (what Starlette, Go's
        #: Header.Get and Java's getHeader read, and nginx 1.22's $http_<name>: a header
        #: action keys on it, so repeating a field makes no new key); Transfer-Encoding
        #: alone is joined (framing: every line counts)
        self.fields: dict[str, str] = {}
        #: every X-Forwarded-For line joined with ", " (RFC 9110 §5.3: one list; the
        #: client is its right-most untrusted address), None without one
        self.xff: str | None = None
        self.keep = True
        self.expect_continue = False
        self.continued = False
        self.body: Body | None = None
        self.error: ClientError | None = None
        self._url = b""
        self._size = 0
        self._seen = 0  # the fields of _UNIQUE seen (their bits, see SPECIAL)
        self._dup = ""  # one of them seen twice


def check_head(req: Request, max_headers: int, version: str) -> ClientError | None:
    """What nginx refuses and llhttp lets through; the target split into path and query."""
    if req._size > max_headers:
        return ClientError(431, f"more than {max_headers} header fields")
    if version != "1.1" and version != "1.0":  # llhttp also takes 0.9 and 2.0
        if version >= "2":
            return ClientError(505, "HTTP/1.1 and HTTP/1.0 only")
        return ClientError(400, f"HTTP/{version} requests are not served")
    f = req.fields
    te = f.get("transfer-encoding")
    if te is not None and te.rstrip(" ").lower() != "chunked":  # nginx's rule; llhttp takes ",chunked" too
        return ClientError(501, "the only Transfer-Encoding understood is 'chunked'")
    if req._dup:
        return ClientError(400, f"a duplicate {req._dup!r} field")
    if req.http10:
        if te is not None:
            return ClientError(400, "Transfer-Encoding is not allowed in HTTP/1.0")
    elif not req._seen & HOST_BIT:
        return ClientError(400, "HTTP/1.1 requests need exactly one Host header")
    host = f.get("host")
    if host is not None:
        ok = _HOSTS_OK.get(host)
        if ok is None:
            if len(_HOSTS_OK) >= 1024:  # clients choose them: bounded
                _HOSTS_OK.clear()
            ok = _HOSTS_OK[host] = _valid_host(host.rstrip(" "))  # llhttp keeps trailing spaces, nginx drops them
        if not ok:
            return ClientError(400, "an invalid Host")
    if req.method == "CONNECT":
        return ClientError(405, "CONNECT is not allowed: this is a reverse proxy")
    known = _TARGETS.get(req._url)
    if known is None:  # targets repeat (an auth_request location asks for one): split and checked once
        known = _split_target(req._url.decode("latin-1"))
        if known[0] is None:  # a refusal is built anew each time (an exception object is not shared)
            if len(_TARGETS) >= 1024:  # clients choose them: bounded
                _TARGETS.clear()
            _TARGETS[req._url] = known
    err, req.target, req.path, req.query = known
    return err


#: request targets as sent -> what _split_target made of them
_TARGETS: dict[bytes, tuple[ClientError | None, str, str, str]] = {}


def _split_target(target: str) -> tuple[ClientError | None, str, str, str]:
    """A request target's refusal (None: served), the target, its path and query."""
    if target.startswith("/"):
        path = target
    elif target[:8].lower().startswith(("http://", "https://")):  # absolute-form (RFC 9112 §3.2.2): its path
        rest = target[target.index("//") + 2 :]
        cut = min((i for i in (rest.find("/"), rest.find("?")) if i >= 0), default=len(rest))
        authority = rest[:cut]
        if not _AUTHORITY.match(authority) or not _valid_host(authority):
            return (
                ClientError(400, "an absolute-form target needs a host name or address, no user information"),
                target,
                "",
                "",
            )
        path = rest[cut:] or "/"
        if path.startswith("?"):
            path = "/" + path
    elif target == "*":
        return ClientError(400, "asterisk-form targets (OPTIONS *) are not served"), target, "", ""
    else:
        return ClientError(400, "the request target must be a path (origin-form) or an absolute URL"), target, "", ""
    q = path.find("?")
    query = ""
    if q >= 0:
        path, query = path[:q], path[q + 1 :]
    # a '#fragment' (no client sends one, a hand-made request may): as nginx, the path
    # ends at '#' for matching and limiting (actions.path_of_uri) and the target is
    # forwarded as it came
    p = path
    if "#" in p:
        p = p.partition("#")[0]
    if "%" in p or "/." in p:
        return _check_path(p), target, path, query
    return None, target, path, query


_BAD_ESCAPE = re.compile(r"%(?![0-9A-Fa-f]{2})")
#: fields nginx refuses to see twice (ngx_http_process_unique_header_line, and Host);
#: llhttp already refuses a second Content-Length or Transfer-Encoding
_UNIQUE = frozenset(
    ("host", "if-modified-since", "if-unmodified-since", "if-match", "if-none-match", "content-range", "authorization")
)
#: fields nginx validates with a tab at either end of the value kept (it takes only
#: spaces for optional whitespace; llhttp, as RFC 9110, takes tabs too and drops them)
_EDGE_TAB = frozenset(("host", "content-length", "transfer-encoding"))
#: list fields whose repeated lines are joined: Transfer-Encoding in Request.fields
#: (framing), X-Forwarded-For in Request.xff (its first line stays in fields)
_JOINED, XFF = 1, 2
_LISTS = {"transfer-encoding": _JOINED, "x-forwarded-for": XFF}
#: what on_header checks beyond collecting, by field (one lookup for the usual field):
#: (the field's bit in Request._seen if it may appear once, whether tabs around its
#: value are refused, whether its lines are joined: _LISTS)
SPECIAL = {name: (1 << i if name in _UNIQUE else 0, name in _EDGE_TAB, _LISTS.get(name, 0))
            for i, name in enumerate(sorted({*_UNIQUE, *_EDGE_TAB, *_LISTS}))}  # fmt: skip
HOST_BIT = SPECIAL["host"][0]
_HOSTS_OK: dict[str, bool] = {}  # Host values checked (they repeat: checked once)
#: the authority of an absolute-form target, as nginx parses it: letters, digits, '.'
#: and '-' (or an IPv6 literal), then an optional port of digits
_AUTHORITY = re.compile(r"(?:[A-Za-z0-9.-]+|\[[0-9A-Fa-f:.]+\])(?::[0-9]*)?\Z")
_HOST_BAD = re.compile(r"[\x00-\x20\x7f/]|\.\.")


def edge_tab(raw: bytes, name: bytes) -> bool:
    """Whether the field line of ``name`` in ``raw`` has a tab at an end of its value."""
    n = re.escape(name)
    return re.search(rb"(?:^|\n)" + n + rb":(?: *\t|[^\r\n]*\t *\r)", raw) is not None


def _valid_host(host: str) -> bool:
    """nginx's ngx_http_validate_host: no control bytes, space, '/' or '..', and a
    name left once the port and a trailing dot are taken off."""
    if _HOST_BAD.search(host):
        return False
    if host.startswith("["):
        end = host.find("]")
        name = host[: end + 1] if end >= 0 else host
    else:
        name = host.split(":", 1)[0]
    return name not in ("", ".")


def _check_path(path: str) -> ClientError | None:
    """What nginx refuses in a path (400), so that the application never gets a
    request nginx would not forward: a ``%`` not followed by two hex digits, an
    encoded NUL, and dot segments that climb above the root once ``%XX`` is
    decoded (``%2f`` included) and repeated slashes are merged (``/../x``,
    ``/%2e%2e/x``, ``/a/../..``)."""
    if "%" in path:
        if _BAD_ESCAPE.search(path):
            return ClientError(400, "a malformed percent-encoding in the path")
        path = unquote(path, errors="surrogateescape")
        if "\x00" in path:
            return ClientError(400, "an encoded NUL in the path")
    if "/." in path:
        depth = 0
        for seg in path.split("/"):
            if seg == ".." and depth == 0:
                return ClientError(400, "the path climbs above the root")
            if seg == "..":
                depth -= 1
            elif seg and seg != ".":
                depth += 1
    return None
