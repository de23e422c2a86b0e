"""``actions``: how a request becomes descriptor lists (Envoy's rate_limit actions).

Each inner list of ``http.actions`` yields one descriptor, its entries in order:

* ``remote_address`` → ``("remote_address", client address)``. The client is the
  TCP peer; only when the peer is in ``trusted_proxies`` is ``X-Forwarded-For``
  believed, walked from the right and skipping trusted hops (the first
  untrusted address is the client).  A spoofed header from an untrusted peer is
  ignored.
* ``path`` → ``("path", path)``: percent-decoded, without the query string, dot
  segments resolved and repeated slashes merged, so ``/a/../login`` and
  ``//login`` count as ``/login``.
* ``method`` → ``("method", "GET")``.
* ``header:<Name>`` → ``("header:<Name>", header value)`` (the key is the action
  as written, so rules say ``key: "header:X-Api-Key"``); when the request lacks
  the header the whole descriptor is not produced (as Envoy's ``request_headers``).
  The value is that of the header's **first** field line, as the application
  reads it (Starlette, Go's ``Header.Get``, Java's ``getHeader``, nginx 1.22's
  ``$http_<name>``): repeating a field makes no new key.  The doors give the
  plan a mapping of first lines (sidecar/http11.py ``Request.fields``); the
  ``X-Original-*`` inputs of the auth_request door are read the same way.
* ``generic:<key>=<value>`` → ``(key, value)``.
"""

from __future__ import annotations

import ipaddress
import re
from collections.abc import Callable, Mapping, Sequence
from typing import Any
from urllib.parse import unquote

from ..errors import NetlimitError

Entry = tuple[str, str]

_REMOTE, _PATH, _METHOD, _HEADER, _GENERIC = range(5)
#: most X-Forwarded-For hops looked at (the header is bounded by the HTTP
#: parser anyway; this bounds the work per request)
MAX_XFF_HOPS = 16


def normalize_path(path: str) -> str:
    """Resolve ``.``/``..`` segments and merge repeated slashes (RFC 3986 §5.2.4)."""
    if "//" not in path and "/." not in path:
        return path or "/"
    out: list[str] = []
    for seg in path.split("/"):
        if seg == "" or seg == ".":
            continue
        if seg == "..":
            if out:
                out.pop()
            continue
        out.append(seg)
    res = "/" + "/".join(out)
    if path.endswith(("/", "/.", "/..")) and res != "/":
        res += "/"
    return res


#: a segment's matrix parameters: from ';' to the end of the segment
_PARAMS = re.compile(r";[^/]*")


def path_of_uri(uri: str, *, lower: bool = False, slash: bool = False, params: bool = False) -> str:
    """The normalized, decoded path of a request-target (``$request_uri``): the
    query and a ``#fragment`` cut off (as nginx does), percent-decoded, dot
    segments resolved, slashes merged; and, as ``http.path_match`` says,
    ``params``: ``;name=value`` matrix parameters cut from each segment (before
    the dot segments: ``/..;/x`` is ``/x``), ``lower``: lower-cased, ``slash``:
    without a trailing slash (``/login/`` is ``/login``)."""
    q = uri.find("?")
    if q >= 0:
        uri = uri[:q]
    h = uri.find("#")
    if h >= 0:
        uri = uri[:h]
    if uri.startswith(("http://", "https://")):  # absolute-form
        s = uri.find("/", uri.find("//") + 2)
        uri = uri[s:] if s >= 0 else "/"
    if "%" in uri:
        uri = unquote(uri, errors="replace")
    if params and ";" in uri:
        uri = _PARAMS.sub("", uri)
    p = normalize_path(uri)
    if lower:
        p = p.lower()
    if slash and p[-1] == "/" and len(p) > 1:
        p = p.rstrip("/") or "/"
    return p


def path_function(
    case: str = "insensitive", trailing_slash: str = "ignore", params: str = "strip"
) -> Callable[[str], str]:
    """``http.path_match`` as a function of a request-target: the path every door
    hands the actions and ``netlimit simulate`` replays (one function for both).
    Paths repeat, so each target is normalized once (a bounded cache: clients
    choose targets)."""
    lower = case == "insensitive"
    slash = trailing_slash == "ignore"
    strip = params == "strip"
    cache: dict[str, str] = {}

    def path_of(uri: str) -> str:
        p = cache.get(uri)
        if p is None:
            p = path_of_uri(uri, lower=lower, slash=slash, params=strip)
            if len(cache) >= PATH_CACHE:
                cache.clear()
            cache[uri] = p
        return p

    return path_of


#: request-targets whose normalized path is kept, per plan
PATH_CACHE = 4096


class TrustedProxies:
    """Is this address one of ``trusted_proxies``? (cached per address)"""

    __slots__ = ("_nets", "_cache")

    def __init__(self, nets: Sequence[ipaddress.IPv4Network | ipaddress.IPv6Network]):
        self._nets = tuple(nets)
        self._cache: dict[str, bool] = {}

    def __bool__(self) -> bool:
        return bool(self._nets)

    def __contains__(self, addr: str) -> bool:
        r = self._cache.get(addr)
        if r is None:
            ip = parse_ip(addr)
            r = ip is not None and any(ip.version == n.version and ip in n for n in self._nets)
            if len(self._cache) >= 4096:
                self._cache.clear()
            self._cache[addr] = r
        return r


def parse_ip(text: str) -> ipaddress.IPv4Address | ipaddress.IPv6Address | None:
    """An IP address from a peer or an X-Forwarded-For element; IPv4-mapped IPv6
    addresses become IPv4; ``[v6]:port`` and ``v4:port`` forms are accepted; an
    IPv6 zone id (``fe80::1%eth0``, ``%25eth0``) is stripped (it names an
    interface of the sender, not another client).  Anything else -- among it a
    zero-padded IPv4 address (``001.002.003.004``: decimal to nginx, octal to
    inet_aton) -- is not an address (None)."""
    t = text.strip()
    if not t:
        return None
    if t.startswith("["):
        end = t.find("]")
        if end < 0:
            return None
        t = t[1:end]
    elif t.count(":") == 1:  # 1.2.3.4:5678
        t = t.split(":", 1)[0]
    if "%" in t and ":" in t:
        t = t.split("%", 1)[0]
    try:
        ip = ipaddress.ip_address(t)
    except ValueError:
        return None
    if ip.version == 6 and ip.ipv4_mapped is not None:
        return ip.ipv4_mapped
    return ip


#: what a client may mean as an IPv4 address that ipaddress refuses: leading zeros
#: (``001.002.003.004``), octal/hex/short forms (``0x7f.1``, ``127.1``)
_AMBIGUOUS_V4 = re.compile(r"(?:\[)?(?:0x[0-9a-f]+|\d+)(?:\.(?:0x[0-9a-f]+|\d+)){0,3}(?:\]?:\d*)?\Z", re.I)


class BadAddress(NetlimitError, ValueError):
    """An X-Forwarded-For element in the client's place that could be read as
    several addresses: the request is refused (400), never keyed."""


def client_address(peer: str, xff: str | None, trusted: TrustedProxies) -> str:
    """The client's address: the peer, or from X-Forwarded-For when the peer is a
    trusted proxy (rightmost untrusted hop; all trusted → the leftmost).  An
    element that is no address stops the walk at the last trusted hop, except
    one a reader could take for an IPv4 address in another spelling
    (``001.002.003.004``, ``0x7f.1``): :class:`BadAddress`."""
    if peer.startswith("::ffff:") or "%" in peer:
        ip = parse_ip(peer)
        if ip is not None:
            peer = str(ip)
    if not xff or not trusted or peer not in trusted:
        return peer
    client = peer
    parts = xff.rsplit(",", MAX_XFF_HOPS)
    for part in reversed(parts):
        ip = parse_ip(part)
        if ip is None:
            p = part.strip()
            if _AMBIGUOUS_V4.match(p):
                raise BadAddress(f"X-Forwarded-For element {p[:60]!r} is not an IP address in canonical form")
            break  # garbage: stop at the last trusted hop
        client = str(ip)
        if client not in trusted:
            break
    return client


class ClientKey:
    """``remote_address`` values: the client's ``http.client_prefix`` network,
    written canonically -- the address itself at /32 (IPv4) or /128 (IPv6),
    else the network (``2001:db8:1:2::/64``, ``198.51.100.0/24``), so that a
    client rotating through the addresses of its /64 is one key.  Cached per
    address (bounded: clients choose X-Forwarded-For)."""

    __slots__ = ("v4", "v6", "_cache")

    def __init__(self, v4: int = 32, v6: int = 64):
        self.v4 = v4
        self.v6 = v6
        self._cache: dict[str, str] = {}

    @property
    def v4_whole(self) -> bool:
        """IPv4 addresses are their own key (the usual case: no work per request)."""
        return self.v4 == 32

    def __call__(self, addr: str) -> str:
        r = self._cache.get(addr)
        if r is None:
            ip = parse_ip(addr)
            if ip is None:
                r = addr  # not an address (a Unix socket peer): as it is
            else:
                plen = self.v4 if ip.version == 4 else self.v6
                if plen == ip.max_prefixlen:
                    r = str(ip)
                else:
                    r = str(ipaddress.ip_network((int(ip), plen), strict=False))
            if len(self._cache) >= 4096:
                self._cache.clear()
            self._cache[addr] = r
        return r


class ActionPlan:
    """Compiled ``http.actions`` + ``trusted_proxies``."""

    __slots__ = (
        "groups",
        "trusted",
        "needs_path",
        "needs_method",
        "needs_remote",
        "header_names",
        "_trusting",
        "build",
        "client_key",
        "_v4_whole",
        "path_of",
        "_lower",
        "peer_only",
    )

    def __init__(
        self,
        actions: Sequence[Sequence[str]],
        trusted_proxies=(),
        client_prefix: tuple[int, int] = (32, 64),
        path_match: tuple[str, str, str] = ("insensitive", "ignore", "strip"),
    ):
        groups = []
        for group in actions:
            g = []
            for item in group:
                if item == "remote_address":
                    g.append((_REMOTE, "remote_address", ""))
                elif item == "path":
                    g.append((_PATH, "path", ""))
                elif item == "method":
                    g.append((_METHOD, "method", ""))
                elif item.startswith("header:"):
                    g.append((_HEADER, item, item[len("header:") :].lower()))
                elif item.startswith("generic:"):
                    k, _, v = item[len("generic:") :].partition("=")
                    g.append((_GENERIC, k, v))
                else:
                    raise ValueError(f"unknown action {item!r}")
            groups.append(tuple(g))
        self.groups = tuple(groups)
        self.trusted = TrustedProxies(trusted_proxies)
        #: remote_address values: the client's http.client_prefix network
        self.client_key = ClientKey(*client_prefix)
        self._v4_whole = self.client_key.v4_whole
        #: http.path_match: the path the ``path`` action sees, of a request-target
        self.path_of: Callable[[str], str] = path_function(*path_match)
        self._lower = path_match[0] == "insensitive"
        self._trusting = bool(self.trusted)  # (a plain bool: no __bool__ call per request)
        self.needs_path = any(a[0] == _PATH for g in self.groups for a in g)
        self.needs_method = any(a[0] == _METHOD for g in self.groups for a in g)
        self.needs_remote = any(a[0] == _REMOTE for g in self.groups for a in g)
        #: the (lower-case) header names the header actions read
        self.header_names = frozenset(a[2] for g in self.groups for a in g if a[0] == _HEADER)
        #: :meth:`descriptors` with positional arguments (the fast paths' call); for
        #: the most common plan, ``[[remote_address]]`` without trusted proxies, a
        #: version that skips the loop
        self.build: Callable[..., list[list[Entry]]] = (
            self._build_peer
            if self.groups == (((_REMOTE, "remote_address", ""),),) and not self._trusting
            else self._build
        )
        #: the descriptors depend on the TCP peer alone (``[[remote_address]]``, no
        #: trusted proxies): the same for every request of a connection
        self.peer_only = self.build == self._build_peer

    @classmethod
    def of(cls, http: Any) -> ActionPlan:
        """The plan of an ``http:`` section (config/model.py HttpConfig)."""
        cp, pm = http.client_prefix, http.path_match
        return cls(http.actions, http.trusted_proxies, (cp.ipv4, cp.ipv6), (pm.case, pm.trailing_slash, pm.params))

    def rule_value(self, key: str, value: str) -> str:
        """A rule's value as the requests' values are written, so that it matches
        them: a ``path`` value normalized by ``http.path_match`` (a wildcard only
        lower-cased, when case-insensitive), an address of ``remote_address`` as
        its client's key (``2001:db8::1`` -> ``2001:db8::/64``)."""
        if not value:
            return value
        if key == "path":
            if "*" in value:
                return value.lower() if self._lower else value
            return self.path_of(value)
        if key == "remote_address" and "*" not in value:
            if "/" in value:  # a network, as the keys write one (2001:db8:0:1::/64)
                try:
                    net = ipaddress.ip_network(value.strip(), strict=False)
                except ValueError:
                    return value
                return str(net) if net.prefixlen < net.max_prefixlen else self.client_key(str(net.network_address))
            if parse_ip(value) is not None:
                return self.client_key(value)
        return value

    def descriptors(
        self,
        *,
        peer: str,
        method: str,
        path: str | Callable[[], str],
        headers: Mapping[str, str],
        xff: str | None = None,
    ) -> list[list[Entry]]:
        """Descriptor lists for one request.  ``headers.get`` is called with
        lower-case names (a dict with lower-case keys, or any case-insensitive mapping
        with lower-case keys); ``xff`` defaults to its X-Forwarded-For; ``path``
        may be a callable, called only when an action needs it."""
        return self.build(peer, method, path, headers, xff)

    def _build_peer(
        self, peer: str, method: str, path: str | Callable[[], str], headers: Mapping[str, str], xff: str | None = None
    ) -> list[list[Entry]]:
        """:meth:`_build` for ``[[remote_address]]`` without trusted proxies."""
        if ":" in peer or not self._v4_whole:  # IPv6 (or IPv4-mapped), or IPv4 by prefix
            peer = self.client_key(peer)
        return [[("remote_address", peer)]]

    def _build(
        self, peer: str, method: str, path: str | Callable[[], str], headers: Mapping[str, str], xff: str | None = None
    ) -> list[list[Entry]]:
        out: list[list[Entry]] = []
        client: str | None = None
        p: str | None = None
        for group in self.groups:
            entries: list[Entry] = []
            for kind, key, arg in group:
                if kind == _REMOTE:
                    if client is None:
                        if self._trusting:
                            if xff is None:
                                xff = headers.get("x-forwarded-for")
                            client = client_address(peer, xff, self.trusted)
                        else:  # what client_address returns without trusted proxies
                            client = peer
                        if ":" in client or not self._v4_whole:
                            client = self.client_key(client)
                    entries.append((key, client))
                elif kind == _PATH:
                    if p is None:
                        p = path() if callable(path) else path
                    entries.append((key, p))
                elif kind == _METHOD:
                    entries.append((key, method))
                elif kind == _HEADER:
                    v = headers.get(arg)
                    if v is None:  # a header action without its header: no descriptor (as Envoy does)
                        break
                    entries.append((key, v))
                else:
                    entries.append((key, arg))
            else:
                out.append(entries)
        return out
