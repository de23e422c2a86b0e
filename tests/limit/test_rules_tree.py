"""The Lyft descriptor tree: matching semantics, rule identity, store keys."""

from __future__ import annotations

import textwrap

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from netlimit.config.validate import ConfigError, load_string
from netlimit.limit.rules import from_loaded, sf_string

TREE = """
version: 1
http:
  domain: api
  descriptors:
    - key: remote_address                    # key only: any address
      rate_limit: {unit: second, requests_per_unit: 10}
    - key: remote_address
      value: 10.0.0.1                        # key+value beats key only
      rate_limit: {unit: second, requests_per_unit: 1000, name: vip}
    - key: path
      value: /login
      descriptors:
        - key: remote_address
          rate_limit: {unit: minute, requests_per_unit: 5}
          algorithm: sliding_window_log
    - key: path
      value: /api/v2/*                       # trailing wildcard, listed first
      rate_limit: {unit: minute, requests_per_unit: 7, name: v2}
    - key: path
      value: /api/*
      rate_limit: {unit: minute, requests_per_unit: 50, name: api-any}
      descriptors:
        - key: method
          value: POST
          rate_limit: {unit: minute, requests_per_unit: 20, name: api-post}
    - key: path
      value: /api/exact
      rate_limit: {unit: minute, requests_per_unit: 3, name: api-exact}
    - key: path                              # any other path: per-path limit
      rate_limit: {unit: hour, requests_per_unit: 100, name: per-path}
    - key: plan
      value: free
      descriptors:
        - key: user
          rate_limit: {unit: day, requests_per_unit: 100, name: free-user}
          algorithm: token_bucket
          burst: 10
        - key: user
          value: root
          unlimited: true
    - key: tenant                            # a limit with children: the limit is for
      rate_limit: {unit: minute, requests_per_unit: 60, name: tenant}   # requests ending here
      descriptors:
        - key: user
          rate_limit: {unit: minute, requests_per_unit: 6, name: tenant-user}
    - key: ab
      value: c*
      rate_limit: {unit: minute, requests_per_unit: 1, name: ab-wild}
    - key: dark
      rate_limit: {unit: minute, requests_per_unit: 1, name: dark}
      shadow_mode: true
"""


@pytest.fixture(scope="module")
def rs():
    return from_loaded(load_string(TREE, "tree.yaml"))


def name(rs, *entries):
    r = rs.match(list(entries))
    return None if r is None else r.name


def test_key_value_beats_key_only_at_the_same_depth(rs):
    assert name(rs, ("remote_address", "10.0.0.1")) == "vip"
    assert name(rs, ("remote_address", "10.0.0.2")) == "remote_address"
    assert name(rs, ("remote_address", "")) == "remote_address"


def test_exact_then_wildcard_then_key_only(rs):
    assert name(rs, ("path", "/api/exact")) == "api-exact"
    assert name(rs, ("path", "/api/v2/users")) == "v2"
    assert name(rs, ("path", "/api/v1/users")) == "api-any"
    assert name(rs, ("path", "/api/")) == "api-any"
    assert name(rs, ("path", "/api")) == "per-path"  # the prefix is "/api/"
    assert name(rs, ("path", "/other")) == "per-path"


def test_wildcard_config_order_first_prefix_wins(rs):
    # "/api/v2/*" is listed before "/api/*": both prefixes match, the first wins (as Lyft)
    assert name(rs, ("path", "/api/v2/")) == "v2"


def test_wildcard_compares_the_value_of_its_own_key_only(rs):
    # Lyft's string-prefix test ("ab_c" + ...) would let key "ab_c" match "ab: c*"; we do not
    assert name(rs, ("ab", "cat")) == "ab-wild"
    assert rs.match([("ab_c", "x")]) is None


def test_nested_match_and_depth(rs):
    assert name(rs, ("path", "/login"), ("remote_address", "1.2.3.4")) == "path_/login.remote_address"
    # stopping above the node with the limit: /login itself has no rate_limit
    assert rs.match([("path", "/login")]) is None
    # more entries than the tree is deep: no match
    assert rs.match([("path", "/login"), ("remote_address", "1.2.3.4"), ("method", "GET")]) is None
    assert rs.match([("remote_address", "1.2.3.4"), ("path", "/x")]) is None


def test_no_backtracking_to_key_only_sibling(rs):
    # ("path", "/login") chose the exact node; its subtree has no "method" key, and the
    # key-only "path" node (which has no children either) is not tried instead
    assert rs.match([("path", "/login"), ("method", "GET")]) is None
    # wildcard node chosen, its child matches
    assert name(rs, ("path", "/api/x"), ("method", "POST")) == "api-post"
    assert rs.match([("path", "/api/x"), ("method", "GET")]) is None


def test_limit_on_an_inner_node_applies_to_requests_ending_there(rs):
    assert name(rs, ("tenant", "t1")) == "tenant"
    assert name(rs, ("tenant", "t1"), ("user", "u")) == "tenant-user"


def test_order_of_entries_matters(rs):
    assert rs.match([("remote_address", "1.2.3.4"), ("path", "/login")]) is None


def test_unknown_key_and_empty_descriptor(rs):
    assert rs.match([("nope", "x")]) is None
    assert rs.match([]) is None


def test_unlimited_matches_without_a_limit(rs):
    r = rs.match([("plan", "free"), ("user", "root")])
    assert r is not None and r.unlimited and r.limit is None
    r2 = rs.match([("plan", "free"), ("user", "alice")])
    assert r2.name == "free-user" and not r2.unlimited


def test_rules_carry_limit_objects_built_once(rs):
    r1 = rs.match([("plan", "free"), ("user", "alice")])
    r2 = rs.match([("plan", "free"), ("user", "bob")])
    assert r1 is r2
    assert r1.limit is r2.limit
    lim = r1.limit
    assert (lim.algorithm, lim.limit, lim.period, lim.burst, lim.name) == (
        "token_bucket",
        100,
        86400.0,
        10,
        "free-user",
    )
    assert r1.unit == "day" and r1.requests_per_unit == 100 and r1.period == 86400
    assert r1.policy == '"free-user";q=100;w=86400'
    assert r1.keys == ("plan", "user")


def test_rule_names_default_to_the_lyft_stat_path(rs):
    names = [r.name for r in rs.rules]
    assert names == [
        "remote_address",
        "vip",
        "path_/login.remote_address",
        "v2",
        "api-any",
        "api-post",
        "api-exact",
        "per-path",
        "free-user",
        "plan_free.user_root",
        "tenant",
        "tenant-user",
        "ab-wild",
        "dark",
    ]
    assert rs.match([("dark", "x")]).shadow is True
    assert rs.domain == "api"


def test_near_threshold_is_lyfts(rs):
    r = rs.match([("remote_address", "1.2.3.4")])  # 10/s: near when used > floor(0.8 * 10), as Lyft
    assert r.near_threshold == 1
    assert rs.match([("path", "/api/exact")]).near_threshold == 0  # 3: used > 2 -> 3


def test_store_keys_count_each_concrete_value_apart(rs):
    r = rs.match([("path", "/api/a")])
    ka = rs.store_key(r, [("path", "/api/a")])
    kb = rs.store_key(r, [("path", "/api/b")])
    assert ka != kb and ka.startswith("api|path_/api/*|")
    r2 = rs.match([("path", "/login"), ("remote_address", "1.2.3.4")])
    assert (
        rs.store_key(r2, [("path", "/login"), ("remote_address", "1.2.3.4")])
        == "api|path_/login.remote_address|/login\x1f1.2.3.4"
    )


def test_store_keys_cannot_be_forged_with_the_separator(rs):
    r = rs.match([("tenant", "a"), ("user", "b")])
    k1 = rs.store_key(r, [("tenant", "a\x1fb"), ("user", "c")])
    k2 = rs.store_key(r, [("tenant", "a"), ("user", "b\x1fc")])
    assert k1 != k2


def test_the_reported_collision_is_gone(rs):
    """("x\x1fy", "z") and ("x\\sy", "z") used to share one counter."""
    r = rs.match([("tenant", "a"), ("user", "b")])
    assert rs.store_key(r, [("tenant", "x\x1fy"), ("user", "z")]) != rs.store_key(
        r, [("tenant", "x\\sy"), ("user", "z")]
    )


_VALUE = st.text(alphabet=st.sampled_from(["a", "\\", "\x1f", "s", "h", "#", "0", "é"]), max_size=12) | st.text(
    max_size=300
)


@settings(max_examples=1500, deadline=None)
@given(a=st.tuples(_VALUE, _VALUE), b=st.tuples(_VALUE, _VALUE), one=_VALUE, other=_VALUE)
def test_store_keys_are_injective(rs, a, b, one, other):
    """Different descriptors never share a key, whatever bytes a client puts in
    its values (separators, backslashes, a forged digest), long ones included."""
    r2 = rs.match([("tenant", "t"), ("user", "u")])
    k = lambda vals: rs.store_key(r2, [("tenant", vals[0]), ("user", vals[1])])
    assert (k(a) == k(b)) == (a == b)
    r1 = rs.match([("path", "/x")])
    forged = "\\h" + rs.store_key(r1, [("path", "/" + "y" * 400)]).rsplit("\\h", 1)[1]
    for v, w in ((one, other), (forged, "/" + "y" * 400)):
        assert (rs.store_key(r1, [("path", v)]) == rs.store_key(r1, [("path", w)])) == (v == w)


def test_long_keys_are_hashed_to_a_bounded_length(rs):
    r = rs.match([("path", "/x")])
    k = rs.store_key(r, [("path", "/" + "x" * 10_000)])
    assert len(k) <= len(r.key_prefix) + 34
    assert k != rs.store_key(r, [("path", "/" + "x" * 9_999)])


def test_duplicate_siblings_are_reported_with_position():
    text = textwrap.dedent("""\
        version: 1
        http:
          domain: api
          descriptors:
            - key: path
              value: /a
              rate_limit: {unit: second, requests_per_unit: 1}
            - key: path
              value: /a
              rate_limit: {unit: second, requests_per_unit: 2}
        """)
    with pytest.raises(ConfigError) as ei:
        load_string(text, "dup.yaml")  # the file's validation: netlimit validate and the sidecar alike
    assert [str(p) for p in ei.value.problems] == [
        "dup.yaml:8:12: http: duplicate descriptor composite key 'api.path_/a' (first at line 5)"
    ]


def test_no_http_section_is_an_error():
    with pytest.raises(ConfigError) as ei:
        from_loaded(load_string("version: 1\n", "none.yaml"))
    assert "has no 'http:' section" in str(ei.value)


def test_algorithm_limits_surface_as_config_errors():
    text = textwrap.dedent("""\
        version: 1
        http:
          domain: api
          descriptors:
            - key: k
              algorithm: token_bucket
              rate_limit: {unit: second, requests_per_unit: 5000000000}
        """)
    with pytest.raises(ConfigError) as ei:
        from_loaded(load_string(text, "fast.yaml"))
    (p,) = ei.value.problems
    assert (p.file, p.line) == ("fast.yaml", 7)
    assert "'requests_per_unit' input should be less than or equal to 4294967295" in p.message


def test_sf_string_escapes_and_replaces():
    assert sf_string('a"b\\c') == '"a\\"b\\\\c"'
    assert sf_string("caf\u00e9\n") == '"caf??"'


# --- Lyft's wildcards: several `*`, anywhere ---------------------------------------


@settings(max_examples=400, deadline=None)
@given(
    parts=st.lists(st.text("ab/", max_size=3), min_size=2, max_size=4),
    value=st.text("ab/", max_size=10),
)
def test_wildcards_match_as_globs(parts, value):
    """Each `*` matches any text, also none (config_impl.go wildcardMatch): the same
    as a regular expression of the literal parts joined by `.*`."""
    import re

    from netlimit.limit.rules import wild_match, wildcard

    pattern = "*".join(parts)
    first, rest = wildcard(pattern)
    want = re.fullmatch(".*".join(map(re.escape, parts)), value, re.DOTALL) is not None
    assert wild_match(first, rest, value) == want, (pattern, value)


WILD = """
version: 1
http:
  domain: w
  descriptors:
    - key: path
      value: /api/*/users/*
      rate_limit: {unit: minute, requests_per_unit: 1, name: users}
    - key: path
      value: "*.png"
      rate_limit: {unit: minute, requests_per_unit: 2, name: png}
    - key: path
      value: /a*b*c
      share_threshold: true
      rate_limit: {unit: minute, requests_per_unit: 3, name: abc}
    - key: path
      rate_limit: {unit: minute, requests_per_unit: 4, name: any}
"""


def test_wildcards_in_the_middle_and_several():
    rs = from_loaded(load_string(WILD, "w.yaml"))
    assert name(rs, ("path", "/api/v1/users/42")) == "users"
    assert name(rs, ("path", "/api/v1/users/")) == "users"  # the last * matches nothing
    assert name(rs, ("path", "/api/v1/groups/42")) == "any"
    assert name(rs, ("path", "/img/logo.png")) == "png"
    assert name(rs, ("path", "/abc")) == "abc" and name(rs, ("path", "/a-b-c")) == "abc"
    assert name(rs, ("path", "/ab")) == "any"  # prefix and suffix may not overlap ("/ab" has no "c")


def test_share_threshold_values_share_one_store_key():
    rs = from_loaded(load_string(WILD, "w.yaml"))
    r = rs.match([("path", "/a1b2c")])
    k1 = rs.store_key(r, [("path", "/a1b2c")])
    assert k1 == rs.store_key(r, [("path", "/aXbYc")]) == rs.store_key(r, [("path", "/a*b*c")])
    other = rs.match([("path", "/img/x.png")])
    assert rs.store_key(other, [("path", "/img/x.png")]) != rs.store_key(other, [("path", "/img/y.png")])


def test_stat_keys_are_lyfts():
    rs = from_loaded(load_string(WILD, "w.yaml"))
    r = rs.match([("path", "/img/x.png")])
    assert rs.stat_key(r, [("path", "/img/x.png")]) == "w.path_*.png" and r.steps is None
