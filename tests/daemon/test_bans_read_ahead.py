"""netlimitd's read of the kernel's ban sets begun at start, beside the first apply and
the list's read (issue 35): the first whole write hands it to the sync once; a read that
failed, or is still running after AHEAD_WAIT, is not waited for (the sync reads the sets
itself); later writes never see it. The kernel side (the generation check, the
difference written) is tests/kernel/test_bans_ahead.py; here the follower's logic."""

from __future__ import annotations

import threading

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from netlimit.bans.store import Snapshot
from netlimit.config.validate import load_string
from netlimit.daemon import bans as daemon_bans
from netlimit.daemon.bans import BanFollower, ReadAhead

FILE = "version: 1\nbans: {store: 'redis://127.0.0.1:1'}\n"
PREFIXES = [(4, 0x0A000000, 24, 600.0), (4, 0x0A000107, 32, 500.0), (6, 0x20010DB8 << 96, 64, 600.0)]


class Kernel:
    """What BanFollower asks of KernelOps at a start, recorded."""

    ahead_from = "apply"  # KernelOps says where its read ahead was begun

    def __init__(self, ahead):
        self.ahead = ahead
        self.syncs: list[tuple[list, tuple]] = []

    def ban_sets_cover(self) -> bool:
        return True

    def bans_held_ahead(self, config):
        return self.ahead()

    def bans_sync_prefixes(self, prefixes, *held):
        self.syncs.append((prefixes, held))
        return {"write": "diff", "held": len(prefixes), "added": 0, "removed": 0}


def follower(kernel: Kernel) -> BanFollower:
    return BanFollower(load_string(FILE, "<t>").config, kernel, lambda: None)


def snapshot() -> Snapshot:
    return Snapshot([], prefixes=list(PREFIXES), build=lambda: [])


def test_the_first_write_gets_the_read_ahead_once():
    token = object()
    k = Kernel(lambda: token)
    f = follower(k)
    f._snapshot(snapshot())
    assert [held for _p, held in k.syncs] == [(token,)]
    assert [p[:3] for p in k.syncs[0][0]] == [p[:3] for p in PREFIXES]
    assert f._ahead is None and f.first_loaded
    f.kernel_known = False  # a later whole write (after an apply, a refusal): reads the sets itself
    f._unindexed = None
    f._snapshot(snapshot())
    assert [held for _p, held in k.syncs] == [(token,), ()]


def test_a_failed_read_ahead_leaves_the_sync_to_read_the_sets():
    def boom():
        raise OSError(105, "No buffer space available")  # a netlink dump that failed mid-way

    k = Kernel(boom)
    f = follower(k)
    f._snapshot(snapshot())
    assert [held for _p, held in k.syncs] == [()]
    assert f.first_loaded
    assert f.load_timings["ahead_miss"] == "OSError: [Errno 105] No buffer space available"  # status says why


def test_a_read_ahead_still_running_is_waited_for_at_most_ahead_wait(monkeypatch):
    release = threading.Event()
    k = Kernel(lambda: release.wait(30) and "late")
    monkeypatch.setattr(daemon_bans, "AHEAD_WAIT", 0.2)
    f = follower(k)
    try:
        f._snapshot(snapshot())
        assert [held for _p, held in k.syncs] == [()]
        assert f.load_timings["ahead_wait_s"] >= 0.2
        assert f.load_timings["ahead_miss"] == "not done in 0.2 s"
    finally:
        release.set()


def test_a_reload_writes_the_list_through_the_sync(monkeypatch):
    """A reload (after an apply, drift, a refused write) goes through the same sync as a
    start (banset.sync_prefixes: only what differs, in steps), never one transaction of
    the whole list; the status's last_load says why and what it wrote. A refused sync
    leaves a reload due."""
    from netlimit.bans.model import Ban
    from netlimit.prefixes import network_of

    k = Kernel(lambda: None)
    f = follower(k)
    nets = [network_of(v, a, p) for v, a, p, _left in PREFIXES]
    for net in reversed(nets):
        f.index.put(Ban(net, expires=0.0), 600.0)
    f.reload("drift")
    assert len(k.syncs) == 1 and k.syncs[0][1] == ()  # no read ahead: the sync reads the sets itself
    assert [p[:3] for p in k.syncs[0][0]] == sorted(p[:3] for p in PREFIXES)  # ascending, as the sync takes them
    assert all(599 < p[3] <= 600 for p in k.syncs[0][0])
    assert f.load_timings["reason"] == "drift" and f.load_timings["write"] == "diff", f.load_timings
    assert f.kernel_known and not f.need_reload

    def refused(prefixes, *held):
        raise OSError(12, "Cannot allocate memory")

    monkeypatch.setattr(k, "bans_sync_prefixes", refused)
    f.reload("after an apply")
    assert f.need_reload and not f.kernel_known
    assert "Cannot allocate memory" in f.last_error


def test_a_difference_is_told_the_same_on_the_ready_line_and_in_the_log():
    """startphases.difference: one wording for the ready line and netlimitd's log lines."""
    from netlimit.daemon.bans import _written
    from netlimit.daemon.startphases import _write, difference

    done = {"write": "diff", "held": 9, "added": 3, "removed": 2, "steps": 1, "held_from": "dump"}
    assert difference(done) == "3 written, 2 removed"
    assert difference(dict(done, steps=4)) == "3 written, 2 removed in 4 steps"
    assert difference(dict(done, steps=4, foreign=1)) == (
        "3 written, 2 removed (1 of them not written by netlimit) in 4 steps"
    )
    assert _written(dict(done, steps=4)) == "; 3 written, 2 removed in 4 steps"
    assert _write(dict(done, steps=4)).startswith(": 3 written, 2 removed in 4 steps, 9 held before")
    assert _written({"write": "whole", "added": 5}) == _written(None) == ""


def test_read_ahead_returns_the_result_or_none():
    assert ReadAhead(lambda: 42).take(10) == 42
    assert ReadAhead(lambda: 1 / 0).take(10) is None


def test_a_memory_store_reads_nothing_ahead():
    k = Kernel(lambda: pytest.fail("read ahead on store: memory"))
    f = BanFollower(load_string("version: 1\nbans: {store: memory}\n", "<t>").config, k, lambda: None)
    assert f._ahead is None


# --- the first write's filter (the list's prefixes -> what the kernel is given) -------------


def reference(prefixes, waited, protected, max_entries):
    """The filter as it was before it was made cheaper: one allows() per prefix (and
    max_entries' ties broken by address, as the filter now does)."""
    keep = []
    for v, a, p, left in sorted(prefixes):
        left -= waited
        hi = a + (1 << ((32 if v == 4 else 128) - p)) - 1
        if left > 0.05 and protected.allows(v, a, hi):
            keep.append((v, a, p, hi, left))
    if len(keep) > max_entries:
        keep = sorted(keep, key=lambda k: -k[4])[:max_entries]
    keep.sort()
    out, lastv, lasthi = [], 0, -1
    for k in keep:
        if k[0] == lastv and k[1] <= lasthi:
            continue
        out.append(k)
        lastv, lasthi = k[0], k[3]
    return [(v, a, p, left) for v, a, p, _hi, left in out]


@settings(max_examples=200, deadline=None)
@given(
    st.lists(
        st.tuples(st.integers(0, 255), st.integers(20, 32), st.sampled_from([0.01, 30.0, 60.0, 90.0])),
        max_size=40,
        unique_by=lambda t: (t[0], t[1]),
    ),
    st.sampled_from(["", "exempt: [10.0.0.0/26]\n", "http: {domain: d, trusted_proxies: [10.0.0.77]}\n"]),
    st.integers(1, 50),
)
def test_the_first_writes_filter_is_the_reference(bans, extra, max_entries):
    text = f"version: 1\n{extra}bans: {{store: 'redis://127.0.0.1:1', max_entries: {max_entries}}}\n"
    k = Kernel(lambda: None)
    f = BanFollower(load_string(text, "<t>").config, k, lambda: None)
    prefixes = []
    for off, plen, left in bans:
        a = (0x0A000000 + off) >> (32 - plen) << (32 - plen)
        if all((a, plen) != (x[1], x[2]) for x in prefixes):
            prefixes.append((4, a, plen, left))
    written = f._load_prefixes(list(prefixes), 0.02)
    assert written == reference(prefixes, 0.02, f.protected, f.max_entries)
    assert k.syncs[-1][0] == written


def test_the_switch_interval_is_lowered_while_reads_run_and_put_back_after():
    import sys

    before = sys.getswitchinterval()
    gates = [threading.Event(), threading.Event()]
    a = ReadAhead(lambda: gates[0].wait(30), switch=0.0005)
    b = ReadAhead(lambda: gates[1].wait(30), switch=0.0005)  # overlapping reads
    try:
        assert sys.getswitchinterval() == pytest.approx(0.0005)
        gates[0].set()
        assert a.take(30)
        assert sys.getswitchinterval() == pytest.approx(0.0005)  # b still runs
    finally:
        for g in gates:
            g.set()
    assert b.take(30)
    assert sys.getswitchinterval() == pytest.approx(before)


def test_the_early_read_is_taken_once_and_only_for_its_namespace_and_backend(monkeypatch):
    """netlimitd begins reading the nftables sets before its imports (readahead.begin_early):
    the start takes that read only where it guessed right, and only once."""
    from netlimit.daemon import readahead

    calls: list[tuple[str | None, str]] = []
    monkeypatch.setattr(readahead, "_early", None)

    def fake(netns, backend):
        calls.append((netns, backend))
        readahead._early = (netns, backend, ReadAhead(lambda: ("held", netns, backend)))

    monkeypatch.setattr(readahead, "begin_early", fake)
    readahead.begin_early("ns-a", "nftables")
    assert readahead.take_early("ns-b", "nftables") is None  # another namespace: never taken...
    assert readahead.take_early("ns-a", "nftables") is None  # ...and gone: a guess is tried once
    readahead.begin_early("ns-a", "nftables")
    assert readahead.take_early("ns-a", "restore") is None  # the file chose another backend
    readahead.begin_early(None, "nftables")
    got = readahead.take_early(None, "nftables")
    assert got is not None and got.take(30) == ("held", None, "nftables")
    assert readahead.take_early(None, "nftables") is None  # once: a later read reads the sets anew


def test_kernel_ops_takes_the_early_read_instead_of_reading_again(monkeypatch):
    from netlimit.daemon import readahead
    from netlimit.daemon.kernel_ops import KernelOps

    monkeypatch.setenv("NETLIMIT_BACKEND", "nftables")
    monkeypatch.setattr(readahead, "_early", (None, "nftables", ReadAhead(lambda: "read before the imports")))
    k = KernelOps(None)

    class Config:
        backend = None

    assert k.bans_held_ahead(Config()) == "read before the imports"
    assert readahead._early is None


def test_an_early_read_nobody_took_is_let_go_at_ready(monkeypatch):
    """A file without bans (or a memory store) never takes the early read: it must not
    keep what it read (100,000 prefixes) for the daemon's life."""
    from netlimit.daemon import readahead

    monkeypatch.setattr(readahead, "_early", (None, "nftables", ReadAhead(lambda: {"held": 1})))
    readahead.discard_early()
    assert readahead._early is None
    assert readahead.take_early(None, "nftables") is None


def test_the_early_read_goes_by_the_backend_named_before_the_file(monkeypatch):
    from netlimit.kernel.registry import DEFAULT, guess

    monkeypatch.delenv("NETLIMIT_BACKEND", raising=False)
    assert guess(None) == DEFAULT == "nftables"
    assert guess("auto") == DEFAULT
    assert guess("iptables-legacy-restore") == "restore"  # an alias
    assert guess("no-such-backend") == DEFAULT  # choose() refuses it later, with the error
    monkeypatch.setenv("NETLIMIT_BACKEND", "iptc")
    assert guess(None) == "python-iptables"
    assert guess("nft") == "nftables"  # --backend before the variable


def test_the_ready_line_says_where_the_sets_were_read_and_why_a_read_ahead_was_not_used():
    from netlimit.daemon.startphases import _ahead_source

    diff = {"write": "diff", "added": 0, "removed": 0, "held": 5}
    assert _ahead_source(dict(diff, held_from="prefetch", ahead_from="imports")) == ", read before the imports"
    assert _ahead_source(dict(diff, held_from="prefetch", ahead_from="apply")) == ", read beside the apply"
    miss = dict(diff, held_from="dump", ahead_from="imports", ahead_miss="not done in 5 s")
    assert _ahead_source(miss) == ", the read begun before the imports not used (not done in 5 s)"
    stale = dict(diff, held_from="dump", ahead_from="imports")
    assert _ahead_source(stale) == ", the read begun before the imports out of date (a commit since)"
    assert _ahead_source(dict(diff, held_from="dump")) == ""


def test_a_read_ahead_says_why_it_gave_nothing():
    gate = threading.Event()
    slow = ReadAhead(lambda: gate.wait(30))
    assert slow.take(0.01) is None and slow.why_none(0.01) == "not done in 0.01 s"
    gate.set()
    failed = ReadAhead(lambda: 1 / 0)
    assert failed.take(10) is None and failed.why_none(10) == "ZeroDivisionError: division by zero"
    changed = ReadAhead(lambda: None)  # held() gives None when the ruleset moved during the dump
    assert changed.take(10) is None
    assert changed.why_none(10) == "nothing read: the ruleset changed during the read, or the backend cannot read ahead"
