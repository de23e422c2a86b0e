"""`netlimit sidecar` as a real process: decision endpoints, JSON API, /healthz,
/metrics, reverse-proxy mode in front of a real upstream process, store failure
modes and hot reload.

Limits are token buckets per hour where exact values matter: the n-th request of
a burst then has deterministic headers (3/hour: 1 token per 1200 s, so a denied
request's Retry-After is exactly 1200 and RateLimit t is 1200 * tokens used).
"""

from __future__ import annotations

import gzip
import hashlib
import http.client
import json
import re
import signal
import time

import pytest
from sidecar_proc import (
    Sidecar,
    Upstream,
    free_port,
    get_metrics,
    logged_at,
    metric,
    netlimit_cmd,
    request,
    wait_until,
    write_config,
)

pytestmark = pytest.mark.timeout(60)

DECISION = """\
version: 1
http:
  domain: api
  actions:
    - [path, remote_address]
    - [path, header:X-Api-Key]
  descriptors:
    - key: path
      value: /hourly
      descriptors:
        - key: remote_address
          rate_limit: {unit: hour, requests_per_unit: 3, name: hourly}
          algorithm: token_bucket
    - key: path
      value: /multi
      descriptors:
        - key: remote_address
          rate_limit: {unit: hour, requests_per_unit: 5, name: multi-ip}
          algorithm: token_bucket
        - key: "header:X-Api-Key"
          rate_limit: {unit: hour, requests_per_unit: 2, name: multi-key}
          algorithm: token_bucket
    - key: path
      value: /shadow
      descriptors:
        - key: remote_address
          rate_limit: {unit: hour, requests_per_unit: 1, name: dark}
          algorithm: token_bucket
          shadow_mode: true
    - key: path
      value: /spoof
      descriptors:
        - key: remote_address
          rate_limit: {unit: hour, requests_per_unit: 2, name: spoof}
          algorithm: token_bucket
    - key: path
      value: /envoy/*
      descriptors:
        - key: remote_address
          rate_limit: {unit: hour, requests_per_unit: 2, name: envoy}
          algorithm: token_bucket
    - key: path
      value: /forbidden
      descriptors:
        - key: remote_address
          rate_limit: {unit: hour, requests_per_unit: 1, name: forbidden}
          algorithm: token_bucket
    - key: path
      value: /raw
      descriptors:
        - key: remote_address
          rate_limit: {unit: hour, requests_per_unit: 1000, name: raw}
          algorithm: token_bucket
    - key: user
      rate_limit: {unit: hour, requests_per_unit: 3, name: per-user}
      algorithm: token_bucket
    - key: metered
      rate_limit: {unit: hour, requests_per_unit: 10, name: metered}
      algorithm: token_bucket
"""

PROBLEM_CT = "application/problem+json; charset=utf-8"


def problem(rule: str, per: str, retry: int, status: int = 429, domain: str = "api") -> dict:
    return {
        "type": "about:blank",
        "title": "Too Many Requests",
        "status": status,
        "detail": f"rate limit {rule!r} exceeded ({per}); retry after {retry} s",
        "rule": rule,
        "domain": domain,
        "retry_after": retry,
    }


def rate(r, *names):
    return {n: r.header(n) for n in names}


RATE = (
    "X-RateLimit-Limit",
    "X-RateLimit-Remaining",
    "RateLimit-Policy",
    "RateLimit",
    "X-RateLimit-Retry-After",
    "Retry-After",
)


@pytest.fixture(scope="module")
def decision(tmp_path_factory):
    cfg = write_config(tmp_path_factory.mktemp("decision") / "netlimit.yaml", DECISION)
    sc = Sidecar(cfg)
    try:
        yield sc
    finally:
        sc.stop()


def check(sc, uri, *, method="GET", headers=None, query=""):
    h = {"X-Original-URI": uri, "X-Original-Method": method, **(headers or {})}
    return sc.get("/v1/check" + query, h)


# --- decision endpoint --------------------------------------------------------------------


def test_check_endpoint_allows_then_answers_429_with_every_header(decision):
    rs = [check(decision, "/hourly?page=1") for _ in range(4)]
    assert [r.status for r in rs] == [200, 200, 200, 429]
    for r, remaining, t in zip(rs[:3], (2, 1, 0), (1200, 2400, 3600)):
        assert r.body == b""
        assert rate(r, *RATE) == {
            "X-RateLimit-Limit": "3",
            "X-RateLimit-Remaining": str(remaining),
            "RateLimit-Policy": '"hourly";q=3;w=3600',
            "RateLimit": f'"hourly";r={remaining};t={t}',
            "X-RateLimit-Retry-After": None,
            "Retry-After": None,
        }
    denied = rs[3]
    assert rate(denied, *RATE) == {
        "X-RateLimit-Limit": "3",
        "X-RateLimit-Remaining": "0",
        "RateLimit-Policy": '"hourly";q=3;w=3600',
        "RateLimit": '"hourly";r=0;t=3600',
        "X-RateLimit-Retry-After": "1200",
        "Retry-After": "1200",
    }
    assert denied.header("Content-Type") == PROBLEM_CT
    assert denied.json() == problem("hourly", "3 per hour", 1200)
    assert denied.header("X-Netlimit-Problem") == json.dumps(
        problem("hourly", "3 per hour", 1200), separators=(",", ":")
    )
    # the same path through a different query string or dot segments is the same bucket
    assert check(decision, "/x/../hourly?other").status == 429


def test_check_endpoint_deny_status_for_nginx(decision):
    assert check(decision, "/forbidden", query="?deny_status=403").status == 200
    r = check(decision, "/forbidden", query="?deny_status=403")
    assert r.status == 403
    assert r.json() == problem("forbidden", "1 per hour", 3600, status=403)
    # nginx reads the 429 problem from this header (auth_request cannot read bodies)
    assert json.loads(r.header("X-Netlimit-Problem")) == problem("forbidden", "1 per hour", 3600)
    assert (r.header("Retry-After"), r.header("X-RateLimit-Retry-After")) == ("3600", "3600")


def test_check_endpoint_bad_requests(decision):
    r = decision.get("/v1/check", {"X-Original-Method": "GET"})
    assert r.status == 400 and r.header("Content-Type") == PROBLEM_CT
    assert r.json() == {
        "type": "about:blank",
        "title": "Bad Request",
        "status": 400,
        "detail": "the actions use 'path' but the request has no X-Original-URI header "
        "(nginx: proxy_set_header X-Original-URI $request_uri;)",
    }
    r = check(decision, "/hourly", query="?deny_status=500")
    assert r.status == 400
    assert r.json()["detail"] == "deny_status must be a 4xx status code, got '500'"


def test_every_descriptor_charged_most_constraining_reported(decision):
    before = get_metrics(decision.port)
    key = {"X-Api-Key": "k-multi"}
    rs = [check(decision, "/multi", headers=key) for _ in range(3)]
    assert [r.status for r in rs] == [200, 200, 429]
    # multi-key (2/hour) is the tighter one: it is reported, and it denies
    assert rate(rs[0], "X-RateLimit-Limit", "X-RateLimit-Remaining", "RateLimit-Policy") == {
        "X-RateLimit-Limit": "2",
        "X-RateLimit-Remaining": "1",
        "RateLimit-Policy": '"multi-key";q=2;w=3600',
    }
    assert rs[2].json() == problem("multi-key", "2 per hour", 1800)
    # without the header only multi-ip applies; it was charged by all three requests above
    r = check(decision, "/multi")
    assert rate(r, "X-RateLimit-Limit", "X-RateLimit-Remaining") == {
        "X-RateLimit-Limit": "5",
        "X-RateLimit-Remaining": "1",
    }
    after = get_metrics(decision.port)
    d = lambda name, rule: metric(after, name, domain="api", rule=rule) - metric(before, name, domain="api", rule=rule)
    assert d("netlimit_http_rule_hits_total", "multi-ip") == 4
    assert d("netlimit_http_rule_hits_total", "multi-key") == 3
    assert d("netlimit_http_rule_over_limit_total", "multi-key") == 1
    assert d("netlimit_http_rule_over_limit_total", "multi-ip") == 0


def test_spoofed_x_forwarded_for_is_ignored_without_trusted_proxies(decision):
    rs = [check(decision, "/spoof", headers={"X-Forwarded-For": f"198.51.100.{i}"}) for i in range(3)]
    assert [r.status for r in rs] == [200, 200, 429]  # one bucket: the peer, 127.0.0.1
    assert "is not in http.trusted_proxies: the header is ignored" in decision.log()


def test_shadow_rule_never_blocks_but_counts_and_logs(decision):
    before = get_metrics(decision.port)
    mark = decision.mark()
    rs = [check(decision, "/shadow") for _ in range(3)]
    assert [r.status for r in rs] == [200, 200, 200]
    assert all(r.header("X-RateLimit-Limit") is None and r.header("Retry-After") is None for r in rs)
    decision.wait_line(
        r"shadow_mode rule 'dark' \(domain api, 1 per hour \(token_bucket\)\) would have "
        r"limited path='/shadow', remote_address='127\.0\.0\.1'",
        start=mark,
    )
    after = get_metrics(decision.port)
    for name, n in (
        ("netlimit_http_rule_hits_total", 3),
        ("netlimit_http_rule_over_limit_total", 2),
        ("netlimit_http_rule_shadow_over_limit_total", 2),
        ("netlimit_http_rule_within_limit_total", 1),
    ):
        assert metric(after, name, domain="api", rule="dark") - metric(before, name, domain="api", rule="dark") == n, (
            name
        )


def test_envoy_ext_authz_path(decision):
    rs = [request(decision.port, "POST", "/v1/authz/envoy/a?x=1") for _ in range(3)]
    assert [r.status for r in rs] == [200, 200, 429]
    assert rs[0].header("X-RateLimit-Remaining") == "1"
    assert rs[2].json() == problem("envoy", "2 per hour", 1800)
    assert rs[2].header("X-Netlimit-Problem") is None
    # the wildcard counts each concrete path apart (as Lyft)
    assert request(decision.port, "GET", "/v1/authz/envoy/b").status == 200


# --- HTTP/1.1 details on the decision port (fast path and aiohttp alike) ------------------


def read_responses(sock, n: int, head_only: tuple[int, ...] = ()) -> list[tuple[str, dict[str, str], bytes]]:
    """Read n responses (Content-Length framed) from a socket: (status line, headers, body)."""
    buf = b""
    out = []
    deadline = time.monotonic() + 5
    while len(out) < n:
        end = buf.find(b"\r\n\r\n")
        if end >= 0:
            lines = buf[:end].decode("latin-1").split("\r\n")
            h = {k.lower(): v.strip() for k, _, v in (x.partition(":") for x in lines[1:])}
            size = 0 if len(out) in head_only else int(h.get("content-length", "0"))
            if len(buf) >= end + 4 + size:
                out.append((lines[0], h, buf[end + 4 : end + 4 + size]))
                buf = buf[end + 4 + size :]
                continue
        assert time.monotonic() < deadline, (out, buf)
        chunk = sock.recv(65536)
        if not chunk:
            break
        buf += chunk
    assert len(out) == n, (out, buf)
    return out


def raw_conn(sc):
    import socket

    s = socket.create_connection(("127.0.0.1", sc.port), timeout=5)
    return s


CHECK_RAW = b"GET /v1/check HTTP/1.1\r\nHost: t\r\nX-Original-URI: /raw\r\n\r\n"


def test_pipelined_requests_are_answered_in_order_across_the_handoff(decision):
    body = json.dumps({"domain": "api", "descriptors": [{"entries": [{"key": "metered", "value": "pipe"}]}]}).encode()
    with raw_conn(decision) as s:
        s.sendall(
            CHECK_RAW + CHECK_RAW + b"POST /v1/check HTTP/1.1\r\nHost: t\r\nContent-Type: application/json\r\n"
            b"Content-Length: " + str(len(body)).encode() + b"\r\n\r\n" + body + CHECK_RAW
        )
        rs = read_responses(s, 4)
    assert [r[0] for r in rs] == ["HTTP/1.1 200 OK"] * 4
    rem = [int(r[1]["x-ratelimit-remaining"]) for r in rs]
    assert rem[1] == rem[0] - 1 and rem[3] == rem[1] - 1
    assert json.loads(rs[2][2])["statuses"][0]["rule"] == "metered"


def test_connection_close_and_http10_keep_alive(decision):
    with raw_conn(decision) as s:
        s.sendall(b"GET /v1/check HTTP/1.1\r\nHost: t\r\nConnection: close\r\nX-Original-URI: /raw\r\n\r\n")
        (r,) = read_responses(s, 1)
        assert r[0] == "HTTP/1.1 200 OK" and r[1]["connection"] == "close"
        assert s.recv(10) == b""  # closed by the server
    with raw_conn(decision) as s:
        req = b"GET /v1/check HTTP/1.0\r\nConnection: keep-alive\r\nX-Original-URI: /raw\r\n\r\n"
        s.sendall(req)
        (r1,) = read_responses(s, 1)
        s.sendall(req)
        (r2,) = read_responses(s, 1)
        assert r1[1]["connection"].lower() == "keep-alive" and r2[0].endswith("200 OK")
    with raw_conn(decision) as s:
        s.sendall(b"GET /v1/check HTTP/1.0\r\nX-Original-URI: /raw\r\n\r\n")
        (r,) = read_responses(s, 1)
        assert r[0].endswith("200 OK") and s.recv(10) == b""  # HTTP/1.0 without keep-alive: closed


def test_head_and_bodies_and_malformed_heads(decision):
    with raw_conn(decision) as s:
        # HEAD: the headers of the GET, no body
        s.sendall(b"HEAD /v1/check HTTP/1.1\r\nHost: t\r\nX-Original-URI: /raw\r\n\r\n" + CHECK_RAW)
        rs = read_responses(s, 2, head_only=(0,))
        assert rs[0][2] == b"" and rs[0][1]["x-ratelimit-limit"] == "1000"
        assert rs[1][0] == "HTTP/1.1 200 OK"
        # a GET with a body is still answered (by aiohttp), and the connection goes on
        s.sendall(
            b"GET /v1/check HTTP/1.1\r\nHost: t\r\nX-Original-URI: /raw\r\nContent-Length: 5\r\n\r\nhello" + CHECK_RAW
        )
        rs = read_responses(s, 2)
        assert [r[0] for r in rs] == ["HTTP/1.1 200 OK"] * 2
    with raw_conn(decision) as s:
        # bare LF line ends are not left waiting for a CRLF CRLF that never comes
        s.sendall(b"GET /v1/check HTTP/1.1\nHost: t\nX-Original-URI: /raw\n\n")
        (r,) = read_responses(s, 1)
        assert r[0].split(" ")[1] in ("200", "400"), r
    with raw_conn(decision) as s:
        # whitespace before the colon is a request-smuggling vector: 400 (RFC 9112 §5.1)
        s.sendall(b"GET /v1/check HTTP/1.1\r\nHost: t\r\nX-Original-URI : /raw\r\n\r\n")
        (r,) = read_responses(s, 1)
        assert r[0].split(" ")[1] == "400", r  # aiohttp answers parse errors (as HTTP/1.0)
    with raw_conn(decision) as s:
        # two Content-Lengths: where does the request end? never guess (smuggling): 400
        s.sendall(
            b"GET /v1/check HTTP/1.1\r\nHost: t\r\nX-Original-URI: /raw\r\nContent-Length: 0\r\n"
            b"Content-Length: 5\r\n\r\nhello"
        )
        (r,) = read_responses(s, 1)
        assert r[0].split(" ")[1] == "400", r


# --- JSON API ---------------------------------------------------------------------------


def test_json_api_ok_then_over_limit(decision):
    body = {
        "domain": "api",
        "descriptors": [
            {"entries": [{"key": "user", "value": "alice"}]},
            {"entries": [{"key": "nomatch", "value": "x"}]},
        ],
    }
    r = decision.post_json("/v1/check", body)
    assert r.status == 200 and r.header("Content-Type") == "application/json; charset=utf-8"
    assert r.json() == {
        "overallCode": "OK",
        "statuses": [
            {
                "code": "OK",
                "rule": "per-user",
                "currentLimit": {"name": "per-user", "requestsPerUnit": 3, "unit": "HOUR"},
                "algorithm": "token_bucket",
                "shadowMode": False,
                "limitRemaining": 2,
                "durationUntilReset": "1200s",
                "source": "store",
            },
            {"code": "OK"},
        ],
    }
    assert rate(r, "X-RateLimit-Limit", "X-RateLimit-Remaining") == {
        "X-RateLimit-Limit": "3",
        "X-RateLimit-Remaining": "2",
    }
    r = decision.post_json("/v1/check", {**body, "hits_addend": 2})
    assert r.status == 200 and r.json()["statuses"][0]["limitRemaining"] == 0
    r = decision.post_json("/v1/check", body)
    assert r.status == 429
    st = r.json()["statuses"][0]
    assert re.fullmatch(r"3599\.\d{3}s|3600s", st.pop("durationUntilReset"))
    assert r.json()["overallCode"] == "OVER_LIMIT"
    assert st == {
        "code": "OVER_LIMIT",
        "rule": "per-user",
        "currentLimit": {"name": "per-user", "requestsPerUnit": 3, "unit": "HOUR"},
        "algorithm": "token_bucket",
        "shadowMode": False,
        "limitRemaining": 0,
        "retryAfter": 1200,
        "source": "store",
    }
    assert (r.header("Retry-After"), r.header("X-RateLimit-Retry-After")) == ("1200", "1200")


def test_json_api_camel_case_cost_and_unknown_domain(decision):
    r = decision.post_json(
        "/v1/check",
        {"domain": "api", "hitsAddend": 4, "descriptors": [{"entries": [{"key": "metered", "value": "m"}]}]},
    )
    assert r.json()["statuses"][0]["limitRemaining"] == 6
    r = decision.post_json(
        "/v1/check", {"domain": "elsewhere", "descriptors": [{"entries": [{"key": "user", "value": "x"}]}]}
    )
    assert (r.status, r.json()) == (200, {"overallCode": "OK", "statuses": [{"code": "OK"}]})
    assert r.header("X-RateLimit-Limit") is None


def test_json_api_takes_lyfts_per_descriptor_cost_and_limit_override(decision):
    """The JSON door reads the whole RateLimitRequest shape, as the gRPC door does:
    a descriptor's own hitsAddend (0 = a free probe) and a limit override, which
    applies even where no configured descriptor matches."""
    entry = {"key": "nothing-configured", "value": "json-override"}
    ov = {"requestsPerUnit": 2, "unit": "MINUTE"}
    probe = decision.post_json(
        "/v1/check", {"domain": "api", "descriptors": [{"entries": [entry], "limit": ov, "hitsAddend": 0}]}
    )
    assert probe.status == 200 and probe.json()["statuses"][0]["limitRemaining"] == 2  # nothing charged
    codes = []
    for _ in range(3):
        r = decision.post_json("/v1/check", {"domain": "api", "descriptors": [{"entries": [entry], "limit": ov}]})
        codes.append(r.status)
        st = r.json()["statuses"][0]
        assert st["currentLimit"] == {"name": "override 2 per minute", "requestsPerUnit": 2, "unit": "MINUTE"}
    assert codes == [200, 200, 429]


@pytest.mark.parametrize(
    "raw,detail",
    [
        (
            b"{not json",
            "the body is not valid JSON: Expecting property name enclosed in double quotes at line 1 column 2",
        ),
        (
            b"",
            'empty body: expected JSON like {"domain": "api", "descriptors": [{"entries": [{"key": '
            '"remote_address", "value": "10.0.0.1"}]}]}',
        ),
        (b"[1]", "the body must be a JSON object, got list"),
        (b'{"domain": "api"}', '\'descriptors\' must be a list of {"entries": [{"key": ..., "value": ...}]}'),
        (b'{"domain": 1, "descriptors": []}', "'domain' must be a non-empty string"),
        (
            b'{"domain": "api", "descriptors": [{"entries": [{"key": "a", "value": 1}]}]}',
            "descriptors[0].entries[0].value must be a string",
        ),
        (b'{"domain": "api", "descriptors": [{"entries": []}]}', "descriptors[0].entries is empty"),
        (
            b'{"domain": "api", "descriptors": [{"entries": [{"key": "a"}]}], "hits_addend": -1}',
            "hits_addend must be a whole number from 0 to 1000000, got -1",
        ),
        (
            b'{"domain": "api", "descriptors": [{"entries": [{"key": "a"}], "hitsAddend": 2000000}]}',
            "descriptors[0].hits_addend must be a whole number from 0 to 1000000, got 2000000",
        ),
        (b'{"domain": "api", "descriptors": []}', "the descriptor list must not be empty"),
        (
            b'{"domain": "api", "descriptors": [], "extra": 1}',
            "unknown field(s) 'extra': expected domain, descriptors, hitsAddend",
        ),
        (b'{"domain": "api", "descriptors": ' + b"[" * 30_000 + b"]" * 30_000 + b"}", None),
        (b'{"domain": "api", "descriptors": [], "hits_addend": ' + b"9" * 5000 + b"}", None),
        (
            b'{"domain": "api", "descriptors": [{"entries": [{"key": "a"}], "limit": {"unit": "FORTNIGHT"}}]}',
            "descriptors[0].limit.unit must be one of SECOND, MINUTE, HOUR, DAY, MONTH, YEAR, got \"'FORTNIGHT'\"",
        ),
    ],
)
def test_json_api_bad_input_is_400_with_a_clear_message(decision, raw, detail):
    r = decision.post_json("/v1/check", raw)
    assert r.status == 400
    assert r.header("Content-Type") == PROBLEM_CT
    doc = r.json()
    if detail is None:  # hostile bodies: a 400 naming JSON, never a server error or a traceback
        assert doc["detail"].startswith("the body is not valid JSON"), doc
    else:
        assert doc == {"type": "about:blank", "title": "Bad Request", "status": 400, "detail": detail}


def test_json_api_body_size_is_bounded(decision):
    r = decision.post_json("/v1/check", b"{" + b" " * 70_000 + b"}")
    assert r.status == 413 and r.json()["detail"] == "the JSON body is limited to 65536 bytes"


# --- health, metrics ------------------------------------------------------------------------


def test_healthz_and_rules(decision):
    # The previous test's connection may still be closing on the server's side: wait for
    # the count to settle at this request's own connection (a deadline, not a sleep).
    wait_until(lambda: decision.get("/healthz").json()["connections"] == 1, 10, what="one connection")
    r = decision.get("/healthz")
    assert r.status == 200
    assert r.json() == {
        "status": "ok",
        "mode": "decision",
        "domain": "api",
        "rules": 10,
        "store": "memory",
        "store_available": True,
        "on_store_failure": "local",
        "config": str(decision.config),
        "config_sha256": hashlib.sha256(DECISION.encode()).hexdigest(),
        "last_reload_error": None,
        "connections": 1,
        "connections_shed": 0,
        "admin_connections": 0,
    }
    rules = decision.get("/v1/rules").json()
    assert rules["domain"] == "api"
    assert rules["rules"][0] == {
        "name": "hourly",
        "path": "path_/hourly.remote_address",
        "keys": ["path", "remote_address"],
        "shadow_mode": False,
        "unit": "hour",
        "requests_per_unit": 3,
        "algorithm": "token_bucket",
    }


def test_metrics_endpoint_parses_with_bounded_labels(decision):
    for i in range(3):  # many distinct clients / users: labels must not grow with them
        decision.post_json(
            "/v1/check", {"domain": "api", "descriptors": [{"entries": [{"key": "metered", "value": f"c{i}"}]}]}
        )
    s = get_metrics(decision.port)
    assert metric(s, "netlimit_http_rules") == 10
    assert metric(s, "netlimit_http_store_up") == 1
    assert metric(s, "netlimit_http_store_errors_total", reason="timeout") == 0
    assert metric(s, "netlimit_http_store_fallbacks_total", mode="local") == 0
    assert metric(s, "netlimit_http_decision_seconds_count") >= 3
    assert metric(s, "netlimit_http_decision_seconds_bucket", le="+Inf") == metric(
        s, "netlimit_http_decision_seconds_count"
    )
    assert metric(s, "netlimit_http_requests_total", endpoint="json", result="ok") >= 3
    rule_labels = {dict(lbl)["rule"] for (name, lbl) in s if name == "netlimit_http_rule_hits_total"}
    assert rule_labels == {
        "hourly",
        "multi-ip",
        "multi-key",
        "dark",
        "spoof",
        "envoy",
        "forbidden",
        "raw",
        "per-user",
        "metered",
    }
    assert not any("c1" in str(lbl) or "127.0.0.1" in str(lbl) for (_, lbl) in s)


# --- startup, reload, store failures --------------------------------------------------------------


def test_invalid_file_at_start_exits_1_with_positions(tmp_path):
    import subprocess

    cfg = write_config(
        tmp_path / "bad.yaml",
        "version: 1\nhttp:\n  domain: api\n  descriptors:\n"
        "    - key: k\n      rate_limit: {unit: fortnight, requests_per_unit: 1}\n",
    )
    p = subprocess.run(
        [*netlimit_cmd(), "sidecar", "--config", str(cfg), "--listen", "127.0.0.1:0"],
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert p.returncode == 1
    # every line with its time and level (netlimit/logs.py), then the problem
    assert [re.sub(r"^\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3} ", "", x) for x in p.stderr.splitlines()] == [
        f"ERROR {cfg}:6:26: http: 'unit' must be one of 'second', 'minute', 'hour', 'day', 'week', 'month', 'year', "
        "got 'fortnight'",
        f"ERROR {cfg}: 1 problem; the sidecar did not start",
    ]


RELOAD = """\
version: 1
http:
  domain: api
  actions:
    - [remote_address]
  descriptors:
    - key: remote_address
      rate_limit: {{unit: hour, requests_per_unit: {n}, name: r}}
      algorithm: token_bucket
"""


def test_hot_reload_rename_inplace_bad_file_and_sighup(tmp_path):
    cfg = write_config(tmp_path / "r.yaml", RELOAD.format(n=2))
    sc = Sidecar(cfg)
    try:
        limit = lambda: sc.post_json(
            "/v1/check",
            {"domain": "api", "descriptors": [{"entries": [{"key": "remote_address", "value": "192.0.2.1"}]}]},
        ).header("X-RateLimit-Limit")
        assert limit() == "2"
        # 1. an editor replacing the file by rename (new inode)
        mark = sc.mark()
        write_config(cfg, RELOAD.format(n=5))
        sc.wait_line(r"reloaded \(file changed\): domain 'api', 1 rules", timeout=5, start=mark)
        assert limit() == "5"
        # 2. an in-place rewrite (same inode)
        mark = sc.mark()
        with open(cfg, "w") as f:
            f.write(RELOAD.format(n=7))
        sc.wait_line(r"reloaded \(file changed\)", timeout=5, start=mark)
        assert limit() == "7"
        # 3. a bad file: every problem logged as FILE:LINE:COL, the old rules stay
        mark = sc.mark()
        write_config(cfg, RELOAD.format(n=7).replace("token_bucket", "token_bucket\n      zzzzzz: 1"))
        m = sc.wait_line(
            r"reload \(file changed\) failed with 1 problem; keeping the previous rules", timeout=5, start=mark
        )
        assert m is not None
        bad = [line for line in sc.log().splitlines()[mark:] if "zzzzzz" in line]
        assert len(bad) == 1 and f"ERROR {cfg}:10:7: http: unknown field 'zzzzzz'" in bad[0], sc.log().splitlines()[
            mark:
        ]
        assert limit() == "7"
        h = sc.get("/healthz").json()
        assert h["last_reload_error"].startswith(f"{cfg}:10:7: http: unknown field 'zzzzzz'")
        assert h["config_sha256"] == hashlib.sha256(RELOAD.format(n=7).encode()).hexdigest()
        s = get_metrics(sc.port)
        assert metric(s, "netlimit_http_config_reloads_total", result="error") == 1
        assert metric(s, "netlimit_http_config_last_reload_successful") == 0
        # 4. fixed file, then SIGHUP reloads too
        mark = sc.mark()
        write_config(cfg, RELOAD.format(n=9))
        sc.wait_line(r"reloaded \(file changed\)", timeout=5, start=mark)
        assert limit() == "9"
        mark = sc.mark()
        sc.signal(signal.SIGHUP)
        sc.wait_line(r"reloaded \(SIGHUP\)", timeout=5, start=mark)
        s = get_metrics(sc.port)
        assert metric(s, "netlimit_http_config_reloads_total", result="ok") == 4
        assert metric(s, "netlimit_http_config_last_reload_successful") == 1
        assert sc.get("/healthz").json()["last_reload_error"] is None
    finally:
        assert sc.stop() == 0


def test_reload_never_reads_a_half_written_file_and_holds_one_without_rules(tmp_path):
    """A rewrite caught mid-write (its first lines parse: a domain and no
    descriptors) is never loaded; a complete file with no rules is held until it has
    stayed the same for a second, then applied with a warning."""
    cfg = write_config(tmp_path / "r.yaml", RELOAD.format(n=2))
    sc = Sidecar(cfg)
    try:
        limit = lambda: sc.post_json(
            "/v1/check",
            {"domain": "api", "descriptors": [{"entries": [{"key": "remote_address", "value": "192.0.2.9"}]}]},
        ).header("X-RateLimit-Limit")
        assert limit() == "2"
        full = RELOAD.format(n=4)
        head = full.split("  descriptors:")[0]  # version, domain, actions: a valid file without rules
        mark = sc.mark()
        with open(cfg, "w") as fh:
            fh.write(head)
            fh.flush()
            time.sleep(1.5)  # the writer pauses; nothing may be loaded meanwhile
            assert limit() == "2"
            assert "reload" not in "\n".join(sc.log().splitlines()[mark:])
            fh.write(full[len(head) :])
        sc.wait_line(r"reloaded \(file changed\): domain 'api', 1 rules", timeout=5, start=mark)
        assert limit() == "4"
        # a complete file without rules: held, then applied
        mark = sc.mark()
        write_config(cfg, head + "  descriptors: []\n")
        held = sc.wait_line(r"would remove 1 of the 1 running rules; holding it back", timeout=10, start=mark)
        during = limit()
        answered = time.time()
        applied = sc.wait_line(r"reloaded \(held file\): domain 'api', 0 rules", timeout=10, start=mark)
        sc.wait_line(r"the file still removes most rules after 1 s: applying it", timeout=10, start=mark)
        # the hold, on the sidecar's own clock (a loaded machine can only make it longer)
        assert logged_at(applied) - logged_at(held) >= 0.9
        # during the hold the running rules answer; only a check that a loaded machine
        # delayed past the hold's end may see the new file
        assert during == "4" or logged_at(applied) <= answered + 0.001, (during, applied.string)
        assert limit() is None
    finally:
        assert sc.stop() == 0


STORE_DOWN = """\
version: 1
http:
  domain: api
  on_store_failure: {mode}
  store_timeout_ms: 50
  actions:
    - [remote_address]
  descriptors:
    - key: remote_address
      rate_limit: {{unit: hour, requests_per_unit: 3, name: guarded}}
      algorithm: token_bucket
"""


def test_unreachable_store_local_closed_open_never_5xx(tmp_path):
    cfg = write_config(tmp_path / "s.yaml", STORE_DOWN.format(mode="local"))
    dead = free_port()  # nothing listens there: connection refused
    sc = Sidecar(cfg, "--redis", f"redis://127.0.0.1:{dead}/0")
    try:

        def one():
            return sc.get("/v1/check", {"X-Original-URI": "/"})

        # local: decided by the in-memory store, with headers, limits still hold
        rs = [one() for _ in range(4)]
        assert [r.status for r in rs] == [200, 200, 200, 429]
        assert rs[0].header("X-RateLimit-Remaining") == "2" and rs[3].header("Retry-After") == "1200"
        sc.wait_line(
            r"WARNING store failure \(connection\): redis token_bucket for .*deciding with the "
            r"local in-memory store \(on_store_failure: local\), retrying every 0.25s"
        )
        h = sc.get("/healthz").json()
        assert (h["store"], h["store_available"]) == ("redis", False)
        s = get_metrics(sc.port)
        assert metric(s, "netlimit_http_store_fallbacks_total", mode="local") == 4
        assert metric(s, "netlimit_http_store_errors_total", reason="connection") >= 1
        assert metric(s, "netlimit_http_store_up") == 0

        # closed (hot reload): denied with 429 + Retry-After = the breaker's retry interval
        mark = sc.mark()
        write_config(cfg, STORE_DOWN.format(mode="closed"))
        sc.wait_line(r"reloaded \(file changed\).*on_store_failure closed", timeout=5, start=mark)
        r = one()
        assert r.status == 429
        assert rate(r, *RATE) == {
            "X-RateLimit-Limit": "3",
            "X-RateLimit-Remaining": "0",
            "RateLimit-Policy": '"guarded";q=3;w=3600',
            "RateLimit": '"guarded";r=0;t=1',
            "X-RateLimit-Retry-After": "1",
            "Retry-After": "1",
        }
        assert r.json() == {
            "type": "about:blank",
            "title": "Too Many Requests",
            "status": 429,
            "detail": "the rate-limit store is unavailable and on_store_failure is 'closed'; retry after 1 s",
            "rule": "guarded",
            "domain": "api",
            "retry_after": 1,
        }

        # open: allowed, no limit headers
        mark = sc.mark()
        write_config(cfg, STORE_DOWN.format(mode="open"))
        sc.wait_line(r"reloaded \(file changed\).*on_store_failure open", timeout=5, start=mark)
        r = one()
        assert r.status == 200 and r.header("X-RateLimit-Limit") is None
        s = get_metrics(sc.port)
        assert metric(s, "netlimit_http_store_fallbacks_total", mode="closed") == 1
        assert metric(s, "netlimit_http_store_fallbacks_total", mode="open") == 1
        assert sc.log().count("store is back") == 0
    finally:
        sc.stop()


# --- reverse proxy --------------------------------------------------------------------------------

PROXY = """\
version: 1
http:
  domain: web
  trusted_proxies: [127.0.0.1/32]
  actions:
    - [remote_address]
  descriptors:
    - key: remote_address
      rate_limit: {unit: hour, requests_per_unit: 3, name: per-client}
      algorithm: token_bucket
"""


@pytest.fixture(scope="module")
def upstream():
    up = Upstream()
    try:
        yield up
    finally:
        up.stop()


@pytest.fixture(scope="module")
def proxy(tmp_path_factory, upstream):
    cfg = write_config(tmp_path_factory.mktemp("proxy") / "netlimit.yaml", PROXY)
    sc = Sidecar(cfg, "--upstream", upstream.url)
    try:
        yield sc
    finally:
        sc.stop()


_client = iter(range(1, 250))


def client_ip() -> dict[str, str]:
    """A fresh client (trusted X-Forwarded-For from 127.0.0.1) so each test has its own bucket."""
    return {"X-Forwarded-For": f"198.51.100.{next(_client)}"}


def test_proxy_passes_request_and_response_through(proxy):
    xff = client_ip()
    r = request(
        proxy.port,
        "GET",
        "/echo/p%2Fq?a=1&b=%20",
        [
            ("Host", "app.example"),
            ("X-Custom", "v1"),
            ("X-Custom", "v2"),
            ("X-Forwarded-For", xff["X-Forwarded-For"]),
            ("Connection", "keep-alive, X-Hop-Req"),
            ("X-Hop-Req", "secret"),
            ("Keep-Alive", "timeout=5"),
            ("TE", "trailers"),
            ("Accept", "text/x-test"),
            ("User-Agent", "test-agent/1"),
        ],
    )
    assert r.status == 200
    seen = r.json()
    assert (seen["method"], seen["raw_path"], seen["body"]) == ("GET", "/echo/p%2Fq?a=1&b=%20", "")
    assert seen["headers"] == [
        ["Host", "app.example"],
        ["X-Custom", "v1"],
        ["X-Custom", "v2"],
        ["X-Forwarded-For", f"{xff['X-Forwarded-For']}, 127.0.0.1"],
        ["Accept", "text/x-test"],
        ["User-Agent", "test-agent/1"],
        ["Via", "1.1 netlimit"],
    ]
    assert r.all("Set-Cookie") == ["a=1; Path=/", "b=2; Path=/"]
    assert r.header("X-Upstream") == "yes"
    assert r.header("Content-Type") == "application/json; charset=utf-8"
    assert rate(r, *RATE) == {
        "X-RateLimit-Limit": "3",
        "X-RateLimit-Remaining": "2",
        "RateLimit-Policy": '"per-client";q=3;w=3600',
        "RateLimit": '"per-client";r=2;t=1200',
        "X-RateLimit-Retry-After": None,
        "Retry-After": None,
    }


def test_proxy_statuses_and_bodies_pass_through(proxy):
    for method, code in (("GET", 404), ("GET", 503), ("DELETE", 204), ("POST", 201)):
        r = request(proxy.port, method, f"/status/{code}", client_ip(), b"x" if method == "POST" else None)
        assert r.status == code
        assert r.body == (b"" if code == 204 else f"status {code}".encode())
        assert r.header("X-RateLimit-Remaining") == "2"


def test_proxy_hop_by_hop_response_headers_are_dropped(proxy):
    r = request(proxy.port, "GET", "/hop", client_ip())
    assert (r.status, r.body) == (200, b"hop")
    assert r.header("X-End-To-End") == "keep me"
    assert r.header("X-Hop-Secret") is None and r.header("Keep-Alive") is None


def test_proxy_streams_large_bodies_both_ways(proxy):
    from upstream_app import big_body

    data = bytes(range(256)) * (3 * 4096)  # 3 MiB
    r = request(proxy.port, "POST", "/upload", client_ip(), data)
    assert r.json() == {
        "size": len(data),
        "sha256": hashlib.sha256(data).hexdigest(),
        "chunked": False,
        "content_length": str(len(data)),
    }
    # chunked upload stays chunked
    conn = http.client.HTTPConnection("127.0.0.1", proxy.port, timeout=10)
    try:
        conn.request("POST", "/upload", body=iter([data[:1000], data[1000:]]), headers=client_ip(), encode_chunked=True)
        assert json.loads(conn.getresponse().read()) == {
            "size": len(data),
            "sha256": hashlib.sha256(data).hexdigest(),
            "chunked": True,
            "content_length": None,
        }
    finally:
        conn.close()
    r = request(proxy.port, "GET", "/big?n=5000000", client_ip())
    assert r.header("Content-Length") == "5000000"
    assert hashlib.sha256(r.body).digest() == hashlib.sha256(big_body(5_000_000)).digest()
    r = request(proxy.port, "HEAD", "/big?n=1000", client_ip())
    assert (r.status, r.body, r.header("Content-Length")) == (200, b"", "1000")


def test_proxy_keeps_content_encoding(proxy):
    r = request(proxy.port, "GET", "/gzip", {**client_ip(), "Accept-Encoding": "gzip"})
    assert r.header("Content-Encoding") == "gzip"
    assert r.body == gzip.compress(b"compressed hello\n" * 100, mtime=0)


def test_proxy_streams_the_response_as_it_comes(proxy):
    conn = http.client.HTTPConnection("127.0.0.1", proxy.port, timeout=10)
    try:
        t0 = time.monotonic()
        conn.request("GET", "/stream", headers=client_ip())
        resp = conn.getresponse()
        first = resp.readline()
        t_first = time.monotonic() - t0
        rest = resp.read()
        t_all = time.monotonic() - t0
    finally:
        conn.close()
    assert (first, rest) == (b"chunk-0\n", b"chunk-1\nchunk-2\n")
    assert t_first < 0.5 <= 1.2 <= t_all, (t_first, t_all)


def test_proxy_429_after_the_limit_never_reaches_the_upstream(proxy, upstream):
    who = client_ip()
    rs = [request(proxy.port, "GET", "/echo", who) for _ in range(3)]
    assert [r.status for r in rs] == [200, 200, 200]
    n = upstream.count()
    r = request(proxy.port, "GET", "/echo", who)
    assert r.status == 429
    assert rate(r, *RATE) == {
        "X-RateLimit-Limit": "3",
        "X-RateLimit-Remaining": "0",
        "RateLimit-Policy": '"per-client";q=3;w=3600',
        "RateLimit": '"per-client";r=0;t=3600',
        "X-RateLimit-Retry-After": "1200",
        "Retry-After": "1200",
    }
    assert r.header("Content-Type") == PROBLEM_CT
    assert r.json() == problem("per-client", "3 per hour", 1200, domain="web")
    assert r.header("X-Netlimit-Problem") is None
    assert upstream.count() == n
    # another client is not affected
    assert request(proxy.port, "GET", "/echo", client_ip()).status == 200


def test_proxy_mode_operator_and_decision_endpoints_are_only_on_the_admin_listener(proxy, upstream):
    """No client of the proxy can reach /metrics, /v1/rules or the decision API (with
    which it could charge another client's counters): every path of the proxy
    listener is the application's."""
    h = proxy.admin("/healthz").json()
    assert (h["mode"], h["domain"], h["status"]) == ("proxy", "web", "ok")
    assert metric(get_metrics(proxy.admin_port, "/metrics"), "netlimit_http_rules") == 1
    assert proxy.admin("/v1/rules").json()["domain"] == "web"
    for path in ("/healthz", "/metrics", "/v1/rules", "/v1/check", "/_netlimit/healthz", "/_netlimit/v1/check"):
        r = request(proxy.port, "GET", path, client_ip())
        assert r.json()["raw_path"] == path, path  # the application's own paths


def test_proxy_upstream_down_is_502(tmp_path):
    cfg = write_config(tmp_path / "p.yaml", PROXY)
    sc = Sidecar(cfg, "--upstream", f"http://127.0.0.1:{free_port()}")
    try:
        r = request(sc.port, "GET", "/x")
        assert r.status == 502
        assert r.json() == {
            "type": "about:blank",
            "title": "Bad Gateway",
            "status": 502,
            "detail": "the upstream application is unreachable",
        }
        assert r.header("X-RateLimit-Remaining") == "2"
    finally:
        sc.stop()


def test_proxy_answers_expect_100_continue_before_the_body(proxy):
    import socket

    body = b"y" * 5000
    with socket.create_connection(("127.0.0.1", proxy.port), timeout=5) as s:
        s.sendall(
            b"POST /upload HTTP/1.1\r\nHost: t\r\nX-Forwarded-For: 198.51.100.250\r\n"
            b"Content-Length: 5000\r\nExpect: 100-continue\r\n\r\n"
        )
        s.settimeout(1.0)
        assert s.recv(64) == b"HTTP/1.1 100 Continue\r\n\r\n"
        s.settimeout(5)
        s.sendall(body)
        data = b""
        while not data.endswith(b"}"):
            chunk = s.recv(65536)
            assert chunk, data
            data += chunk
    assert data.startswith(b"HTTP/1.1 200 OK\r\n")
    assert json.loads(data.split(b"\r\n\r\n", 1)[1]) == {
        "size": 5000,
        "sha256": hashlib.sha256(body).hexdigest(),
        "chunked": False,
        "content_length": "5000",
    }
