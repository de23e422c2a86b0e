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
    ng = Nginx(
        f"""
        limit_req zone=perkey burst=2 nodelay;
        limit_req_status 429;
        location / {{
            proxy_pass http://127.0.0.1:{app.port};
            proxy_http_version 1.1;
            proxy_set_header Connection "";
        }}
        """,
        app.port,
        http_extra="limit_req_zone $http_x_api_key zone=perkey:1m rate=3r/m;",
    )
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
