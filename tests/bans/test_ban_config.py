"""`escalate:` and `bans:` in the file: what validate accepts and what it refuses
(FILE:LINE:COL, the rule, and why)."""

from __future__ import annotations

import pytest

from netlimit.config.model import Config
from netlimit.config.validate import load_string
from netlimit.errors import ConfigError

GOOD = """\
version: 1
exempt: [10.0.0.0/8]
bans:
  store: redis://127.0.0.1:6379/0
  max_entries: 5000
network:
  - name: udp-flood
    protocol: udp
    ports: [5000]
    limit: 100/second
    escalate: {after: 50, within: 1m, ban: 15m, prefix4: 24, prefix6: 64}
http:
  domain: web
  storage: redis://127.0.0.1:6379/1
  actions: [[remote_address]]
  descriptors:
    - key: remote_address
      rate_limit: {unit: second, requests_per_unit: 5}
      escalate: {after: 20, within: 10s, ban: 1h, reason: scraping}
"""


def problems(text: str) -> list[str]:
    with pytest.raises(ConfigError) as e:
        load_string(text, "f.yaml")
    return [str(p) for p in e.value.problems]


def test_a_good_file():
    c = load_string(GOOD, "f.yaml").config
    esc = c.network[0].escalate
    assert (esc.after, esc.within, esc.ban, esc.prefix(4), esc.prefix(6)) == (50, 60, 900, 24, 64)
    assert c.bans_on and c.ban_store == "redis://127.0.0.1:6379/0" and c.max_bans == 5000
    assert [k for k, _d in c.escalating_descriptors] == [("remote_address",)]


def test_the_store_defaults_to_the_sidecars_and_bans_are_off_without_them():
    c = load_string(GOOD.replace("  store: redis://127.0.0.1:6379/0\n", ""), "f").config
    assert c.ban_store == "redis://127.0.0.1:6379/1"
    plain = load_string("version: 1\nnetwork:\n  - name: a\n    limit: 5/second\n", "f").config
    assert not plain.bans_on and plain.ban_store == "memory" and plain.max_bans == 100_000
    only = load_string("version: 1\nbans: {}\n", "f").config
    assert only.bans_on and only.ban_store == "memory"


@pytest.mark.parametrize(
    ("change", "where", "message"),
    [
        (("ban: 15m", "ban: 30d"), "f.yaml:11:", "longer than the kernel keeps one"),
        (("within: 1m,", "within: 2d,"), "f.yaml:11:", "longer than a day"),
        (("prefix4: 24", "prefix4: 4"), "f.yaml:11:", "'prefix4' input should be greater than or equal to 8"),
        (("after: 50", "after: 0"), "f.yaml:11:", "'after' input should be greater than or equal to 1"),
        (("store: redis://127.0.0.1:6379/0", "store: mysql://x"), "f.yaml:4:", "expected 'memory' or a URL"),
        (("max_entries: 5000", "max_entris: 5000"), "f.yaml:5:", "did you mean 'max_entries'"),
        (("within: 10s, ban: 1h", "within: 10s, bann: 1h"), "f.yaml:19:", "did you mean 'ban'"),
    ],
)
def test_shape_errors_point_at_the_line(change, where, message):
    got = problems(GOOD.replace(*change))
    assert any(p.startswith(where) and message in p for p in got), got


def test_rules_that_cannot_escalate_are_refused():
    text = GOOD.replace(
        "    limit: 100/second\n", "    limit: 100/second\n    action: log\n    sources: [10.9.0.0/16]\n"
    )
    text = text.replace("within: 1m, ban: 15m", "within: 7s, ban: 15m")
    text = text.replace(
        "      escalate: {after: 20",
        "      shadow_mode: true\n      escalate: {after: 20",
    )
    text += """\
    - key: path
      rate_limit: {unit: second, requests_per_unit: 5}
      escalate: {after: 5, within: 10s, ban: 1h}
    - key: generic
      value: lb
      descriptors:
        - key: remote_address
          value: 192.0.2.10
          rate_limit: {unit: second, requests_per_unit: 5}
          escalate: {after: 5, within: 10s, ban: 1h}
"""
    text = text.replace(
        "  actions: [[remote_address]]\n", "  trusted_proxies: [192.0.2.10/32]\n  actions: [[remote_address]]\n"
    )
    got = problems(text)
    expect = [
        "f.yaml:13:15: udp-flood: escalate needs a rule that drops or rejects",
        "f.yaml:13:15: udp-flood: escalate could only ban exempt addresses",
        "f.yaml:13:35: udp-flood: the kernel counts over-limit packets as a whole number",
        "f.yaml:23:17: http: escalate on a shadow_mode descriptor never fires",
        "f.yaml:26:17: http: escalate bans the client's address: this descriptor (or one above it) needs key "
        "remote_address",
        "f.yaml:33:21: http: escalate could only ban 192.0.2.10, which is exempt or a trusted proxy",
    ]
    for e in expect:
        assert any(p.startswith(e) for p in got), (e, got)
    assert len(got) == len(expect), got


def test_the_schema_documents_escalate_and_bans():
    s = Config.model_json_schema(mode="validation")
    assert "bans" in s["properties"] and "escalate" in s["$defs"]["NetworkRule"]["properties"]
    assert s["$defs"]["Escalate"]["required"] == ["after", "within", "ban"]
