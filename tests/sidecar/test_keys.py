"""Limits that hold against a client who knows HTTP (issue 29: keys and paths).

Each test is a client with raw sockets trying the variants of one request that
used to make new keys -- repeated fields, case/slash/matrix-parameter variants
of a path, a /64's rotating addresses, zone ids, zero-padded addresses,
trailers -- against a real sidecar in proxy mode, the application being a
recording upstream (what an attack is judged by is what reached it).  Where
nginx 1.22 has the behaviour, it is given the same bytes in front of the same
kind of application (docs/security.md, "Keys and paths", lists every class).
"""

from __future__ import annotations

import socket
import time

import pytest
from logging_upstream import LoggingUpstream
from sidecar_proc import Nginx, Sidecar, write_config

pytestmark = [pytest.mark.nginx, pytest.mark.timeout(180)]

TRUSTED = "127.0.0.2"  # the front proxy the sidecars believe (its X-Forwarded-For)

PER_KEY = """\
version: 1
http:
  domain: web
  actions:
    - [header:X-Api-Key]
  descriptors:
    - key: header:X-Api-Key
      rate_limit: {unit: minute, requests_per_unit: 3, name: per-key}
"""


def raw_status(port: int, raw: bytes, *, src: str = "127.0.0.1", wait: float = 10.0) -> int:
    """One request on its own connection; the status of its answer."""
    with socket.create_connection(("127.0.0.1", port), timeout=wait, source_address=(src, 0)) as s:
        s.sendall(raw)
        out = b""
        deadline = time.monotonic() + wait
        while b"\r\n" not in out and time.monotonic() < deadline:
            data = s.recv(4096)
            if not data:
                break
            out += data
    assert out.startswith(b"HTTP/1."), out[:200]
    return int(out[9:12])


def head(target: str, *fields: str, method: str = "GET") -> bytes:
    lines = [f"{method} {target} HTTP/1.1", "Host: a", *fields, "Connection: close", "", ""]
    return "\r\n".join(lines).encode("latin-1")


def reached(app: LoggingUpstream, marker: str, before: int = 0, timeout: float = 2.0) -> int:
    """How many requests whose target holds ``marker`` the application received
    (after ``before`` of its list), once nothing more arrives."""
    deadline = time.monotonic() + timeout
    last = -1
    while True:
        with app.lock:
            n = sum(marker in t for _, t, _ in app.requests[before:])
        if n == last or time.monotonic() > deadline:
            return n
        last = n
        time.sleep(0.1)


def nginx_per_key(app: LoggingUpstream, zone: str) -> Nginx:
    """The reference: nginx 1.22 in front of `app`, `limit_req` on ``$http_x_api_key``
    at 3 a minute (burst 2, 429), as PER_KEY is for the sidecar."""
    return Nginx(
        f"""
        limit_req zone={zone} burst=2 nodelay;
        limit_req_status 429;
        location / {{
            proxy_pass http://127.0.0.1:{app.port};
            proxy_http_version 1.1;
            proxy_set_header Connection "";
        }}
        """,
        app.port,
        http_extra=f"limit_req_zone $http_x_api_key zone={zone}:1m rate=3r/m;",
    )


@pytest.fixture(scope="module")
def app():
    u = LoggingUpstream()
    try:
        yield u
    finally:
        u.stop()


def _proxy(tmp_path_factory, app, text: str, name: str):
    cfg = write_config(tmp_path_factory.mktemp(name) / "n.yaml", text)
    return Sidecar(cfg, "--upstream", app.url)


@pytest.fixture(scope="module")
def per_key(tmp_path_factory, app):
    sc = _proxy(tmp_path_factory, app, PER_KEY, "per-key")
    try:
        yield sc
    finally:
        sc.stop()


# --- 1. repeated fields: the first one is the key ------------------------------------------------------


def repeated_key_variants(key: str) -> list[list[str]]:
    """The same key sent once, twice, three and four times (and as a comma list
    over two lines), each variant three times: 15 requests."""
    variants = [[f"X-Api-Key: {key}"] * n for n in (1, 2, 3, 4)]
    variants.append([f"X-Api-Key: {key}", "X-Api-Key: other"])
    return [v for v in variants for _ in range(3)]


def test_a_repeated_header_field_is_one_key_the_first(per_key, app):
    """A header action keys on the first field line: sending ``X-Api-Key: K`` 1-4
    times is one client (the application, reading the first field, saw K), held
    at 3 a minute."""
    before = app.count()
    codes = [raw_status(per_key.port, head("/api?t=repeated", *fields)) for fields in repeated_key_variants("K-repeat")]
    assert codes.count(200) == 3, codes
    assert codes[:3] == [200] * 3 and set(codes[3:]) == {429}
    assert reached(app, "t=repeated", before) == 3


def test_nginx_keys_on_the_first_field_too(app):
    """The reference: nginx 1.22's ``$http_x_api_key`` is the first field, and its
    limit_req holds at 3 for the same bytes."""
    ng = nginx_per_key(app, "perkey")
    try:
        before = app.count()
        codes = [raw_status(ng.port, head("/api?t=nginx-rep", *f)) for f in repeated_key_variants("K-nginx")]
        assert codes.count(200) == 3, codes
        assert reached(app, "t=nginx-rep", before) == 3
    finally:
        ng.stop()


DECISION_PATH = """\
version: 1
http:
  domain: web
  actions:
    - [path, method]
  descriptors:
    - key: path
      value: /login
      descriptors:
        - key: method
          rate_limit: {unit: minute, requests_per_unit: 3, name: login}
"""


def test_the_auth_request_door_reads_the_first_x_original_field(tmp_path):
    """X-Original-URI / X-Original-Method repeated (or a later one naming another
    path) count as the first: the /login budget holds at 3."""
    sc = Sidecar(write_config(tmp_path / "n.yaml", DECISION_PATH))
    try:
        variants = [
            ["X-Original-URI: /login", "X-Original-Method: POST"],
            ["X-Original-URI: /login", "X-Original-URI: /login", "X-Original-Method: POST"],
            ["X-Original-URI: /login", "X-Original-URI: /other", "X-Original-Method: POST"],
            ["X-Original-URI: /login", "X-Original-Method: POST", "X-Original-Method: POST"],
            ["X-Original-URI: /login", "X-Original-Method: POST", "X-Original-Method: GET"],
        ]
        codes = [raw_status(sc.port, head("/v1/check", *v)) for v in variants for _ in range(2)]
        assert codes.count(200) == 3, codes
        # a repeated deny_status is read once, the first
        assert raw_status(sc.port, head("/v1/check?deny_status=403&deny_status=499", *variants[0])) == 403
    finally:
        sc.stop()


# --- 3/4. paths: case, trailing slash, matrix parameters, fragments ---------------------------------------

PER_PATH = """\
version: 1
http:
  domain: web
  actions:
    - [path, remote_address]
  descriptors:
    - key: path
      value: /Login
      descriptors:
        - key: remote_address
          rate_limit: {unit: minute, requests_per_unit: 3, name: login}
    - key: path
      value: /admin*
      descriptors:
        - key: remote_address
          rate_limit: {unit: minute, requests_per_unit: 3, name: admin}
"""

LOGIN_VARIANTS = [
    "/login",
    "/LOGIN",
    "/Login",
    "/login/",
    "/LOGIN/",
    "/login;jsessionid=A1B2",
    "/Login;jsessionid=C3/",
    "/login/;x=1",
    "//login",
    "/a/../login",
    "/%6Cogin",
    "/%4C%4F%47%49%4E",
    "/login#frag",
    "/login?next=/",
    "/x/..;/login",
]


@pytest.fixture(scope="module")
def per_path(tmp_path_factory, app):
    sc = _proxy(tmp_path_factory, app, PER_PATH, "per-path")
    try:
        yield sc
    finally:
        sc.stop()


def test_case_slash_and_matrix_variants_of_a_limited_path_are_one_budget(per_path, app):
    """/LOGIN, /Login, /login/, /login;jsessionid=… reach an application's /login
    handler: with the default http.path_match they are /login (the rule's
    ``/Login`` too), and the client gets 3 of them, whichever it picks."""
    before = app.count()
    codes = [raw_status(per_path.port, head(p), src="127.0.0.5") for p in LOGIN_VARIANTS]
    assert codes.count(200) == 3, list(zip(LOGIN_VARIANTS, codes))
    with app.lock:
        got = len(app.requests[before:])
    assert got == 3


def test_a_wildcard_counts_a_path_and_its_trailing_slash_as_one_budget(per_path, app):
    variants = ["/admin", "/admin/", "/ADMIN", "/Admin/", "/admin;s=1", "/admin/;s=2"] * 2
    codes = [raw_status(per_path.port, head(p), src="127.0.0.6") for p in variants]
    assert codes.count(200) == 3, list(zip(variants, codes))
    # another path under the wildcard is another value (Lyft's wildcard counts values apart)
    assert raw_status(per_path.port, head("/admin/users"), src="127.0.0.6") == 200


def test_path_match_can_be_switched_back_to_exact(tmp_path, app):
    text = PER_PATH.replace(
        "  actions:", "  path_match: {case: sensitive, trailing_slash: keep, params: keep}\n  actions:"
    )
    sc = _proxy_at(tmp_path, app, text.replace("value: /Login", "value: /login"))
    try:
        codes = [raw_status(sc.port, head(p), src="127.0.0.7") for p in ("/login/", "/LOGIN", "/login;a=1") * 2]
        assert codes == [200] * 6  # each is another path, none is /login
        codes = [raw_status(sc.port, head("/login"), src="127.0.0.7") for _ in range(4)]
        assert codes == [200, 200, 200, 429]
    finally:
        sc.stop()


def _proxy_at(tmp_path, app, text: str) -> Sidecar:
    return Sidecar(write_config(tmp_path / "n.yaml", text), "--upstream", app.url)


def test_a_fragment_is_cut_from_the_path_and_forwarded_as_nginx_does(per_path, app):
    """nginx takes ``GET /login#x`` (no 400), matches and limits it as /login, and
    forwards the target as it came: so does the sidecar."""
    ng = Nginx(
        f"""
        location / {{
            limit_req zone=peruri burst=2 nodelay;
            limit_req_status 429;
            proxy_pass http://127.0.0.1:{app.port};
            proxy_http_version 1.1;
            proxy_set_header Connection "";
        }}
        """,
        app.port,
        http_extra="limit_req_zone $uri zone=peruri:1m rate=3r/m;",
    )
    try:
        targets = [f"/login#f{i}" for i in range(6)]
        for port, src in ((ng.port, "127.0.0.1"), (per_path.port, "127.0.0.8")):
            before = app.count()
            codes = [raw_status(port, head(t), src=src) for t in targets]
            assert codes == [200] * 3 + [429] * 3, (port, codes)
            with app.lock:
                assert [t for _, t, _ in app.requests[before:]] == targets[:3]
    finally:
        ng.stop()


# --- 3. addresses: the client's /64, zone ids, zero-padded IPv4 -------------------------------------------

PER_ADDRESS = f"""\
version: 1
http:
  domain: web
  trusted_proxies: [{TRUSTED}/32]
  actions:
    - [remote_address]
  descriptors:
    - key: remote_address
      rate_limit: {{unit: minute, requests_per_unit: 3, name: per-address}}
"""


@pytest.fixture(scope="module")
def per_address(tmp_path_factory, app):
    sc = _proxy(tmp_path_factory, app, PER_ADDRESS, "per-address")
    try:
        yield sc
    finally:
        sc.stop()


def xff(addr: str, target: str = "/a") -> bytes:
    return head(target, f"X-Forwarded-For: {addr}")


def test_an_ipv6_client_rotating_through_its_64_is_one_key(per_address, app):
    before = app.count()
    addrs = [f"2001:db8:1:2:{i:x}::{i + 1:x}" for i in range(20)] + ["2001:DB8:1:2::FFFF", "[2001:db8:1:2::9]:443"]
    codes = [raw_status(per_address.port, xff(a, "/v6"), src=TRUSTED) for a in addrs]
    assert codes.count(200) == 3, codes
    assert reached(app, "/v6", before) == 3
    # the next /64 is another client
    assert raw_status(per_address.port, xff("2001:db8:1:3::1", "/v6"), src=TRUSTED) == 200


def test_zone_ids_in_x_forwarded_for_are_never_a_new_key(per_address, app):
    before = app.count()
    addrs = ["fe80::1%eth0", "fe80::1%eth1", "fe80::1%25lo", "[fe80::1%eth2]:80", "fe80::1", "fe80::2%x"]
    codes = [raw_status(per_address.port, xff(a, "/zone"), src=TRUSTED) for a in addrs]
    assert codes.count(200) == 3, codes
    assert reached(app, "/zone", before) == 3


def test_a_zero_padded_ipv4_in_x_forwarded_for_is_refused(per_address, app):
    """``001.002.003.004`` is 1.2.3.4 to nginx and 1.2.3.4 or octal to others: never
    read as another key (nor as the proxy's), the request is refused."""
    before = app.count()
    for a in ("001.002.003.004", "1.2.3.04", "0x7f.1", "01.2.3.4:80"):
        assert raw_status(per_address.port, xff(a, "/pad"), src=TRUSTED) == 400, a
    codes = [raw_status(per_address.port, xff(a, "/pad"), src=TRUSTED) for a in ["1.2.3.4"] * 4]
    assert codes == [200] * 3 + [429]
    assert reached(app, "/pad", before) == 3


def test_a_chunked_trailer_never_becomes_a_field(per_address, app):
    """Trailer fields are dropped, as nginx does: an X-Forwarded-For trailer does
    not change the client (a new key per request), nor reach the application as
    a header."""
    before = app.count()
    codes = []
    for i in range(6):
        raw = (
            b"POST /trailer HTTP/1.1\r\nHost: a\r\nX-Forwarded-For: 198.51.100.20\r\n"
            b"Transfer-Encoding: chunked\r\nConnection: close\r\n\r\n"
            b"2\r\nab\r\n0\r\nX-Forwarded-For: 203.0.113.%d\r\nX-Api-Key: T%d\r\n\r\n" % (i, i)
        )
        codes.append(raw_status(per_address.port, raw, src=TRUSTED))
    assert codes == [200] * 3 + [429] * 3
    assert reached(app, "/trailer", before) == 3
    with app.lock:
        heads = app.heads[before:]
    for h in heads:
        assert all(k.lower() != "x-api-key" for k, _ in h), h
        assert [v for k, v in h if k.lower() == "x-forwarded-for"] == [f"198.51.100.20, {TRUSTED}"]


# --- 10. Connection never strips who the client is ---------------------------------------------------------


def test_connection_never_strips_forwarding_fields_nor_a_keyed_one(per_key, app):
    before = app.count()
    raw = head(
        "/conn",
        "Connection: Host, X-Forwarded-For, Forwarded, X-Real-IP, Via, X-Api-Key, X-Hop",
        "X-Forwarded-For: 203.0.113.9",
        "Forwarded: for=203.0.113.9",
        "X-Real-IP: 203.0.113.9",
        "Via: 1.1 front",
        "X-Api-Key: K-conn",
        "X-Hop: gone",
    ).replace(b"Connection: close\r\n", b"")
    assert raw_status(per_key.port, raw) == 200
    assert reached(app, "/conn", before) == 1
    with app.lock:
        h = {k.lower(): v for k, v in app.heads[before]}
    assert h["host"] == "a"
    assert h["x-forwarded-for"] == "203.0.113.9, 127.0.0.1"
    assert h["forwarded"] == "for=203.0.113.9"
    assert h["x-real-ip"] == "203.0.113.9"
    assert h["via"].startswith("1.1 front")
    assert h["x-api-key"] == "K-conn"
    assert "x-hop" not in h  # what Connection names is still removed (RFC 9110 §7.6.1)


# --- the bypass group: every variant at once, per kind of limit ------------------------------------------

BYPASS = f"""\
version: 1
http:
  domain: web
  trusted_proxies: [{TRUSTED}/32]
  actions:
    - ["header:X-Api-Key"]
    - [path, remote_address]
    - [remote_address]
  descriptors:
    - key: "header:X-Api-Key"
      rate_limit: {{unit: minute, requests_per_unit: 3, name: per-key}}
    - key: path
      value: /login
      descriptors:
        - key: remote_address
          rate_limit: {{unit: minute, requests_per_unit: 3, name: per-path}}
    - key: remote_address
      rate_limit: {{unit: minute, requests_per_unit: 6, name: per-address}}
"""


def chunked(target: str, fields: list[str], trailers: list[str]) -> bytes:
    lines = [f"POST {target} HTTP/1.1", "Host: a", *fields, "Transfer-Encoding: chunked", "Connection: close", "", ""]
    return "\r\n".join(lines).encode() + b"2\r\nab\r\n0\r\n" + "".join(t + "\r\n" for t in trailers).encode() + b"\r\n"


def key_attack(marker: str) -> list[bytes]:
    """One API key K, every way to make it look like another: repeated lines, a
    second value, a trailer, Connection naming it, path variants; from a new
    address each time (so only the per-key limit can hold it)."""
    reqs = []
    t = f"/api?g={marker}"
    for n in (1, 2, 3, 4):
        reqs.append(head(t, *[f"X-Api-Key: K-{marker}"] * n))
    reqs.append(head(t, f"X-Api-Key: K-{marker}", "X-Api-Key: other"))
    reqs.append(head(t, f"X-Api-Key: K-{marker}", "Connection: X-Api-Key"))
    reqs.append(chunked(t, [f"X-Api-Key: K-{marker}"], [f"X-Api-Key: T-{marker}"]))
    reqs.append(head(f"/API/?g={marker}", f"X-Api-Key: K-{marker}"))
    reqs.append(head(f"/api;s=1?g={marker}", f"X-Api-Key: K-{marker}"))
    return [r.replace(b"Host: a\r\n", b"Host: a\r\nX-Forwarded-For: 198.51.100.%d\r\n" % i) for i, r in enumerate(reqs)]


def path_attack(client: str) -> list[bytes]:
    """/login from one client, in every spelling that reaches a /login handler."""
    reqs = [xff(client, p) for p in LOGIN_VARIANTS]
    reqs.append(head("/login", "X-Forwarded-For: 192.0.2.1", f"X-Forwarded-For: {client}"))
    reqs.append(chunked("/Login/", [f"X-Forwarded-For: {client}"], ["X-Forwarded-For: 192.0.2.77"]))
    return reqs


def address_attack(client: str, marker: str) -> list[bytes]:
    """One IPv4 client, written every way: with a port, IPv4-mapped, zero-padded,
    behind a forged hop, as a trailer, with Connection naming the header."""
    t = f"/page?g={marker}"
    forms = [client, f"{client}:1234", f"::ffff:{client}", f"[::ffff:{client}]:80", f" {client} "]
    reqs = [xff(f, t) for f in forms]
    padded = ".".join(f"{int(o):03d}" for o in client.split("."))
    reqs.append(xff(padded, t))
    reqs.append(head(t, "X-Forwarded-For: 192.0.2.1", f"X-Forwarded-For: {client}"))
    reqs.append(head(t, f"X-Forwarded-For: {client}", "Connection: X-Forwarded-For"))
    reqs.append(chunked(t, [f"X-Forwarded-For: {client}"], ["X-Forwarded-For: 192.0.2.99"]))
    return reqs * 2


def prefix_attack(net: str, marker: str) -> list[bytes]:
    """One IPv6 /64 (``2001:db8:a:b``), rotating its interface ids, with zone ids,
    upper case and bracket forms."""
    t = f"/page?g={marker}"
    forms = [f"{net}::{i:x}" for i in range(1, 9)]
    forms += [f"{net}:{i:x}:{i:x}:{i:x}:{i:x}" for i in range(1, 5)]
    forms += [f"{net}::1%eth{i}" for i in range(3)] + [f"[{net.upper()}::2]:443", f"[{net}::3%25lo]:80"]
    return [xff(f, t) for f in forms]


@pytest.fixture(scope="module")
def bypass(tmp_path_factory, app):
    sc = _proxy(tmp_path_factory, app, BYPASS, "bypass")
    try:
        yield sc
    finally:
        sc.stop()


@pytest.mark.parametrize(
    "kind,limit",
    [("per-key", 3), ("per-path", 3), ("per-address", 6), ("ipv6-prefix", 6)],
)
def test_bypass_every_variant_is_admitted_at_most_the_limit(bypass, app, kind, limit):
    """A client who knows HTTP tries every variant against one kind of limit: the
    application sees at most the limit (here: exactly, the first requests are
    admitted)."""
    marker = kind
    if kind == "per-key":
        reqs = key_attack(marker)
    elif kind == "per-path":
        reqs = path_attack("203.0.113.50")
    elif kind == "per-address":
        reqs = address_attack("203.0.113.60", marker)
    else:
        reqs = prefix_attack("2001:db8:a:b", marker)
    before = app.count()
    codes = [raw_status(bypass.port, r, src=TRUSTED) for r in reqs]
    with app.lock:
        got = len(app.requests[before:])
    assert got == limit, (kind, codes)
    assert codes.count(200) == limit and set(codes) <= {200, 400, 429}, codes


def test_bypass_per_key_against_nginx_holds_the_same(app):
    """The per-key attack against nginx 1.22 (``limit_req`` on ``$http_x_api_key``):
    it holds at 3 as well -- the sidecar does what the reference does."""
    ng = nginx_per_key(app, "bykey")
    try:
        before = app.count()
        codes = [raw_status(ng.port, r) for r in key_attack("nginx-key")]
        assert codes.count(200) == 3, codes
        with app.lock:
            assert len(app.requests[before:]) == 3
    finally:
        ng.stop()
