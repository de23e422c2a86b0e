"""Who may reach the sidecar's own endpoints: the shared secret of
``--admin-token-file`` and the warning for listeners beyond loopback.

With a token, every request to the decision endpoints (``/v1/check``, the JSON
API, ``/v1/authz``) and the operator endpoints (``/healthz``, ``/metrics``,
``/v1/rules``, ``/v1/top``) must carry ``Authorization: Bearer <token>``, else
401.  The proxy mode's client-facing listener is not concerned: its clients are
the public.  The token is compared in constant time (``hmac.compare_digest``).
"""

from __future__ import annotations

import hmac
import ipaddress
import logging
import os
import socket
import stat

log = logging.getLogger("netlimit.sidecar")

#: a token file is one line; anything larger is not one
MAX_TOKEN_FILE = 4096
#: shorter tokens are refused (a guessable secret is none)
MIN_TOKEN = 16


def load_token(path: str) -> bytes:
    """The token in ``path`` (one line; surrounding whitespace dropped).  ValueError
    naming the file when it cannot be a token; a warning when others may read it."""
    flag = "--admin-token-file"
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
    except OSError as exc:
        raise ValueError(f"{flag} {path}: {exc.strerror or exc}") from None
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise ValueError(f"{flag} {path}: not a regular file")
        raw = os.read(fd, MAX_TOKEN_FILE + 1)
    finally:
        os.close(fd)
    if len(raw) > MAX_TOKEN_FILE:
        raise ValueError(f"{flag} {path}: larger than {MAX_TOKEN_FILE} bytes; a token file holds one line")
    token = raw.strip()
    if not token:
        raise ValueError(f"{flag} {path}: the file is empty")
    if len(token) < MIN_TOKEN:
        raise ValueError(f"{flag} {path}: the token has {len(token)} characters; use at least {MIN_TOKEN} "
                         "(e.g. `openssl rand -hex 32`)")  # fmt: skip
    if not all(0x21 <= b <= 0x7E for b in token):
        raise ValueError(
            f"{flag} {path}: the token must be one line of printable ASCII without spaces "
            "(it is sent as `Authorization: Bearer <token>`)"
        )
    if st.st_mode & stat.S_IROTH:
        log.warning(
            "%s %s is world-readable (mode %04o): any local user can read the token; chmod 600 it",
            flag,
            path,
            stat.S_IMODE(st.st_mode),
        )
    return token


def bearer_ok(value: str | None, token: bytes) -> bool:
    """Whether an ``Authorization`` value is ``Bearer <token>`` (the scheme in any
    case, RFC 9110 §11.1); the token compared in constant time."""
    if value is None:
        return False
    scheme, _, cred = value.strip(" ").partition(" ")
    if scheme.lower() != "bearer":
        return False
    return hmac.compare_digest(cred.strip(" ").encode("latin-1"), token)


def is_loopback(host: str) -> bool:
    """Whether every address ``host`` names is a loopback address (a name is
    resolved; one that does not resolve is not loopback)."""
    try:
        return ipaddress.ip_address(host.split("%", 1)[0]).is_loopback
    except ValueError:
        pass
    try:
        infos = socket.getaddrinfo(host, None, proto=socket.IPPROTO_TCP)
    except OSError:
        return False
    return bool(infos) and all(ipaddress.ip_address(str(i[4][0]).split("%", 1)[0]).is_loopback for i in infos)


def warn_exposed(what: str, shown: str, hosts: list[str], token: bool) -> None:
    """A warning at start for a listener beyond loopback (``hosts``: the addresses it is
    bound to, or the address asked for)."""
    if all(is_loopback(h) for h in hosts):
        return
    if token:
        guard = "requests need the --admin-token-file token"
    else:
        guard = "there is no authentication (see --admin-token-file)"
    log.warning(
        "the %s listens on %s, which is not a loopback address: whoever reaches it can %s; %s. "
        "Keep it on 127.0.0.1 or a network only your proxies reach",
        what,
        shown,
        _REACH.get(what, "use it"),
        guard if what != "gRPC door" else "the gRPC door has no authentication",
    )


_REACH = {
    "decision listener": "charge any client's counters and read the rules, /metrics and /v1/top",
    "admin listener": "charge any client's counters and read the rules, /metrics and /v1/top",
    "gRPC door": "charge any client's counters",
}
