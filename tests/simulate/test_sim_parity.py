"""simulate is the engine replaying: the same traffic through ``netlimit simulate``
and through a live sidecar (a real process on loopback, its ``GET /v1/check``
door) gives every rule the same hits and the same denials, and simulate denies
exactly as many requests as the sidecar answered 429.

Every example in rules/ with an ``http:`` section runs, the Lyft-format ones
with actions that make their descriptors (Lyft's files have none: Envoy sends
them), and Lyft's ``replaces`` by ``rate_limit.name`` (issue 30: a rule that
names an unnamed limit's netlimit name replaces nothing, in both).

What is changed in a file, and why: the units become a day and the limits are
capped at a few requests, so the live decisions do not depend on when within
the test each request fell (a refill of a few requests a day is nothing in a
second) while the traffic still reaches every limit; ``storage`` becomes the
memory store and ``escalate`` goes (nothing leaves loopback).  Matching,
``replaces``, shadow_mode, quota, algorithms and keys stay as written.
"""

from __future__ import annotations

import http.client
import itertools
import json
import time
from collections import Counter
from pathlib import Path
from typing import Any

import pytest
import yaml
from sidecar_proc import Sidecar, get_metrics, wait_until

from netlimit.config.validate import load_file, load_string
from netlimit.errors import ConfigError
from netlimit.simulate.run import replay

RULES = Path(__file__).resolve().parents[2] / "rules"
#: Lyft's own config files (envoyproxy/ratelimit's tests and examples, vendored)
UPSTREAM = Path(__file__).resolve().parents[1] / "rls" / "upstream"
CLIENTS = ("127.0.0.2", "127.0.0.3", "127.0.0.4")
#: requests per (client, path, headers): past every capped limit and burst
REPEAT = 7
MAX_LIMIT = 4
MAX_BURST = 6

#: the Lyft-format examples: actions that make their descriptors (a request carries every one)
LYFT_ACTIONS: dict[str, list[list[str]]] = {
    "lyft-ratelimit.yaml": [
        ["remote_address"],
        ["path"],
        ["generic:message_type=marketing", "generic:to_number=+15550100"],
        ["generic:source_cluster=internal"],
        ["generic:user=alice"],
        ["generic:org=acme", "generic:plan=free"],
        ["generic:endpoint=export", "generic:org=acme", "generic:plan=free"],
    ],
    "lyft-envoy-grpc.yaml": [
        ["generic:route=api", "remote_address"],
        ["generic:route=healthz"],
        ["header:X-Api-Key"],
    ],
}

#: issue 30: per-ip replaces "path_/x", the netlimit name of an unnamed limit, whose Lyft
#: name is empty: Lyft (and the limiter) replace nothing, so /x is limited to 1
REPLACES_BY_NETLIMIT_NAME = {
    "version": 1,
    "http": {
        "domain": "t",
        "actions": [["remote_address"], ["path"]],
        "descriptors": [
            {
                "key": "remote_address",
                "rate_limit": {
                    "name": "per-ip",
                    "unit": "minute",
                    "requests_per_unit": 100,
                    "replaces": [{"name": "path_/x"}],
                },
            },
            {"key": "path", "value": "/x", "rate_limit": {"unit": "minute", "requests_per_unit": 1}},
        ],
    },
}

#: and a replaces that does apply: the rule named "tight" is replaced on /login
REPLACES_BY_LYFT_NAME = {
    "version": 1,
    "http": {
        "domain": "t",
        "actions": [["remote_address"], ["path", "remote_address"]],
        "descriptors": [
            {"key": "remote_address", "rate_limit": {"name": "tight", "unit": "minute", "requests_per_unit": 2}},
            {
                "key": "path",
                "value": "/login",
                "descriptors": [
                    {
                        "key": "remote_address",
                        "rate_limit": {"unit": "minute", "requests_per_unit": 5, "replaces": [{"name": "tight"}]},
                    }
                ],
            },
            {
                "key": "path",
                "value": "/shadow",
                "shadow_mode": True,
                "rate_limit": {"unit": "hour", "requests_per_unit": 1},
            },
        ],
    },
}


#: Lyft's quota_mode: a request is denied when every quota descriptor is over (or a
#: non-quota rule denies it); and the same rules under http.quota_mode / http.shadow_mode
QUOTAS = {
    "version": 1,
    "http": {
        "domain": "t",
        "actions": [["remote_address"], ["path"], ["header:X-Plan"]],
        "descriptors": [
            {"key": "remote_address", "quota_mode": True, "rate_limit": {"unit": "minute", "requests_per_unit": 2}},
            {
                "key": "path",
                "value": "/q",
                "quota_mode": True,
                "rate_limit": {"unit": "minute", "requests_per_unit": 9},
            },
            {"key": "path", "value": "/hard", "rate_limit": {"unit": "minute", "requests_per_unit": 3}},
            {"key": "header:X-Plan", "value": "free", "rate_limit": {"unlimited": True}},
        ],
    },
}


def _with_http(doc: dict, **http: Any) -> dict:
    out = json.loads(json.dumps(doc))
    out["http"].update(http)
    for d in out["http"]["descriptors"]:
        d.pop("quota_mode", None)
    return out


def _examples() -> list[tuple[str, dict]]:
    out = []
    for f in sorted(RULES.glob("*.yaml")):
        doc = yaml.safe_load(f.read_text())
        if not isinstance(doc, dict) or not isinstance(doc.get("http"), dict):
            continue
        if f.name in LYFT_ACTIONS:
            doc["http"]["actions"] = LYFT_ACTIONS[f.name]
        out.append((f.name, doc))
    out += _upstream()
    out.append(("replaces-by-netlimit-name", REPLACES_BY_NETLIMIT_NAME))
    out.append(("replaces-by-lyft-name", REPLACES_BY_LYFT_NAME))
    out.append(("quota-descriptors", QUOTAS))
    out.append(("http-quota-mode", _with_http(QUOTAS, quota_mode=True)))
    out.append(("http-shadow-mode", _with_http(QUOTAS, shadow_mode=True)))
    return out


def _chains(descs: list, above: list[str]) -> list[list[str]]:
    """One action list per node of a Lyft descriptor tree: the generic entries that
    reach it from the root (a key-only node gets the value "any", which it matches)."""
    out = []
    for d in descs or []:
        if not isinstance(d, dict) or not d.get("key"):
            continue
        chain = [*above, f"generic:{d['key']}={d.get('value') or 'any'}"]
        out.append(chain)
        out += _chains(d.get("descriptors") or [], chain)
    return out


def _upstream() -> list[tuple[str, dict]]:
    """Every Lyft config file in the vendored upstream tests that netlimit loads, with
    actions that send every descriptor its tree names (Envoy would send them)."""
    out = []
    for f in sorted(UPSTREAM.rglob("*.yaml")):
        try:
            lyft = yaml.safe_load(f.read_text())
        except yaml.YAMLError:  # bad_yaml.yaml
            continue
        if not isinstance(lyft, dict) or not isinstance(lyft.get("descriptors"), list):
            continue
        doc = {"version": 1, "http": {**lyft, "actions": _chains(lyft["descriptors"], [])}}
        try:
            load_string(yaml.safe_dump(doc, sort_keys=False))
        except ConfigError:  # the upstream tests' invalid files (bad_*, duplicate_*, ...): nothing to replay
            continue
        out.append((f"lyft:{f.relative_to(UPSTREAM)}", doc))
    assert len(out) >= 8, [n for n, _ in out]  # the parity run covers Lyft's own files, not none of them
    return out


def _tame(node: Any) -> None:
    """Units to a day, limits and bursts capped, escalation dropped (in place)."""
    if isinstance(node, list):
        for x in node:
            _tame(x)
        return
    if not isinstance(node, dict):
        return
    node.pop("escalate", None)
    rl = node.get("rate_limit")
    if isinstance(rl, dict) and "requests_per_unit" in rl:
        rl["unit"] = "day"
        rl.pop("multiplier", None)
        rl["requests_per_unit"] = min(int(rl["requests_per_unit"]), MAX_LIMIT)
    if "burst" in node:
        node["burst"] = min(int(node["burst"]), MAX_BURST)
    for v in node.values():
        _tame(v)


def _values(descs: list, key: str) -> set[str]:
    """The values the descriptors (at any depth) give ``key``."""
    out: set[str] = set()
    for d in descs or []:
        if d.get("key") == key and d.get("value"):
            out.add(str(d["value"]).replace("*", "x"))
        out |= _values(d.get("descriptors") or [], key)
    return out


def _traffic(http_cfg: dict) -> list[tuple[str, str, dict[str, str]]]:
    """(client, path, headers) in the order sent: every client on every path the
    descriptors name (and one they do not), with each header value they name."""
    descs = http_cfg.get("descriptors") or []
    paths = sorted(_values(descs, "path") | {"/other"})
    names = sorted({a[len("header:") :] for g in http_cfg.get("actions") or [] for a in g if a.startswith("header:")})
    choices = [sorted(_values(descs, "header:" + n))[:1] + ["key-1"] for n in names]
    out = []
    for client in CLIENTS:
        for path in paths:
            for combo in itertools.product(*choices):
                out += [(client, path, dict(zip(names, combo)))] * REPEAT
    return out


def _send_all(port: int, traffic: list) -> list[tuple[float, int]]:
    """Each request through ``GET /v1/check`` from its client's address; (time, status)."""
    conns: dict[str, http.client.HTTPConnection] = {}
    out = []
    try:
        for client, path, headers in traffic:
            c = conns.get(client)
            if c is None:
                c = conns[client] = http.client.HTTPConnection(
                    "127.0.0.1", port, timeout=10, source_address=(client, 0)
                )
            t = time.time()
            c.request("GET", "/v1/check", headers={"X-Original-URI": path, "X-Original-Method": "GET", **headers})
            r = c.getresponse()
            r.read()
            assert r.status in (200, 429), (r.status, client, path, headers)
            out.append((t, r.status))
    finally:
        for c in conns.values():
            c.close()
    return out


def _away_from_midnight() -> None:
    """A day's fixed window turns at 00:00 UTC: start at least a minute before it (bounded wait)."""
    left = 86400 - time.time() % 86400
    if left < 60:
        time.sleep(left + 1)


@pytest.mark.timeout(120)
@pytest.mark.parametrize(("name", "doc"), _examples(), ids=[n for n, _ in _examples()])
def test_simulate_decides_as_the_live_sidecar(tmp_path, name, doc):
    doc = json.loads(json.dumps(doc))  # a copy to tame
    http_cfg = doc["http"]
    http_cfg.pop("storage", None)
    _tame(http_cfg.get("descriptors"))
    cfg = tmp_path / "netlimit.yaml"
    cfg.write_text(yaml.safe_dump(doc, sort_keys=False))
    domain = http_cfg.get("domain") or load_file(cfg).config.http.domain
    traffic = _traffic(http_cfg)
    _away_from_midnight()
    sc = Sidecar(cfg)
    try:
        sent = _send_all(sc.port, traffic)
        wait_until(lambda: sc.admin("/healthz").status == 200, timeout=10, what="the sidecar's health")
        samples = get_metrics(sc.admin_port)
    finally:
        sc.stop()
    live: dict[str, list[float]] = {}
    for (mname, labels), v in samples.items():
        lab = dict(labels)
        if lab.get("domain") != domain or "rule" not in lab:
            continue
        for metric, i in (("netlimit_http_rule_hits_total", 0), ("netlimit_http_rule_over_limit_total", 1)):
            if mname == metric:
                live.setdefault(lab["rule"], [0.0, 0.0])[i] = v
    log = tmp_path / "access.jsonl"
    with log.open("w") as f:
        for (client, path, headers), (t, _) in zip(traffic, sent):
            line = {"ts": t, "ip": client, "method": "GET", "path": path}
            line.update({"http_" + h.lower().replace("-", "_"): v for h, v in headers.items()})
            f.write(json.dumps(line) + "\n")
    res = replay(
        load_file(cfg),
        [str(log)],
        fmt="json",
        fields={"ts": "ts", "ip": "ip", "method": "method", "path": "path"},
        progress=False,
        jobs=1,
    )
    assert res.unreadable == 0 and res.requests == len(traffic)
    sim: dict[str, list[float]] = {}
    for r in res.rules:
        if r.unlimited:  # matched, never charged: no hits in either
            assert r.denied == 0
            continue
        s = sim.setdefault(r.name, [0.0, 0.0])
        s[0] += r.requests
        s[1] += r.denied
    live = {k: v for k, v in live.items() if k in sim or v != [0.0, 0.0]}
    assert sim == live, (name, sim, live)
    assert sum(v[1] for v in sim.values()) > 0, "the traffic reaches no limit: the comparison would prove little"
    statuses = Counter(s for _, s in sent)
    assert res.denied == statuses[429], (name, res.denied, statuses)
    if name == "http-shadow-mode":
        assert statuses[429] == 0  # the rules deny (above), the answers do not
    if name.startswith(("quota", "http-quota")):
        assert 0 < statuses[429] < sum(v[1] for v in sim.values())  # some denials alone deny nothing
    if name == "replaces-by-netlimit-name":
        # 21 requests to /x (one key: the path): the unnamed 1/day limit is not replaced
        assert sim["path_/x"] == [21.0, 20.0]
