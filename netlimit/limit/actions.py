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
* ``generic:<key>=<value>`` → ``(key, value)``.
"""

from __future__ import annotations

import ipaddress
from collections.abc import Callable, Mapping, Sequence
from urllib.parse import unquote

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


def path_of_uri(uri: str) -> str:
    """The normalized, decoded path of a request-target (``$request_uri``)."""
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
    return normalize_path(uri)


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
    addresses become IPv4; ``[v6]:port`` and ``v4:port`` forms are accepted."""
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
    try:
        ip = ipaddress.ip_address(t)
    except ValueError:
        return None
    if ip.version == 6 and ip.ipv4_mapped is not None:
        return ip.ipv4_mapped
    return ip


def client_address(peer: str, xff: str | None, trusted: TrustedProxies) -> str:
    """The client's address: the peer, or from X-Forwarded-For when the peer is a
    trusted proxy (rightmost untrusted hop; all trusted → the leftmost)."""
    if peer.startswith("::ffff:"):
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
            break  # garbage: stop at the last trusted hop
        client = str(ip)
        if client not in trusted:
            break
    return client


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
    )

    def __init__(self, actions: Sequence[Sequence[str]], trusted_proxies=()):
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
        if peer.startswith("::ffff:"):
            peer = client_address(peer, None, self.trusted)
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
                        elif peer.startswith("::ffff:"):
                            client = client_address(peer, None, self.trusted)
                        else:  # what client_address returns without trusted proxies
                            client = peer
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
