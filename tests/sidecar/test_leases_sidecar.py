"""http.leases through the sidecar's door: two real sidecar processes on one REAL
redis-server, one hot key (tests/limit/test_leases.py tests the store itself)."""

from __future__ import annotations

import asyncio
import uuid

import pytest
from sidecar_proc import Sidecar, get_metrics, metric, write_config
from test_two_sidecars_redis import hammer

pytestmark = [pytest.mark.redis, pytest.mark.timeout(90)]

LEASED = """\
version: 1
http:
  domain: leased
  store_timeout_ms: 500
  leases: on
  actions:
    - [header:X-Api-Key]
  descriptors:
    - key: "header:X-Api-Key"
      rate_limit: {unit: day, requests_per_unit: 300, name: fw}
"""


def test_two_leasing_sidecars_never_admit_more_than_the_limit(redis_server, tmp_path):
    cfg = write_config(tmp_path / "netlimit.yaml", LEASED)
    a = b = None
    try:
        a = Sidecar(cfg, "--redis", redis_server.url)
        b = Sidecar(cfg, "--redis", redis_server.url)
        key = f"hot-{uuid.uuid4().hex}"
        statuses = asyncio.run(hammer([a.port, b.port], key, total=2000, concurrency=32))
        admitted = statuses.count(200)
        samples = [get_metrics(sc.port) for sc in (a, b)]
    finally:
        for sc in (a, b):
            if sc is not None:
                sc.stop()
    assert len(statuses) == 2000 and statuses.count(429) == 2000 - admitted
    # never over; short of it by at most the quota leases held when the window
    # saturated (5 % of 300 = 15 per sidecar)
    assert 300 - 2 * 15 <= admitted <= 300, admitted
    decisions = sum(metric(s, "netlimit_http_lease_decisions_total") for s in samples)
    trips = sum(metric(s, "netlimit_http_lease_round_trips_total") for s in samples)
    granted = sum(metric(s, "netlimit_http_leases_granted_total") for s in samples)
    print(f"two sidecars: {admitted} admitted of 2000, {trips:.0f} round trips for {decisions:.0f} decisions")
    assert decisions == 2000 and granted > 0
    assert trips < decisions / 2
    for s in samples:  # /metrics: per rule held quota (at most a lease's 5 % of 300), trips per decision
        held = s[("netlimit_http_lease_rule_held_units", (("domain", "leased"), ("rule", "fw")))]
        assert 0 <= held <= 15, held
        per = metric(s, "netlimit_http_lease_round_trips_per_decision")
        own = metric(s, "netlimit_http_lease_round_trips_total") / metric(s, "netlimit_http_lease_decisions_total")
        assert per == pytest.approx(own, rel=1e-9) and 0 < per < 0.5
        assert ("netlimit_http_lease_confirms_total", (("result", "ok"),)) in s
