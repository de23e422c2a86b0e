"""The replay: answers computable by hand, the same decisions as the Limiter
on a store whose clock is set per line, the five-algorithm comparison equal
to running the pure functions over every key's whole history, exact peaks."""

from __future__ import annotations

import json
import math
from collections import defaultdict
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from simlog import T0, combined, config, three_abusers, write

from netlimit.config.model import ALGORITHMS  # the five a file can name
from netlimit.config.validate import load_file, load_string
from netlimit.limit.actions import ActionPlan
from netlimit.limit.algorithms import DECIDERS, REGISTRY, Limit
from netlimit.limit.limiter import OVER_LIMIT, Limiter
from netlimit.limit.request import CheckRequest
from netlimit.limit.rules import from_loaded
from netlimit.limit.stores import MemoryStore
from netlimit.simulate.figures import MAX_BUCKETS
from netlimit.simulate.replay import Replay
from netlimit.simulate.run import replay

TEN_PER_SECOND = """\
  actions: [[remote_address]]
  descriptors:
    - key: remote_address
      rate_limit: {unit: second, requests_per_unit: 10}
      algorithm: %s
"""


def _sim(tmp_path: Path, body: str, lines: list[str], **kw):
    cfg = load_file(config(tmp_path / "rules.yaml", body))
    return replay(cfg, [str(write(tmp_path / "access.log", lines))], progress=False, **kw)


# --------------------------------------------------------------------------- by hand


@pytest.mark.parametrize("configured", ALGORITHMS)
def test_three_abusers_among_a_thousand(tmp_path, configured):
    """Three clients at 50 requests/s among 1000 at 0.1/s, against 10/s: exactly the
    three are denied.  Each second a log stamps 50 requests of an abuser with one
    time, so the buckets, the fixed window and the log admit 10 each second (40
    denied x 60 s), and the sliding counter -- whose estimate still holds the previous
    second's 10 at the start of the next -- admits 10 every other second (2700)."""
    ev = three_abusers(60)
    res = _sim(tmp_path, TEN_PER_SECOND % configured, [combined(ip, t) for t, ip in ev])
    assert res.lines == res.requests == len(ev) == 15_000
    assert res.unreadable == 0
    (r,) = res.rules
    assert r.clients == 1003
    assert r.clients_denied == 3
    assert sorted(c.key for c in r.top) == ["203.0.113.1", "203.0.113.2", "203.0.113.3"]
    assert all(c.peak == 50 and c.requests == 3000 for c in r.top)
    assert r.peaks == {"p50": 1, "p90": 1, "p99": 1, "p99.9": 50, "max": 50}
    by_hand = {
        "token_bucket": 3 * 2400,
        "leaky_bucket": 3 * 2400,
        "fixed_window": 3 * 2400,
        "sliding_window_log": 3 * 2400,
        "sliding_window_counter": 3 * 2700,
    }
    assert {c.algorithm: c.denied for c in r.compare} == by_hand
    assert {c.algorithm: c.clients_denied for c in r.compare} == dict.fromkeys(ALGORITHMS, 3)
    assert all(c.within_denied == 0 for c in r.compare)
    assert r.denied == res.denied == by_hand[configured]
    assert r.requests == 15_000
    # and the pure functions, run over every client's requests, agree
    pure = _pure_denials(ev, Limit(configured, 10, 1.0))
    assert pure == by_hand[configured]
    # the timeline holds every request once
    assert sum(r.timeline.admitted) + sum(r.timeline.denied) == 15_000
    assert sum(r.timeline.denied) == by_hand[configured]
    # the offenders' timelines: the three abusers, every request of theirs
    assert len(r.offenders) == 3
    for o in r.offenders:
        assert sum(o.timeline.admitted) + sum(o.timeline.denied) == 3000
        assert sum(o.timeline.denied) == by_hand[configured] // 3


def _pure_denials(ev, limit: Limit) -> int:
    fn = DECIDERS[limit.algorithm]
    state: dict[str, object] = {}
    denied = 0
    for t, key in ev:
        d, state[key] = fn(limit, state.get(key), t, 1)
        denied += not d.allowed
    return denied


def test_burst_is_what_the_bucket_tolerates(tmp_path):
    """A client sending 30 at once every 10 s against 10/s burst 30: the bucket
    admits every burst (it refills in 3 s); the windows deny 20 of each."""
    body = TEN_PER_SECOND % "token_bucket" + "      burst: 30\n"
    ev = [(T0 + 10 * k, "10.9.9.9") for k in range(6) for _ in range(30)]
    res = _sim(tmp_path, body, [combined(ip, t) for t, ip in ev])
    (r,) = res.rules
    got = {c.algorithm: (c.denied, c.burst) for c in r.compare}
    assert got == {
        "token_bucket": (0, 30),
        "leaky_bucket": (0, 30),
        "fixed_window": (120, None),
        "sliding_window_log": (120, None),
        "sliding_window_counter": (120, None),
    }
    assert r.denied == 0 and r.peaks["max"] == 30
    # clients within the limit per window are never denied by a bucket at least that big
    assert {c.algorithm: c.within_denied for c in r.compare}["token_bucket"] == 0


def test_shadow_rules_count_but_do_not_deny(tmp_path):
    body = TEN_PER_SECOND % "fixed_window" + "      shadow_mode: true\n"
    ev = [(T0, "10.0.0.1")] * 15
    res = _sim(tmp_path, body, [combined(ip, t) for t, ip in ev])
    assert res.rules[0].denied == 5 and res.rules[0].shadow
    assert res.denied == 0  # no request was denied: the rule is dark


# --------------------------------------------------------------------------- the Limiter's decisions

RULES = """\
  actions:
    - [remote_address]
    - [path, remote_address]
    - ["header:X-Api-Key"]
    - ["generic:everyone=all"]
  descriptors:
    - key: remote_address
      rate_limit: {unit: second, requests_per_unit: %(ip)d}
      algorithm: %(alg_ip)s
    - key: path
      value: /Login
      descriptors:
        - key: remote_address
          rate_limit: {unit: minute, requests_per_unit: %(login)d, name: login}
          algorithm: %(alg_login)s
    - key: path
      value: /static/*
      descriptors:
        - key: remote_address
          unlimited: true
    - key: "header:X-Api-Key"
      rate_limit: {unit: second, requests_per_unit: %(key)d, name: per-key}
      algorithm: %(alg_key)s
      replaces: [{name: login}]
    - key: everyone
      value: all
      rate_limit: {unit: second, requests_per_unit: %(all)d, name: total}
      algorithm: %(alg_all)s
      shadow_mode: true
"""

IPS = [f"10.0.0.{i}" for i in range(1, 6)]
# with the variants http.path_match (default) makes one path: the replay must see them as the sidecar does
PATHS = ["/", "/login", "/static/app.js", "/login?next=/x", "/a/../login", "/api"]
PATHS += ["/LOGIN", "/Login/", "/login;jsessionid=1", "/Static/App.js", "/API/"]

events = st.lists(
    st.tuples(
        st.sampled_from([0.0, 0.0, 0.001, 0.05, 0.2, 0.5, 1.0, 1.0, 3.0, 30.0, 61.0, -0.3]),  # gap to the previous
        st.sampled_from(IPS),
        st.sampled_from(PATHS),
        st.sampled_from([None, None, "k1", "k2"]),
    ),
    min_size=1,
    max_size=120,
)


@given(
    evs=events,
    params=st.fixed_dictionaries(
        {
            "ip": st.integers(0, 6),
            "login": st.integers(1, 4),
            "key": st.integers(1, 5),
            "all": st.integers(1, 8),
            "alg_ip": st.sampled_from(ALGORITHMS),
            "alg_login": st.sampled_from(ALGORITHMS),
            "alg_key": st.sampled_from(ALGORITHMS),
            "alg_all": st.sampled_from(ALGORITHMS),
        }
    ),
)
@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
def test_the_replay_decides_as_the_limiter(tmp_path, evs, params):
    """Every request through Limiter.check_nowait with a store whose clock is the
    line's time: the same per-rule counts and the same requests denied."""
    text = f"version: 1\nhttp:\n  domain: t\n{RULES % params}"
    loaded = load_string(text, "rules.yaml")
    t = float(T0)
    lines = []
    reqs = []
    for gap, ip, path, key in evs:
        t += gap
        obj = {"time": t, "remote_addr": ip, "request_uri": path, "request_method": "GET"}
        if key is not None:
            obj["http_x_api_key"] = key
        lines.append(json.dumps(obj))
        reqs.append((t, ip, path, key))
    log = write(tmp_path / "l.jsonl", lines)
    res = replay(loaded, [str(log)], progress=False, jobs=1)

    rules = from_loaded(loaded)
    now = [0.0]
    limiter = Limiter(rules, MemoryStore(clock=lambda: now[0]))
    plan = ActionPlan.of(loaded.config.http)  # the sidecar's plan: its path_of is what the doors call
    denied = 0
    for t, ip, path, key in reqs:
        now[0] = t
        headers = {} if key is None else {"x-api-key": key}
        descs = plan.build(ip, "GET", plan.path_of(path), headers, None)
        result = limiter.check_nowait(CheckRequest.simple("t", descs))
        denied += result.code == OVER_LIMIT
    assert res.denied == denied
    assert res.requests == len(reqs)
    # (the limiter keeps no counts for unlimited rules: the replay counts what they exempted)
    got = {r.name: (r.requests, r.denied) for r in res.rules if not r.unlimited}
    want = {r.name: (r.stats.hits, r.stats.over) for r in rules.rules if r.limit is not None}
    assert got == want
    exempted = sum(1 for _, _, path, _ in reqs if plan.path_of(path).startswith("/static/"))
    assert next(r.requests for r in res.rules if r.unlimited) == exempted
    # the comparison's run of the configured algorithm is the replay itself
    for r in res.rules:
        if not r.unlimited:
            assert next(c.denied for c in r.compare if c.configured) == r.denied


# --------------------------------------------------------------------------- the comparison, exactly


def _brute_peak(ts: list[float], period: float) -> int:
    ts = sorted(ts)
    return max(sum(1 for x in ts if t - period < x <= t) for t in ts)


@given(
    alg=st.sampled_from(ALGORITHMS),
    limit=st.integers(0, 12),
    unit=st.sampled_from(["second", "minute"]),
    burst=st.one_of(st.none(), st.integers(1, 25)),
    delay=st.booleans(),
    evs=st.lists(
        st.tuples(
            st.sampled_from([0.0, 0.0, 0.0, 1e-3, 0.1, 0.25, 0.5, 1.0, 1.0, 2.0, 2.0000001, 5.0, 59.99, 60.0, 120.0]),
            st.sampled_from(["a", "b", "c"]),
            st.booleans(),  # a step back in time (logs are only roughly ordered)
        ),
        min_size=1,
        max_size=300,
    ),
)
@settings(max_examples=250, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
def test_quiet_sessions_change_no_answer(tmp_path, alg, limit, unit, burst, delay, evs):
    """The comparison skips the algorithms while a key is quiet; its counts must be
    those of every algorithm run over every request (the pure functions), and each
    key's peak the brute-force one."""
    bucket = REGISTRY[alg].bucket
    extra = ""
    if bucket and burst is not None:
        extra += f"      burst: {burst}\n"
    if alg == "leaky_bucket" and delay:
        extra += "      delay: true\n"
    body = (
        "  actions: [[remote_address]]\n  descriptors:\n    - key: remote_address\n"
        f"      rate_limit: {{unit: {unit}, requests_per_unit: {limit}}}\n      algorithm: {alg}\n{extra}"
    )
    loaded = load_string(f"version: 1\nhttp:\n  domain: t\n{body}", "r.yaml")
    t = float(T0)
    ev = []
    for gap, who, back in evs:
        t += gap
        ev.append((t - 0.7 if back else t, f"10.0.0.{ord(who)}"))
    lines = [json.dumps({"time": x, "remote_addr": ip}) for x, ip in ev]
    res = replay(loaded, [str(write(tmp_path / "q.jsonl", lines))], progress=False, jobs=1)
    (r,) = res.rules
    period = 1.0 if unit == "second" else 60.0
    for c in r.compare:
        lm = Limit(
            c.algorithm,
            limit,
            period,
            # the file's burst (set only on a bucket) sizes both buckets of the comparison
            burst=burst if REGISTRY[c.algorithm].bucket and bucket else None,
            delay=delay and c.algorithm == alg == "leaky_bucket",
        )
        fn = DECIDERS[c.algorithm]
        state: dict[str, object] = {}
        denied = 0
        who_denied = set()
        for x, ip in ev:
            d, state[ip] = fn(lm, state.get(ip), x, 1)
            if not d.allowed:
                denied += 1
                who_denied.add(ip)
        assert (c.algorithm, c.denied, c.clients_denied) == (c.algorithm, denied, len(who_denied))
    per_key = defaultdict(list)
    for x, ip in ev:
        per_key[ip].append(x)
    want_peaks = sorted(_brute_peak(ts, period) for ts in per_key.values())
    got_peaks = sorted(v for v, n in r.peak_counts for _ in range(n))
    assert got_peaks == want_peaks
    assert r.peaks["max"] == want_peaks[-1]


def test_peak_percentiles_are_nearest_rank(tmp_path):
    # 100 clients: client i makes i+1 requests in one second
    lines = [combined(f"10.1.0.{i}", T0) for i in range(100) for _ in range(i + 1)]
    res = _sim(tmp_path, TEN_PER_SECOND % "sliding_window_log", lines)
    (r,) = res.rules
    assert r.peaks == {"p50": 50, "p90": 90, "p99": 99, "p99.9": 100, "max": 100}
    # the sliding log denies exactly the clients whose peak is above the limit
    assert r.clients_denied == 90
    assert sum(c.denied for c in r.top) <= r.denied


# --------------------------------------------------------------------------- bounds


def test_clients_beyond_max_clients_are_counted_not_tracked(tmp_path):
    lines = [combined(f"10.2.{i // 256}.{i % 256}", T0 + i) for i in range(50)]
    res = _sim(tmp_path, TEN_PER_SECOND % "fixed_window", lines, max_clients=20)
    (r,) = res.rules
    assert r.requests == 50 and r.clients == 20 and r.untracked == 30


def test_the_timeline_stays_bounded_over_long_logs(tmp_path):
    # one request an hour for a year: the bucket width doubles until it fits
    lines = [combined("10.3.0.1", T0 + 3600 * h) for h in range(24 * 365)]
    res = _sim(tmp_path, TEN_PER_SECOND % "token_bucket", lines)
    tl = res.rules[0].timeline
    assert len(tl.admitted) <= MAX_BUCKETS + 1
    assert sum(tl.admitted) == 24 * 365 and sum(tl.denied) == 0
    assert math.log2(tl.width).is_integer()


def test_a_full_store_forgets_as_the_sidecars_would_and_says_so(tmp_path):
    body = "  max_keys: 4\n" + TEN_PER_SECOND % "fixed_window"
    lines = [combined(f"10.4.0.{i % 40}", T0) for i in range(400)]
    res = _sim(tmp_path, body, lines)
    assert res.evictions > 0
    assert any("max_keys = 4" in w for w in res.warnings)


def test_rotated_logs_replay_oldest_first(tmp_path):
    cfg = load_file(config(tmp_path / "rules.yaml", TEN_PER_SECOND % "sliding_window_log"))
    new = write(tmp_path / "access.log", [combined("10.5.0.1", T0 + 100 + i / 100) for i in range(1)])
    old = write(tmp_path / "access.log.1", [combined("10.5.0.1", T0 + i / 100) for i in range(1)], gz=True)
    res = replay(cfg, [str(new), str(old)], progress=False)
    assert res.files == [str(old), str(new)]
    assert res.formats == ["combined", "combined"]
    assert res.first == T0 and res.last == T0 + 100


def test_lines_logged_out_of_time_order_are_reported(tmp_path):
    """Two servers' logs replayed one after the other: the second one's lines step
    back in time, which the replay says (where and by how much); a step of one second
    (workers stamping to the second) is not worth a word."""
    jitter = [combined("10.6.0.1", T0 + t) for t in (0, 2, 1, 3)]
    res = _sim(tmp_path, TEN_PER_SECOND % "fixed_window", jitter)
    assert not any("earlier than a request above" in w for w in res.warnings)
    cfg = load_file(config(tmp_path / "rules.yaml", TEN_PER_SECOND % "fixed_window"))
    a = write(tmp_path / "a.log", [combined("10.6.0.2", T0 + t) for t in range(0, 60, 10)])
    b = write(tmp_path / "b.log", [combined("10.6.0.3", T0 + 5 + t) for t in range(0, 60, 10)])
    res = replay(cfg, [str(a), str(b)], progress=False)
    (w,) = [w for w in res.warnings if "earlier than a request above" in w]
    # b's lines at 5, 15, ... 45 s come after a's last line at 50 s; 55 s does not step back
    assert w.startswith("5 requests are logged more than 1 s earlier") and f"by up to 45 s, at {b}:1" in w


def test_unreadable_lines_are_counted_with_their_line_numbers(tmp_path):
    lines = [combined("10.6.0.1", T0 + i) for i in range(10)]
    lines[3] = lines[3][:40]
    lines[7] = "garbage"
    lines.insert(9, "")
    res = _sim(tmp_path, TEN_PER_SECOND % "fixed_window", lines)
    assert res.requests == 10 - 2
    assert res.unreadable == 3
    assert [(e.line, e.reason) for e in res.examples] == [
        (4, "no [time] field"),
        (8, "no [time] field"),
        (10, "empty line"),
    ]
    assert res.examples[0].file.endswith("access.log")


def test_the_replay_uses_the_sidecars_actions(tmp_path):
    """trusted_proxies: the client is taken from the logged X-Forwarded-For only when
    the logged peer is trusted, as the sidecar takes it."""
    body = "  trusted_proxies: [10.7.0.1/32]\n" + TEN_PER_SECOND % "fixed_window"
    lines = [combined("10.7.0.1", T0, xff=f"198.51.100.{i % 3}") for i in range(30)]
    lines += [combined("10.7.0.2", T0, xff="198.51.100.77") for _ in range(5)]
    res = _sim(tmp_path, body, lines)
    r = res.rules[0]
    assert r.clients == 4  # three behind the trusted proxy, and 10.7.0.2 itself (its header is not believed)
    assert sorted(c.key for c in r.top) == []  # 10 each and 5: none over 10
    assert "x-forwarded-for" in Replay.needs_of(load_file(tmp_path / "rules.yaml")).headers


def test_the_helper_process_gives_the_same_figures(tmp_path):
    """jobs=2 (the figures in a forked helper) and jobs=1 (in process) agree on everything."""
    body = TEN_PER_SECOND % "token_bucket" + "      burst: 15\n"
    ev = three_abusers(40)
    ev += [(T0 + 5 + i / 7, "10.8.0.1") for i in range(300)]  # a busy client, sometimes over
    ev.sort(key=lambda e: e[0])
    cfg = load_file(config(tmp_path / "rules.yaml", body))
    log = write(tmp_path / "access.log", [combined(ip, t) for t, ip in ev])
    one = replay(cfg, [str(log)], progress=False, jobs=1)
    two = replay(cfg, [str(log)], progress=False, jobs=2)
    one.seconds = two.seconds = 0.0
    assert one == two
    assert one.rules[0].denied > 0 and one.rules[0].offenders
