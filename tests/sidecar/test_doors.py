"""The sidecar's doors against a client who knows HTTP (issue 29): a client that
pipelines decisions and never reads its answers, tried with raw sockets against
a real sidecar process whose memory is read from /proc while the attack runs."""

from __future__ import annotations

import json
import socket
import time

import pytest
from sidecar_proc import Sidecar, request, write_config

pytestmark = pytest.mark.timeout(120)

CONFIG = """\
version: 1
http:
  domain: web
  actions:
    - [remote_address]
  descriptors:
    - key: remote_address
      rate_limit: {unit: second, requests_per_unit: 1000000000, name: everyone}
"""

_JSON = json.dumps(
    {"domain": "web", "descriptors": [{"entries": [{"key": "remote_address", "value": "192.0.2.1"}]}]}
).encode()
#: one request of each decision door, as a client pipelines it
DOORS = {
    "check": b"GET /v1/check HTTP/1.1\r\nHost: a\r\n\r\n",
    "authz": b"GET /v1/authz/some/path HTTP/1.1\r\nHost: a\r\n\r\n",
    "json": b"POST /v1/check HTTP/1.1\r\nHost: a\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n%s"
    % (len(_JSON), _JSON),
}
#: the issue's goal for this attack (it grew the decision endpoint by 40-132 MiB)
GROWTH_MAX_KIB = 16 * 1024


@pytest.fixture(scope="module")
def sidecar(tmp_path_factory):
    cfg = write_config(tmp_path_factory.mktemp("doors") / "n.yaml", CONFIG)
    sc = Sidecar(cfg)
    try:
        yield sc
    finally:
        sc.stop()


def _rss_kib(pid: int) -> int:
    with open(f"/proc/{pid}/status") as f:
        return int(next(line.split()[1] for line in f if line.startswith("VmRSS:")))


def _pipeline_without_reading(port: int, req: bytes, pid: int, *, budget: float = 10.0, stall: float = 1.5):
    """Send ``req`` back to back without reading a byte, until the sidecar has stopped
    reading us for ``stall`` seconds (every buffer between us full) or ``budget``
    seconds have passed; the sidecar's RSS is sampled all along.  Returns (bytes
    sent, the largest RSS seen in KiB, the socket, still open)."""
    burst = req * 2000
    s = socket.create_connection(("127.0.0.1", port), timeout=5)
    s.setblocking(False)
    sent = 0
    peak = _rss_kib(pid)
    t0 = last = time.monotonic()
    while True:
        now = time.monotonic()
        if now - t0 > budget or now - last > stall:
            break
        try:
            n = s.send(burst)
            if n:
                sent += n
                last = now
        except BlockingIOError:
            time.sleep(0.01)
        peak = max(peak, _rss_kib(pid))
    return sent, peak, s


@pytest.mark.parametrize("door", sorted(DOORS))
def test_a_client_that_pipelines_decisions_and_never_reads_cannot_grow_the_sidecar(sidecar, door):
    req = DOORS[door]
    # the door's code paths are loaded (imports, caches) before the baseline
    for _ in range(3):
        if door == "json":
            r = sidecar.post_json("/v1/check", json.loads(_JSON))
        else:
            r = request(sidecar.port, "GET", req.split(b" ")[1].decode())
        assert r.status == 200, r
    pid = sidecar.proc.pid
    rss0 = _rss_kib(pid)
    sent, peak, s = _pipeline_without_reading(sidecar.port, req, pid)
    try:
        grown = peak - rss0
        assert sent > 1024 * 1024, "the attack did not get going"  # kernel buffers alone take megabytes
        assert grown <= GROWTH_MAX_KIB, f"{door}: RSS grew by {grown} KiB while {sent} bytes were pipelined unread"
        # what the sidecar did answer is the door's answer, in order
        s.setblocking(True)
        s.settimeout(5)
        head = s.recv(4096)
        assert head.startswith(b"HTTP/1.1 200 "), head[:200]
    finally:
        s.close()
    # and the sidecar still serves everyone else
    assert request(sidecar.port, "GET", "/healthz").status == 200


# --- --admin-token-file: the decision and operator endpoints need the shared secret ---------------

TOKEN = "k7Qm2xR9vT4wZp8sN3bL6yH1"


@pytest.fixture(scope="module")
def token_file(tmp_path_factory):
    f = tmp_path_factory.mktemp("token") / "token"
    f.write_text(TOKEN + "\n")
    f.chmod(0o600)
    return f


@pytest.fixture(scope="module")
def guarded(tmp_path_factory, token_file):
    cfg = write_config(tmp_path_factory.mktemp("guarded") / "n.yaml", CONFIG)
    sc = Sidecar(cfg, "--admin-token-file", str(token_file))
    try:
        yield sc
    finally:
        sc.stop()


def _raw(port: int, head: bytes) -> bytes:
    """One request, the answer read until the server closes or 2 s of silence."""
    with socket.create_connection(("127.0.0.1", port), timeout=5) as s:
        s.sendall(head)
        s.shutdown(socket.SHUT_WR)
        s.settimeout(2)
        out = b""
        try:
            while chunk := s.recv(65536):
                out += chunk
        except TimeoutError:
            pass
        return out


@pytest.mark.parametrize(
    "head",
    [
        b"GET /v1/check HTTP/1.1\r\nHost: a\r\n%s\r\n",
        b"GET /v1/authz/x HTTP/1.1\r\nHost: a\r\n%s\r\n",
        b"POST /v1/check HTTP/1.1\r\nHost: a\r\nContent-Length: %d\r\n%%s\r\n%s" % (len(_JSON), _JSON),
        b"GET /metrics HTTP/1.1\r\nHost: a\r\n%s\r\n",
        b"GET /v1/top HTTP/1.1\r\nHost: a\r\n%s\r\n",
        b"GET /v1/rules HTTP/1.1\r\nHost: a\r\n%s\r\n",
        b"GET /healthz HTTP/1.1\r\nHost: a\r\n%s\r\n",
    ],
    ids=["check", "authz", "json", "metrics", "top", "rules", "healthz"],
)
def test_every_endpoint_needs_the_bearer_token(guarded, head):
    good = b"Authorization: Bearer " + TOKEN.encode() + b"\r\n"
    for auth in (
        b"",  # none
        b"Authorization: Bearer " + TOKEN[:-1].encode() + b"\r\n",  # one character short
        b"Authorization: Bearer " + TOKEN.encode() + b"x\r\n",  # one character more
        b"Authorization: Basic " + TOKEN.encode() + b"\r\n",  # another scheme
        b"Authorization: " + TOKEN.encode() + b"\r\n",  # no scheme
        b"X-Authorization: Bearer " + TOKEN.encode() + b"\r\n",  # another field
    ):
        out = _raw(guarded.port, head % auth)
        assert out.startswith(b"HTTP/1.1 401 Unauthorized\r\n"), (auth, out[:300])
        assert b'\r\nWWW-Authenticate: Bearer realm="netlimit"\r\n' in out
    for auth in (good, b"Authorization: bearer  " + TOKEN.encode() + b" \r\n"):  # the scheme in any case
        out = _raw(guarded.port, head % auth)
        assert out.startswith(b"HTTP/1.1 200 OK\r\n"), (auth, out[:300])
    # two Authorization fields are refused (nginx: a duplicate unique field), never taken as one
    out = _raw(guarded.port, head % (good + good))
    assert out.startswith(b"HTTP/1.1 400 "), out[:300]


def test_refusals_are_counted_and_logged_within_bounds(tmp_path, token_file):
    cfg = write_config(tmp_path / "n.yaml", CONFIG)
    guarded = Sidecar(cfg, "--admin-token-file", str(token_file))
    try:
        _refusals_are_counted_and_logged(guarded)
    finally:
        guarded.stop()


def _refusals_are_counted_and_logged(guarded) -> None:
    mark = guarded.mark()
    for _ in range(20):
        assert request(guarded.port, "GET", "/v1/check").status == 401
    r = request(guarded.port, "GET", "/metrics", {"Authorization": f"Bearer {TOKEN}"})
    assert r.status == 200
    n = [
        float(line.split()[-1])
        for line in r.body.decode().splitlines()
        if line.startswith('netlimit_http_requests_total{endpoint="http",result="unauthorized"}')
    ]
    assert n and n[0] >= 20
    guarded.wait_line(r"refused with 401: no bearer token", start=mark)
    lines = [line for line in guarded.lines[mark:] if "refused with 401" in line]
    assert len(lines) <= 2  # at most one line per 10 s
    assert TOKEN not in guarded.log()


def test_in_proxy_mode_the_clients_need_no_token_and_the_admin_listener_does(tmp_path, token_file):
    from sidecar_proc import Upstream

    up = Upstream()
    cfg = write_config(tmp_path / "n.yaml", CONFIG)
    sc = Sidecar(cfg, "--upstream", up.url, "--admin-token-file", str(token_file))
    try:
        assert request(sc.port, "GET", "/anything").status == 200  # the public's listener
        assert sc.admin("/healthz").status == 401
        assert sc.admin("/v1/check").status == 401
        assert sc.admin("/healthz", {"Authorization": f"Bearer {TOKEN}"}).status == 200
    finally:
        sc.stop()
        up.stop()


def test_a_world_readable_token_file_is_named_in_a_warning(tmp_path):
    f = tmp_path / "token"
    f.write_text(TOKEN)
    f.chmod(0o644)
    cfg = write_config(tmp_path / "n.yaml", CONFIG)
    sc = Sidecar(cfg, "--admin-token-file", str(f))
    try:
        sc.wait_line(rf"--admin-token-file {f} is world-readable \(mode 0644\)")
        assert request(sc.port, "GET", "/v1/check", {"Authorization": f"Bearer {TOKEN}"}).status == 200
    finally:
        sc.stop()


@pytest.mark.parametrize(
    ("content", "message"),
    [
        ("", "the file is empty"),
        ("short\n", "the token has 5 characters; use at least 16"),
        ("two words of a token here\n", "one line of printable ASCII without spaces"),
        (None, "No such file or directory"),
    ],
)
def test_a_token_file_that_holds_no_token_stops_the_start(tmp_path, content, message):
    import subprocess

    from sidecar_proc import netlimit_cmd

    f = tmp_path / "token"
    if content is not None:
        f.write_text(content)
        f.chmod(0o600)
    cfg = write_config(tmp_path / "n.yaml", CONFIG)
    argv = [*netlimit_cmd(), "sidecar", "--config", str(cfg), "--listen", "127.0.0.1:0", "--admin-token-file", str(f)]
    r = subprocess.run(argv, capture_output=True, text=True, timeout=60)
    assert r.returncode == 64, r.stderr
    assert f"--admin-token-file {f}: " in r.stderr and message in r.stderr, r.stderr


@pytest.mark.parametrize("door", sorted(DOORS))
def test_a_client_that_half_closes_after_its_request_gets_the_answer(sidecar, door):
    # uvloop hands over the end of a read and the EOF in one loop iteration; the answer,
    # held for the end of the iteration, was dropped when the EOF closed the transport
    for _ in range(10):
        out = _raw(sidecar.port, DOORS[door])
        assert out.startswith(b"HTTP/1.1 200 OK\r\n"), out[:200]


# --- header: values (API keys) are hashed in /v1/top and the logs unless --show-values ---------

KEYED = """\
version: 1
http:
  domain: web
  actions:
    - ["header:X-Api-Key"]
  descriptors:
    - key: "header:X-Api-Key"
      rate_limit: {unit: minute, requests_per_unit: 1, name: per-key}
"""
SECRET = "sk_live_51HqLyjWDarjtT1zdp7dc"


@pytest.mark.parametrize("show", [False, True], ids=["hashed", "shown"])
def test_client_key_values_are_hashed_in_top_and_logs_unless_shown(tmp_path, show):
    import hashlib

    cfg = write_config(tmp_path / "n.yaml", KEYED)
    sc = Sidecar(cfg, *(["--show-values"] if show else []))
    try:
        got = [sc.get("/v1/check", {"X-Api-Key": SECRET}).status for _ in range(3)]
        assert got == [200, 429, 429]
        hashed = "sha256:" + hashlib.sha256(SECRET.encode()).hexdigest()[:16]
        shown = SECRET if show else hashed
        top = sc.get("/v1/top").json()
        assert top["denied"][0]["key"] == f"header:X-Api-Key={shown}"
        assert top["denied"][0]["count"] == 2
        sc.wait_line(rf"over limit for header:X-Api-Key='{shown}'")
        if not show:
            assert SECRET not in sc.get("/v1/top").body.decode()
            assert SECRET not in sc.log()
    finally:
        sc.stop()


# --- listeners beyond loopback are named in a warning at start -------------------------------------


@pytest.mark.netns
def test_decision_and_admin_listeners_beyond_loopback_are_warned_about(tmp_path):
    from lone_netns import LoneNetns
    from sidecar_proc import LogProc, netlimit_cmd

    cfg = write_config(tmp_path / "n.yaml", CONFIG)
    with LoneNetns("doors") as ns:
        argv = [*netlimit_cmd(), "sidecar", "--config", str(cfg), "--listen", "0.0.0.0:0", "--admin-listen", "[::]:0"]
        sc = LogProc(ns.argv(*argv))
        try:
            m = sc.wait_line(
                r"the decision listener listens on 0\.0\.0\.0:(\d+), which is not a loopback address", timeout=60
            )
            assert "there is no authentication (see --admin-token-file)" in m.string
            sc.wait_line(r"the admin listener listens on \[::\]:\d+, which is not a loopback address")
            port = int(m.group(1))
            assert ns.connect(("127.0.0.1", port), ("::1", port)) == {
                f"127.0.0.1 {port}": "answers",
                f"::1 {port}": "ConnectionRefusedError",  # 0.0.0.0 is IPv4 only
            }
        finally:
            sc.stop()
        # proxy mode: the client-facing listener is the public's, as it should be; its admin
        # listener on loopback: no warning at all
        argv = [*netlimit_cmd(), "sidecar", "--config", str(cfg), "--listen", "0.0.0.0:0"]
        sc = LogProc(ns.argv(*argv, "--upstream", "http://127.0.0.1:9", "--admin-listen", "127.0.0.1:0"))
        try:
            sc.wait_line(r"admin listener on http://127\.0\.0\.1:\d+", timeout=60)
        finally:
            sc.stop()
        assert "not a loopback address" not in sc.log()


def test_loopback_listeners_are_not_warned_about(sidecar):
    assert "not a loopback address" not in sidecar.log()


@pytest.mark.nginx
def test_nginx_auth_request_with_the_token_line_of_the_snippet(tmp_path, token_file):
    """The shipped snippet with its commented token line enabled, in front of a sidecar
    that needs the token: nginx's clients are limited as before; without the line
    nginx passes the sidecar's 401 on (a misconfiguration shows at once)."""
    from sidecar_proc import SNIPPET, Nginx, Upstream

    cfg = write_config(
        tmp_path / "n.yaml",
        CONFIG.replace("1000000000, name: everyone", "2, name: two").replace(
            "domain: web", "domain: web\n  trusted_proxies: [127.0.0.1/32]"
        ),
    )
    text = SNIPPET.read_text()
    line = '    # proxy_set_header Authorization "Bearer <the token in FILE>";\n'
    assert line in text
    for with_token in (True, False):
        snippet = tmp_path / f"snippet-{with_token}.conf"
        snippet.write_text(
            text.replace(line, f'    proxy_set_header Authorization "Bearer {TOKEN}";\n') if with_token else text
        )
        up = Upstream()
        sc = Sidecar(cfg, "--admin-token-file", str(token_file))
        try:
            ng = Nginx(f"include {snippet};\nlocation / {{ proxy_pass http://127.0.0.1:{up.port}; }}\n", sc.port)
            try:
                got = [request(ng.port, "GET", "/x").status for _ in range(3)]
            finally:
                ng.stop()
        finally:
            sc.stop()
            up.stop()
        assert got == ([200, 200, 429] if with_token else [401, 401, 401])


def test_netlimit_top_reads_a_guarded_sidecar_with_the_token(guarded, token_file, tmp_path):
    import subprocess

    from sidecar_proc import netlimit_cmd

    url = f"http://127.0.0.1:{guarded.port}"
    base = [*netlimit_cmd(), "top", "--socket", str(tmp_path / "none.sock"), "--sidecar", url, "--count", "1"]
    p = subprocess.run(base, capture_output=True, text=True, timeout=60)
    assert p.returncode == 0 and f"sidecar {url}: HTTP Error 401" in p.stdout, p.stdout + p.stderr
    p = subprocess.run([*base, "--admin-token-file", str(token_file)], capture_output=True, text=True, timeout=60)
    assert p.returncode == 0, p.stderr
    assert f"http 127.0.0.1:{guarded.port} web/everyone: " in p.stdout and "401" not in p.stdout, p.stdout
