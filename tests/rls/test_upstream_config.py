"""envoyproxy/ratelimit's test/config/config_test.go, replayed: the same config
files (kept verbatim in tests/rls/upstream/test/config; the inline
``config.YamlRoot{...}`` configs written out as YAML) load, or are refused
with the same message at FILE:LINE:COL; every ``GetLimit`` lookup finds the
same limit (requests_per_unit, unit, name, shadow_mode, unlimited, metadata,
share_threshold pattern) and Lyft's stat key (``Stats.Key``: the per-value
metric names of detailed_metric / value_to_metric).  Each lookup is also sent
through both doors (gRPC and the JSON API) as a check-only request
(hits_addend 0): the answer carries the same limit.

Differences kept on purpose (README, "What answers differently"): generic
YAML and schema errors use netlimit's messages (with a position and a
did-you-mean); a descriptor without entries is refused at the door
(INVALID_ARGUMENT), Lyft answers it OK.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
from lyft_replay import CONFIG_DIR, Clock, reset_of, rules, serving_doors, upstream_text
from rls_helpers import OK, U32_MAX, desc, request

from netlimit.config.validate import ConfigError, load_lyft_string
from netlimit.limit.limiter import Limiter
from netlimit.limit.stores import MemoryStore

NOW = 1_800_000_000.0  # a fixed instant: upstream's tests fix time too


@dataclass(frozen=True)
class Want:
    """What GetLimit returns (None: nil)."""

    rpu: int | None = None  # None with unlimited
    unit: str = ""
    name: str = ""
    stat: str = ""  # Stats.Key (and FullKey)
    shadow: bool = False
    unlimited: bool = False
    share: dict[int, str] = field(default_factory=dict)  # ShareThresholdKeyPattern, by entry index
    metadata: dict[str, Any] | None = None


@dataclass(frozen=True)
class Lookup:
    case: str  # upstream test (and sub-test)
    files: tuple[tuple[str, str], ...]  # the config: (file name, text)
    domain: str
    entries: tuple[tuple[str, str], ...]
    want: Want | None
    merge: bool = False


def up(*names: str) -> tuple[tuple[str, str], ...]:
    return tuple((n, upstream_text(n)) for n in names)


def inline(text: str) -> tuple[tuple[str, str], ...]:
    return (("inline.yaml", text),)


def E(*kv: str) -> tuple[tuple[str, str], ...]:
    it = iter(kv)
    return tuple(zip(it, it))


B, T = "basic_config.yaml", "test-domain"
LOOKUPS: list[Lookup] = [
    # ---------------------------------------------------------------- TestBasicConfig
    Lookup("TestBasicConfig/unknown-domain", up(B), "foo_domain", (), None),
    Lookup("TestBasicConfig/empty-descriptor", up(B), T, (), None),
    Lookup("TestBasicConfig/key1-something", up(B), T, E("key1", "something"), None),
    Lookup("TestBasicConfig/key1-value1-no-limit", up(B), T, E("key1", "value1"), None),
    Lookup("TestBasicConfig/deeper-than-key2", up(B), T, E("key2", "value2", "subkey", "subvalue"), None),
    Lookup("TestBasicConfig/key5-subkey5-other", up(B), T, E("key5", "value5", "subkey5", "subvalue"), None),
    Lookup(
        "TestBasicConfig/subkey1-default",
        up(B),
        T,
        E("key1", "value1", "subkey1", "something"),
        Want(5, "second", stat="test-domain.key1_value1.subkey1"),
    ),
    Lookup(
        "TestBasicConfig/subkey1-subvalue1",
        up(B),
        T,
        E("key1", "value1", "subkey1", "subvalue1"),
        Want(10, "second", stat="test-domain.key1_value1.subkey1_subvalue1"),
    ),
    Lookup(
        "TestBasicConfig/key2-default", up(B), T, E("key2", "something"), Want(20, "minute", stat="test-domain.key2")
    ),
    Lookup(
        "TestBasicConfig/key2-value2", up(B), T, E("key2", "value2"), Want(30, "minute", stat="test-domain.key2_value2")
    ),
    Lookup("TestBasicConfig/key2-value3-whitelisted", up(B), T, E("key2", "value3"), None),
    Lookup("TestBasicConfig/key3", up(B), T, E("key3", "foo"), Want(1, "hour", stat="test-domain.key3")),
    Lookup(
        "TestBasicConfig/key4-named",
        up(B),
        T,
        E("key4", "foo"),
        Want(1, "day", name="key4_rate_limit", stat="test-domain.key4"),
    ),
    Lookup("TestBasicConfig/key6-unlimited", up(B), T, E("key6", "foo"), Want(unlimited=True, stat="test-domain.key6")),
    Lookup(
        "TestBasicConfig/key7-detailed-1",
        up(B),
        T,
        E("key7", "unspecified_value"),
        Want(70, "minute", stat="test-domain.key7_unspecified_value"),
    ),
    Lookup(
        "TestBasicConfig/key7-detailed-2",
        up(B),
        T,
        E("key7", "another_value"),
        Want(70, "minute", stat="test-domain.key7_another_value"),
    ),
    # ---------------------------------------------------------------- TestDomainMerge
    Lookup(
        "TestDomainMerge/unknown", up("merge_domain_key1.yaml", "merge_domain_key2.yaml"), "foo_domain", (), None, True
    ),
    Lookup("TestDomainMerge/empty", up("merge_domain_key1.yaml", "merge_domain_key2.yaml"), T, (), None, True),
    Lookup(
        "TestDomainMerge/key1",
        up("merge_domain_key1.yaml", "merge_domain_key2.yaml"),
        T,
        E("key1", "value1"),
        Want(10, "minute", stat="test-domain.key1_value1"),
        True,
    ),
    Lookup(
        "TestDomainMerge/key2",
        up("merge_domain_key1.yaml", "merge_domain_key2.yaml"),
        T,
        E("key2", "value2"),
        Want(20, "minute", stat="test-domain.key2_value2"),
        True,
    ),
    # ---------------------------------------------------------------- TestShadowModeConfig
    Lookup(
        "TestShadowModeConfig/subkey1",
        up("shadowmode_config.yaml"),
        T,
        E("key1", "value1", "subkey1", "something"),
        Want(5, "second", stat="test-domain.key1_value1.subkey1"),
    ),
    Lookup(
        "TestShadowModeConfig/subkey1-subvalue1",
        up("shadowmode_config.yaml"),
        T,
        E("key1", "value1", "subkey1", "subvalue1"),
        Want(10, "second", stat="test-domain.key1_value1.subkey1_subvalue1", shadow=True),
    ),
    Lookup(
        "TestShadowModeConfig/key2",
        up("shadowmode_config.yaml"),
        T,
        E("key2", "something"),
        Want(20, "minute", stat="test-domain.key2", shadow=True),
    ),
    Lookup(
        "TestShadowModeConfig/key2-value2",
        up("shadowmode_config.yaml"),
        T,
        E("key2", "value2"),
        Want(30, "minute", stat="test-domain.key2_value2"),
    ),
    # ---------------------------------------------------------------- TestMetadata
    Lookup("TestMetadata/empty", up("metadata.yaml"), T, (), None),
    Lookup(
        "TestMetadata/subkey1",
        up("metadata.yaml"),
        T,
        E("key1", "value1", "subkey1", "something"),
        Want(5, "second", stat="test-domain.key1_value1.subkey1", metadata={"name": "service_1"}),
    ),
    Lookup(
        "TestMetadata/key2",
        up("metadata.yaml"),
        T,
        E("key2", "something"),
        Want(20, "minute", stat="test-domain.key2", metadata={"service_with_quota": {"name": "service_2"}}),
    ),
]

# ---------------------------------------------------------------- TestWildcardConfig
W = up("wildcard.yaml")
LOOKUPS += [
    Lookup("TestWildcardConfig/noVal-1", W, T, E("noVal", "foo1"), Want(20, "minute", stat="test-domain.noVal")),
    Lookup("TestWildcardConfig/noVal-2", W, T, E("noVal", "foo2"), Want(20, "minute", stat="test-domain.noVal")),
    Lookup("TestWildcardConfig/wild-1", W, T, E("wild", "foo1"), Want(20, "minute", stat="test-domain.wild_foo*")),
    Lookup("TestWildcardConfig/wild-2", W, T, E("wild", "foo2"), Want(20, "minute", stat="test-domain.wild_foo*")),
    Lookup(
        "TestWildcardConfig/nested-wild",
        W,
        T,
        E("nestedWild", "val1", "wild", "goo2"),
        Want(20, "minute", stat="test-domain.nestedWild_val1.wild_goo*"),
    ),
    Lookup("TestWildcardConfig/no-match", W, T, E("wild", "bar"), None),
    Lookup("TestWildcardConfig/no-eager-match", W, T, E("noWild", "foo1"), None),
    Lookup(
        "TestWildcardConfig/middle-1", W, T, E("midWild", "barab"), Want(20, "minute", stat="test-domain.midWild_bar*b")
    ),
    Lookup(
        "TestWildcardConfig/middle-2",
        W,
        T,
        E("midWild", "bar123b"),
        Want(20, "minute", stat="test-domain.midWild_bar*b"),
    ),
    Lookup(
        "TestWildcardConfig/middle-empty",
        W,
        T,
        E("midWild", "barb"),
        Want(20, "minute", stat="test-domain.midWild_bar*b"),
    ),
    Lookup("TestWildcardConfig/middle-no-suffix", W, T, E("midWild", "bara"), None),
    Lookup("TestWildcardConfig/middle-no-prefix", W, T, E("midWild", "xbarb"), None),
    Lookup(
        "TestWildcardConfig/multi-1",
        W,
        T,
        E("multiWild", "foo123bar456baz"),
        Want(10, "minute", stat="test-domain.multiWild_foo*bar*baz"),
    ),
    Lookup(
        "TestWildcardConfig/multi-2",
        W,
        T,
        E("multiWild", "foobarbaz"),
        Want(10, "minute", stat="test-domain.multiWild_foo*bar*baz"),
    ),
    Lookup("TestWildcardConfig/multi-missing-middle", W, T, E("multiWild", "foo123baz"), None),
    Lookup("TestWildcardConfig/multi-missing-prefix", W, T, E("multiWild", "bar456baz"), None),
]

# ---------------------------------------------------------------- TestDetailedMetric
NESTED_DETAILED = """
domain: nested
descriptors:
  - key: key-1
    detailed_metric: {d1}
    rate_limit: {{requests_per_unit: 100, unit: minute}}
    descriptors:
      - key: key-2
        detailed_metric: {d2}
        rate_limit: {{requests_per_unit: 5, unit: minute}}
"""
REALISTIC = """
domain: nested
descriptors:
  - key: key_1
    rate_limit: {requests_per_unit: 500, unit: minute}
    detailed_metric: true
  - key: key_1
    value: some-value-for-key-1
    rate_limit: {requests_per_unit: 500, unit: minute}
  - key: key_2
    rate_limit: {requests_per_unit: 5000, unit: minute}
    detailed_metric: true
    descriptors:
      - key: key_3
        detailed_metric: true
      - key: key_3
        value: requested-key3-value
        rate_limit: {requests_per_unit: 5, unit: minute}
        detailed_metric: true
  - key: key_2
    value: specific-id
    rate_limit: {requests_per_unit: 50000, unit: minute}
    detailed_metric: true
    descriptors:
      - key: key_3
        detailed_metric: true
      - key: key_3
        value: requested-key3-value
        rate_limit: {requests_per_unit: 100, unit: minute}
        detailed_metric: true
"""
LOOKUPS += [
    Lookup(
        "TestDetailedMetric/nested-top-level-request",
        inline(NESTED_DETAILED.format(d1="true", d2="false")),
        "nested",
        E("key-1", "value-1"),
        Want(100, "minute", stat="nested.key-1_value-1"),
    ),
    Lookup(
        "TestDetailedMetric/nested-top-level-request-no-detailed",
        inline(NESTED_DETAILED.format(d1="false", d2="false")),
        "nested",
        E("key-1", "value-1"),
        Want(100, "minute", stat="nested.key-1"),
    ),
    Lookup(
        "TestDetailedMetric/nested-full-request",
        inline(NESTED_DETAILED.format(d1="true", d2="true")),
        "nested",
        E("key-1", "value-1", "key-2", "value-2"),
        Want(5, "minute", stat="nested.key-1_value-1.key-2_value-2"),
    ),
    Lookup(
        "TestDetailedMetric/nested-full-request-no-detailed",
        inline(NESTED_DETAILED.format(d1="false", d2="false")),
        "nested",
        E("key-1", "value-1", "key-2", "value-2"),
        Want(5, "minute", stat="nested.key-1.key-2"),
    ),
    Lookup(
        "TestDetailedMetric/realistic-simple",
        inline(REALISTIC),
        "nested",
        E("key_1", "value-for-key-1"),
        Want(500, "minute", stat="nested.key_1_value-for-key-1"),
    ),
    Lookup(
        "TestDetailedMetric/realistic-second-not-nested",
        inline(REALISTIC),
        "nested",
        E("key_2", "key-2-value"),
        Want(5000, "minute", stat="nested.key_2_key-2-value"),
    ),
    Lookup(
        "TestDetailedMetric/realistic-nested",
        inline(REALISTIC),
        "nested",
        E("key_2", "key-2-value", "key_3", "requested-key3-value"),
        Want(5, "minute", stat="nested.key_2_key-2-value.key_3_requested-key3-value"),
    ),
]

# ---------------------------------------------------------------- TestValueToMetric_*
ROUTE_METHOD_SUBJECT = """
domain: {domain}
descriptors:
  - key: route
    value_to_metric: {v1}
    descriptors:
      - key: http_method
        value_to_metric: {v2}
        descriptors:
          - key: subject_id
            detailed_metric: {det}
            rate_limit: {{requests_per_unit: 60, unit: minute}}
"""


def rms(domain: str = "domain", v1: bool = True, v2: bool = True, det: bool = False) -> tuple[tuple[str, str], ...]:
    return inline(
        ROUTE_METHOD_SUBJECT.format(domain=domain, v1=str(v1).lower(), v2=str(v2).lower(), det=str(det).lower())
    )


RMS = ("route", "draw", "http_method", "GET", "subject_id", "123")
LOOKUPS += [
    Lookup(
        "TestValueToMetric_UsesRuntimeValuesInStats",
        rms(),
        "domain",
        E(*RMS),
        Want(60, "minute", stat="domain.route_draw.http_method_GET.subject_id"),
    ),
    Lookup(
        "TestValueToMetric_DefaultKeyIncludesValueAtThatLevel",
        inline("""
            domain: d
            descriptors:
              - key: k1
                value_to_metric: true
                descriptors:
                  - key: k2
                    rate_limit: {requests_per_unit: 1, unit: second}
            """),
        "d",
        E("k1", "A", "k2", "foo"),
        Want(1, "second", stat="d.k1_A.k2"),
    ),
    Lookup(
        "TestValueToMetric_MidLevelOnly",
        inline("""
            domain: d
            descriptors:
              - key: k1
                descriptors:
                  - key: k2
                    value_to_metric: true
                    descriptors:
                      - key: k3
                        rate_limit: {requests_per_unit: 1, unit: second}
            """),
        "d",
        E("k1", "X", "k2", "Y", "k3", "Z"),
        Want(1, "second", stat="d.k1.k2_Y.k3"),
    ),
    Lookup(
        "TestValueToMetric_NoFlag_Unchanged",
        inline("""
            domain: d
            descriptors:
              - key: k1
                descriptors:
                  - key: k2
                    rate_limit: {requests_per_unit: 1, unit: second}
            """),
        "d",
        E("k1", "X", "k2", "Y"),
        Want(1, "second", stat="d.k1.k2"),
    ),
    Lookup(
        "TestValueToMetric_DoesNotOverrideDetailedMetric",
        rms(det=True),
        "domain",
        E(*RMS),
        Want(60, "minute", stat="domain.route_draw.http_method_GET.subject_id_123"),
    ),
    Lookup(
        "TestValueToMetric_WithEmptyValue/route",
        rms(),
        "domain",
        E("route", "", "http_method", "GET", "subject_id", "123"),
        Want(60, "minute", stat="domain.route.http_method_GET.subject_id"),
    ),
    Lookup(
        "TestValueToMetric_WithEmptyValue/http_method",
        rms(),
        "domain",
        E("route", "draw", "http_method", "", "subject_id", "123"),
        Want(60, "minute", stat="domain.route_draw.http_method.subject_id"),
    ),
    Lookup(
        "TestValueToMetric_WithEmptyValue/both",
        rms(),
        "domain",
        E("route", "", "http_method", "", "subject_id", "123"),
        Want(60, "minute", stat="domain.route.http_method.subject_id"),
    ),
    Lookup(
        "TestValueToMetric_FullKeyMatchesStatsKey/value_to_metric",
        rms("test-domain"),
        "test-domain",
        E("route", "api", "http_method", "GET", "subject_id", "user123"),
        Want(60, "minute", stat="test-domain.route_api.http_method_GET.subject_id"),
    ),
    Lookup(
        "TestValueToMetric_FullKeyMatchesStatsKey/no-flags",
        rms("test-domain-2", False, False),
        "test-domain-2",
        E("route", "api", "http_method", "GET", "subject_id", "user123"),
        Want(60, "minute", stat="test-domain-2.route.http_method.subject_id"),
    ),
    Lookup(
        "TestValueToMetric_FullKeyMatchesStatsKey/detailed",
        rms("test-domain-3", False, False, True),
        "test-domain-3",
        E("route", "api", "http_method", "GET", "subject_id", "user123"),
        Want(60, "minute", stat="test-domain-3.route_api.http_method_GET.subject_id_user123"),
    ),
]
WITH_CONFIGURED = inline("""
    domain: test-domain
    descriptors:
      - key: route
        value_to_metric: true
        descriptors:
          - key: http_method
            value: GET
            value_to_metric: true
            descriptors:
              - key: subject_id
                rate_limit: {requests_per_unit: 60, unit: minute}
          - key: http_method
            value: POST
            value_to_metric: true
            descriptors:
              - key: subject_id
                rate_limit: {requests_per_unit: 30, unit: minute}
    """)
WITH_WILDCARD = inline("""
    domain: domain
    descriptors:
      - key: user
        value_to_metric: true
        descriptors:
          - key: action
            value: read*
            value_to_metric: true
            descriptors:
              - key: resource
                rate_limit: {requests_per_unit: 100, unit: minute}
    """)
LOOKUPS += [
    Lookup(
        "TestValueToMetric_WithConfiguredValues/GET",
        WITH_CONFIGURED,
        T,
        E("route", "api", "http_method", "GET", "subject_id", "user123"),
        Want(60, "minute", stat="test-domain.route_api.http_method_GET.subject_id"),
    ),
    Lookup(
        "TestValueToMetric_WithConfiguredValues/POST",
        WITH_CONFIGURED,
        T,
        E("route", "api", "http_method", "POST", "subject_id", "user456"),
        Want(30, "minute", stat="test-domain.route_api.http_method_POST.subject_id"),
    ),
    Lookup(
        "TestValueToMetric_WithWildcard/alice",
        WITH_WILDCARD,
        "domain",
        E("user", "alice", "action", "readfile", "resource", "documents"),
        Want(100, "minute", stat="domain.user_alice.action_readfile.resource"),
    ),
    Lookup(
        "TestValueToMetric_WithWildcard/bob",
        WITH_WILDCARD,
        "domain",
        E("user", "bob", "action", "readdata", "resource", "database"),
        Want(100, "minute", stat="domain.user_bob.action_readdata.resource"),
    ),
]

# ---------------------------------------------------------------- TestShareThreshold
S = up("share_threshold.yaml")
LOOKUPS += [
    Lookup(
        f"TestShareThreshold/basic-{v}",
        S,
        T,
        E("files", v),
        Want(100, "minute", stat="test-domain.files_files/*", share={0: "files/*"}),
    )
    for v in ("files/a.pdf", "files/b.csv", "files/c.txt")
]
LOOKUPS += [
    Lookup(
        "TestShareThreshold/metrics-value_to_metric",
        S,
        T,
        E("route", "api/v1", "method", "GET"),
        Want(60, "minute", stat="test-domain.route_api/*.method", share={0: "api/*"}),
    ),
    Lookup(
        "TestShareThreshold/metrics-detailed_metric",
        S,
        T,
        E("service", "svc/user", "endpoint", "get"),
        Want(80, "minute", stat="test-domain.service_svc/*.endpoint_get", share={0: "svc/*"}),
    ),
    Lookup(
        "TestShareThreshold/nested",
        S,
        T,
        E("nested", "parent", "files", "nested/file1.txt"),
        Want(200, "minute", stat="test-domain.nested_parent.files_nested/*", share={1: "nested/*"}),
    ),
    Lookup(
        "TestShareThreshold/same-key-twice",
        S,
        T,
        E("files", "top/file1.txt", "files", "nested/file1.txt"),
        Want(300, "minute", stat="test-domain.files_top/*.files_nested/*", share={0: "top/*", 1: "nested/*"}),
    ),
    Lookup(
        "TestShareThreshold/parent-shares-child-does-not",
        S,
        T,
        E("path", "path/foo", "file", "file/doc1", "type", "pdf"),
        Want(120, "minute", stat="test-domain.path_path/*.file_file/*.type", share={0: "path/*", 1: ""}),
    ),
    Lookup(
        "TestShareThreshold/both-share",
        S,
        T,
        E("user", "user/alice", "resource", "res/file1", "action", "read"),
        Want(150, "minute", stat="test-domain.user_user/*.resource_res/*.action", share={0: "user/*", 1: "res/*"}),
    ),
    Lookup(
        "TestShareThreshold/explicit-value-first",
        S,
        T,
        E("file", "test1"),
        Want(50, "minute", stat="test-domain.file_test1"),
    ),
]
LOOKUPS += [
    Lookup(
        f"TestShareThreshold/explicit-then-wildcard-{v}",
        S,
        T,
        E("file", v),
        Want(100, "minute", stat="test-domain.file_test*", share={0: "test*"}),
    )
    for v in ("test2", "test23", "test123")
]
LOOKUPS += [
    Lookup(
        f"TestShareThreshold/middle-wildcard-{v}",
        S,
        T,
        E("midpath", v),
        Want(100, "minute", stat="test-domain.midpath_/api*v1", share={0: "/api*v1"}),
    )
    for v in ("/api/v1", "/api-beta-v1", "/apiXYZv1")
]
LOOKUPS += [Lookup("TestShareThreshold/middle-wildcard-no-match", S, T, E("midpath", "/api/v2"), None)]
LOOKUPS += [
    Lookup(
        f"TestShareThreshold/multi-wildcard-{v}",
        S,
        T,
        E("multiroute", v),
        Want(50, "minute", stat="test-domain.multiroute_svc*ep*rpc", share={0: "svc*ep*rpc"}),
    )
    for v in ("svcAepBrpc", "svcXXXepYYYrpc", "svceprpc")
]
LOOKUPS += [Lookup("TestShareThreshold/multi-wildcard-no-match", S, T, E("multiroute", "svcABCrpc"), None)]
LOOKUPS += [
    Lookup(
        f"TestShareThreshold/middle-over-value_to_metric-{v}",
        S,
        T,
        E("midroute", v),
        Want(80, "minute", stat="test-domain.midroute_/api*v2", share={0: "/api*v2"}),
    )
    for v in ("/api/v2", "/api-beta-v2")
]
LOOKUPS += [
    Lookup(
        f"TestShareThreshold/nested-middle-{a}",
        S,
        T,
        E("tenant", a, "resource", b),
        Want(60, "minute", stat="test-domain.tenant_t*prod.resource_res*v2", share={0: "t*prod", 1: "res*v2"}),
    )
    for a, b in (("t1prod", "resAv2"), ("t99prod", "resBBBv2"))
]


# ---------------------------------------------------------------- TestWildcardStatsBehavior
def wild(value: str, *flags: str) -> tuple[tuple[str, str], ...]:
    fl = "".join(f"\n    {f}: true" for f in flags)
    return inline(f"""
domain: test-domain
descriptors:
  - key: wild
    value: "{value}"{fl}
    rate_limit: {{requests_per_unit: 20, unit: minute}}
""")


LOOKUPS += [
    Lookup(
        "TestWildcardStatsBehavior/no-flags",
        wild("foo*"),
        T,
        E("wild", "foo1"),
        Want(20, "minute", stat="test-domain.wild_foo*"),
    ),
    Lookup(
        "TestWildcardStatsBehavior/value_to_metric",
        wild("foo*", "value_to_metric"),
        T,
        E("wild", "foo1"),
        Want(20, "minute", stat="test-domain.wild_foo1"),
    ),
    Lookup(
        "TestWildcardStatsBehavior/share_threshold",
        wild("foo*", "share_threshold"),
        T,
        E("wild", "foo1"),
        Want(20, "minute", stat="test-domain.wild_foo*", share={0: "foo*"}),
    ),
    Lookup(
        "TestWildcardStatsBehavior/share_threshold-and-value_to_metric",
        wild("foo*", "share_threshold", "value_to_metric"),
        T,
        E("wild", "foo1"),
        Want(20, "minute", stat="test-domain.wild_foo*", share={0: "foo*"}),
    ),
    Lookup(
        "TestWildcardStatsBehavior/value_to_metric-elsewhere",
        inline("""
            domain: test-domain
            descriptors:
              - key: wild
                value: foo*
                descriptors:
                  - key: other
                    value_to_metric: true
                    descriptors:
                      - key: limit
                        rate_limit: {requests_per_unit: 20, unit: minute}
            """),
        T,
        E("wild", "foo1", "other", "bar", "limit", "X"),
        Want(20, "minute", stat="test-domain.wild_foo*.other_bar.limit"),
    ),
    Lookup(
        "TestWildcardStatsBehavior/middle-trailing-1",
        wild("foo*bar*"),
        T,
        E("wild", "foo123bar456"),
        Want(20, "minute", stat="test-domain.wild_foo*bar*"),
    ),
    Lookup(
        "TestWildcardStatsBehavior/middle-trailing-2",
        wild("foo*bar*"),
        T,
        E("wild", "fooXbarY"),
        Want(20, "minute", stat="test-domain.wild_foo*bar*"),
    ),
    Lookup(
        "TestWildcardStatsBehavior/middle-trailing-value_to_metric",
        wild("foo*bar*", "value_to_metric"),
        T,
        E("wild", "foo123bar456"),
        Want(20, "minute", stat="test-domain.wild_foo123bar456"),
    ),
]


def _files(lookup: Lookup, tmp: Path) -> Any:
    return rules(tmp, dict(lookup.files), **({"merge_domains": True} if lookup.merge else {}))


@pytest.mark.parametrize("lookup", LOOKUPS, ids=[lk.case for lk in LOOKUPS])
def test_get_limit(lookup: Lookup, tmp_path: Path) -> None:
    """config_test.go's GetLimit assertions: the limit found, and Stats.Key."""
    rs = _files(lookup, tmp_path)
    d = rs.domains.get(lookup.domain)
    rule = None if d is None else d.match(list(lookup.entries))
    w = lookup.want
    if w is None:
        assert rule is None, rule
        return
    assert rule is not None
    assert d is not None
    if w.unlimited:
        assert rule.unlimited
    else:
        assert (rule.requests_per_unit, rule.unit) == (w.rpu, w.unit)
    assert (rule.lyft_name, rule.shadow) == (w.name, w.shadow)
    assert d.stat_key(rule, list(lookup.entries)) == w.stat
    got_share = {i: (p or "") for i, p in enumerate(rule.share or ())}
    for i, p in w.share.items():
        assert got_share.get(i, "") == p, (i, got_share)
    if not w.share:
        assert rule.share is None  # Lyft: ShareThresholdKeyPattern nil
    assert rule.metadata == w.metadata


@pytest.mark.parametrize("lookup", [lk for lk in LOOKUPS if lk.entries], ids=[lk.case for lk in LOOKUPS if lk.entries])
def test_get_limit_through_the_doors(lookup: Lookup, tmp_path: Path) -> None:
    """The same lookups as check-only requests (hits_addend 0) through the gRPC
    and JSON doors: no current_limit when GetLimit is nil, the limit and a full
    window otherwise, 2^32-1 remaining for unlimited."""
    rs = _files(lookup, tmp_path)
    clock = Clock(NOW)
    w = lookup.want
    if w is None:
        want = (OK, [(OK, None, 0, None)])
    elif w.unlimited:
        want = (OK, [(OK, None, U32_MAX, None)])
    else:
        unit = w.unit.upper()
        want = (OK, [(OK, (w.rpu, unit), w.rpu, reset_of(unit, NOW))])

    async def go():
        async with serving_doors(lambda: Limiter(rs, MemoryStore(clock=clock))) as doors:
            req = request(lookup.domain, desc(*lookup.entries, hits=0))
            for door, got in await doors.ask(req):
                assert got == want, door

    asyncio.run(go())


def test_empty_descriptor_is_refused_at_the_door(tmp_path: Path) -> None:
    """Lyft's GetLimit(domain, {}) is nil (replayed above); at the door netlimit
    refuses a descriptor without entries (a client bug; Envoy never sends one)."""
    import grpc

    rs = rules(tmp_path, {B: upstream_text(B)})

    async def go():
        async with serving_doors(lambda: Limiter(rs, MemoryStore(clock=Clock(NOW))), json_door=False) as doors:
            with pytest.raises(grpc.aio.AioRpcError) as ei:
                await doors.grpc(request(T, []))
            assert ei.value.code() == grpc.StatusCode.INVALID_ARGUMENT
            assert "descriptors[0].entries is empty" in ei.value.details()

    asyncio.run(go())


def test_config_limit_override(tmp_path: Path) -> None:
    """TestConfigLimitOverride: a descriptor's limit override replaces the
    configured limit (not in an unknown domain), whatever it is, per value."""
    rs = rules(tmp_path, {B: upstream_text(B)})
    day, hour = 4, 3  # envoy.type.v3.RateLimitUnit
    sub = ("key1", "value1"), ("subkey1", "something")

    async def go():
        async with serving_doors(lambda: Limiter(rs, MemoryStore(clock=Clock(NOW)))) as doors:
            cases = [
                ("foo_domain", desc(*sub, limit=(10, day), hits=0), (OK, [(OK, None, 0, None)])),
                (T, desc(*sub, limit=(10, day), hits=0), (OK, [(OK, (10, "DAY"), 10, reset_of("DAY", NOW))])),
                (T, desc(*sub, limit=(42, hour), hits=0), (OK, [(OK, (42, "HOUR"), 42, reset_of("HOUR", NOW))])),
                (
                    T,
                    desc(("key1", "value1"), ("subkey1", "something_else"), limit=(42, hour), hits=0),
                    (OK, [(OK, (42, "HOUR"), 42, reset_of("HOUR", NOW))]),
                ),
            ]
            for domain, d, want in cases:
                for door, got in await doors.ask(request(domain, d)):
                    assert got == want, (domain, door)

    asyncio.run(go())


def test_detailed_metric_counts_per_value_and_is_bounded(tmp_path: Path) -> None:
    """TestBasicConfig's stat checks for key7 (detailed_metric): each value its
    own counters (test-domain.key7_<value>.total_hits ...); netlimit keeps at
    most http.max_metric_values names per rule, the rest under '(other)'."""
    from netlimit.limit.metrics import Metrics

    rs = rules(tmp_path, {B: upstream_text(B)}, max_metric_values=2)
    lim = Limiter(rs, MemoryStore(clock=Clock(NOW)))
    m = Metrics(lim)

    async def go():
        async with serving_doors(lambda: lim, json_door=False) as doors:
            for v in ("unspecified_value", "another_value", "third", "fourth", "another_value"):
                await doors.grpc(request(T, [("key7", v)]))
            text = m.render().decode()
            assert (
                'netlimit_http_descriptor_hits_total{descriptor="key7_unspecified_value",domain="test-domain",rule="key7"} 1.0'
                in text
            )
            assert (
                'netlimit_http_descriptor_hits_total{descriptor="key7_another_value",domain="test-domain",rule="key7"} 2.0'
                in text
            )
            assert (
                'netlimit_http_descriptor_hits_total{descriptor="(other)",domain="test-domain",rule="key7"} 2.0' in text
            )
            assert 'netlimit_http_rule_hits_total{domain="test-domain",rule="key7"} 5.0' in text
            assert text.count("netlimit_http_descriptor_hits_total{") == 3

    asyncio.run(go())


# ================================================================ refused files

#: (upstream test, files, upstream's message, netlimit's) -- netlimit's is Lyft's
#: own words for Lyft's own checks, its own (with a did-you-mean) for YAML and schema
ERRORS = [
    (
        "TestEmptyDomain",
        ["empty_domain.yaml"],
        "config file cannot have empty domain",
        "config file cannot have empty domain",
    ),
    (
        "TestDuplicateDomain",
        [B, "duplicate_domain.yaml"],
        "duplicate domain 'test-domain' in config file",
        "duplicate domain 'test-domain' in config file",
    ),
    ("TestEmptyKey", ["empty_key.yaml"], "descriptor has empty key", "descriptor has empty key"),
    (
        "TestDuplicateKey",
        ["duplicate_key.yaml"],
        "duplicate descriptor composite key 'test-domain.key1_value1'",
        "duplicate descriptor composite key 'test-domain.key1_value1'",
    ),
    (
        "TestBadLimitUnit",
        ["bad_limit_unit.yaml"],
        "invalid rate limit unit 'foo'",
        "'unit' must be one of 'second', 'minute', 'hour', 'day', 'week', 'month', 'year', got 'foo'",
    ),
    (
        "TestReplacesSelf",
        ["replaces_self.yaml"],
        "replaces should not contain name of same descriptor",
        "replaces should not contain name of same descriptor",
    ),
    (
        "TestReplacesEmpty",
        ["replaces_empty.yaml"],
        "should not have an empty replaces entry",
        "should not have an empty replaces entry",
    ),
    (
        "TestBadYaml",
        ["bad_yaml.yaml"],
        "error loading config file: yaml: line 2: found unexpected end of stream",
        "YAML syntax error: while scanning a quoted scalar: found unexpected end of stream",
    ),
    (
        "TestMisspelledKey/1",
        ["misspelled_key.yaml"],
        "config error, unknown key 'ratelimit'",
        "unknown field 'ratelimit' (did you mean 'rate_limit'?)",
    ),
    (
        "TestMisspelledKey/2",
        ["misspelled_key2.yaml"],
        "config error, unknown key 'requestsperunit'",
        "unknown field 'requestsperunit' (did you mean 'requests_per_unit'?)",
    ),
    (
        "TestNonStringKey",
        ["non_string_key.yaml"],
        "config error, key is not of type string: 0.25",
        "key is not of type string: 0.25",
    ),
    (
        "TestNonMapList",
        ["non_map_list.yaml"],
        "config error, yaml file contains list of type other than map: a",
        "'descriptors' must be a mapping of fields, got str",
    ),
    (
        "TestUnlimitedWithRateLimitUnit",
        ["unlimited_with_unit.yaml"],
        "should not specify rate limit unit when unlimited",
        "should not specify rate limit unit when unlimited",
    ),
]


@pytest.mark.parametrize("case, files, lyft_says, we_say", ERRORS, ids=[e[0] for e in ERRORS])
def test_refused_as_upstream_refuses(case, files, lyft_says, we_say, tmp_path: Path) -> None:
    """config_test.go's expectConfigPanic cases: refused, naming the file and the
    line and column (Lyft names the file only)."""
    with pytest.raises(ConfigError) as ei:
        rules(tmp_path, {n: upstream_text(n) for n in files})
    bad = files[-1]
    found = [p for p in ei.value.problems if p.file.endswith("/" + bad) and we_say in p.message]
    assert found, (case, [str(p) for p in ei.value.problems])
    assert all(p.line >= 1 and p.col >= 1 for p in found)
    if lyft_says == we_say:  # Lyft's own checks: Lyft's own words
        assert found[0].message.startswith(lyft_says)


def test_duplicate_key_across_merged_files(tmp_path: Path) -> None:
    """TestDuplicateKeyDomainMerge: with MERGE_DOMAIN_CONFIG (http.merge_domains)
    the same descriptor in two files of one domain is refused."""
    text = upstream_text("merge_domain_key1.yaml")
    with pytest.raises(ConfigError) as ei:
        rules(tmp_path, {"merge_domain_key1.yaml": text, "merge_domain_key1_again.yaml": text}, merge_domains=True)
    (p,) = ei.value.problems
    assert p.file.endswith("merge_domain_key1_again.yaml") and (p.line, p.col) == (5, 10)
    assert p.message.startswith("duplicate descriptor composite key 'test-domain.key1_value1'")


def test_every_upstream_config_file_is_replayed() -> None:
    """No file of upstream's test/config is left out of the replay."""
    used = {n for lk in LOOKUPS for n, _ in lk.files} | {n for e in ERRORS for n in e[1]}
    used.add("merge_domain_key1.yaml")
    assert {p.name for p in CONFIG_DIR.glob("*.yaml")} <= used


def test_lyft_files_load_one_by_one_as_lyft_reads_them() -> None:
    """Each accepted upstream file also loads on its own (load_lyft_string), as
    the config check tool of upstream does."""
    for n in (B, "shadowmode_config.yaml", "wildcard.yaml", "share_threshold.yaml", "metadata.yaml"):
        assert load_lyft_string(upstream_text(n), n).config.domain == T
