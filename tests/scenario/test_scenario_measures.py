"""How the scenario measures, without hosts.

vagrant/scenario.py's `bucket_passes` (the expectation for a hashlimit: a
token bucket replayed over arrival times) must give rate x T + burst for even
floods, everything for traffic under the rate, and fewer after a pause (the
bucket banks at most its burst), which is what a stalled VM's clumped arrivals
get from the kernel. vagrant/tools.py's `StallWatch` must notice a process
that was stopped.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from hypothesis import given
from hypothesis import strategies as st
from vagrant_scenario import load_scenario

ROOT = Path(__file__).resolve().parents[2]


sc = load_scenario()


def test_an_even_flood_passes_rate_times_span_plus_burst():
    times = [i / 300 for i in range(1800)]  # 300/s for 6 s
    got = sc.bucket_passes(times, 20.0, 10)
    assert abs(got - (20.0 * times[-1] + 10)) <= 1


def test_traffic_under_the_rate_all_passes():
    times = [i / 4 for i in range(24)]
    assert sc.bucket_passes(times, 20.0, 10) == 24


def test_a_pause_in_the_arrivals_costs_what_the_bucket_could_not_bank():
    # 300/s, then nothing for 2.4 s (the VM stalled), then the queued packets in a clump and 300/s again
    before = [i / 300 for i in range(900)]
    clump = [before[-1] + 2.4 + i * 1e-5 for i in range(200)]
    after = [clump[-1] + (i + 1) / 300 for i in range(700)]
    times = before + clump + after
    span = times[-1] - times[0]
    got = sc.bucket_passes(times, 20.0, 10)
    # the pause refills 10 tokens, not 48: about 38 fewer than rate x T + burst
    assert abs(got - (20.0 * (span - 2.4) + 10 + 10)) <= 2
    assert 20.0 * span + 10 - got > 30
    assert sc.longest_gap(times) >= 2.4


@given(
    gaps=st.lists(st.floats(min_value=0.0, max_value=0.5), min_size=1, max_size=400),
    rate=st.floats(min_value=1.0, max_value=200.0),
    burst=st.integers(min_value=1, max_value=50),
)
def test_never_more_than_rate_times_span_plus_burst_nor_more_than_arrived(gaps, rate, burst):
    times, t = [], 0.0
    for g in gaps:
        t += g
        times.append(t)
    got = sc.bucket_passes(times, rate, burst)
    assert 0 < got <= len(times)
    assert got <= rate * (times[-1] - times[0]) + burst + 1e-9


STALL_PROBE = """
import importlib.util, json, sys
spec = importlib.util.spec_from_file_location("tools", sys.argv[1])
tools = importlib.util.module_from_spec(spec)
spec.loader.exec_module(tools)
w = tools.StallWatch()
print("READY", flush=True)
sys.stdin.read()
print(json.dumps(w.result()), flush=True)
"""


def test_stall_watch_notices_a_stopped_process():
    p = subprocess.Popen(
        [sys.executable, "-c", STALL_PROBE, str(ROOT / "vagrant" / "tools.py")],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert p.stdout.readline().strip() == "READY"
        time.sleep(0.1)  # its first tick
        os.kill(p.pid, signal.SIGSTOP)
        time.sleep(0.8)  # the stall itself: what a host that stops scheduling a VM does to it
        os.kill(p.pid, signal.SIGCONT)
        out, _ = p.communicate("", timeout=30)
    finally:
        if p.poll() is None:
            p.kill()
            p.wait()
    res = json.loads(out.strip().splitlines()[-1])
    assert res["longest_stall_s"] >= 0.7, res


@given(
    st.lists(st.floats(0, 0.05), max_size=400),
    st.floats(1, 500),
    st.integers(1, 50),
)
def test_the_demo_replays_the_same_bucket_as_the_scenario(gaps, rate, burst):
    """netlimit demo's expectation (kernel/traffic.py, over its flood's send times) is the
    scenario's bucket (over the limiter's arrival times): two copies, since scenario.py
    runs where netlimit is not importable; this keeps them one rule."""
    from itertools import accumulate

    from netlimit.kernel.traffic import bucket_passes

    times = list(accumulate(gaps))
    assert bucket_passes(times, rate, burst) == sc.bucket_passes(times, rate, burst)


def test_the_demo_expects_fewer_when_its_sender_paused():
    from netlimit.kernel.traffic import bucket_passes

    even = [i / 2000 for i in range(8000)]  # 2000/s for 4 s, as the demo floods
    kept_up = bucket_passes(even, 100, 10)
    assert abs(kept_up - (100 * even[-1] + 10)) <= 1  # rate x T + burst
    paused = [t if t < 2 else t + 0.5 for t in even]  # the sender stalled 0.5 s halfway
    got = bucket_passes(paused, 100, 10)
    assert 0 < got - kept_up <= 10  # the pause banks the burst, no more
    assert got < 100 * paused[-1] + 10 - 30  # rate x (the span with the pause) + burst: 41 more
