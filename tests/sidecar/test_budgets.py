"""One budget per rule (issue 29, item 2): junk keys under one rule never evict
another rule's state.  A real sidecar in proxy mode (memory store, a small
http.max_keys), a recording upstream: a client over its /login limit sends
thousands of requests elsewhere with a new X-Api-Key each -- never touching the
login rule's key, each one stored under the per-key rule -- and is still over its
/login limit afterwards (it had a fresh one before: one LRU for all rules); the
application saw 3 logins.  Evictions are
counted per rule and logged (rate-limited)."""

from __future__ import annotations

import http.client
import textwrap

import pytest
from logging_upstream import LoggingUpstream
from sidecar_proc import Sidecar, get_metrics, metric, write_config

pytestmark = [pytest.mark.timeout(180)]

CONFIG = """\
version: 1
http:
  domain: web
  max_keys: 300
  actions:
    - [path, remote_address]
    - [header:X-Api-Key]
  descriptors:
    - key: path
      value: /login
      descriptors:
        - key: remote_address
          rate_limit: {unit: hour, requests_per_unit: 3, name: login}
    - key: "header:X-Api-Key"
      rate_limit: {unit: hour, requests_per_unit: 1000, name: per-key}
"""
JUNK = 3000  # 30x the per-key rule's budget (300 // 3): many rotations of its generations


@pytest.fixture
def app():
    u = LoggingUpstream()
    try:
        yield u
    finally:
        u.stop()


def _get(conn: http.client.HTTPConnection, path: str, key: str | None = None) -> int:
    conn.request("GET", path, headers={"X-Api-Key": key} if key is not None else {})
    r = conn.getresponse()
    r.read()
    return r.status


def test_junk_keys_under_one_rule_never_evict_another_rules_state(tmp_path, app):
    cfg = write_config(tmp_path / "n.yaml", CONFIG)
    sc = Sidecar(cfg, "--upstream", app.url, "--log-level", "info")
    try:
        conn = http.client.HTTPConnection("127.0.0.1", sc.port, timeout=10)
        assert [_get(conn, "/login") for _ in range(4)] == [200, 200, 200, 429]
        # the junk: a new key each, stored under the per-key rule (the login key untouched)
        statuses = {_get(conn, "/other", f"junk-{i}") for i in range(JUNK)}
        assert statuses == {200}
        assert [_get(conn, "/login") for _ in range(3)] == [429, 429, 429]  # no fresh limit
        assert sum(1 for _, url, _ in app.requests if url == "/login") == 3
        conn.close()
        m = get_metrics(sc.admin_port)
        per_key = metric(m, "netlimit_http_store_evictions_total", domain="web", rule="per-key")
        assert per_key >= JUNK - 300, per_key
        assert metric(m, "netlimit_http_store_evictions_total", domain="web", rule="login") == 0
        assert ("netlimit_http_store_evictions_total", (("domain", "web"), ("rule", "login"))) in m  # listed, 0
        lines = [ln for ln in sc.log().splitlines() if "is over its budget" in ln]
        assert len(lines) == 1, lines  # one line per log interval (10 s), however many evictions
        assert "rule 'per-key' (domain web) is over its budget of 100 keys" in lines[0]
    finally:
        sc.stop()


def test_a_descriptor_sets_its_own_budget(tmp_path, app):
    """``max_keys`` on a descriptor: that rule keeps that many, the others split
    http.max_keys (here the login rule and the overrides: 300 // 2)."""
    text = CONFIG.replace(
        "rate_limit: {unit: hour, requests_per_unit: 1000, name: per-key}",
        "rate_limit: {unit: hour, requests_per_unit: 1000, name: per-key}\n      max_keys: 2000",
    )
    cfg = write_config(tmp_path / "n.yaml", textwrap.dedent(text))
    sc = Sidecar(cfg, "--upstream", app.url)
    try:
        conn = http.client.HTTPConnection("127.0.0.1", sc.port, timeout=10)
        for i in range(1500):  # within its own budget of 2000: nothing evicted
            assert _get(conn, "/x", f"k-{i}") == 200
        conn.close()
        m = get_metrics(sc.admin_port)
        assert metric(m, "netlimit_http_store_evictions_total", domain="web", rule="per-key") == 0
    finally:
        sc.stop()
