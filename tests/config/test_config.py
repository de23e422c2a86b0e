"""Config loading and validation: every error names FILE:LINE:COL: RULE and says what to do."""

import textwrap
from pathlib import Path

import pytest

from netlimit.config import kernel_limits
from netlimit.config.model import Config
from netlimit.config.validate import ConfigError, hashlimit_name, load_file, load_string

ROOT = Path(__file__).resolve().parents[2]


def problems(text: str) -> list[str]:
    with pytest.raises(ConfigError) as exc:
        load_string(textwrap.dedent(text).lstrip("\n"), "f.yaml")
    return [str(p) for p in exc.value.problems]


def test_example_loads_into_canonical_types():
    loaded = load_file(ROOT / "rules/example-all.yaml")
    c = loaded.config
    assert [r.name for r in c.network] == ["ssh-guard", "dns-flood", "api-conns"]
    ssh = c.network[0]
    assert (ssh.limit.count, ssh.limit.period, ssh.method, ssh.families) == (3, 60, "recent", (4, 6))
    dns = c.network[1]
    assert (dns.burst, dns.source_prefix, dns.families) == (10, 24, (4,))
    assert c.network[2].max_connections == 20
    up = c.bandwidth[0]
    assert (up.rate, up.burst, str(up.ports[0]), str(up.sources[0])) == (10_000_000, 65536, "8080", "10.0.0.0/8")
    assert c.bandwidth[1].whole_interface and c.bandwidth[1].direction == "ingress"
    assert c.http.descriptors[1].descriptors[0].algorithm == "sliding_window_log"
    assert c.on_stop == "flush"
    assert len(loaded.sha256) == 64
    assert loaded.position("network", 1, "limit") == (18, 12)  # line 7: the yaml-language-server $schema line


def test_every_layer_is_optional():
    c = load_string("version: 1\n").config
    assert (c.network, c.bandwidth, c.http) == ([], [], None)


def test_yaml_syntax_error():
    assert problems("""
        version: 1
        network: [
    """) == ["f.yaml:3:1: yaml: YAML syntax error: while parsing a flow node: did not find expected node content"]


def test_bad_indentation_is_a_syntax_error_with_position():
    out = problems("""
        version: 1
        network:
          - name: a
           limit: 3/m
    """)
    assert out == [
        "f.yaml:4:4: yaml: YAML syntax error: while parsing a block collection: did not find expected '-' indicator"
    ]


def test_duplicate_key():
    assert problems("""
        version: 1
        network:
          - name: a
            limit: 3/m
            limit: 4/m
    """) == ["f.yaml:5:5: yaml: duplicate key 'limit' (first at line 4); YAML would silently keep only the last"]


def test_unknown_field_order_and_missing():
    out = problems("""
        version: 1
        network:
          - name: a
            limt: 3/minute
            limit: 3/minute
    """)
    assert out == ["f.yaml:4:5: a: unknown field 'limt' (did you mean 'limit'?)"]
    out = problems("""
        version: 1
        http:
          domain: d
          descriptors:
            - key: k
              rate_limit: {unit: second, request_per_unit: 1}
    """)
    assert out == [
        "f.yaml:6:19: http: missing required field 'requests_per_unit'",
        "f.yaml:6:34: http: unknown field 'request_per_unit' (did you mean 'requests_per_unit'?)",
    ]


def test_unknown_field_without_close_match_lists_known_fields():
    out = problems("""
        version: 1
        bandwidth:
          - name: b
            interface: eth0
            rate: 1mbit
            zzz: 1
    """)
    assert out == [
        "f.yaml:6:5: b: unknown field 'zzz'; known fields: name, interface, direction, ports, "
        "protocol, sources, rate, burst, comment"
    ]


def test_version_and_empty_file():
    assert problems("network: []\n") == ["f.yaml:1:1: file: missing required field 'version'"]
    assert problems("version: 2\n") == ["f.yaml:1:10: version: 'version' must be one of 1, got 2"]
    assert problems("\n") == ["f.yaml:1:1: file: the file is empty: start with 'version: 1'"]
    assert problems("- a\n- b\n") == [
        "f.yaml:1:1: file: the file must be a mapping with 'version: 1' and sections network / bandwidth / http"
    ]


def test_bad_units_name_rule_and_column():
    assert problems("""
        version: 1
        network:
          - name: a
            limit: 3/fortnight
        bandwidth:
          - name: b
            interface: eth0
            rate: 10
            burst: 64kib
    """) == [
        "f.yaml:4:12: a: bad rate unit 'fortnight' in '3/fortnight': expected second, minute, hour or day (s, m, h, d)",
        "f.yaml:8:11: b: bandwidth 10 has no unit: write e.g. '10mbit' (bit, kbit, mbit, gbit; bps = bytes/s)",
        "f.yaml:9:12: b: bad size unit 'kib' in '64kib': expected b, kb, mb, gb (1024-based, as tc)",
    ]


def test_bad_enum_port_cidr_and_types():
    assert problems("""
        version: 1
        exempt: [10.0.0.1/8, nonsense]
        network:
          - name: a
            protocol: tcpp
            ports: [0, "9-3", 22]
            limit: 3/m
            new_connections: maybe
            burst: -1
    """) == [
        "f.yaml:2:10: exempt: '10.0.0.1/8' has host bits set: did you mean '10.0.0.0/8'?",
        "f.yaml:2:22: exempt: 'nonsense' is not an IP address or CIDR network",
        "f.yaml:5:15: a: 'protocol' must be one of 'tcp', 'udp', 'icmp', 'all', got 'tcpp'",
        "f.yaml:6:13: a: port 0 is outside 1-65535",
        "f.yaml:6:16: a: port range '9-3' is reversed: write '3-9'",
        "f.yaml:8:22: a: 'new_connections' must be true or false, got 'maybe'",
        "f.yaml:9:12: a: 'burst' input should be greater than or equal to 1, got -1",
    ]


def test_rule_needs_limit_or_max_connections():
    assert problems("""
        version: 1
        network:
          - name: a
            protocol: tcp
          - name: b
            limit: 1/s
            max_connections: 3
    """) == [
        "f.yaml:3:5: a: set 'limit' (a rate) or 'max_connections' (concurrent connections)",
        "f.yaml:5:5: b: 'limit' and 'max_connections' are separate rules: split them in two",
    ]


def test_bad_names():
    out = problems("""
        version: 1
        network:
          - name: "bad name!"
            limit: 1/s
    """)
    assert out == [
        "f.yaml:3:11: bad name!: name 'bad name!' must be 1-48 characters of letters, digits, '-', "
        "'_' or '.', starting with a letter or digit"
    ]


def test_duplicate_names_across_sections():
    assert problems("""
        version: 1
        network:
          - name: web
            limit: 10/s
        bandwidth:
          - name: web
            interface: eth0
            rate: 1mbit
    """) == [
        "f.yaml:6:11: web: duplicate rule name (first used at line 3); names must be unique across "
        "network and bandwidth"
    ]


def test_recent_hitcount_above_kernel_limit(monkeypatch):
    monkeypatch.setattr(kernel_limits, "host_limits", lambda: kernel_limits.KernelLimits(20, "test", 250, "test"))
    assert problems("""
        version: 1
        network:
          - name: ssh
            protocol: tcp
            ports: [22]
            limit: 30/minute
            method: recent
    """) == [
        "f.yaml:6:12: ssh: method: recent can count at most 20 hits per address (test); 30/minute needs "
        "more: use method: hashlimit"
    ]


def test_recent_limit_is_read_from_sys_or_defaults_to_20(tmp_path, monkeypatch):
    kernel_limits.host_limits.cache_clear()
    try:
        lim = kernel_limits.host_limits()
        try:
            tot = int(open("/sys/module/xt_recent/parameters/ip_pkt_list_tot").read())
        except OSError:
            assert lim.recent_max_hitcount == 20
        else:
            assert lim.recent_max_hitcount == (tot if tot else 255)
    finally:
        kernel_limits.host_limits.cache_clear()


def test_recent_shape_errors():
    assert problems("""
        version: 1
        network:
          - name: r
            limit: 3/m
            method: recent
            per: source+port
            burst: 4
            source_prefix: 24
    """) == [
        "f.yaml:5:13: r: method: recent cannot group sources by prefix: use method: hashlimit",
        "f.yaml:6:10: r: method: recent tracks one address per entry: per must be source or destination, "
        "not source+port (use method: hashlimit)",
        "f.yaml:7:12: r: method: recent has no burst: it allows exactly N per window",
    ]


def test_hashlimit_rate_range():
    assert problems("""
        version: 1
        network:
          - name: fast
            limit: 2000000/second
          - name: slow
            limit: 1/day
    """) == [
        "f.yaml:4:12: fast: 2000000/second is faster than hashlimit can express (at most 1000000/second)",
        "f.yaml:6:12: slow: 1/day is slower than hashlimit can express (at least one per 4294 s, e.g. 1/hour "
        "or 21/day); for new connections use method: recent",
    ]
    load_string("version: 1\nnetwork:\n  - name: ok\n    limit: 21/day\n")


def test_rates_hashlimit_cannot_express_exactly():
    assert problems("""
        version: 1
        network:
          - name: odd
            limit: 2/7s
    """) == [
        "f.yaml:4:12: odd: hashlimit counts per second, minute, hour or day: 2/7s is not a whole number "
        "per any of them; pick another rate or use method: recent"
    ]
    c = load_string(
        "version: 1\nnetwork:\n  - name: ok\n    protocol: tcp\n    new_connections: true\n"
        "    limit: 3/10s\n    method: recent\n"
    ).config
    assert c.network[0].limit.period == 10


def test_source_prefix_needs_per_source():
    assert problems("""
        version: 1
        network:
          - name: d
            limit: 10/s
            per: destination
            source_prefix: 24
    """) == ["f.yaml:6:20: d: source_prefix groups sources, but per is destination: use per: source (or source+port)"]


def test_recent_without_new_connections_is_a_warning():
    loaded = load_string(
        textwrap.dedent("""
        version: 1
        network:
          - name: pings
            protocol: icmp
            limit: 5/minute
            method: recent
    """).lstrip("\n"),
        "f.yaml",
    )
    assert [str(w) for w in loaded.warnings] == [
        "f.yaml:6:13: pings: warning: method: recent without new_connections: true counts every packet as a hit "
        "(fine for e.g. pings; for connections set new_connections: true)"
    ]


def test_hashlimit_names_fit_the_kernel_and_never_collide():
    assert hashlimit_name("ssh") == "ssh"
    long_a = hashlimit_name("a-very-long-rule-name-one")
    long_b = hashlimit_name("a-very-long-rule-name-two")
    assert len(long_a) <= 15 and len(long_b) <= 15 and long_a != long_b


def test_ports_need_tcp_or_udp():
    assert problems("""
        version: 1
        network:
          - name: p
            ports: [80]
            limit: 1/s
    """) == ["f.yaml:4:12: p: ports need protocol: tcp or udp (protocol is all)"]


def test_prefix_family_mismatch():
    assert problems("""
        version: 1
        network:
          - name: v6only
            sources: ["2001:db8::/32"]
            source_prefix: 24
            limit: 1/s
    """) == [
        "f.yaml:5:20: v6only: source_prefix is for IPv4 but this rule only matches IPv6 addresses: use source_prefix6"
    ]


def test_tc_burst_below_one_mtu_per_tick(monkeypatch):
    monkeypatch.setattr(kernel_limits, "host_limits", lambda: kernel_limits.KernelLimits(255, "test", 250, "test"))
    assert problems("""
        version: 1
        bandwidth:
          - name: fat
            interface: eth0
            rate: 1gbit
            burst: 1kb
    """) == [
        "f.yaml:6:12: fat: burst 1024 bytes is below one MTU-sized frame per timer tick at this rate "
        "(500000 bytes at HZ=250); the cap would not be reached. Raise it or omit burst (default 1000448 bytes)"
    ]


def test_connlimit_shape():
    assert problems("""
        version: 1
        network:
          - name: c
            max_connections: 2
            per: source+port
            burst: 3
    """) == [
        "f.yaml:3:5: c: max_connections needs protocol: tcp (or udp)",
        "f.yaml:5:10: c: max_connections counts per source, destination or all; 'source+port' is not "
        "possible with connlimit",
        "f.yaml:6:12: c: burst applies to 'limit' rules, not max_connections",
    ]


def test_one_whole_interface_cap_per_direction():
    assert problems("""
        version: 1
        bandwidth:
          - name: a
            interface: eth0
            rate: 1mbit
          - name: b
            interface: eth0
            rate: 2mbit
    """) == [
        "f.yaml:7:16: b: egress on eth0 already has a whole-interface rate in rule 'a': one interface has "
        "one cap per direction"
    ]


def test_http_section_errors():
    assert problems("""
        version: 1
        http:
          domain: api
          storage: mysql://x
          actions:
            - [remote_address, cookie]
            - []
          descriptors:
            - key: k
              algorithm: leaky
              rate_limit: {unit: Second, requests_per_unit: 5}
            - key: u
              unlimited: true
              rate_limit: {unit: second, requests_per_unit: 5}
            - key: f
              burst: 3
              rate_limit: {unit: second, requests_per_unit: 5}
    """) == [
        "f.yaml:4:12: http: storage 'mysql://x': expected 'memory' or a URL like redis://127.0.0.1:6379/0, "
        "redis+cluster://10.0.0.1:6379,10.0.0.2:6379/ or redis+sentinel://10.0.0.1:26379/mymaster",
        "f.yaml:6:24: http: unknown action 'cookie': expected remote_address, path, method, header:<Name> "
        "or generic:<key>=<value>",
        "f.yaml:7:7: http: 'actions' needs at least 1 item, got an empty list",
        "f.yaml:10:18: http: 'algorithm' must be one of 'token_bucket', 'leaky_bucket', 'fixed_window', "
        "'sliding_window_log', 'sliding_window_counter', got 'leaky'",
        "f.yaml:12:7: http: should not specify rate limit unit when unlimited: write 'rate_limit: "
        "{unlimited: true}' (or 'unlimited: true' on the descriptor) without unit and requests_per_unit",
        "f.yaml:15:7: http: 'burst' applies to token_bucket and leaky_bucket, not fixed_window",
    ]


def test_lyft_values_are_text_and_units_case_insensitive():
    c = load_string(
        textwrap.dedent("""
        version: 1
        http:
          domain: d
          descriptors:
            - key: port
              value: 80
              rate_limit: {unit: MINUTE, requests_per_unit: 5}
    """)
    ).config
    d = c.http.descriptors[0]
    assert d.value == "80" and d.rate_limit.unit == "minute" and d.rate_limit.period == 60


def test_file_errors(tmp_path):
    with pytest.raises(ConfigError) as exc:
        load_file(tmp_path / "missing.yaml")
    assert str(exc.value.problems[0]) == f"{tmp_path}/missing.yaml:0:0: file: no such file"
    bad = tmp_path / "bin.yaml"
    bad.write_bytes(b"version: 1\n\xff\xfe")
    with pytest.raises(ConfigError) as exc:
        load_file(bad)
    assert str(exc.value.problems[0]) == f"{bad}:1:1: file: not UTF-8 text (byte 11)"


def test_merge_keys_refused():
    out = problems("""
        version: 1
        base: &b {limit: 1/s}
        network:
          - <<: *b
            name: a
    """)
    assert "f.yaml:4:5: yaml: YAML merge keys ('<<') are not supported: write the fields out" in out


def test_schema_is_json_schema_of_the_contract():
    s = Config.model_json_schema()
    assert s["additionalProperties"] is False
    assert set(s["properties"]) >= {"version", "exempt", "network", "bandwidth", "http", "on_stop"}
    nr = s["$defs"]["NetworkRule"]["properties"]
    for f in (
        "name",
        "protocol",
        "ports",
        "new_connections",
        "limit",
        "burst",
        "per",
        "method",
        "action",
        "source_prefix",
        "source_prefix6",
        "sources",
        "max_connections",
    ):
        assert f in nr, f
    assert nr["limit"]["anyOf"][0]["type"] == "string"


def test_unknown_top_level_section():
    assert problems("""
        version: 1
        netwrok: []
    """) == ["f.yaml:2:1: file: unknown field 'netwrok' (did you mean 'network'?)"]


def test_client_prefix_and_path_match_are_checked_with_their_line():
    out = problems("""
        version: 1
        http:
          domain: d
          client_prefix: {ipv4: 33, ipv6: 64}
          path_match: {case: upper}
    """)
    assert out == [
        "f.yaml:4:25: http: 'ipv4' input should be less than or equal to 32, got 33",
        "f.yaml:5:22: http: 'case' must be one of 'insensitive', 'sensitive', got 'upper'",
    ]
