"""No client input reaches a 5xx (issue 29, item 5): a real sidecar (proxy mode,
its decision and JSON endpoints on the admin listener), once on the memory store
and once on a real Redis, given what a client controls -- a request whose actions
produce no descriptor, JSON bodies of every shape (hypothesis) -- never answers
5xx and never logs an unhandled exception."""

from __future__ import annotations

import json

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from logging_upstream import LoggingUpstream
from sidecar_proc import Sidecar, get_metrics, metric, request, write_config

pytestmark = [pytest.mark.timeout(300)]

CONFIG = """\
version: 1
http:
  domain: web
  actions:
    - [header:X-Api-Key]
  descriptors:
    - key: "header:X-Api-Key"
      rate_limit: {unit: minute, requests_per_unit: 3, name: per-key}
    - key: tb
      algorithm: token_bucket
      burst: 5
      rate_limit: {unit: second, requests_per_unit: 2, name: tb}
    - key: lb
      algorithm: leaky_bucket
      rate_limit: {unit: second, requests_per_unit: 2, name: lb}
    - key: swl
      algorithm: sliding_window_log
      rate_limit: {unit: second, requests_per_unit: 2, name: swl}
    - key: swc
      algorithm: sliding_window_counter
      rate_limit: {unit: second, requests_per_unit: 2, name: swc}
"""

#: what a log line of an unhandled failure looks like (netlimit/logs.py, http11.py)
BAD_LOG = ("Traceback", "ERROR", "failed;", "; 500")


@pytest.fixture(scope="module")
def app():
    u = LoggingUpstream()
    try:
        yield u
    finally:
        u.stop()


@pytest.fixture(scope="module", params=["memory", "redis"])
def sidecar(request, tmp_path_factory, app, redis_server):
    store = request.param
    cfg = write_config(tmp_path_factory.mktemp("no5xx") / "n.yaml", CONFIG)
    extra = ["--redis", redis_server.url] if store == "redis" else []
    sc = Sidecar(cfg, "--upstream", app.url, *extra)
    try:
        yield sc
    finally:
        sc.stop()


def _clean_log(sc: Sidecar) -> None:
    bad = [ln for ln in sc.log().splitlines() if any(b in ln for b in BAD_LOG)]
    assert not bad, "\n".join(bad[:20])


def test_a_request_without_descriptor_is_forwarded_unlimited(sidecar, app):
    """The only action reads a header the request lacks: no descriptor, so nothing to
    limit -- forwarded (was a 500, IndexError), counted as no descriptor."""
    before = metric(get_metrics(sidecar.admin_port), "netlimit_http_no_descriptor_total")
    for _ in range(5):  # more than the per-key limit of 3: none of them is limited
        r = request(sidecar.port, "GET", "/nokey")
        assert r.status == 200, r
    after = metric(get_metrics(sidecar.admin_port), "netlimit_http_no_descriptor_total")
    assert after - before == 5
    # the decision endpoint answers the same request OK, counted the same way
    r = request(sidecar.admin_port, "GET", "/v1/check")
    assert r.status == 200, r
    assert metric(get_metrics(sidecar.admin_port), "netlimit_http_no_descriptor_total") - after == 1
    _clean_log(sidecar)


def _override(rpu, unit, mult):
    lim = {"requestsPerUnit": rpu, "unit": unit}
    if mult is not None:
        lim["unitMultiplier"] = mult
    return {"domain": "web", "descriptors": [{"entries": [{"key": "tb", "value": "x"}], "limit": lim}]}


@pytest.mark.parametrize(
    "rpu, unit, mult, why",
    [
        (5, "SECOND", 10**400, "longer than the maximum of one year"),
        (5, "YEAR", 2, "longer than the maximum of one year"),
        (5, "YEAR", 2**32 - 1, "longer than the maximum of one year"),
        (5, "DAY", 366, "longer than the maximum of one year"),
        (2**31 + 1, "SECOND", None, "requests_per_unit must be 0-2147483648"),
        (10**400, "SECOND", None, "requests_per_unit must be 0-2147483648"),
    ],
)
def test_an_override_beyond_the_bounds_is_400(sidecar, rpu, unit, mult, why):
    r = sidecar.post_json("/v1/check", _override(rpu, unit, mult), admin=True)
    assert r.status == 400, r
    assert why in r.json()["detail"]
    assert len(r.body) < 2000  # the client's 400-digit number is not echoed whole


def test_overrides_at_the_bounds_are_decided(sidecar):
    """One year and 2^31 requests are allowed (documented maxima), on every store."""
    for body in (_override(2**31, "YEAR", None), _override(1, "DAY", 365), _override(3, "MONTH", 12)):
        r = sidecar.post_json("/v1/check", body, admin=True)
        assert r.status == 200, r
        assert r.json()["overallCode"] == "OK"
    _clean_log(sidecar)


# --- the property: JSON bodies of every shape -------------------------------------------

_num = st.one_of(
    st.integers(min_value=-5, max_value=2**33),
    st.sampled_from([0, 1, 2**31, 2**31 + 1, 2**32 - 1, 2**32, 2**63, 2**64, 10**400]),
    st.floats(allow_nan=False),
    st.text(alphabet="0123456789-e.", max_size=25),
    st.booleans(),
    st.none(),
)
_text = st.one_of(st.text(max_size=12), st.sampled_from(["tb", "lb", "swl", "swc", "header:X-Api-Key"]))
_unit = st.one_of(
    st.sampled_from(["SECOND", "MINUTE", "HOUR", "DAY", "MONTH", "YEAR", "WEEK", "UNKNOWN", "second"]), _num
)
_scalar = st.one_of(_num, _text, st.none())
_json = st.recursive(
    _scalar,
    lambda kids: st.lists(kids, max_size=3) | st.dictionaries(st.text(max_size=6), kids, max_size=3),
    max_leaves=6,
)
_entry = st.one_of(
    st.fixed_dictionaries({"key": _text, "value": _text}),
    st.dictionaries(st.sampled_from(["key", "value", "x"]), _scalar, max_size=3),
    _json,
)
_limit = st.one_of(
    st.fixed_dictionaries(
        {"requestsPerUnit": _num, "unit": _unit},
        optional={"unitMultiplier": _num, "unit_multiplier": _num, "requests_per_unit": _num},
    ),
    _json,
)
_descriptor = st.one_of(
    st.fixed_dictionaries(
        {"entries": st.lists(_entry, max_size=3)},
        optional={"limit": _limit, "hitsAddend": _num, "hits_addend": _num, "isNegativeHits": _scalar},
    ),
    _json,
)
_body = st.one_of(
    st.fixed_dictionaries(
        {"domain": st.one_of(st.just("web"), _scalar), "descriptors": st.lists(_descriptor, max_size=4)},
        optional={"hitsAddend": _num, "hits_addend": _num},
    ),
    _json,
)


def _encode(doc) -> bytes:
    return json.dumps(doc).encode()


@settings(max_examples=150, deadline=None, derandomize=True, suppress_health_check=list(HealthCheck), database=None)
@given(body=st.one_of(_body.map(_encode), st.binary(max_size=64)))
def test_json_bodies_never_reach_a_5xx(sidecar, body):
    r = request(sidecar.admin_port, "POST", "/v1/check", {"Content-Type": "application/json"}, body)
    assert r.status in (200, 400, 429), (r.status, r.body[:300], body[:300])


@settings(max_examples=60, deadline=None, derandomize=True, suppress_health_check=list(HealthCheck), database=None)
@given(key=st.lists(st.text(alphabet=st.characters(min_codepoint=0x21, max_codepoint=0x7E), max_size=8), max_size=3))
def test_proxied_requests_never_reach_a_5xx(sidecar, key):
    """Zero, one or several X-Api-Key fields: forwarded or 429, never 5xx."""
    r = request(sidecar.port, "GET", "/p", [("X-Api-Key", k) for k in key])
    assert r.status in (200, 429), (r.status, r.body[:300], key)


def test_zz_nothing_unhandled_in_the_log(sidecar):
    """After every test above on this sidecar: no unhandled exception was logged."""
    _clean_log(sidecar)
    m = get_metrics(sidecar.admin_port)
    assert metric(m, "netlimit_http_store_errors_total", reason="error") == 0
