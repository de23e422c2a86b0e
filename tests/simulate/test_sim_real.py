"""Logs written by the real programs, and the decisions the real sidecar made
while they were written: replaying the log must deny exactly the requests the
sidecar denied (429 in the log), client by client.

* nginx in front of the sidecar (auth_request), logging in nginx's combined
  format; the clients connect from different loopback addresses;
* Envoy with the rate limit filter asking the sidecar's gRPC door, logging in
  Envoy's default format (whose client is the X-Forwarded-For hop Envoy adds).

The limits are token buckets refilling once an hour, so the live decisions do
not depend on when within the test each request fell.
"""

from __future__ import annotations

import http.client
import json
import shutil
import subprocess
import sys
import tempfile
import textwrap
from collections import Counter
from pathlib import Path

import pytest
from rls_helpers import envoy_binary, grpc_sidecar
from sidecar_proc import SNIPPET, LogProc, Nginx, Sidecar, Upstream, free_port, request, wait_until, write_config

EXE = str(Path(sys.executable).with_name("netlimit"))

# (client address, path) in the order sent
TRAFFIC = [("127.0.0.2", "/api/orders")] * 6 + [("127.0.0.3", "/api/orders")] * 2
TRAFFIC += [("127.0.0.4", "/api/x"), ("127.0.0.4", "/other")] * 4 + [("127.0.0.2", "/api/y")] * 2


def _send(port: int, src: str, path: str) -> int:
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=10, source_address=(src, 0))
    try:
        conn.request("GET", path)
        r = conn.getresponse()
        r.read()
        return r.status
    finally:
        conn.close()


def _simulate(config: Path, log: Path, fmt: str) -> dict:
    p = subprocess.run(
        [EXE, "simulate", "-c", str(config), "--format", fmt, "--json", str(log)],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert p.returncode == 0, p.stderr
    return json.loads(p.stdout)


def _lines(path: Path) -> list[str]:
    try:
        return path.read_text().splitlines()
    except FileNotFoundError:
        return []


NGINX_RULES = """\
version: 1
http:
  domain: edge
  trusted_proxies: [127.0.0.1/32]        # nginx: its X-Forwarded-For is the client
  actions:
    - [path, remote_address]
  descriptors:
    - key: path
      value: /api/*
      descriptors:
        - key: remote_address
          rate_limit: {unit: hour, requests_per_unit: 3, name: api-per-client}
          algorithm: token_bucket
"""


@pytest.mark.nginx
@pytest.mark.timeout(120)
def test_an_nginx_log_replays_to_the_sidecars_decisions(tmp_path):
    cfg = write_config(tmp_path / "netlimit.yaml", NGINX_RULES)
    log = tmp_path / "access.log"
    server = f"""
        access_log {log} combined;
        include {SNIPPET};
        location / {{
            proxy_pass http://127.0.0.1:{{up}};
        }}
    """
    up = sc = ng = None
    try:
        up = Upstream()
        sc = Sidecar(cfg)
        ng = Nginx(server.replace("{up}", str(up.port)), sc.port)
        statuses = [_send(ng.port, src, path) for src, path in TRAFFIC]
        wait_until(lambda: len(_lines(log)) == len(TRAFFIC), timeout=20, what="nginx's access log lines")
    finally:
        for p in (ng, sc, up):
            if p is not None:
                p.stop()
    live = Counter(src for (src, _), s in zip(TRAFFIC, statuses) if s == 429)
    # per path and client, as the rule counts (127.0.0.2's /api/y is a key of its own)
    assert live == {"127.0.0.2": 3, "127.0.0.4": 1}, statuses
    logged = Counter(ln.split(" ", 1)[0] for ln in _lines(log) if '" 429 ' in ln)
    assert logged == live
    doc = _simulate(cfg, log, "combined")
    (r,) = doc["rules"]
    assert (r["requests"], r["denied"], r["clients"]) == (14, 4, 4)
    assert doc["unreadable"] == 0 and doc["unmatched"] == 4
    assert {c["client"]: c["denied"] for c in r["top_denied"]} == {"/api/orders, 127.0.0.2": 3, "/api/x, 127.0.0.4": 1}


ENVOY_RULES = """\
version: 1
http:
  domain: edge
  actions:
    - [remote_address]                   # what a log replay builds; Envoy sends the same descriptor
  descriptors:
    - key: remote_address
      rate_limit: {unit: hour, requests_per_unit: 3, name: per-client}
      algorithm: token_bucket
"""


def _envoy_config(listen: int, admin: int, upstream: int, grpc: int, log: Path) -> str:
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
                  access_log:
                  - name: envoy.access_loggers.file
                    typed_config:
                      "@type": type.googleapis.com/envoy.extensions.access_loggers.file.v3.FileAccessLog
                      path: {log}
                  route_config:
                    name: local
                    virtual_hosts:
                    - name: app
                      domains: ["*"]
                      routes:
                      - match: {{prefix: "/"}}
                        route:
                          cluster: upstream
                          rate_limits:
                          - actions:
                            - remote_address: {{}}
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
                - endpoint: {{address: {{socket_address: {{address: 127.0.0.1, port_value: {grpc}}}}}}}
        """)


@pytest.mark.envoy
@pytest.mark.timeout(180)
def test_an_envoy_log_replays_to_the_sidecars_decisions(tmp_path):
    binary = envoy_binary()
    cfg = write_config(tmp_path / "netlimit.yaml", ENVOY_RULES)
    log = tmp_path / "envoy-access.log"
    work = Path(tempfile.mkdtemp(prefix="netlimit-envoy-"))
    up = sc = env = None
    try:
        up = Upstream()
        sc = grpc_sidecar(cfg)
        admin, listen = free_port(), free_port()
        (work / "envoy.yaml").write_text(_envoy_config(listen, admin, up.port, sc.grpc_port, log))
        env = LogProc(
            [
                str(binary),
                "-c",
                str(work / "envoy.yaml"),
                "--disable-hot-restart",
                "--concurrency",
                "1",
                "-l",
                "warning",
                "--file-flush-interval-msec",
                "50",
            ]
        )

        def ready() -> bool:
            if env.proc.poll() is not None:
                raise AssertionError(f"envoy exited with {env.proc.returncode}:\n{env.log()[-4000:]}")
            try:
                r = request(admin, "GET", "/ready", timeout=2)
            except OSError:
                return False
            return r.status == 200 and b"LIVE" in r.body

        wait_until(ready, timeout=60, interval=0.1, what="Envoy's admin /ready = LIVE")
        statuses = [_send(listen, src, path) for src, path in TRAFFIC]
        wait_until(lambda: len(_lines(log)) == len(TRAFFIC), timeout=30, what="Envoy's access log lines")
    finally:
        for p in (env, sc, up):
            if p is not None:
                p.stop()
        shutil.rmtree(work, ignore_errors=True)
    live = Counter(src for (src, _), s in zip(TRAFFIC, statuses) if s == 429)
    # per client address: 127.0.0.2 sends 8 (5 denied), .3 sends 2, .4 sends 8 (5 denied)
    assert live == {"127.0.0.2": 5, "127.0.0.4": 5}, statuses
    assert sum(1 for ln in _lines(log) if '" 429 ' in ln) == 10
    doc = _simulate(cfg, log, "auto")
    assert doc["formats"] == ["envoy"] and doc["unreadable"] == 0
    (r,) = doc["rules"]
    assert (r["requests"], r["denied"], r["clients"]) == (len(TRAFFIC), 10, 3)
    assert {c["client"]: c["denied"] for c in r["top_denied"]} == dict(live)
