"""Prometheus metrics of the sidecar (own registry, served on /metrics).

The decision path only bumps plain integers (``Rule.stats``, ``Limiter.stats``,
:class:`FrontStats`); this collector turns them into metric families when
/metrics is scraped, so counting costs no locks or label lookups per request.

Labels are bounded by the configuration: per-rule series carry ``domain`` and
``rule`` (the rule's ``rate_limit.name`` or its Lyft path such as
``path_/login.remote_address``); store series a fixed ``reason`` / ``mode``;
front-door series a fixed ``endpoint`` / ``result``.  The one place request
values reach a label is Lyft's ``detailed_metric`` / ``value_to_metric``: the
``netlimit_http_descriptor_*`` series carry the Lyft stat key (``descriptor``,
e.g. ``key7_some_value``), at most ``http.max_metric_values`` per rule, the
rest counted under ``(other)``.  A reload drops the series of removed rules and
keeps the counts of rules that stay.

Counters count hits (the request cost, 1 unless a JSON API caller sets
``hits_addend``), as Lyft's ``total_hits`` / ``over_limit`` / ``near_limit`` do.
"""

from __future__ import annotations

from prometheus_client.core import CollectorRegistry, CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily
from prometheus_client.exposition import CONTENT_TYPE_PLAIN_0_0_4, generate_latest

from .limiter import Limiter
from .rules import OTHER, RuleStats
from .stores import LeasedRedisStore, RedisStore

CONTENT_TYPE = CONTENT_TYPE_PLAIN_0_0_4

ENDPOINTS = ("proxy", "check", "authz", "json", "http")  # http: refused before an endpoint was known
RESULTS = ("ok", "over_limit", "bad_request", "upstream_error", "unauthorized")


class FrontStats:
    """Front-door and reload counters (plain ints)."""

    def __init__(self) -> None:
        self.requests = {(e, r): 0 for e in ENDPOINTS for r in RESULTS}
        self.reloads = {"ok": 0, "error": 0}
        self.last_reload_ok = 1

    def request(self, endpoint: str, result: str) -> None:
        self.requests[(endpoint, result)] += 1

    def reload(self, ok: bool) -> None:
        self.reloads["ok" if ok else "error"] += 1
        self.last_reload_ok = 1 if ok else 0


class Metrics:
    def __init__(self, limiter: Limiter, front: FrontStats | None = None) -> None:
        self.limiter = limiter
        self.front = front if front is not None else FrontStats()
        self.registry = CollectorRegistry(auto_describe=False)
        self.registry.register(self)

    def render(self) -> bytes:
        return generate_latest(self.registry)

    def describe(self):
        return []

    def collect(self):
        lim = self.limiter
        yield from _rule_families(lim)
        yield from _store_families(lim)
        yield from _front_families(self.front)
        yield GaugeMetricFamily("netlimit_http_rules", "Rules loaded", value=len(lim.rules.all_rules))


def _rule_families(lim: Limiter):
    """The per-rule counters, and per Lyft stat key for the rules that keep them."""
    lbl = ["domain", "rule"]
    fams = [
        ("netlimit_http_rule_hits", "Hits charged to a rule (every matching request)", "hits"),
        ("netlimit_http_rule_within_limit", "Hits a rule allowed", "within"),
        (
            "netlimit_http_rule_over_limit",
            "Hits over a rule's limit (shadow_mode rules included, as Lyft counts them)",
            "over",
        ),
        ("netlimit_http_rule_near_limit", "Allowed hits past http.near_limit_ratio of a rule's limit", "near"),
        (
            "netlimit_http_rule_shadow_over_limit",
            "Hits a shadow_mode rule would have denied (not enforced)",
            "shadow",
        ),
    ]
    per_rule: dict[tuple[str, str], RuleStats] = {}  # rules sharing a name share their stats
    for r in lim.rules.all_rules:
        per_rule.setdefault((r.domain, r.name), r.stats)
    for name, doc, attr in fams:
        f = CounterMetricFamily(name, doc, labels=lbl)
        for (domain, rule), stats in per_rule.items():
            f.add_metric([domain, rule], getattr(stats, attr))
        yield f
    # per Lyft stat key, for the rules whose key carries request values
    per_value = [(d, r, st.values) for (d, r), st in per_rule.items() if st.values]
    for name, doc, attr in fams:
        f = CounterMetricFamily(
            name.replace("_rule_", "_descriptor_"),
            f"{doc}, per Lyft stat key (detailed_metric, value_to_metric)",
            labels=[*lbl, "descriptor"],
        )
        for domain, rule, values in per_value:
            cut = len(domain) + 1
            for key, stats in list(values.items()):
                f.add_metric([domain, rule, key if key == OTHER else key[cut:]], getattr(stats, attr))
        yield f


def _store_families(lim: Limiter):
    """The store's counters: evictions, key budgets, errors, fallbacks, its state, the latency."""
    lbl = ["domain", "rule"]
    st = lim.stats
    f = CounterMetricFamily(
        "netlimit_http_store_evictions",
        "States the memory store dropped because their rule's budget was full (a rule's keys evict only "
        "its own; rule (overrides): the limit overrides')",
        labels=lbl,
    )
    for (domain, rule), n in lim.evictions().items():
        f.add_metric([domain, rule], n)
    yield f
    f = CounterMetricFamily(
        "netlimit_http_store_key_budget_exceeded",
        "New keys beyond a rule's max_keys on the shared store in one period of the rule: not written, "
        "decided as on_store_failure says",
        labels=lbl,
    )
    for (domain, rule), n in lim.stats.over_key_budget.items():
        f.add_metric([domain, rule], n)
    yield f
    yield CounterMetricFamily(
        "netlimit_http_no_descriptor",
        "Requests whose actions produced no descriptor (an input missing): not limited, answered OK or forwarded",
        value=st.no_descriptor,
    )
    yield CounterMetricFamily(
        "netlimit_http_global_shadow_mode",
        "OVER_LIMIT answers turned OK by http.shadow_mode (Lyft's global_shadow_mode)",
        value=st.global_shadow,
    )
    f = CounterMetricFamily(
        "netlimit_http_store_errors",
        "Failed calls to the shared store that opened the breaker (reason: timeout, connection, error)",
        labels=["reason"],
    )
    for reason, n in st.store_errors.items():
        f.add_metric([reason], n)
    yield f
    yield CounterMetricFamily(
        "netlimit_http_store_request_errors",
        "Errors the shared store answered about one call (not its health): that decision followed "
        "on_store_failure, the store stayed in use",
        value=st.request_errors,
    )
    f = CounterMetricFamily(
        "netlimit_http_store_fallbacks",
        "Decisions made without the shared store (mode: local, open, closed)",
        labels=["mode"],
    )
    for mode, n in st.fallbacks.items():
        f.add_metric([mode], n)
    yield f
    yield GaugeMetricFamily(
        "netlimit_http_store_up",
        "1 when the shared store is used, 0 while it is bypassed",
        value=1 if lim.store_available else 0,
    )
    if isinstance(lim.store, RedisStore):
        yield from _topology(lim.store)
    if isinstance(lim.store, LeasedRedisStore) or hasattr(lim.store, "lease_stats"):  # stores/shared.py leases too
        yield from _leases(lim.store)  # type: ignore[arg-type]  # SharedMemoryStore: the same lease_stats, held()
    if isinstance(lim.store, LeasedRedisStore):  # per rule, WAIT and round trips: the Redis leases' own figures
        yield from _lease_rules(lim, lim.store)
    h = st.latency
    buckets = []
    acc = 0
    for bound, n in zip(h.bounds, h.counts):
        acc += n
        buckets.append((repr(float(bound)), acc))
    buckets.append(("+Inf", h.count))
    yield HistogramMetricFamily(
        "netlimit_http_decision_seconds",
        "Time to decide one request (limiter core)",
        buckets=buckets,
        sum_value=h.sum,
    )


def _front_families(fr: FrontStats):
    """The front door's and the reloads' counters."""
    f = CounterMetricFamily(
        "netlimit_http_requests", "Requests by front door and outcome", labels=["endpoint", "result"]
    )
    for (endpoint, result), n in fr.requests.items():
        f.add_metric([endpoint, result], n)
    yield f
    f = CounterMetricFamily("netlimit_http_config_reloads", "Rule reloads (result: ok, error)", labels=["result"])
    for result, n in fr.reloads.items():
        f.add_metric([result], n)
    yield f
    yield GaugeMetricFamily(
        "netlimit_http_config_last_reload_successful", "1 when the last reload succeeded", value=fr.last_reload_ok
    )


def _topology(store: RedisStore):
    """The Redis store's routing: redirects, failovers, map look-ups, errors and
    reachability per node (labels: the topology's addresses, at most 64)."""
    ts = store.stats
    f = CounterMetricFamily(
        "netlimit_http_store_redirects",
        "Redis Cluster redirects followed (kind: moved, ask)",
        labels=["kind"],
    )
    for kind, n in ts.redirects.items():
        f.add_metric([kind], n)
    yield f
    yield CounterMetricFamily(
        "netlimit_http_store_failovers",
        "Times the store saw a new primary (Sentinel switch, a promoted cluster replica)",
        value=ts.failovers,
    )
    yield CounterMetricFamily(
        "netlimit_http_store_topology_refreshes",
        "Topology look-ups (CLUSTER SHARDS, SENTINEL get-master-addr-by-name)",
        value=ts.refreshes,
    )
    f = CounterMetricFamily(
        "netlimit_http_store_node_errors",
        "Failed commands per Redis node (connection, timeout, error replies)",
        labels=["node"],
    )
    for node, n in ts.node_errors.items():
        f.add_metric([node], n)
    yield f
    g = GaugeMetricFamily(
        "netlimit_http_store_node_up",
        "1 while the store's connection to a primary is up, 0 when it is down or refused",
        labels=["node", "role"],
    )
    for n in store.topology().get("nodes", [])[:64]:
        if n.get("reachable") is not None:
            g.add_metric([n["address"], n["role"]], 1 if n["reachable"] else 0)
    yield g


def _lease_rules(lim: Limiter, store: LeasedRedisStore):
    """http.leases per rule: the quota its leases hold now; WAIT confirmations; the
    round trips per decision since the start."""
    held = store.held_by_ns()
    g = GaugeMetricFamily(
        "netlimit_http_lease_rule_held_units",
        "Units reserved in leases and not used yet, per rule (a rule that leases; 0 when none is held)",
        labels=["domain", "rule"],
    )
    seen: dict[tuple[str, str], int] = {}
    for r in lim.rules.all_rules:
        if r.lease and r.limit is not None:
            k = (r.domain, r.name)
            seen[k] = seen.get(k, 0) + held.get(r.limit._ns, 0)
    for (domain, rule), n in seen.items():
        g.add_metric([domain, rule], n)
    yield g
    ls = store.lease_stats
    f = CounterMetricFamily(
        "netlimit_http_lease_confirms",
        "Lease calls confirmed on a replica (WAIT) before use (ok), or not in time (unconfirmed: lease dropped)",
        labels=["result"],
    )
    f.add_metric(["ok"], ls.confirms - ls.unconfirmed)
    f.add_metric(["unconfirmed"], ls.unconfirmed)
    yield f
    yield GaugeMetricFamily(
        "netlimit_http_lease_round_trips_per_decision",
        "Redis calls per decision of the rules that lease, since the start (0 before any)",
        value=ls.round_trips / ls.decisions if ls.decisions else 0.0,
    )


def _leases(store: LeasedRedisStore):
    """http.leases (stores/lease.py): leases, the quota they hold, round trips per decision."""
    ls = store.lease_stats
    yield CounterMetricFamily("netlimit_http_leases_granted", "Leases of quota reserved for hot keys", value=ls.granted)
    f = CounterMetricFamily(
        "netlimit_http_lease_units",
        "Units of quota leased (granted), given back unused (returned), or unused when the window ended "
        "or the give-back failed (expired: never admitted, so never over the limit)",
        labels=["what"],
    )
    f.add_metric(["granted"], ls.granted_units)
    f.add_metric(["returned"], ls.returned_units)
    f.add_metric(["expired"], ls.expired_units)
    yield f
    yield GaugeMetricFamily(
        "netlimit_http_lease_held_units", "Units reserved in leases and not used yet", value=store.held()
    )
    yield CounterMetricFamily(
        "netlimit_http_lease_decisions", "Decisions of the rules that lease (cost >= 1)", value=ls.decisions
    )
    yield CounterMetricFamily(
        "netlimit_http_lease_round_trips",
        "Redis calls those decisions made (round trips per decision = this / decisions)",
        value=ls.round_trips,
    )
