#!/usr/bin/env python3
"""Write dashboards/netlimit.json, the Grafana dashboard, from the panel list below.

    .venv/bin/python scripts/build_dashboard.py          # rewrite the file
    .venv/bin/python scripts/build_dashboard.py --check  # exit 1 if the file differs

The queries live here once; tests/monitoring runs every one of them against a real
Prometheus scraping a real netlimitd and sidecar. Variables: $datasource (any
Prometheus), $instance, $rule, $domain (multi-select, "All" = .*).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

OUT = Path(__file__).resolve().parents[1] / "dashboards" / "netlimit.json"
DS = {"type": "prometheus", "uid": "${datasource}"}
K = 'instance=~"$instance", rule=~"$rule"'  # kernel metrics (netlimitd)
H = 'instance=~"$instance", domain=~"$domain", rule=~"$rule"'  # HTTP metrics (sidecar)
I = 'instance=~"$instance"'
RI = "$__rate_interval"

# (title, unit, [(expr, legend)], description); None starts a new row named by `unit`
PANELS: list[tuple[str, str, list[tuple[str, str]], str] | tuple[None, str]] = [
    (None, "Kernel (netlimitd): packets, drops, bandwidth"),
    (
        "Packets matched per rule",
        "pps",
        [(f"sum by (rule, layer) (rate(netlimit_rule_packets_total{{{K}}}[{RI}]))", "{{rule}} ({{layer}})")],
        "Packets each network rule matched, per second, per packet filter (iptables, ip6tables, nftables).",
    ),
    (
        "Packets dropped per rule",
        "pps",
        [(f"sum by (rule, layer) (rate(netlimit_rule_dropped_packets_total{{{K}}}[{RI}]))", "{{rule}} ({{layer}})")],
        "Packets over a rule's limit that the kernel dropped or rejected, per second.",
    ),
    (
        "Bandwidth per shaped class vs its configured rate",
        "Bps",
        [
            (f'sum by (rule) (rate(netlimit_rule_bytes_total{{layer="tc", {K}}}[{RI}]))', "{{rule}} sent"),
            (f"max by (rule) (netlimit_bandwidth_limit_bytes_per_second{{{K}}})", "{{rule}} configured rate"),
        ],
        "Bytes per second through each tc class (TBF/HTB) against the rate the file configures.",
    ),
    (None, "HTTP (sidecar): hits, denials, latency"),
    (
        "HTTP hits per rule: all, within, over, near the limit, shadow",
        "reqps",
        [
            (f"sum by (domain, rule) (rate(netlimit_http_rule_hits_total{{{H}}}[{RI}]))", "{{rule}} hits"),
            (f"sum by (domain, rule) (rate(netlimit_http_rule_within_limit_total{{{H}}}[{RI}]))", "{{rule}} within"),
            (f"sum by (domain, rule) (rate(netlimit_http_rule_over_limit_total{{{H}}}[{RI}]))", "{{rule}} over"),
            (f"sum by (domain, rule) (rate(netlimit_http_rule_near_limit_total{{{H}}}[{RI}]))", "{{rule}} near"),
            (
                f"sum by (domain, rule) (rate(netlimit_http_rule_shadow_over_limit_total{{{H}}}[{RI}]))",
                "{{rule}} shadow (not enforced)",
            ),
        ],
        "Per rule: every hit, hits allowed, hits over the limit (429), allowed hits with 80% of the limit used, "
        "and hits a shadow_mode rule would have denied.",
    ),
    (
        "Share of hits denied, per rule",
        "percentunit",
        [
            (
                f"sum by (domain, rule) (rate(netlimit_http_rule_over_limit_total{{{H}}}[{RI}]))"
                f" / clamp_min(sum by (domain, rule) (rate(netlimit_http_rule_hits_total{{{H}}}[{RI}])), 1e-9)",
                "{{domain}}/{{rule}}",
            )
        ],
        "Who is hitting the limit: the rules whose clients are denied most, as a share of their hits.",
    ),
    (
        "Decision latency (p50, p99)",
        "s",
        [
            (
                f"histogram_quantile(0.5, sum by (le) (rate(netlimit_http_decision_seconds_bucket{{{I}}}[{RI}])))",
                "p50",
            ),
            (
                f"histogram_quantile(0.99, sum by (le) (rate(netlimit_http_decision_seconds_bucket{{{I}}}[{RI}])))",
                "p99",
            ),
        ],
        "Time the limiter core takes to decide one request (store round trip included).",
    ),
    (
        "Requests by front door and outcome",
        "reqps",
        [(f"sum by (endpoint, result) (rate(netlimit_http_requests_total{{{I}}}[{RI}]))", "{{endpoint}} {{result}}")],
        "Requests per second at each door (proxy, auth, check, json, grpc) by outcome.",
    ),
    (
        "Shared store: errors, fallbacks, up",
        "short",
        [
            (f"sum by (reason) (rate(netlimit_http_store_errors_total{{{I}}}[{RI}]))", "errors: {{reason}}"),
            (f"sum by (mode) (rate(netlimit_http_store_fallbacks_total{{{I}}}[{RI}]))", "fallback: {{mode}}"),
            (f"min(netlimit_http_store_up{{{I}}})", "store up (1) / bypassed (0)"),
        ],
        "Failed calls to Redis and decisions made without it (local, open or closed, as on_store_failure says).",
    ),
    (None, "Bans (L7 and network escalate, pushed to the kernel)"),
    (
        "Bans in the list and in the kernel",
        "short",
        [
            (f"max by (instance) (netlimit_bans_active{{{I}}})", "{{instance}} active"),
            (f"max by (instance) (netlimit_bans_in_kernel{{{I}}})", "{{instance}} prefixes in the kernel"),
            (f"min(netlimit_bans_store_up{{{I}}})", "ban list reachable (1)"),
        ],
        "Bans the fleet's list holds, the prefixes this host's kernel drops, and whether the list's store answers.",
    ),
    (
        "Bans added by rule and origin; packets dropped by bans",
        "short",
        [
            (
                f"sum by (rule, origin) (increase(netlimit_bans_added_total{{{I}}}[{RI}]))",
                "added: {{rule}} ({{origin}})",
            ),
            (f"sum(rate(netlimit_bans_dropped_packets_total{{{I}}}[{RI}]))", "packets dropped by bans /s"),
        ],
        "New bans per rule (origin http, network or manual), and what the ban sets drop.",
    ),
    (None, "Operations: reloads, applies, drift, targets"),
    (
        "Config reloads and rejections",
        "short",
        [
            (f"sum by (result) (increase(netlimit_config_reloads_total{{{I}}}[{RI}]))", "netlimitd {{result}}"),
            (f"sum by (result) (increase(netlimit_http_config_reloads_total{{{I}}}[{RI}]))", "sidecar {{result}}"),
            (f"max(netlimit_config_rejected{{{I}}})", "netlimitd running an older config"),
            (f"min(netlimit_http_config_last_reload_successful{{{I}}})", "sidecar last reload ok"),
        ],
        "A rejected file keeps the previous rules running; these say so.",
    ),
    (
        "Kernel applies and their duration",
        "s",
        [
            (f"sum by (result) (increase(netlimit_applies_total{{{I}}}[{RI}]))", "applies {{result}}"),
            (
                f"histogram_quantile(0.99, sum by (le) (rate(netlimit_apply_duration_seconds_bucket{{{I}}}[{RI}])))",
                "p99 duration",
            ),
        ],
        "Applies by result, and how long the kernel writes take.",
    ),
    (
        "Drift repairs and kernel reads",
        "short",
        [
            (f"sum(increase(netlimit_drift_repairs_total{{{I}}}[{RI}]))", "drift repairs"),
            (f"min(netlimit_kernel_read_ok{{{I}}})", "kernel counters readable"),
        ],
        "Repairs of rules another program changed or removed; counters that could not be read.",
    ),
    (
        "Configs and versions across hosts",
        "short",
        [
            (
                f"count by (job) (count by (job, sha256) (netlimit_config_info{{{I}}}))",
                "{{job}}: configs running (1 = all agree)",
            ),
            # count by instance first: a sidecar with --workers N exports one series per worker
            (
                f"count by (job, version) (count by (job, version, instance) (netlimit_build_info{{{I}}}))",
                "{{job}} {{version}}: hosts",
            ),
        ],
        "How many different configs (sha256 of the file and its include:/lyft files) the hosts of each job run, "
        "and how many hosts run each netlimit version: during a rollout 2, after it 1.",
    ),
    (
        "Scrape targets up",
        "short",
        [(f'up{{job=~"netlimit.*", {I}}}', "{{job}} {{instance}}")],
        "1 while Prometheus reaches netlimitd and the sidecars.",
    ),
]

VARIABLES = [
    ("instance", "Instance", 'label_values(up{job=~"netlimit.*"}, instance)'),
    ("domain", "Domain (HTTP)", "label_values(netlimit_http_rule_hits_total, domain)"),
    ("rule", "Rule", 'label_values({__name__=~"netlimit_rule_packets_total|netlimit_http_rule_hits_total"}, rule)'),
]


def build() -> dict:
    panels: list[dict] = []
    y = 0
    x = 0
    pid = 1
    for p in PANELS:
        if p[0] is None:
            if x:
                y += 8
                x = 0
            panels.append(
                {
                    "type": "row",
                    "title": p[1],
                    "id": pid,
                    "collapsed": False,
                    "gridPos": {"h": 1, "w": 24, "x": 0, "y": y},
                }
            )
            pid += 1
            y += 1
            continue
        title, unit, targets, desc = p[0], p[1], p[2], p[3]  # a panel (a row marker is (None, title))
        panels.append(
            {
                "type": "timeseries",
                "title": title,
                "description": desc,
                "id": pid,
                "datasource": DS,
                "gridPos": {"h": 8, "w": 12, "x": x, "y": y},
                "fieldConfig": {"defaults": {"unit": unit}, "overrides": []},
                "options": {"legend": {"displayMode": "list", "placement": "bottom"}, "tooltip": {"mode": "multi"}},
                "targets": [
                    {"datasource": DS, "expr": expr, "legendFormat": legend, "refId": chr(ord("A") + i)}
                    for i, (expr, legend) in enumerate(targets)
                ],
            }
        )
        pid += 1
        x = 12 - x
        if x == 0:
            y += 8
    templating = [
        {
            "name": "datasource",
            "label": "Data source",
            "type": "datasource",
            "query": "prometheus",
            "current": {},
            "hide": 0,
        }
    ]
    for name, label, query in VARIABLES:
        templating.append(
            {
                "name": name,
                "label": label,
                "type": "query",
                "datasource": DS,
                "definition": query,
                "query": {"query": query, "refId": f"var-{name}"},
                "refresh": 2,
                "includeAll": True,
                "multi": True,
                "allValue": ".*",
                "current": {"selected": True, "text": ["All"], "value": ["$__all"]},
                "sort": 1,
                "hide": 0,
            }
        )
    return {
        "title": "netlimit",
        "uid": "netlimit",
        "description": "netlimit: kernel rules (netlimitd) and HTTP limits (sidecar), per rule.",
        "tags": ["netlimit", "rate-limiting"],
        "editable": True,
        "schemaVersion": 39,
        "version": 1,
        "graphTooltip": 1,
        "refresh": "10s",
        "time": {"from": "now-1h", "to": "now"},
        "templating": {"list": templating},
        "annotations": {"list": []},
        "panels": panels,
    }


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--check", action="store_true", help="exit 1 if dashboards/netlimit.json is not up to date")
    args = ap.parse_args()
    text = json.dumps(build(), indent=2) + "\n"
    if args.check:
        if not OUT.exists() or OUT.read_text() != text:
            print(f"{OUT} is out of date: run scripts/build_dashboard.py", file=sys.stderr)
            return 1
        return 0
    OUT.parent.mkdir(exist_ok=True)
    OUT.write_text(text)
    print(f"wrote {OUT}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
