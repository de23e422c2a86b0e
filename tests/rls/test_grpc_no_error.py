"""No client input breaks the gRPC door (issue 29, items 5 and 7): a real sidecar
process with --grpc, on the memory store and on a real Redis, given
RateLimitRequests of every shape (hypothesis) answers OK / OVER_LIMIT or
INVALID_ARGUMENT -- never another status, never an unhandled exception in its
log -- and an override beyond the documented bounds (one year, 2^31 requests)
is INVALID_ARGUMENT, never a store error that switches the store off."""

from __future__ import annotations

import grpc
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from rls_helpers import Descriptor, RateLimitRequest, grpc_sidecar
from sidecar_proc import get_metrics, metric, write_config

from netlimit.rls.proto import rls_pb2_grpc

pytestmark = [pytest.mark.timeout(300)]

CONFIG = """\
version: 1
http:
  domain: api
  descriptors:
    - key: fw
      rate_limit: {unit: minute, requests_per_unit: 3}
    - key: tb
      algorithm: token_bucket
      burst: 5
      rate_limit: {unit: second, requests_per_unit: 2}
    - key: lb
      algorithm: leaky_bucket
      delay: true
      burst: 2
      rate_limit: {unit: second, requests_per_unit: 50}
    - key: swl
      algorithm: sliding_window_log
      rate_limit: {unit: second, requests_per_unit: 2}
    - key: swc
      algorithm: sliding_window_counter
      rate_limit: {unit: second, requests_per_unit: 2}
"""

BAD_LOG = ("Traceback", "ERROR", "failed;", "store failure")
U32 = 2**32 - 1
U64 = 2**64 - 1


@pytest.fixture(scope="module", params=["memory", "redis"])
def sidecar(request, tmp_path_factory, redis_server):
    cfg = write_config(tmp_path_factory.mktemp("grpcfz") / "n.yaml", CONFIG)
    extra = ["--redis", redis_server.url] if request.param == "redis" else []
    p = grpc_sidecar(cfg, *extra)
    ch = grpc.insecure_channel(f"127.0.0.1:{p.grpc_port}")
    p.stub = rls_pb2_grpc.RateLimitServiceStub(ch)
    try:
        yield p
    finally:
        ch.close()
        p.stop()


def _clean_log(p) -> None:
    bad = [ln for ln in p.log().splitlines() if any(b in ln for b in BAD_LOG)]
    assert not bad, "\n".join(bad[:20])


def _desc(entries, rpu=None, unit=0, mult=None, hits=None, negative=False):
    d = Descriptor(entries=[Descriptor.Entry(key=k, value=v) for k, v in entries])
    if rpu is not None:
        d.limit.requests_per_unit = rpu
        d.limit.unit = unit
        if mult is not None:
            d.limit.unit_multiplier.value = mult
    if hits is not None:
        d.hits_addend.value = hits
    d.is_negative_hits = negative
    return d


def _call(p, req):
    try:
        return p.stub.ShouldRateLimit(req, timeout=10), None
    except grpc.RpcError as exc:
        return None, exc


@pytest.mark.parametrize(
    "rpu, unit, mult, why",
    [
        (5, 6, U32, "longer than the maximum of one year"),  # 2^32-1 years: Redis cannot expire that
        (5, 6, 2, "longer than the maximum of one year"),
        (5, 1, U32, "longer than the maximum of one year"),
        (2**31 + 1, 1, None, "requests_per_unit must be 0-2147483648"),
        (U32, 2, None, "requests_per_unit must be 0-2147483648"),
    ],
)
def test_an_override_beyond_the_bounds_is_invalid_argument(sidecar, rpu, unit, mult, why):
    resp, err = _call(sidecar, RateLimitRequest(domain="api", descriptors=[_desc([("tb", "x")], rpu, unit, mult)]))
    assert resp is None and err is not None
    assert err.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert why in err.details()


def test_a_year_and_2_31_are_decided_and_the_store_stays_up(sidecar):
    for rpu, unit, mult in ((2**31, 6, None), (3, 4, 365), (7, 5, 12)):
        resp, err = _call(sidecar, RateLimitRequest(domain="api", descriptors=[_desc([("swl", "y")], rpu, unit, mult)]))
        assert err is None, err
        assert resp.overall_code == 1  # OK
    m = get_metrics(sidecar.port)
    assert metric(m, "netlimit_http_store_up") == 1
    assert sum(v for (n, _), v in m.items() if n == "netlimit_http_store_errors_total") == 0
    _clean_log(sidecar)


_text = st.one_of(st.text(max_size=10), st.sampled_from(["fw", "tb", "lb", "swl", "swc", ""]))
_entries = st.lists(st.tuples(_text, _text), max_size=4)
_u32 = st.one_of(st.integers(0, U32), st.sampled_from([0, 1, 2**31, 2**31 + 1, U32]))
_descriptor = st.builds(
    _desc,
    _entries,
    rpu=st.none() | _u32,
    unit=st.integers(0, 9),
    mult=st.none() | _u32,
    hits=st.none() | st.integers(0, U64),
    negative=st.booleans(),
)
_request = st.builds(
    lambda domain, ds, hits: RateLimitRequest(domain=domain, descriptors=ds, hits_addend=hits),
    st.one_of(st.just("api"), st.text(max_size=8)),
    st.lists(_descriptor, max_size=5),
    st.one_of(st.integers(0, 3), st.integers(0, U32)),
)


@settings(max_examples=200, deadline=None, derandomize=True, suppress_health_check=list(HealthCheck), database=None)
@given(req=_request)
def test_requests_of_every_shape_get_an_answer_or_invalid_argument(sidecar, req):
    resp, err = _call(sidecar, req)
    if err is not None:
        assert err.code() == grpc.StatusCode.INVALID_ARGUMENT, (err.code(), err.details(), req)
    else:
        assert resp.overall_code in (1, 2)
        assert len(resp.statuses) == len(req.descriptors)


def test_zz_nothing_unhandled_in_the_log_and_no_store_error(sidecar):
    _clean_log(sidecar)
    m = get_metrics(sidecar.port)
    assert metric(m, "netlimit_http_requests_total", endpoint="grpc", result="error") == 0
    assert sum(v for (n, _), v in m.items() if n == "netlimit_http_store_errors_total") == 0
