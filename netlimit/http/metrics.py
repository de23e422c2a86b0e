"""Prometheus metrics of the sidecar (own registry, served on /metrics).

Labels are bounded by the configuration, never by request values: per-rule
series carry ``domain`` and ``rule`` (the rule's ``rate_limit.name`` or its Lyft
path such as ``path_/login.remote_address``); store series carry a fixed
``reason`` / ``mode``; front-door series a fixed ``endpoint``.  Series of rules
removed by a reload are dropped.

Counters count hits (the request cost, 1 unless a JSON API caller sets
``hits_addend``), as Lyft's ``total_hits`` / ``over_limit`` / ``near_limit`` do.
"""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, disable_created_metrics
from prometheus_client.exposition import CONTENT_TYPE_PLAIN_0_0_4, generate_latest

from .limiter import Hooks
from .rules import Rule, RuleSet

CONTENT_TYPE = CONTENT_TYPE_PLAIN_0_0_4

LATENCY_BUCKETS = (0.0001, 0.00025, 0.0005, 0.001, 0.002, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 1.0)


class Metrics(Hooks):
    def __init__(self) -> None:
        # no *_created series: they double the output and nobody graphs them
        # (process-wide switch; this module runs in the sidecar process)
        disable_created_metrics()
        r = self.registry = CollectorRegistry(auto_describe=True)
        lbl = ("domain", "rule")
        self.hits = Counter("netlimit_http_rule_hits", "Hits charged to a rule (every matching request)",
                            lbl, registry=r)
        self.within = Counter("netlimit_http_rule_within_limit", "Hits a rule allowed", lbl, registry=r)
        self.over = Counter("netlimit_http_rule_over_limit",
                            "Hits over a rule's limit (shadow_mode rules included, as Lyft counts them)",
                            lbl, registry=r)
        self.near = Counter("netlimit_http_rule_near_limit",
                            "Allowed hits with at least 80% of the rule's limit used", lbl, registry=r)
        self.shadow = Counter("netlimit_http_rule_shadow_over_limit",
                              "Hits a shadow_mode rule would have denied (not enforced)", lbl, registry=r)
        self.store_errors = Counter("netlimit_http_store_errors",
                                    "Failed calls to the shared store (reason: timeout, connection, error)",
                                    ("reason",), registry=r)
        self.fallbacks = Counter("netlimit_http_store_fallbacks",
                                 "Decisions made without the shared store (mode: local, open, closed)",
                                 ("mode",), registry=r)
        self.up = Gauge("netlimit_http_store_up", "1 when the shared store is used, 0 while it is bypassed",
                        registry=r)
        self.decision = Histogram("netlimit_http_decision_seconds", "Time to decide one request (limiter core)",
                                  buckets=LATENCY_BUCKETS, registry=r)
        self.requests = Counter("netlimit_http_requests", "Requests by front door and outcome",
                                ("endpoint", "result"), registry=r)
        self.reloads = Counter("netlimit_http_config_reloads", "Rule reloads (result: ok, error)",
                               ("result",), registry=r)
        self.rules_gauge = Gauge("netlimit_http_rules", "Rules loaded", registry=r)
        self.last_reload_ok = Gauge("netlimit_http_config_last_reload_successful",
                                    "1 when the last reload succeeded", registry=r)
        self.last_reload_ok.set(1)
        for reason in ("timeout", "connection", "error"):
            self.store_errors.labels(reason)
        for mode in ("local", "open", "closed"):
            self.fallbacks.labels(mode)
        for res in ("ok", "error"):
            self.reloads.labels(res)
        self._labels: set[tuple[str, str]] = set()
        self._observe = self.decision.observe
        self._fb = {m: self.fallbacks.labels(m) for m in ("local", "open", "closed")}
        self._err = {m: self.store_errors.labels(m) for m in ("timeout", "connection", "error")}
        self._req: dict[tuple[str, str], Counter] = {}

    # -- limiter hooks ---------------------------------------------------------------

    def rules_changed(self, rules: RuleSet) -> None:
        new: set[tuple[str, str]] = set()
        for rule in rules.rules:
            lv = (rule.domain, rule.name)
            new.add(lv)
            rule.metrics = (self.hits.labels(*lv), self.within.labels(*lv), self.over.labels(*lv),
                            self.near.labels(*lv), self.shadow.labels(*lv))
        for lv in self._labels - new:
            for c in (self.hits, self.within, self.over, self.near, self.shadow):
                try:
                    c.remove(*lv)
                except KeyError:
                    pass
        self._labels = new
        self.rules_gauge.set(len(rules.rules))

    def rule_hit(self, rule: Rule, cost: int, over: bool, near: bool, shadow_over: bool) -> None:
        m = rule.metrics
        if m is None or not cost:
            return
        m[0].inc(cost)
        if over:
            m[2].inc(cost)
            if shadow_over:
                m[4].inc(cost)
        else:
            m[1].inc(cost)
            if near:
                m[3].inc(cost)

    def store_error(self, reason: str) -> None:
        self._err[reason].inc()

    def fallback(self, mode: str) -> None:
        self._fb[mode].inc()

    def store_up(self, up: bool) -> None:
        self.up.set(1 if up else 0)

    def latency(self, seconds: float) -> None:
        self._observe(seconds)

    # -- front doors ---------------------------------------------------------------

    def request(self, endpoint: str, result: str) -> None:
        k = (endpoint, result)
        c = self._req.get(k)
        if c is None:
            c = self._req[k] = self.requests.labels(endpoint, result)
        c.inc()

    def reload(self, ok: bool) -> None:
        self.reloads.labels("ok" if ok else "error").inc()
        self.last_reload_ok.set(1 if ok else 0)

    def render(self) -> bytes:
        return generate_latest(self.registry)
