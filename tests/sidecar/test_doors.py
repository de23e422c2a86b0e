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
