"""`netlimit sidecar --workers N`: /metrics and /v1/top answer for every worker
(netlimit/sidecar/peers.py), whichever worker a scrape lands on.

Real supervisor and workers on loopback; the traffic is counted by the test, so
the sums are exact: the per-worker decision counters add up to the requests
sent, /v1/top's merged counts to the traffic.  A stopped worker (SIGSTOP) does
not hold the answer past the timeout and is counted unreachable.
"""

from __future__ import annotations

import asyncio
import os
import signal
import time
import uuid
from pathlib import Path

import pytest
from prometheus_client.parser import text_string_to_metric_families
from sidecar_proc import LogProc, netlimit_cmd, request
from test_two_sidecars_redis import hammer
from test_workers import Workers, config

from netlimit.sidecar.peers import PEER_TIMEOUT, merged_exposition, merged_top

pytestmark = pytest.mark.timeout(120)


def samples(text: str, name: str) -> list:
    return [s for f in text_string_to_metric_families(text) for s in f.samples if s.name == name]


def decisions(text: str) -> dict[str, float]:
    """netlimit_http_requests_total{endpoint="check"} summed per worker."""
    per: dict[str, float] = {}
    for s in samples(text, "netlimit_http_requests_total"):
        if s.labels["endpoint"] == "check":
            per[s.labels["worker"]] = per.get(s.labels["worker"], 0.0) + s.value
    return per


def worker_pids(w: Workers) -> list[int]:
    return [p for p in w.kids if '"owner"' not in Path(f"/proc/{p}/cmdline").read_text()]


def spread(port: int, total: int, n: int, key: str) -> list[int]:
    return asyncio.run(hammer([port], key, total=total, concurrency=8 * n))


@pytest.mark.parametrize("n", [2, 3])
def test_metrics_and_top_cover_every_worker(tmp_path, n):
    total = 400  # LIMIT 300: 100 denied, so /v1/top has the key
    w = Workers(config(tmp_path), n)
    try:
        key = f"m-{uuid.uuid4().hex}"
        statuses = spread(w.port, total, n, key)
        assert len(statuses) == total and statuses.count(429) == 100
        for _ in range(6):  # every scrape, whichever worker it lands on, sees every worker
            text = request(w.port, "GET", "/metrics").body.decode()
            per = decisions(text)
            assert set(per) == {str(i) for i in range(n)}, per
            assert sum(per.values()) == total, per
            assert samples(text, "netlimit_sidecar_workers")[0].value == n
            assert samples(text, "netlimit_sidecar_workers_unreachable")[0].value == 0
            over = samples(text, "netlimit_http_rule_over_limit_total")
            assert {s.labels["worker"] for s in over} == {str(i) for i in range(n)}
            assert sum(s.value for s in over) == 100
            top = request(w.port, "GET", "/v1/top").json()
            assert top["workers"] == n and top["workers_unreachable"] == 0
            (fw,) = [r for r in top["rules"] if r["rule"] == "fw"]
            assert fw["hits"] == total and fw["over"] == 100
            (d,) = [d for d in top["denied"] if d["rule"] == "fw"]
            assert d["count"] == 100
    finally:
        w.stop(timeout=15)


def test_a_stopped_worker_is_left_out_within_the_timeout(tmp_path):
    w = Workers(config(tmp_path), 3)
    victim = None
    try:
        spread(w.port, 60, 3, f"s-{uuid.uuid4().hex}")
        victim = worker_pids(w)[0]
        os.kill(victim, signal.SIGSTOP)
        answered = {"/metrics": 0, "/v1/top": 0}
        deadline = time.monotonic() + 60
        while min(answered.values()) < 2 and time.monotonic() < deadline:
            path = min(answered, key=answered.__getitem__)
            t0 = time.monotonic()
            try:
                r = request(w.port, "GET", path, timeout=4)
            except TimeoutError:
                continue  # the kernel gave this connection to the stopped worker's listener
            took = time.monotonic() - t0
            assert took < PEER_TIMEOUT + 2.5, took  # the peer timeout, not a hang (2.5 s: a loaded host)
            if path == "/metrics":
                text = r.body.decode()
                assert samples(text, "netlimit_sidecar_workers_unreachable")[0].value == 1
                assert len(decisions(text)) == 2
            else:
                assert r.json()["workers_unreachable"] == 1
            answered[path] += 1
        assert min(answered.values()) == 2, f"running workers did not answer within 60 s: {answered}"
        os.kill(victim, signal.SIGCONT)
        victim = None
        text = request(w.port, "GET", "/metrics").body.decode()
        assert samples(text, "netlimit_sidecar_workers_unreachable")[0].value == 0
    finally:
        if victim is not None:
            os.kill(victim, signal.SIGCONT)
        w.stop(timeout=15)


def test_one_worker_has_no_worker_label(tmp_path):
    p = LogProc([*netlimit_cmd(), "sidecar", "--config", str(config(tmp_path)), "--listen", "127.0.0.1:0"])
    try:
        port = int(p.wait_line(r"listening on http://127\.0\.0\.1:(\d+)", timeout=30).group(1))
        assert request(port, "GET", "/v1/check", {"X-Api-Key": "one"}).status == 200
        text = request(port, "GET", "/metrics").body.decode()
        assert 'worker="' not in text and "netlimit_sidecar_workers" not in text
        assert "workers" not in request(port, "GET", "/v1/top").json()
    finally:
        p.stop(timeout=15)


def test_merged_exposition_keeps_families_and_escapes():
    a = (
        '# HELP x_total X "quoted"\n# TYPE x_total counter\n'
        'x_total{k="a\\"b\\\\c",j="{ }"} 1.0\nx_total{} 2.0\n'
        "# HELP g A ratio\n# TYPE g gauge\ng 0.5\n"
    )
    out = merged_exposition([(0, a), (1, a)], 2, 1).decode()
    assert out.count("# TYPE x_total counter") == 1 and out.count("# HELP g ") == 1
    fams = {f.name: f for f in text_string_to_metric_families(out)}
    xs = [(s.labels, s.value) for s in fams["x"].samples]
    assert ({"worker": "0", "k": 'a"b\\c', "j": "{ }"}, 1.0) in xs
    assert ({"worker": "1"}, 2.0) in xs and len(xs) == 4
    assert [(s.labels, s.value) for s in fams["g"].samples] == [({"worker": "0"}, 0.5), ({"worker": "1"}, 0.5)]
    assert fams["netlimit_sidecar_workers_unreachable"].samples[0].value == 1


def test_merged_top_sums_and_cuts():
    docs = [
        {"time": 1.0, "rules": [{"domain": "d", "rule": "r", "hits": 3, "over": 1, "shadow": 0}],
         "denied": [{"rule": "r", "key": f"k{i}", "count": i, "error": 0} for i in range(10)]},
        {"time": 2.0, "rules": [{"domain": "d", "rule": "r", "hits": 4, "over": 2, "shadow": 1}],
         "denied": [{"rule": "r", "key": "k1", "count": 100, "error": 1}]},
    ]  # fmt: skip
    top = merged_top(docs, 2, 0)
    assert top["rules"] == [{"domain": "d", "rule": "r", "hits": 7, "over": 3, "shadow": 1}]
    assert top["denied"][0] == {"rule": "r", "key": "k1", "count": 101, "error": 1}
    assert len(top["denied"]) == 10 and top["time"] == 2.0
