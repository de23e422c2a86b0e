"""The memory store shared by `sidecar --workers N` (netlimit/limit/stores/shared.py):
a real state owner on a Unix socket (its asyncio loop in a thread) and several
worker-side stores in this process, driven in any interleaving.

Claims: the workers together never admit more than the limit; once every worker
has given its leases back, the owner's count is exactly what was admitted
(nothing reserved is lost, nothing is counted twice); hot keys are answered from
leases (fewer round trips than decisions); an owner that goes away leaves each
worker deciding alone, and it comes back by itself.
"""

from __future__ import annotations

import asyncio
import threading
import uuid
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from netlimit.limit.algorithms import Limit
from netlimit.limit.stores import MemoryStore
from netlimit.limit.stores.shared import SharedMemoryStore, serve_owner


class OwnerThread:
    def __init__(self, path: Path):
        self.path = str(path)
        self.store = MemoryStore()
        self.loop = asyncio.new_event_loop()
        ready = threading.Event()
        self.task: asyncio.Task | None = None

        def run() -> None:
            asyncio.set_event_loop(self.loop)
            self.task = self.loop.create_task(serve_owner(self.path, self.store, ready.set))
            try:
                self.loop.run_until_complete(self.task)
            except asyncio.CancelledError:
                pass

        self.t = threading.Thread(target=run, daemon=True)
        self.t.start()
        assert ready.wait(10), "the owner did not start"

    def stop(self) -> None:
        if self.task is not None:
            self.loop.call_soon_threadsafe(self.task.cancel)
        self.t.join(10)
        assert not self.t.is_alive()
        self.loop.close()


@pytest.fixture
def owner(tmp_path):
    o = OwnerThread(tmp_path / "state.sock")
    try:
        yield o
    finally:
        o.stop()


def _limit(alg: str, n: int) -> Limit:
    from netlimit.limit.algorithms import REGISTRY

    assert alg in REGISTRY
    # a period of ~3 years: a bucket refills nothing measurable during a test
    return Limit(alg, n, 1e8, name=f"shared-{alg}-{n}")


ALGS = ["fixed_window", "fixed_window_admitted", "token_bucket", "leaky_bucket", "sliding_window_counter"]


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    alg=st.sampled_from(ALGS),
    limit=st.integers(1, 400),
    plan=st.lists(st.tuples(st.integers(0, 2), st.integers(1, 3), st.integers(1, 60)), min_size=1, max_size=30),
)
def test_workers_never_admit_over_the_limit(owner, alg, limit, plan):
    lim = _limit(alg, limit)
    key = f"k{uuid.uuid4().hex}"
    workers = [SharedMemoryStore(owner.path) for _ in range(3)]
    admitted = 0
    try:
        for w, cost, times in plan:  # bursts: a worker sees `times` hits in a row (hot keys lease)
            for _ in range(times):
                d = workers[w].hit_sync(key, lim, cost)
                admitted += cost if d.allowed else 0
                assert 0 <= d.remaining <= lim.capacity
        assert admitted <= limit
    finally:
        for w in workers:
            asyncio.run(w.close())
    assert all(w.owner_errors == 0 for w in workers)
    if alg == "fixed_window_admitted":  # leases all back: the owner counts exactly what was admitted
        left = owner.store.peek_sync(key, lim, 0).remaining
        assert left == limit - admitted


def test_a_hot_key_is_answered_from_leases(owner):
    lim = _limit("fixed_window", 100_000)
    a, b = SharedMemoryStore(owner.path), SharedMemoryStore(owner.path)
    try:
        n = 0
        for _ in range(5000):
            n += a.hit_sync("hot", lim).allowed
            n += b.hit_sync("hot", lim).allowed
        assert n == 10_000
        trips = a.lease_stats.round_trips + b.lease_stats.round_trips
        assert a.lease_stats.local > 0 and b.lease_stats.local > 0
        assert trips < 10_000 / 4, trips
    finally:
        asyncio.run(a.close())
        asyncio.run(b.close())
    assert owner.store.peek_sync("hot", lim, 0).remaining == 100_000 - 10_000


def test_twice_the_limit_from_three_workers_admits_exactly_the_limit(owner):
    for alg in ("fixed_window", "fixed_window_admitted", "token_bucket"):
        lim = _limit(alg, 500)
        ws = [SharedMemoryStore(owner.path) for _ in range(3)]
        try:
            got = sum(ws[i % 3].hit_sync("k", lim).allowed for i in range(1000))
        finally:
            for w in ws:
                asyncio.run(w.close())
        assert got == 500, (alg, got)


def test_without_an_owner_a_worker_decides_alone_and_comes_back(tmp_path):
    path = tmp_path / "state.sock"
    lim = _limit("fixed_window", 3)
    w = SharedMemoryStore(str(path))
    try:
        got = [w.hit_sync("k", lim).allowed for _ in range(4)]
        assert got == [True, True, True, False]  # its own state meanwhile
        assert w.owner_errors == 1  # one failure, then no retry before RETRY seconds
        o = OwnerThread(path)
        try:
            w._down_until = 0.0  # the retry time has come
            assert w.hit_sync("k2", lim).allowed
            assert len(o.store) == 1  # decided by the owner again
        finally:
            o.stop()
    finally:
        asyncio.run(w.close())


def test_units_given_back_to_a_saturated_window_are_still_admitted(owner):
    """Lyft's counting: a denial saturates the window; the unused rest of a lease
    another worker held then comes back into the owner's pool and is admitted."""
    from time import monotonic

    lim = _limit("fixed_window", 500)
    a, b = SharedMemoryStore(owner.path), SharedMemoryStore(owner.path)
    try:
        admitted = sum(a.hit_sync("k", lim).allowed for _ in range(200))
        held = a.held()
        assert held > 0  # a is hot: it holds a lease
        admitted += sum(b.hit_sync("k", lim).allowed for _ in range(1000))
        assert admitted == 500 - held  # b saturated the window; a's lease is all that is left
        a._sweep(monotonic(), everything=True)  # a gives its lease back (as at its expiry)
        assert a.lease_stats.returned_units == held and not owner.store.peek_sync("k", lim, 0).allowed
        admitted += sum(a.hit_sync("k", lim).allowed for _ in range(100))
    finally:
        asyncio.run(a.close())
        asyncio.run(b.close())
    assert admitted == 500


def test_limit_overrides_are_decided_by_the_owner(owner):
    """A DynamicLimit (a request's limit override) never leases: every decision is the owner's."""
    from netlimit.limit.algorithms.base import DynamicLimit

    lim = DynamicLimit("fixed_window", 7, 1e8)
    a, b = SharedMemoryStore(owner.path), SharedMemoryStore(owner.path)
    try:
        got = [(a if i % 2 else b).hit_sync("override-key", lim).allowed for i in range(20)]
        peek = a.peek_sync("override-key", lim, 0)
    finally:
        asyncio.run(a.close())
        asyncio.run(b.close())
    assert got.count(True) == 7 and got[:7] == [True] * 7
    assert not peek.allowed and a.lease_stats.granted == b.lease_stats.granted == 0
