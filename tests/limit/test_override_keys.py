"""A descriptor's ``limit`` override counts under a key built from the
descriptor's keys and values, all chosen by the client (gRPC, the JSON API):
no two different descriptors may share a counter."""

from __future__ import annotations

import asyncio
import textwrap

from hypothesis import given, settings
from hypothesis import strategies as st

from netlimit.config.validate import load_string
from netlimit.limit.limiter import OVER_LIMIT, Limiter, override_rule
from netlimit.limit.request import DescriptorIn, Override, build_request
from netlimit.limit.rules import from_loaded
from netlimit.limit.stores import MemoryStore

CONFIG = textwrap.dedent("""\
    version: 1
    http:
      domain: api
      descriptors:
        - key: k
          rate_limit: {unit: second, requests_per_unit: 1000}
    """)
OV = Override("minute", 1)


def _rules():
    return from_loaded(load_string(CONFIG, "ov.yaml"))


def full_key(rs, entries: list[tuple[str, str]], ov: Override = OV) -> str:
    """The store key the limiter uses for ``entries`` under the override ``ov``."""
    rule = override_rule(rs.domain, tuple(k for k, _ in entries), ov, rs.match(entries))
    return rs.store_key(rule, entries)


def test_the_reported_collisions_are_gone():
    rs = _rules()
    assert full_key(rs, [("k|x", "v")]) != full_key(rs, [("k", "x|v")])
    assert full_key(rs, [("a\x1fb", "1"), ("c", "2")]) != full_key(rs, [("a", "1"), ("b\x1fc", "2")])


def test_colliding_descriptors_do_not_share_a_counter():
    """Through the limiter: one request each, an override of 1 per minute; the
    second descriptor is a different client and is admitted."""

    async def go() -> list[int]:
        lim = Limiter(_rules(), MemoryStore())
        codes = []
        for entries in ([("k|x", "v")], [("k", "x|v")], [("a\x1fb", "c")], [("a", "b\x1fc")]):
            req = build_request("api", [DescriptorIn(entries, override=OV)])
            codes.append((await lim.check(req)).code)
        again = build_request("api", [DescriptorIn([("k", "x|v")], override=OV)])
        codes.append((await lim.check(again)).code)
        await lim.close()
        return codes

    codes = asyncio.run(go())
    assert codes[:4] == [codes[0]] * 4 and codes[0] != OVER_LIMIT
    assert codes[4] == OVER_LIMIT  # the same descriptor again: the override does count


_TEXT = st.text(alphabet=st.sampled_from(["a", "|", "\\", "\x1f", "p", "s", "h", "#", "é"]), max_size=8) | st.text(
    min_size=1, max_size=80
)
_KEY = _TEXT.filter(bool)
_DESC = st.lists(st.tuples(_KEY, _TEXT), min_size=1, max_size=3)


@st.composite
def _resplit(draw, desc):
    """``desc`` with the text around one boundary (a key and its value, or one
    entry's key and the next one's) joined by a separator and split again at
    another occurrence of it: the neighbours a naive join confuses."""
    fields = [x for e in desc for x in e]
    i = draw(st.integers(0, len(fields) - 2)) if len(fields) > 1 else 0
    if len(fields) < 2:
        return desc
    sep = draw(st.sampled_from(["|", "\x1f", "\\", "\\p", "\\s"]))
    joined = fields[i] + sep + fields[i + 1]
    cuts = [j for j in range(len(joined)) if joined.startswith(sep, j)]
    j = draw(st.sampled_from(cuts))
    fields[i], fields[i + 1] = joined[:j], joined[j + len(sep) :]
    out = list(zip(fields[::2], fields[1::2]))
    return out if all(k for k, _ in out) else desc


@st.composite
def _pair(draw):
    a = draw(_DESC)
    return a, draw(_DESC | _resplit(a))


@settings(max_examples=2000, deadline=None)
@given(ab=_pair())
def test_override_keys_are_injective(ab):
    """Different descriptors (keys or values, separators, backslashes, long keys
    hashed) never share an override's counter; equal ones always do."""
    a, b = ab
    rs = _rules()
    assert (full_key(rs, a) == full_key(rs, b)) == (a == b)


@settings(max_examples=300, deadline=None)
@given(keys=st.lists(_KEY, min_size=1, max_size=3))
def test_a_forged_digest_is_not_a_long_tag(keys):
    """A long tag becomes a digest; a client sending that digest as a key does not
    land on the long tag's counter."""
    rs = _rules()
    long = [("x" * 70, "v")]
    digest = override_rule(rs.domain, ("x" * 70,), OV, None).key_prefix.split("|")[-2]
    assert digest.startswith("\\h")
    assert full_key(rs, [(digest, "v")]) != full_key(rs, long)
    entries = [(k, "v") for k in keys]
    assert (full_key(rs, entries) == full_key(rs, long)) == (entries == long)
