"""The Space-Saving summary behind `netlimit top`'s most denied clients: bounded, and
its guarantees hold for any stream (hypothesis)."""

from __future__ import annotations

import hashlib
from collections import Counter

from hypothesis import given
from hypothesis import strategies as st

from netlimit.limit.hitters import MAX_KEY, HeavyHitters, descriptor_text, shown_value

streams = st.lists(st.tuples(st.sampled_from("abcdefghijklmnop"), st.integers(1, 5)), max_size=400)


@given(streams, st.integers(1, 8))
def test_space_saving_guarantees(stream, capacity):
    hh = HeavyHitters(capacity)
    true: Counter = Counter()
    for k, n in stream:
        hh.add(("rule", k), n)
        true[k] += n
    total = sum(true.values())
    top = {e["key"]: e for e in hh.top(capacity)}
    assert len(top) <= capacity  # bounded, whatever the stream
    for k, e in top.items():
        assert e["count"] >= true[k] >= e["count"] - e["error"]  # over-states by at most its error
    for k, n in true.items():
        if n > total / capacity:  # a heavy hitter is never missed
            assert k in top


def test_top_is_largest_first_and_keys_are_cut():
    hh = HeavyHitters(4)
    for k, n in (("a", 1), ("b", 5), ("c", 3)):
        hh.add(("r", k), n)
    assert [e["key"] for e in hh.top(2)] == ["b", "c"]
    long = descriptor_text([("user", "v" * 1000)])
    assert len(long) == MAX_KEY and long.endswith("…")
    assert descriptor_text([("path", "/login"), ("remote_address", "1.2.3.4")]) == "path=/login, remote_address=1.2.3.4"


@given(st.text(max_size=300))
def test_header_values_are_shown_hashed_unless_revealed(value):
    h = "sha256:" + hashlib.sha256(value.encode("utf-8", "surrogateescape")).hexdigest()[:16]
    assert shown_value("header:X-Api-Key", value) == h
    assert shown_value("header:X-Api-Key", value, reveal=True) == value
    assert shown_value("remote_address", value) == value  # addresses are what operators ban: shown
    text = descriptor_text([("path", "/a"), ("header:X-Api-Key", value)])
    assert text == f"path=/a, header:X-Api-Key={h}"
