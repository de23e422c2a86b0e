"""A real nginx with the shipped snippet (rules/nginx-auth-request.conf) in
front of a real upstream, asking a real sidecar through auth_request.

nginx turns any auth status other than 2xx/401/403 into 500; the snippet's
403 + error_page recipe must give the client a real 429 with Retry-After and
the X-RateLimit-* headers, while allowed requests reach the upstream.
"""

from __future__ import annotations

import json

import pytest
from sidecar_proc import SNIPPET, Nginx, Sidecar, Upstream, request, write_config

pytestmark = [pytest.mark.nginx, pytest.mark.timeout(60)]

CONFIG = """\
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

SERVER = f"""
include {SNIPPET};

location / {{
    proxy_pass http://127.0.0.1:{{up}};
    proxy_http_version 1.1;
    proxy_set_header Connection "";
}}

location /private {{
    deny all;
}}
"""


@pytest.fixture(scope="module")
def stack(tmp_path_factory):
    cfg = write_config(tmp_path_factory.mktemp("nginx") / "netlimit.yaml", CONFIG)
    up = sc = ng = None
    try:
        up = Upstream()
        sc = Sidecar(cfg)
        ng = Nginx(SERVER.replace("{up}", str(up.port)), sc.port)
        yield ng, sc, up
    finally:
        for p in (ng, sc, up):
            if p is not None:
                p.stop()


def test_allowed_requests_reach_the_upstream_with_limit_headers(stack):
    ng, sc, up = stack
    n0 = up.count()
    r = request(ng.port, "POST", "/api/items?x=1", {"Content-Type": "text/plain"}, b"payload")
    assert r.status == 200
    seen = r.json()
    assert (seen["method"], seen["raw_path"], seen["body"]) == ("POST", "/api/items?x=1", "payload")
    assert r.header("X-RateLimit-Limit") == "3"
    assert r.header("X-RateLimit-Remaining") == "2"
    assert r.header("RateLimit-Policy") == '"api-per-client";q=3;w=3600'
    assert r.header("RateLimit") == '"api-per-client";r=2;t=1200'
    assert r.header("Retry-After") is None and r.header("X-RateLimit-Retry-After") is None
    assert r.header("X-Netlimit-Problem") is None
    assert up.count() == n0 + 1
    # paths without a rule: no headers, straight through
    r = request(ng.port, "GET", "/other")
    assert r.status == 200 and r.json()["raw_path"] == "/other"
    assert r.header("X-RateLimit-Limit") is None and r.header("RateLimit") is None


def test_over_the_limit_the_client_gets_a_real_429(stack):
    ng, sc, up = stack
    # a client-sent X-Forwarded-For cannot pick another bucket: nginx replaces it with $remote_addr
    rs = [request(ng.port, "GET", "/api/orders", {"X-Forwarded-For": f"203.0.113.{i}"}) for i in range(3)]
    assert [r.status for r in rs] == [200, 200, 200]
    assert [r.header("X-RateLimit-Remaining") for r in rs] == ["2", "1", "0"]
    n = up.count()
    r = request(ng.port, "GET", "/api/orders", {"X-Forwarded-For": "203.0.113.99"})
    assert r.status == 429, (r, ng.error_log())
    assert r.header("Retry-After") == "1200"
    assert r.header("X-RateLimit-Retry-After") == "1200"
    assert r.header("X-RateLimit-Limit") == "3"
    assert r.header("X-RateLimit-Remaining") == "0"
    assert r.header("RateLimit-Policy") == '"api-per-client";q=3;w=3600'
    assert r.header("RateLimit") == '"api-per-client";r=0;t=3600'
    assert r.header("Content-Type") == "application/problem+json"
    assert json.loads(r.body) == {
        "type": "about:blank",
        "title": "Too Many Requests",
        "status": 429,
        "detail": "rate limit 'api-per-client' exceeded (3 per hour); retry after 1200 s",
        "rule": "api-per-client",
        "domain": "edge",
        "retry_after": 1200,
    }
    assert r.header("X-Netlimit-Problem") is None  # internal: never sent to the client
    assert up.count() == n  # the upstream never saw it
    assert "auth request unexpected status" not in ng.error_log()
    # the sidecar saw the client as 127.0.0.1 (nginx's $remote_addr), not the spoofed addresses
    assert "remote_address='127.0.0.1'" in sc.log()
    assert "203.0.113" not in sc.log()


def test_other_403s_stay_403(stack):
    ng, _, _ = stack
    r = request(ng.port, "GET", "/private")
    assert r.status == 403
    assert r.header("Retry-After") is None


def test_the_check_location_is_internal(stack):
    ng, _, _ = stack
    assert request(ng.port, "GET", "/_netlimit/check").status == 404
