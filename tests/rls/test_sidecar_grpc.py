"""`netlimit sidecar --grpc` as a real process: one core behind three front
doors (the proxy, the HTTP check endpoints, gRPC) sharing rules, counters and
metrics; reloads reach gRPC; bad flags and busy ports are usage errors."""

from __future__ import annotations

import asyncio
import json
import socket
import subprocess

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc
from rls_helpers import OK, OVER_LIMIT, grpc_sidecar
from rls_helpers import request as rls_request
from sidecar_proc import Upstream, get_metrics, metric, netlimit_cmd, request, write_config

from netlimit.rls.proto import rls_pb2_grpc

CONFIG = """\
version: 1
http:
  domain: doors
  actions:
    - [remote_address]
  descriptors:
    - key: remote_address
      rate_limit: {unit: day, requests_per_unit: 6}
      algorithm: token_bucket
"""


def grpc_call(port: int, *descriptors, domain: str = "doors"):
    async def go():
        async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as ch:
            return await rls_pb2_grpc.RateLimitServiceStub(ch).ShouldRateLimit(
                rls_request(domain, *descriptors), timeout=10
            )

    return asyncio.run(go())


def health(port: int) -> int:
    async def go():
        async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as ch:
            r = await health_pb2_grpc.HealthStub(ch).Check(health_pb2.HealthCheckRequest(), timeout=5)
            return r.status

    return asyncio.run(go())


@pytest.fixture
def upstream():
    u = Upstream()
    try:
        yield u
    finally:
        u.stop()


def test_one_core_three_front_doors_share_one_counter(tmp_path, upstream):
    cfg = write_config(tmp_path / "n.yaml", CONFIG)
    sc = grpc_sidecar(cfg, "--upstream", upstream.url)
    try:
        assert health(sc.grpc_port) == health_pb2.HealthCheckResponse.SERVING
        me = [("remote_address", "127.0.0.1")]  # what the HTTP doors derive for this client
        assert request(sc.port, "GET", "/app/1").status == 200  # proxy
        assert request(sc.admin_port, "GET", "/v1/check").status == 200  # HTTP check
        body = json.dumps(
            {"domain": "doors", "descriptors": [{"entries": [{"key": "remote_address", "value": "127.0.0.1"}]}]}
        ).encode()
        r = request(sc.admin_port, "POST", "/v1/check", {"Content-Type": "application/json"}, body)
        assert r.status == 200 and r.json()["statuses"][0]["limitRemaining"] == 3  # JSON API
        r = grpc_call(sc.grpc_port, me)  # gRPC
        assert r.overall_code == OK and r.statuses[0].limit_remaining == 2
        assert request(sc.port, "GET", "/app/2").status == 200
        r = grpc_call(sc.grpc_port, me)
        assert r.overall_code == OK and r.statuses[0].limit_remaining == 0
        # the 7th decision, whichever door it comes through, is over the limit
        assert grpc_call(sc.grpc_port, me).overall_code == OVER_LIMIT
        assert request(sc.port, "GET", "/app/3").status == 429
        assert request(sc.admin_port, "GET", "/v1/check").status == 429
        assert upstream.count() == 2
        m = get_metrics(sc.admin_port, "/metrics")
        assert metric(m, "netlimit_http_requests_total", endpoint="grpc", result="ok") == 2
        assert metric(m, "netlimit_http_requests_total", endpoint="grpc", result="over_limit") == 1
        assert metric(m, "netlimit_http_requests_total", endpoint="proxy", result="ok") == 2
        assert metric(m, "netlimit_http_rule_hits_total", domain="doors", rule="remote_address") == 9
        assert metric(m, "netlimit_http_rule_over_limit_total", domain="doors", rule="remote_address") == 3
    finally:
        assert sc.stop() == 0, sc.log()
    assert "stopping" in sc.log()


def test_a_reload_reaches_the_grpc_door(tmp_path):
    cfg = write_config(tmp_path / "n.yaml", CONFIG)
    sc = grpc_sidecar(cfg)
    try:
        r = grpc_call(sc.grpc_port, [("remote_address", "10.0.0.1")])
        assert r.statuses[0].current_limit.requests_per_unit == 6
        mark = sc.mark()
        write_config(cfg, CONFIG.replace("requests_per_unit: 6", "requests_per_unit: 2"))
        sc.wait_line(r"reloaded", timeout=15, start=mark)
        r = grpc_call(sc.grpc_port, [("remote_address", "10.0.0.1")])
        assert r.statuses[0].current_limit.requests_per_unit == 2 and r.statuses[0].limit_remaining == 1
        codes = [grpc_call(sc.grpc_port, [("remote_address", "10.0.0.1")]).overall_code for _ in range(2)]
        assert codes == [OK, OVER_LIMIT]
        # a bad file keeps the running rules
        mark = sc.mark()
        write_config(cfg, "version: 1\nhttp: {domain: doors, descriptors: [{key: k, rate_limit: {unit: fortnight}}]}\n")
        sc.wait_line(r"keeping the previous rules", timeout=15, start=mark)
        assert (
            grpc_call(sc.grpc_port, [("remote_address", "10.0.0.2")]).statuses[0].current_limit.requests_per_unit == 2
        )
    finally:
        sc.stop()


@pytest.mark.parametrize(
    "flag, message",
    [
        ("nonsense", "--grpc 'nonsense': expected HOST:PORT"),
        ("127.0.0.1:99999", "port must be 0-65535"),
        ("::1:80", "write IPv6 addresses as [ADDRESS]:PORT"),
    ],
)
def test_a_bad_grpc_address_is_a_usage_error(tmp_path, flag, message):
    cfg = write_config(tmp_path / "n.yaml", CONFIG)
    p = subprocess.run(
        [*netlimit_cmd(), "sidecar", "--config", str(cfg), "--listen", "127.0.0.1:0", "--grpc", flag],
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert p.returncode == 64, p.stderr
    assert message in p.stderr


def test_a_busy_grpc_port_is_a_usage_error_that_says_so(tmp_path):
    cfg = write_config(tmp_path / "n.yaml", CONFIG)
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        s.listen(1)
        port = s.getsockname()[1]
        p = subprocess.run(
            [
                *netlimit_cmd(),
                "sidecar",
                "--config",
                str(cfg),
                "--listen",
                "127.0.0.1:0",
                "--grpc",
                f"127.0.0.1:{port}",
            ],
            capture_output=True,
            text=True,
            timeout=30,
        )
    assert p.returncode == 64, p.stderr
    assert f"cannot listen for gRPC on 127.0.0.1:{port}" in p.stderr


def test_without_grpc_flag_there_is_no_grpc_server(tmp_path):
    from sidecar_proc import Sidecar

    cfg = write_config(tmp_path / "n.yaml", CONFIG)
    sc = Sidecar(cfg)
    try:
        assert "gRPC" not in sc.log()
        assert request(sc.port, "GET", "/healthz").status == 200
    finally:
        sc.stop()
