"""Access logs in, requests out: ``(time, client address, method, target, headers)``.

Formats (``FORMATS``; :func:`detect` picks one from a file's first lines):

* ``combined`` -- nginx's and Apache's combined format
  (``$remote_addr - $remote_user [$time_local] "$request" $status $bytes
  "$http_referer" "$http_user_agent"``), optionally followed by nginx's
  ``"$http_x_forwarded_for"`` (its stock ``main`` format) and more fields;
* ``common`` -- the same without referer and user agent;
* ``json`` -- one JSON object per line; ``--field role=name,...`` maps the
  fields (roles: ``ts``, ``ip``, ``method``, ``path``, ``request``; any other
  role is a request header), and the usual nginx / Envoy field names are found
  without a mapping;
* ``envoy`` -- Envoy's default access-log format.  It records no peer
  address: the client is the last ``X-Forwarded-For`` hop (the address Envoy
  appends with ``use_remote_address``), and ``trusted_proxies`` walks further
  left as the sidecar does.

Times keep the zone they are written with; a time written without one is read
in ``tz`` (UTC by default).  A line that cannot be read becomes a reason (a
``str``) instead of a request, never an exception.  Files may be gzip'ed
(recognised by their first bytes, not their name); ``-`` is stdin.  Lines are
read in chunks and bounded (:data:`MAX_LINE`).
"""

from __future__ import annotations

import codecs
import datetime as dt
import gzip
import io
import json
import math
import os
import re
import sys
import zlib
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, cast
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

from ..errors import NetlimitError
from ..limit.actions import parse_ip

FORMATS = ("combined", "common", "json", "envoy")
#: a longer line is not a request (counted as unreadable, never held whole)
MAX_LINE = 64 * 1024
#: lines :func:`detect` looks at
DETECT_LINES = 50

#: one request: (unix time, client address, method, request target, headers by lower-case name)
Request = tuple[float, str, str, str, Mapping[str, str]]
#: what a parser returns: a request, or why the line is not one
Parsed = Request | str

_NO_HEADERS: Mapping[str, str] = {}


class LogError(NetlimitError):
    """A log that cannot be read at all (no such file, unknown format, a bad
    ``--field``); the message names the file."""


# --------------------------------------------------------------------------- time


_MONTHS = {
    m: i + 1 for i, m in enumerate(["Jan", "Feb", "Mar", "Apr", "May", "Jun", "Jul", "Aug", "Sep", "Oct", "Nov", "Dec"])
}


def timezone(name: str) -> dt.tzinfo:
    """``UTC``, ``local``, an offset like ``+02:00`` / ``-0700``, or an IANA name."""
    if name.upper() in ("UTC", "Z", "GMT"):
        return dt.UTC
    if name == "local":
        local = dt.datetime.now().astimezone().tzinfo
        assert local is not None
        return local
    m = re.fullmatch(r"([+-])(\d\d):?(\d\d)", name)
    if m:
        off = dt.timedelta(hours=int(m.group(2)), minutes=int(m.group(3)))
        return dt.timezone(-off if m.group(1) == "-" else off)
    try:
        return ZoneInfo(name)
    except (ZoneInfoNotFoundError, ValueError):
        raise LogError(
            f"unknown time zone {name!r}: say UTC, local, an offset like +02:00, or a name like Europe/Paris"
        ) from None


class ClfTime:
    """``10/Oct/2000:13:55:36 -0700`` (nginx ``$time_local``, Apache ``%t``) -> unix
    time.  The date and hour are computed once per hour and zone (a dict), the
    minutes and seconds per line; the last answer is kept for lines of the same second."""

    __slots__ = ("_hours", "_tz", "_last", "_last_t")

    def __init__(self, tz: dt.tzinfo = dt.UTC):
        self._hours: dict[str, float] = {}
        self._tz = tz
        self._last = ""
        self._last_t = 0.0

    def __call__(self, s: str) -> float:
        if s == self._last:
            return self._last_t
        n = len(s)
        if not (n == 26 or n == 20) or s[14] != ":" or s[17] != ":":
            raise ValueError(s)
        hk = s[:14] + s[20:]
        base = self._hours.get(hk)
        if base is None:
            base = self._hour(s)
        mm = s[15:17]
        ss = s[18:20]
        if not (mm.isdigit() and ss.isdigit()):
            raise ValueError(s)
        m = int(mm)
        sec = int(ss)
        if m > 59 or sec > 60:
            raise ValueError(s)
        t = base + (m * 60 + sec)
        self._last = s
        self._last_t = t
        return t

    def _hour(self, s: str) -> float:
        if s[2] != "/" or s[6] != "/" or s[11] != ":" or not (s[:2] + s[7:11] + s[12:14]).isdigit():
            raise ValueError(s)
        mon = _MONTHS.get(s[3:6])
        if mon is None:
            raise ValueError(s)
        tz: dt.tzinfo = self._tz
        if len(s) == 26:
            z = s[21:]
            if s[20] != " " or z[0] not in "+-" or not z[1:].isdigit():
                raise ValueError(s)
            off = dt.timedelta(hours=int(z[1:3]), minutes=int(z[3:5]))
            tz = dt.timezone(-off if z[0] == "-" else off)
        base = dt.datetime(int(s[7:11]), mon, int(s[:2]), int(s[12:14]), tzinfo=tz).timestamp()
        if len(self._hours) >= 4096:
            self._hours.clear()
        self._hours[s[:14] + s[20:]] = base
        return base


class AnyTime:
    """A logged time in any usual shape -> unix time: a number (seconds; milli- or
    microseconds when too large to be seconds), a CLF time, or ISO 8601 (with
    ``Z`` or an offset; without one, in ``tz``)."""

    __slots__ = ("_tz", "_clf", "_last", "_last_t")

    def __init__(self, tz: dt.tzinfo = dt.UTC):
        self._tz = tz
        self._clf = ClfTime(tz)
        self._last: Any = None
        self._last_t = 0.0

    def __call__(self, v: Any) -> float:
        if v == self._last and type(v) is type(self._last):
            return self._last_t
        if isinstance(v, bool):
            raise ValueError(v)
        if isinstance(v, (int, float)):
            t = _epoch(float(v))
        elif isinstance(v, str):
            s = v.strip()
            if s.startswith("[") and s.endswith("]"):
                s = s[1:-1]
            if not s:
                raise ValueError(v)
            if s[0].isdigit() and "/" in s[:3]:
                t = self._clf(s)
            elif s.replace(".", "", 1).isdigit():
                t = _epoch(float(s))
            else:
                d = dt.datetime.fromisoformat(s)
                if d.tzinfo is None:
                    d = d.replace(tzinfo=self._tz)
                t = d.timestamp()
        else:
            raise ValueError(v)
        self._last = v
        self._last_t = t
        return t


def _epoch(x: float) -> float:
    if not math.isfinite(x) or x < 0:
        raise ValueError(x)
    if x >= 1e14:  # microseconds
        return x / 1e6
    if x >= 1e11:  # milliseconds
        return x / 1e3
    return x


# --------------------------------------------------------------------------- formats


# a quoted field with backslash escapes (Apache writes \" inside; nginx \x22)
_Q = r'"([^"\\]*(?:\\.[^"\\]*)*)"'
_CLF = r'(\S+) \S+ (?:\S+|"[^"]*") \[([^\]]{1,40})\] ' + _Q + r" (\d{3}|-) (\d+|-)"
COMBINED_RE = re.compile(_CLF + " " + _Q + " " + _Q + r"(?: " + _Q + r")?(?: .*)?$")
COMMON_RE = re.compile(_CLF + r"$")
ENVOY_RE = re.compile(
    r"\[(\S+)\] "
    + _Q
    + r" (\d+|-) (\S+) (\d+|-) (\d+|-) (\d+|-) (\S+) "
    + _Q
    + " "
    + _Q
    + " "
    + _Q
    + " "
    + _Q
    # UPSTREAM_HOST, and whatever a format based on the default appends
    + r"(?: "
    + _Q
    + r")?(?: .*)?$"
)

#: the request headers each format records (lower-case names)
RECORDED: dict[str, frozenset[str]] = {
    "combined": frozenset(("referer", "user-agent", "x-forwarded-for")),
    "common": frozenset(),
    "envoy": frozenset(("x-forwarded-for", "user-agent", "x-request-id", "host")),
}


def split_request(line: str) -> tuple[str, str] | None:
    """``"GET /path HTTP/1.1"`` -> ``("GET", "/path")``; None for anything else."""
    parts = line.split(" ")
    n = len(parts)
    if n == 3 or n == 2:
        m, target = parts[0], parts[1]
    elif n > 3:  # a target with raw spaces (not HTTP, but logged as seen)
        m, target = parts[0], " ".join(parts[1:-1])
    else:
        return None
    if not m or not target or not m.isascii() or not m.isalpha():
        return None
    return m, target


@dataclass(frozen=True)
class Needs:
    """What the rules' actions read from a request: parsers skip the rest."""

    peer: bool = True
    request: bool = False  # method or path
    headers: frozenset[str] = frozenset()


def _clf_parser(regex: re.Pattern[str], fmt: str, needs: Needs, tz: dt.tzinfo) -> Callable[[str], Parsed]:
    """The parser of ``combined`` or ``common``: one compiled regex per line (a
    split-at-the-quotes fast path measured no faster once every separator is checked)."""
    match = regex.match
    clock = ClfTime(tz)
    combined = fmt == "combined"
    want = needs.headers & RECORDED[fmt]
    want_req = needs.request
    want_ref = "referer" in want
    want_ua = "user-agent" in want
    want_xff = "x-forwarded-for" in want
    no_headers = _NO_HEADERS

    last_ts = [""]  # the last time text and its value: most lines repeat it
    last_t = [0.0]

    def parse(line: str) -> Parsed:
        m = match(line)
        if m is None:
            return _clf_why(line, fmt)
        peer, ts, req = m.group(1, 2, 3)
        if ts == last_ts[0]:
            t = last_t[0]
        else:
            try:
                t = clock(ts)
            except ValueError:
                return f"bad time [{ts}]"
            last_ts[0] = ts
            last_t[0] = t
        method = target = ""
        if want_req:
            parts = req.split(" ")
            method = parts[0]
            if len(parts) == 3 and parts[1] and method.isalpha() and method.isascii():
                target = parts[1]
            else:
                rq = split_request(req)
                if rq is None:
                    return f"the request {req[:60]!r} is not 'METHOD TARGET PROTOCOL'"
                method, target = rq
        headers = no_headers
        if want and combined:
            headers = {}
            ref, ua, xff = m.group(6, 7, 8)
            if want_ref and ref != "-":
                headers["referer"] = ref
            if want_ua and ua != "-":
                headers["user-agent"] = ua
            if want_xff and xff is not None and xff != "-":
                headers["x-forwarded-for"] = xff
        return (t, peer, method, target, headers)

    return parse


def _clf_why(line: str, fmt: str) -> str:
    """Why a line is not in a CLF format (a short reason for the user)."""
    if not line.strip():
        return "empty line"
    if line.count('"') % 2:
        return "an unclosed quote (a truncated line?)"
    if "[" not in line or "]" not in line:
        return "no [time] field"
    if fmt == "combined" and COMMON_RE.match(line):
        return "common format, not combined (no referer and user agent): say --format common"
    return f"not in the {fmt} format"


def _envoy_parser(needs: Needs, tz: dt.tzinfo) -> Callable[[str], Parsed]:
    match = ENVOY_RE.match
    clock = AnyTime(tz)
    want = needs.headers & RECORDED["envoy"]
    want_peer = needs.peer
    no_headers = _NO_HEADERS

    def parse(line: str) -> Parsed:
        m = match(line)
        if m is None:
            if not line.strip():
                return "empty line"
            if line.count('"') % 2:
                return "an unclosed quote (a truncated line?)"
            return "not in Envoy's default format"
        try:
            t = clock(m.group(1))
        except ValueError:
            return f"bad time [{m.group(1)}]"
        rq = split_request(m.group(2))
        if rq is None:
            return f"the request {m.group(2)[:60]!r} is not 'METHOD PATH PROTOCOL'"
        xff = m.group(9)
        peer = ""
        if xff != "-":
            last = xff.rsplit(",", 1)[-1]
            ip = parse_ip(last)
            peer = str(ip) if ip is not None else last.strip()
        elif want_peer:
            return "no client address: X-Forwarded-For is '-' (Envoy's default format logs no peer address)"
        headers = no_headers
        if want:
            headers = {}
            for name, g in (("x-forwarded-for", 9), ("user-agent", 10), ("x-request-id", 11), ("host", 12)):
                if name in want:
                    v = m.group(g)
                    if v != "-":
                        headers[name] = v
        return (t, peer, rq[0], rq[1], headers)

    return parse


# JSON: the field names tried, in order, for each role when --field does not name one
JSON_ROLES = ("ts", "ip", "method", "path", "request")
JSON_CANDIDATES: dict[str, tuple[str, ...]] = {
    "ts": ("time", "time_local", "time_iso8601", "timestamp", "@timestamp", "ts", "msec", "start_time", "date"),
    "ip": (
        "remote_addr",
        "remote_ip",
        "client_ip",
        "clientip",
        "ip",
        "client",
        "remote_address",
        "downstream_remote_address",
    ),
    "method": ("request_method", "method", "http_method"),
    "path": ("request_uri", "uri", "path", "url", "request_path"),
    "request": ("request",),
}
_ROLE_ALIASES = {
    "ts": "ts",
    "time": "ts",
    "timestamp": "ts",
    "ip": "ip",
    "peer": "ip",
    "client": "ip",
    "remote_address": "ip",
    "method": "method",
    "path": "path",
    "uri": "path",
    "target": "path",
    "request": "request",
}
# header fields under other names than http_<name>
_HEADER_FIELDS = {
    "user_agent": "user-agent",
    "useragent": "user-agent",
    "referer": "referer",
    "referrer": "referer",
    "x_forwarded_for": "x-forwarded-for",
    "authority": "host",
    "host": "host",
    "request_id": "x-request-id",
    "x_request_id": "x-request-id",
}


def parse_fields(spec: Sequence[str]) -> dict[str, str]:
    """``--field ts=time,ip=remote_addr`` (repeatable) -> {role: field name}; a role
    that is not ts/ip/method/path/request is a request header (``user-agent=ua``,
    ``header:X-Api-Key=api_key``)."""
    out: dict[str, str] = {}
    for item in spec:
        for part in item.split(","):
            part = part.strip()
            if not part:
                continue
            role, eq, name = part.partition("=")
            role, name = role.strip(), name.strip()
            if not eq or not role or not name:
                raise LogError(f"--field {part!r}: expected ROLE=FIELD, e.g. ts=time or ip=remote_addr")
            r = _ROLE_ALIASES.get(role.lower())
            if r is None:
                r = "h:" + role.removeprefix("header:").lower()
            out[r] = name
    return out


def _getter(name: str) -> Callable[[dict[str, Any]], Any]:
    """A field by name; ``a.b`` is field b of object a when there is no field named ``a.b``."""
    if "." not in name:
        return lambda obj: obj.get(name)
    parts = name.split(".")

    def get(obj: dict[str, Any]) -> Any:
        if name in obj:
            return obj[name]
        v: Any = obj
        for p in parts:
            if not isinstance(v, dict):
                return None
            v = v.get(p)
        return v

    return get


def _text(v: Any) -> str | None:
    if v is None or v == "" or v == "-":
        return None
    if isinstance(v, str):
        return v
    if isinstance(v, (int, float)) and not isinstance(v, bool):
        return str(v)
    return None


class _JsonParser:
    """JSON lines.  A role named by ``fields`` reads that field; any other role takes
    the first of the usual names (:data:`JSON_CANDIDATES`) an object holds, and
    keeps it from then on (a role not found yet is looked for again on the next
    line: the first lines may lack an optional field).  A header the actions read
    comes from its mapped field, else ``http_<name>`` (nginx's variable) or a
    usual alias (``user_agent``, ``x_forwarded_for``...)."""

    def __init__(self, fields: Mapping[str, str], needs: Needs, tz: dt.tzinfo):
        self.needs = needs
        self.clock = AnyTime(tz)
        self.names: dict[str, str] = {r: n for r, n in fields.items() if not r.startswith("h:")}
        self.get: dict[str, Callable[[dict[str, Any]], Any]] = {r: _getter(n) for r, n in self.names.items()}
        wanted = ("ts", "ip", "method", "path", "request") if needs.request else ("ts", "ip")
        self.pending = [r for r in wanted if r not in self.get]
        # header -> the fields it may be in, in order
        explicit = {r[2:]: n for r, n in fields.items() if r.startswith("h:")}
        aliases: dict[str, list[str]] = {}
        for field_name, h in _HEADER_FIELDS.items():
            aliases.setdefault(h, []).append(field_name)
        self.headers: list[tuple[str, list[Callable[[dict[str, Any]], Any]]]] = []
        self.seen: set[str] = set()
        for h in sorted(needs.headers):
            cands = [explicit[h]] if h in explicit else ["http_" + h.replace("-", "_"), *aliases.get(h, [])]
            self.headers.append((h, [_getter(c) for c in cands]))

    def _resolve(self, obj: dict[str, Any]) -> None:
        for role in list(self.pending):
            for cand in JSON_CANDIDATES[role]:
                if cand in obj:
                    self.names[role] = cand
                    self.get[role] = _getter(cand)
                    self.pending.remove(role)
                    break

    def __call__(self, line: str) -> Parsed:
        s = line.strip()
        if not s:
            return "empty line"
        try:
            obj = json.loads(s)
        except ValueError as exc:
            return f"not JSON ({exc.args[0].split(':')[0] if exc.args else 'invalid'})"
        if not isinstance(obj, dict):
            return "not a JSON object"
        if self.pending:
            self._resolve(obj)
        get = self.get
        g = get.get("ts")
        if g is None:
            return "no time field (say --field ts=NAME)"
        v = g(obj)
        if v is None:
            return f"no {self.names['ts']!r} field"
        try:
            t = self.clock(v)
        except (ValueError, TypeError, OverflowError):
            return f"bad time {str(v)[:40]!r} in {self.names['ts']!r}"
        peer = ""
        g = get.get("ip")
        if g is not None:
            peer = _text(g(obj)) or ""
            if peer and ":" in peer:  # host:port, [v6]:port, ::ffff:v4
                ip = parse_ip(peer)
                if ip is not None:
                    peer = str(ip)
        if not peer and self.needs.peer:
            return "no client address" + (
                f" in {self.names['ip']!r}" if "ip" in self.names else " (say --field ip=NAME)"
            )
        method = target = ""
        if self.needs.request:
            gm, gp, gr = get.get("method"), get.get("path"), get.get("request")
            m = _text(gm(obj)) if gm is not None else None
            p = _text(gp(obj)) if gp is not None else None
            if (m is None or p is None) and gr is not None:
                r = _text(gr(obj))
                rq = split_request(r) if r is not None else None
                if rq is not None:
                    m = m or rq[0]
                    p = p or rq[1]
            if p is None:
                return "no request path (say --field path=NAME or request=NAME)"
            method, target = m or "GET", p
        headers = _NO_HEADERS
        if self.headers:
            headers = {}
            for h, getters in self.headers:
                for gh in getters:
                    hv = _text(gh(obj))
                    if hv is not None:
                        headers[h] = hv
                        self.seen.add(h)
                        break
        return (t, peer, method, target, headers)

    def found_headers(self) -> set[str]:
        """The headers some line held (for the warning about the ones none did)."""
        return set(self.seen)


def make_parser(
    fmt: str, needs: Needs, tz: dt.tzinfo = dt.UTC, fields: Mapping[str, str] | None = None
) -> Callable[[str], Parsed]:
    """The line parser of one format (a new one per file: JSON resolves its fields per file)."""
    if fmt == "combined":
        return _clf_parser(COMBINED_RE, fmt, needs, tz)
    if fmt == "common":
        return _clf_parser(COMMON_RE, fmt, needs, tz)
    if fmt == "envoy":
        return _envoy_parser(needs, tz)
    if fmt == "json":
        return _JsonParser(fields or {}, needs, tz)
    raise LogError(f"unknown log format {fmt!r}; expected one of {', '.join(FORMATS)} (or auto)")


def recorded_headers(fmt: str) -> frozenset[str] | None:
    """The headers a format records (None: JSON, it depends on the fields of the file)."""
    if fmt == "json":
        return None
    return RECORDED[fmt]


def detect(lines: Sequence[str], tz: dt.tzinfo = dt.UTC, fields: Mapping[str, str] | None = None) -> str | None:
    """The format most of ``lines`` parse in (ties: FORMATS order), or None."""
    sample = [ln for ln in lines if ln.strip()][:DETECT_LINES]
    if not sample:
        return None
    lenient = Needs(peer=False, request=False)
    best, best_n = None, 0
    for fmt in ("json", "envoy", "combined", "common"):
        if fmt == "json" and not sample[0].lstrip().startswith("{"):
            continue
        parse = make_parser(fmt, lenient, tz, fields)
        n = sum(1 for ln in sample if not isinstance(parse(ln), str))
        if n > best_n:
            best, best_n = fmt, n
    return best


# --------------------------------------------------------------------------- reading


class Overlong(str):
    """Stands for a line longer than MAX_LINE (its text is not kept)."""


OVERLONG = Overlong("")


@dataclass
class Source:
    """One log: a path or ``-`` (stdin)."""

    name: str

    @property
    def label(self) -> str:
        return "<stdin>" if self.name == "-" else self.name


class OpenLog:
    """An open log: ``chunks()`` yields lists of lines (without their newline);
    ``done()`` is how many bytes of ``size`` were read (the compressed ones for a
    .gz).  ``head`` are lines read ahead (for detection) that ``chunks()`` yields
    first.  A file that ends in the middle (a truncated .gz) ends the lines there
    and sets ``error``."""

    CHUNK = 1 << 20

    def __init__(self, source: Source, binary: io.BufferedIOBase, raw: io.BufferedReader, size: int | None):
        self.source = source
        self._raw = raw
        self._binary = binary
        self._decode = codecs.getincrementaldecoder("utf-8")(errors="replace").decode
        self._cr = False  # the last chunk ended in "\r" (its "\n" may open the next one)
        self.size = size
        self.head: list[str] = []
        self.error: str | None = None
        self._carry = ""
        self._eof = False

    def done(self) -> int:
        try:
            return self._raw.tell()
        except (OSError, ValueError):
            return 0

    def read_head(self, n: int) -> list[str]:
        """Read ahead until ``n`` lines are known (or the end): for detection."""
        while len(self.head) < n:
            got = self._read_chunk()
            if got is None:
                break
            self.head.extend(got)
        return self.head

    def _read(self) -> str:
        """The next piece of text, newlines made "\n" ("\r\n" and "\r" too); "" at the end."""
        while not self._eof:
            try:
                raw = self._binary.read1(self.CHUNK)
            except (EOFError, OSError, zlib.error) as exc:  # a truncated or corrupt .gz
                self.error = f"{self.source.label}: the file ends early or is corrupt ({exc}); read up to there"
                raw = b""
            final = not raw
            if final:
                self._eof = True
            data = self._decode(raw, final)
            if self._cr:
                data = "\r" + data
                self._cr = False
            if "\r" in data:
                if data.endswith("\r") and not final:
                    data = data[:-1]
                    self._cr = True
                data = data.replace("\r\n", "\n").replace("\r", "\n")
            if data:
                return data
        return ""

    def _read_chunk(self) -> list[str] | None:
        """The next whole lines, or None at the end of the file."""
        while True:
            data = self._read()
            if not data:
                if self._carry:
                    last = self._carry
                    self._carry = ""
                    return [OVERLONG if len(last) > MAX_LINE else last]
                return None
            if self._carry:
                data = self._carry + data
            lines = data.split("\n")
            self._carry = lines.pop()
            if len(self._carry) > MAX_LINE:  # the rest of that line is thrown away as it comes
                self._skip_rest()
                lines.append(OVERLONG)
            for i, ln in enumerate(lines):
                if len(ln) > MAX_LINE:
                    lines[i] = OVERLONG
            if lines:
                return lines

    def _skip_rest(self) -> None:
        self._carry = ""
        while True:
            data = self._read()
            if not data:
                return
            nl = data.find("\n")
            if nl >= 0:
                self._carry = data[nl + 1 :]
                return

    def chunks(self) -> Iterator[list[str]]:
        if self.head:
            head, self.head = self.head, []
            yield head
        while True:
            got = self._read_chunk()
            if got is None:
                return
            yield got

    def close(self) -> None:
        if self.source.name == "-":
            return  # stdin stays open
        try:
            self._binary.close()
            self._raw.close()
        except OSError:
            pass


def open_log(source: Source) -> OpenLog:
    """Open a log for reading (gzip'ed or not); LogError when it cannot be."""
    size: int | None = None
    raw: io.BufferedReader
    if source.name == "-":
        stdin = sys.stdin.buffer
        # a BufferedReader (peek) in any real process; a test harness may swap in another stream
        raw = stdin if isinstance(stdin, io.BufferedReader) else io.BufferedReader(cast(io.RawIOBase, stdin))
    else:
        try:
            raw = open(source.name, "rb")  # noqa: SIM115 - closed by OpenLog.close
        except FileNotFoundError:
            raise LogError(f"{source.name}: no such file") from None
        except IsADirectoryError:
            raise LogError(f"{source.name}: is a directory, expected an access log") from None
        except OSError as exc:
            raise LogError(f"{source.name}: cannot read: {exc.strerror}") from None
        try:
            st = os.fstat(raw.fileno())
            size = st.st_size if st.st_size > 0 else None
        except OSError:
            pass
    try:
        magic = raw.peek(2)[:2]
    except OSError as exc:
        raise LogError(f"{source.label}: cannot read: {exc.strerror}") from None
    binary: io.BufferedIOBase = raw
    if magic == b"\x1f\x8b":
        binary = gzip.GzipFile(fileobj=raw, mode="rb")
    return OpenLog(source, binary, raw, size)
