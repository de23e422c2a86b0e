"""The limiter: a request's descriptors in, one decision per descriptor out.

Door-free on purpose: the HTTP sidecar and the gRPC RateLimitService make a
:class:`~netlimit.limit.request.CheckRequest` and call the same
:meth:`Limiter.check`::

    req = build_request("api", [DescriptorIn([("remote_address", "10.0.0.1")]),
                                 DescriptorIn([("path", "/login"), ("remote_address", "10.0.0.1")])])
    result = await limiter.check(req)
    result.code            # OK (1) or OVER_LIMIT (2), Lyft's numbering
    result.statuses        # one DescriptorStatus per descriptor, in order
    result.report          # the most constraining enforced status (for headers)

:meth:`check_fast` is the same decision without a coroutine for an in-process
store (the sidecar's fast paths), answering its most common outcome without
building result objects.

Semantics
---------
Which rule decides each descriptor (matching, ``replaces``) and how a request's
statuses combine (quota) live in selection.py, the one home ``simulate`` calls too.

* Every descriptor that matches a rule is charged (also when another one is
  over the limit), as Lyft does; ``replaces`` removes the limits whose
  ``rate_limit.name`` a matched rule names first.  ``unlimited`` rules match
  and are never charged (nor replaced).
* The request is over the limit when a non-shadow, non-quota rule says so, or
  when every quota descriptor is over its limit (Lyft's ``quota_mode``: a
  quota descriptor's status is OVER_LIMIT, the answer is not, while another
  quota descriptor passes; ``http.quota_mode`` makes every descriptor, matched
  or not, a quota one).  ``http.shadow_mode`` (Lyft's SHADOW_MODE) then turns
  an OVER_LIMIT answer into OK, leaving every status as it is.  The
  reported status is, among the enforced (non-shadow) rules, the denied one
  with the longest ``retry_after``; when the answer is OK, the allowed one
  with the fewest ``remaining`` (then the smallest limit).
* Each descriptor is charged its own cost (``hits_addend``; 0 is a free probe),
  and a descriptor's limit ``override`` replaces the configured limit for it as
  envoyproxy/ratelimit does (``GetLimit``): it applies whenever the domain is
  ours, also when no configured descriptor matches; it is never shadow_mode and
  never replaced nor replacing.  Its counters are keyed by the descriptor's
  keys and values under the override's rate, apart from the configured limit's;
  it keeps the algorithm of the configured descriptor it matches (fixed_window
  when none, Lyft's only one).
* The request's domain picks the rules (``RuleSet.domains``: the ``http:``
  section's and those of its ``lyft_config_dir``); a domain the sidecar does
  not have has no limits: every status is OK.
* ``shadow_mode`` rules are charged and counted exactly like the others, but
  their denials become OK with ``shadow_over = True``; they never appear in
  ``report`` (clients never see a dark-launched limit) nor delay a request.
* Store failures (timeouts, lost or refused connections, a server's failover
  replies: READONLY, LOADING, MASTERDOWN, CLUSTERDOWN, TRYAGAIN) open a
  circuit breaker: for ``retry_interval`` seconds decisions skip the primary
  store; then one request probes it, and success closes the breaker.  Any other
  error a store raises (a script error, an unexpected reply, a bug) concerns
  that one call: its decision follows ``on_store_failure``, it is counted in
  ``request_errors``, and the breaker is left alone -- one request's arguments
  never switch the store off for everyone.  While open, ``on_store_failure``
  decides: ``local`` (default) uses a process-local
  :class:`MemoryStore`, ``open`` allows (no decision, no headers), ``closed``
  denies with ``retry_after = retry_interval``.  A store that is several
  servers by key (a Redis Cluster: ``breaker_of`` names the primary of a key's
  slot) has one breaker per server: while one shard fails over, the keys on the
  others stay on the shared store.
"""

from __future__ import annotations

import asyncio
import logging
import time
from bisect import bisect_left
from collections import OrderedDict
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from ..errors import StoreError
from ..logevery import LogEvery
from .algorithms import Decision, Limit
from .breaker import MAX_BREAKERS, Breaker, trips
from .breaker import reason as failure_reason
from .breaker import trips as _trips  # noqa: F401  (tests import it from here)
from .corestats import CoreStats
from .hitters import descriptor_text, shown_value
from .keybudget import KeyBudget
from .request import CheckRequest, Override
from .rules import Entry, Rule, RuleSet
from .selection import _OVERRIDE_CACHE_MAX, answer_over, override_rule, select, stats_near
from .selection import count_value as _count_value
from .selection import replace as _replace
from .stores import MemoryStore, Store

log = logging.getLogger("netlimit.limit")
_perf = time.perf_counter
_bisect_left = bisect_left
_new = object.__new__

# Lyft's RateLimitResponse.Code numbering
UNKNOWN = 0
OK = 1
OVER_LIMIT = 2
CODE_NAMES = {UNKNOWN: "UNKNOWN", OK: "OK", OVER_LIMIT: "OVER_LIMIT"}

# DescriptorStatus.source
SRC_NONE = ""  # no rule matched, or unlimited
SRC_STORE = "store"  # the configured store decided
SRC_LOCAL = "local"  # the local fallback store decided (primary unavailable)
SRC_OPEN = "open"  # primary unavailable, on_store_failure: open
SRC_CLOSED = "closed"  # primary unavailable, on_store_failure: closed


@dataclass(slots=True)
class DescriptorStatus:
    code: int
    rule: Rule | None = None
    decision: Decision | None = None
    shadow_over: bool = False  # over the limit, but the rule is in shadow mode
    near: bool = False  # allowed with >= 80% of the limit used
    source: str = SRC_NONE


@dataclass(slots=True)
class CheckResult:
    code: int
    statuses: list[DescriptorStatus]
    report: DescriptorStatus | None = None
    delay: float = 0.0  # leaky bucket queue mode: hold the request this long

    @property
    def allowed(self) -> bool:
        return self.code != OVER_LIMIT


class Limiter:
    """Charge every matching descriptor; report the most constraining.

    ``store`` is the primary store (a :class:`MemoryStore` is called
    synchronously; anything else, e.g. RedisStore, through the breaker).
    ``local`` is the fallback store (created when not given).
    """

    def __init__(
        self,
        rules: RuleSet,
        store: Store | None = None,
        *,
        local: MemoryStore | None = None,
        on_store_failure: str = "local",
        retry_interval: float = 0.25,
        log_interval: float = 10.0,
        clock: Callable[[], float] = time.monotonic,
    ):
        if on_store_failure not in ("open", "local", "closed"):
            raise ValueError(f"on_store_failure must be open, local or closed, not {on_store_failure!r}")
        self.stats = CoreStats()
        cfg = rules.config

        def memory() -> MemoryStore:
            return MemoryStore(
                max_keys=cfg.max_keys if cfg else 100_000, max_key_length=cfg.max_key_length if cfg else 256
            )

        if store is None:
            store = memory()
        self.store = store
        self._mem: MemoryStore | None = store if isinstance(store, MemoryStore) else None
        #: True when the primary store is in-process: :meth:`check_nowait` can decide
        #: (a plain attribute: the fast paths read it per request)
        self.is_sync = self._mem is not None
        if local is None and self._mem is None:
            local = memory()
        self.local = local
        self.on_store_failure = on_store_failure
        self.retry_interval = float(retry_interval)
        self._clock = clock
        #: the store's one breaker; a store with ``breaker_of`` (a Redis Cluster: one per
        #: primary) has one per part instead, in ``_breakers`` (issue 35)
        self._breaker = Breaker(None)
        self._breakers: dict[Any, Breaker] = {}
        self._breaker_of: Callable[[str, Limit], Any] | None = getattr(store, "breaker_of", None)
        #: http.leases: the store that leases quota for hot keys (stores/lease.py), else None
        self._leasing: Any = store if hasattr(store, "from_lease") else None
        self._fail_log = LogEvery(log_interval, clock)
        self._rule_log = LogEvery(log_interval, clock)
        self._evict_log = LogEvery(log_interval, clock)
        #: limit namespace -> (domain, rule name), for evictions (metrics, log)
        self.budget_names: dict[str, tuple[str, str]] = {}
        #: the shared store's key budgets of the rules with their own max_keys (keybudget.py)
        self._key_budgets: dict[Rule, KeyBudget] = {}
        #: header: descriptor values (API keys, tokens) shown as such in the denied top and
        #: the logs; by default they are hashed (hitters.shown_value)
        self.show_values = False
        self.rules = rules
        self._apply_budgets(rules)
        self._ov_rules: RuleSet | None = None  # the rules the override cache was built for
        #: the rules of limit overrides, least recently used first (bounded: _OVERRIDE_CACHE_MAX)
        self._ov_cache: OrderedDict[tuple, Rule] = OrderedDict()
        #: called with (rule, descriptor) for every enforced denial, in every door; it must
        #: only queue (the sidecar's escalation, netlimit.bans.escalate, sets it)
        self.on_over: Callable[[Rule, Sequence[Entry]], None] | None = None

    # -- configuration -------------------------------------------------------

    def set_rules(self, rules: RuleSet, on_store_failure: str | None = None) -> None:
        """Swap the rules (hot reload); one attribute store, so atomic for check().
        Rules keep their counters across reloads (matched by domain and name)."""
        old = {(r.domain, r.name): r.stats for r in self.rules.all_rules}
        for r in rules.all_rules:
            st = old.get((r.domain, r.name))
            if st is not None:
                r.stats = st
        self.rules = rules
        self._apply_budgets(rules)
        if on_store_failure is not None:
            self.on_store_failure = on_store_failure

    def _apply_budgets(self, rules: RuleSet) -> None:
        """Each rule's memory budget (the in-process stores: the primary or the
        fallback): a descriptor's own ``max_keys``, else an even share of
        ``http.max_keys`` among the rules without one and the limit overrides
        (which share one more such budget per algorithm)."""
        budgets, share, names = rule_budgets(rules)
        self.budget_names = names
        if self._mem is None:  # a shared store: the rules with their own max_keys are bounded there too
            old = {(r.domain, r.path, kb.max_keys, kb.period): kb for r, kb in self._key_budgets.items()}
            kbs: dict[Rule, KeyBudget] = {}
            for r in rules.all_rules:
                if r.max_keys is not None and r.limit is not None:
                    kb = old.get((r.domain, r.path, r.max_keys, float(r.limit.period)))
                    kbs[r] = kb if kb is not None else KeyBudget(r.max_keys, r.limit.period)
            self._key_budgets = kbs
        for st in (self._mem, self.local):
            if st is not None:
                st.set_budgets(budgets, share)
                st.on_evict = self._evicted

    def evictions(self) -> dict[tuple[str, str], int]:
        """States dropped for want of budget, per (domain, rule), every rule listed
        (0 included); the overrides' under ``(overrides)``."""
        out = dict.fromkeys(self.budget_names.values(), 0)
        for st in (self._mem, self.local):
            if st is None:
                continue
            for ns, n in st.evicted.items():
                k = self.budget_names.get(ns)
                if k is None:
                    k = (self.rules.domain, OVERRIDES if ns.startswith("~") else "(removed)")
                out[k] = out.get(k, 0) + n
        return out

    def _evicted(self, ns: str, n: int) -> None:
        held = self._evict_log.due(ns)
        if held < 0:
            return
        domain, name = self.budget_names.get(ns, (self.rules.domain, OVERRIDES))
        st = self._mem if self._mem is not None else self.local
        log.warning(
            "memory store: rule %r (domain %s) is over its budget of %d keys: %d of its least recently used "
            "states dropped (other rules keep theirs; raise the descriptor's max_keys or http.max_keys if "
            "these are real clients)%s",
            name,
            domain,
            st.budget(ns) if st is not None else 0,
            n,
            f"; {held} more evictions since the last report" if held else "",
        )

    @property
    def store_available(self) -> bool:
        """False while a breaker is open (the primary store, or a part of it, is skipped)."""
        return not self._breaker.down_until and not any(b.down_until for b in self._breakers.values())

    def stores_down(self) -> list[str]:
        """The parts of the primary store whose breaker is open ("store" when it has one breaker)."""
        down = [b for b in (self._breaker, *self._breakers.values()) if b.down_until]
        return [str(b.part) if b.part is not None else "store" for b in down]

    async def close(self) -> None:
        await self.store.close()
        if self.local is not None and self.local is not self.store:
            await self.local.close()

    # -- the decision ----------------------------------------------------------

    def _rules_of(self, rs: RuleSet, req: CheckRequest) -> list[Rule | None]:
        """The rule deciding each descriptor: the configured one it matches (or the
        override's), after ``replaces``."""
        match = rs.match
        descs = req.descriptors
        ovs = req.overrides
        if not ovs:
            return select(rs, descs)
        rules = [match(d) if ov is None else self._override_rule(rs, d, ov, match(d)) for d, ov in zip(descs, ovs)]
        return _replace(rules) if rs.has_replaces else rules

    def _override_rule(self, rs: RuleSet, entries: Sequence[Entry], ov: Override, matched: Rule | None) -> Rule:
        """The rule an override stands for, cached per (domain, matched rule, keys,
        override) and rebuilt lazily when the rules are reloaded."""
        if self._ov_rules is not self.rules:
            self._ov_rules = self.rules
            self._ov_cache = OrderedDict()
        keys = tuple(k for k, _ in entries)
        ck = (rs.domain, matched.path if matched is not None else None, keys, ov)
        cache = self._ov_cache
        rule = cache.get(ck)
        if rule is None:
            if len(cache) >= _OVERRIDE_CACHE_MAX:
                cache.popitem(last=False)  # the least recently used
            rule = cache[ck] = override_rule(rs.domain, keys, ov, matched)
        else:
            cache.move_to_end(ck)
        return rule

    def check_nowait(self, req: CheckRequest) -> CheckResult:
        """:meth:`check` without a coroutine, for an in-process primary store
        (``is_sync``)."""
        rs = self.rules
        costs = req.costs
        if req.domain != rs.domain:
            other = rs.domains.get(req.domain)
            if other is None:
                return CheckResult(OK, [DescriptorStatus(OK) for _ in req.descriptors])
            rs = other
        if not costs:  # no descriptor (an action's input missing): nothing to limit
            self.stats.no_descriptor += 1
            return CheckResult(OK, [])
        if not req.overrides and (len(costs) == 1 or costs.count(costs[0]) == len(costs)):
            res = self.check_fast(req.descriptors, costs[0], rs)
            return self.as_result(*res) if isinstance(res, tuple) else res
        t0 = _perf()
        mem = self._mem
        assert mem is not None, "check_nowait needs an in-process store; use check()"
        rules = self._rules_of(rs, req)
        key = rs.store_key
        hit = mem.hit_sync
        decided = [
            None if r is None or r.limit is None else (hit(key(r, d), r.limit, c), SRC_STORE)
            for d, r, c in zip(req.descriptors, rules, costs)
        ]
        result = self._evaluate(rs, req.descriptors, rules, decided, costs)
        self.stats.latency.observe(_perf() - t0)
        return result

    @staticmethod
    def as_result(r: Rule, dec: Decision) -> CheckResult:
        """The CheckResult of check_fast's ``(rule, decision)``."""
        # DescriptorStatus(OK, r, dec, False, near, SRC_STORE) and its CheckResult,
        # filled in place (no __init__ frames)
        st = _new(DescriptorStatus)
        st.code = OK
        st.rule = r
        st.decision = dec
        st.shadow_over = False
        st.near = dec.remaining <= r.near_threshold
        st.source = SRC_STORE
        result = _new(CheckResult)
        result.code = OK
        result.statuses = [st]
        result.report = st
        result.delay = 0.0
        return result

    def check_fast(
        self, descriptors: Sequence[Sequence[Entry]], cost: int = 1, rs: RuleSet | None = None
    ) -> tuple[Rule, Decision] | CheckResult:
        """:meth:`check_nowait` of a request in the rules' own domain (or ``rs``'s),
        with one cost for every descriptor and no override -- what the HTTP
        endpoints make -- for the fast paths: ``(rule, decision)`` for the common
        answer (one descriptor, admitted by an enforced rule with no delay,
        counted as check_nowait counts it, but no DescriptorStatus or CheckResult
        built), else check_nowait's CheckResult."""
        t0 = _perf()
        if rs is None:
            rs = self.rules
        mem = self._mem
        if mem is None:
            raise RuntimeError("check_fast needs an in-process store; use check()")
        result: tuple[Rule, Decision] | CheckResult
        if len(descriptors) == 1 and not rs.has_replaces:
            # one descriptor, without list machinery; the same result and counters as _evaluate
            d = descriptors[0]
            r = rs.match(d)
            result = self._one(rs, r, None if r is None or r.limit is None else rs.store_key(r, d), descriptors, cost)
        else:
            if not descriptors:  # no descriptor (an action's input missing): nothing to limit
                self.stats.no_descriptor += 1
            rules = select(rs, descriptors)
            hit = mem.hit_sync
            key = rs.store_key
            decided = [
                None if r is None or r.limit is None else (hit(key(r, d), r.limit, cost), SRC_STORE)
                for d, r in zip(descriptors, rules)
            ]
            result = self._evaluate(rs, descriptors, rules, decided, (cost,) * len(descriptors))
        v = _perf() - t0  # Histogram.observe, inlined
        h = self.stats.latency
        h.counts[_bisect_left(h.bounds, v)] += 1
        h.sum += v
        h.count += 1
        return result

    def check_keyed(
        self, rs: RuleSet, r: Rule | None, key: str | None, descriptors: Sequence[Sequence[Entry]]
    ) -> tuple[Rule, Decision] | CheckResult:
        """:meth:`check_fast` of one descriptor (cost 1) whose rule (``rs.match``) and
        store key (``rs.store_key``, None when the rule has no limit) the caller
        already has -- the decision endpoint keeps them per connection, whose
        descriptor is the same request after request; ``rs`` must not have
        ``replaces``.  The same result and counters as check_fast."""
        t0 = _perf()
        result = self._one(rs, r, key, descriptors, 1)
        v = _perf() - t0  # Histogram.observe, inlined
        h = self.stats.latency
        h.counts[_bisect_left(h.bounds, v)] += 1
        h.sum += v
        h.count += 1
        return result

    def _one(
        self, rs: RuleSet, r: Rule | None, key: str | None, descriptors: Sequence[Sequence[Entry]], cost: int
    ) -> tuple[Rule, Decision] | CheckResult:
        """check_fast's one descriptor, matched to ``r`` (its store key ``key``)."""
        if r is None or r.limit is None or key is None:
            return CheckResult(OK, [DescriptorStatus(OK, r)])
        mem = self._mem
        assert mem is not None
        dec = mem.hit_sync(key, r.limit, cost)
        if not dec.allowed:
            return self._evaluate(rs, descriptors, (r,), ((dec, SRC_STORE),), (cost,))
        stats = r.stats
        stats.hits += cost
        stats.within += cost
        near = dec.remaining <= r.near_threshold
        if near:  # the hits past the threshold, as Lyft counts them
            n = r.near_threshold - dec.remaining + 1
            stats.near += cost if cost < n else n
        if r.steps is not None:
            _count_value(rs.value_stats(r, descriptors[0]), cost, True, stats_near(r, dec, cost), False)
        if not r.shadow and dec.delay <= 0.0:
            return r, dec
        st = DescriptorStatus(OK, r, dec, False, near, SRC_STORE)
        return CheckResult(OK, [st]) if r.shadow else CheckResult(OK, [st], st, dec.delay)

    async def check(self, req: CheckRequest) -> CheckResult:
        """Decide one request: every descriptor that matches a rule is charged its
        cost; see the module doc for how the answer is combined."""
        if self._mem is not None:
            return self.check_nowait(req)
        t0 = _perf()
        rs = self.rules
        if req.domain != rs.domain:
            other = rs.domains.get(req.domain)
            if other is None:
                return CheckResult(OK, [DescriptorStatus(OK) for _ in req.descriptors])
            rs = other
        descs = req.descriptors
        costs = req.costs
        if not descs:  # no descriptor (an action's input missing): nothing to limit
            self.stats.no_descriptor += 1
            return CheckResult(OK, [])
        rules = self._rules_of(rs, req)
        pending = [
            (i, r, r.limit, rs.store_key(r, d), costs[i])
            for i, (d, r) in enumerate(zip(descs, rules))
            if r is not None and r.limit is not None
        ]
        decided: list[Any] = [None] * len(rules)
        if len(pending) == 1:
            i, r, lim, k, c = pending[0]
            decided[i] = await self._hit(k, r, lim, c)
        elif pending:
            res = await asyncio.gather(*[self._hit(k, r, lim, c) for _, r, lim, k, c in pending])
            for (i, _, _, _, _), dr in zip(pending, res):
                decided[i] = dr
        result = self._evaluate(rs, descs, rules, decided, costs)
        self.stats.latency.observe(_perf() - t0)
        return result

    def _evaluate(self, rs: RuleSet, descriptors, rules, decided, costs: Sequence[int]) -> CheckResult:
        """Statuses, per-rule counters, the overall code and the reported status."""
        statuses: list[DescriptorStatus] = []
        ok_report: DescriptorStatus | None = None  # the allowed enforced status with the fewest remaining
        deny_report: DescriptorStatus | None = None  # the enforced denial with the longest retry_after
        quota_report: DescriptorStatus | None = None  # the same among quota_mode denials
        deny_ra = quota_ra = -1.0  # their retry_after (every decision's is >= 0: the first denial wins)
        over = 0  # enforced denials that make the answer OVER_LIMIT
        quotas = quota_over = 0  # quota descriptors, and those over their limit
        all_quota = rs.quota_mode
        delay = 0.0
        for d, rule, dd, cost in zip(descriptors, rules, decided, costs):
            if dd is None:
                statuses.append(DescriptorStatus(OK, rule))
                if all_quota and (rule is None or not rule.unlimited):  # as Lyft counts them: passed
                    quotas += 1
                continue
            dec, src = dd
            stats = rule.stats
            stats.hits += cost
            quota = all_quota or rule.quota
            quotas += quota
            vs = rs.value_stats(rule, d) if rule.steps is not None else None
            if dec is None:  # on_store_failure: open
                stats.within += cost
                if vs is not None:
                    _count_value(vs, cost, True, 0, False)
                statuses.append(DescriptorStatus(OK, rule, None, False, False, src))
                continue
            if dec.allowed:
                stats.within += cost
                near_hits = rule.near_threshold - dec.remaining + 1  # past the threshold (Lyft's near_limit)
                near = near_hits > 0
                if near:
                    if near_hits > cost:
                        near_hits = cost
                    stats.near += near_hits
                if vs is not None:
                    _count_value(vs, cost, True, near_hits if near else 0, False)
                st = DescriptorStatus(OK, rule, dec, False, near, src)
                statuses.append(st)
                if rule.shadow:
                    continue
                if dec.delay > delay:
                    delay = dec.delay
                if ok_report is None:
                    ok_report = st
                else:
                    rd = ok_report.decision
                    assert rd is not None  # a reported status always carries its decision
                    if dec.remaining < rd.remaining or (dec.remaining == rd.remaining and dec.limit < rd.limit):
                        ok_report = st
                continue
            stats.over += cost
            if vs is not None:
                _count_value(vs, cost, False, 0, rule.shadow)
            if rule.shadow:
                stats.shadow += cost
                self._log_rule("shadow", rule, d, dec)
                statuses.append(DescriptorStatus(OK, rule, dec, True, False, src))
                continue
            self._log_rule("over", rule, d, dec)
            self.stats.denied.add((rule.name, descriptor_text(d, self.show_values)), cost)
            if self.on_over is not None:
                self.on_over(rule, d)
            st = DescriptorStatus(OVER_LIMIT, rule, dec, False, False, src)
            statuses.append(st)
            if quota:
                quota_over += 1
                if dec.retry_after > quota_ra:
                    quota_report, quota_ra = st, dec.retry_after
            else:
                over += 1
                if dec.retry_after > deny_ra:
                    deny_report, deny_ra = st, dec.retry_after
        if not answer_over(over, quotas, quota_over):
            return CheckResult(OK, statuses, ok_report, delay)
        code, report = OVER_LIMIT, deny_report if over else quota_report
        if rs.shadow_mode:  # Lyft's SHADOW_MODE: every status as decided, the answer OK
            self.stats.global_shadow += 1
            return CheckResult(OK, statuses, ok_report, delay)
        return CheckResult(code, statuses, report, 0.0)

    # -- store access with the breaker ------------------------------------------

    async def _hit(self, key: str, rule: Rule, limit: Limit, cost: int) -> tuple[Decision | None, str]:
        if rule.max_keys is not None:
            kb = self._key_budgets.get(rule)
            if kb is not None and not kb.admit(key, self._clock()):
                return self._over_key_budget(key, rule, limit, cost, kb)
        leasing = self._leasing if rule.lease else None
        if leasing is not None and leasing.leases:  # a hot key's lease answers without the store (and
            # while it is down); no lease held at all: no from_lease call per cold decision (an
            # attribute read: the holds_leases property is a call, ~700 instructions)
            dec = leasing.from_lease(key, limit, cost)
            if dec is not None:
                return dec, SRC_STORE
        part = self._breaker_of
        b = self._breaker if part is None else self._part(part(key, limit))
        probe = False
        if b.down_until:
            if self._clock() < b.down_until or b.probing:
                return self._fallback(key, limit, cost, b)
            b.probing = probe = True
        try:
            if leasing is not None:
                dec = await leasing.hit_leasing(key, limit, cost)
            else:
                dec = await self.store.hit(key, limit, cost)
        except Exception as exc:  # a StoreError, or a store's bug
            if trips(exc):  # the store (or this part of it) is sick: open its breaker
                self._failed(exc, b)
                return self._fallback(key, limit, cost, b)
            # an error about this one call (a script error, a reply the store refused):
            # this decision follows on_store_failure, the store stays in use for the others
            self._request_failed(exc, key)
            if b.down_until:  # the store answered: it is up
                self._recovered(b)
            return self._fallback(key, limit, cost, b, counted=False)
        finally:
            if probe:
                b.probing = False
        if b.down_until:
            self._recovered(b)
        return dec, SRC_STORE

    def _part(self, part: Any) -> Breaker:
        """The breaker of one part of the store (a cluster's primary), made on first use.
        Bounded: past MAX_BREAKERS parts the closed ones are forgotten (a cluster has a
        few primaries; old ones pile up only across many failovers)."""
        b = self._breakers.get(part)
        if b is None:
            if len(self._breakers) >= MAX_BREAKERS:
                self._breakers = {k: v for k, v in self._breakers.items() if v.down_until}
            b = self._breakers[part] = Breaker(part)
        return b

    def _fallback(
        self, key: str, limit: Limit, cost: int, b: Breaker | None = None, counted: bool = True
    ) -> tuple[Decision | None, str]:
        mode = self.on_store_failure
        if counted and b is not None:  # a decision made while a breaker is open
            b.fallbacks += 1
            self.stats.fallbacks[mode] += 1
        if mode == "local":
            assert self.local is not None  # made in __init__ when the primary is not in-process
            return self.local.hit_sync(key, limit, cost), SRC_LOCAL
        if mode == "open":
            return None, SRC_OPEN
        ri = self.retry_interval
        return Decision(False, limit.capacity, 0, ri, ri), SRC_CLOSED

    def _failed(self, exc: BaseException, b: Breaker) -> None:
        now = self._clock()
        reason = failure_reason(exc)
        self.stats.store_errors[reason] += 1
        if not b.down_until:
            b.down_since = now
            b.fallbacks = 0
        b.down_until = now + self.retry_interval
        held = self._fail_log.due("store" if b.part is None else f"store {b.part}")
        if held >= 0:
            what = {
                "local": "deciding with the local in-memory store",
                "open": "allowing every request",
                "closed": "denying every limited request",
            }[self.on_store_failure]
            if b.part is not None:
                what += f" for the keys on {b.part} (the others go on)"
            msg = exc.args[0] if isinstance(exc, StoreError) and exc.args else repr(exc)
            log.warning(
                "store failure (%s): %s; %s (on_store_failure: %s), retrying every %gs%s",
                reason,
                msg,
                what,
                self.on_store_failure,
                self.retry_interval,
                f"; {held} more failures since the last report" if held else "",
                extra={"reason": reason},
            )

    def _over_key_budget(
        self, key: str, rule: Rule, limit: Limit, cost: int, kb: KeyBudget
    ) -> tuple[Decision | None, str]:
        """A new key beyond the rule's ``max_keys`` on the shared store this period:
        decided as on_store_failure says, counted, logged once per interval."""
        k = (rule.domain, rule.name)
        over = self.stats.over_key_budget
        over[k] = over.get(k, 0) + 1
        held = self._evict_log.due("redis|" + rule.path)
        if held >= 0:
            log.warning(
                "rule %r (domain %s) wrote its max_keys of %d new keys to the shared store in this %gs period: "
                "its further new keys are decided as on_store_failure says (%s), not written%s",
                rule.name,
                rule.domain,
                kb.max_keys,
                kb.period,
                self.on_store_failure,
                f"; {held} more since the last report" if held else "",
            )
        return self._fallback(key, limit, cost, counted=False)

    def _request_failed(self, exc: BaseException, key: str) -> None:
        """A store error caused by one call, not by the store's health: counted
        (``netlimit_http_store_request_errors``) and logged at most once per log
        interval; the breaker is left as it is."""
        self.stats.request_errors += 1
        held = self._fail_log.due("request")
        if held >= 0:
            msg = exc.args[0] if isinstance(exc, StoreError) and exc.args else repr(exc)
            log.warning(
                "the store refused one decision (%s) for %.200r; that decision follows on_store_failure (%s), "
                "the store stays in use%s",
                str(msg)[:300],
                key,
                self.on_store_failure,
                f"; {held} more since the last report" if held else "",
            )

    def _recovered(self, b: Breaker) -> None:
        down_for = self._clock() - b.down_since
        log.warning(
            "store%s is back after %.1fs; %d decisions were made without it (on_store_failure: %s)",
            "" if b.part is None else f" {b.part}",
            down_for,
            b.fallbacks,
            self.on_store_failure,
        )
        b.down_until = 0.0
        b.fallbacks = 0

    def _log_rule(self, kind: str, rule: Rule, entries, dec: Decision) -> None:
        held = self._rule_log.due(kind + "|" + rule.path)
        if held < 0:
            return
        desc = ", ".join(f"{k}={shown_value(k, v, self.show_values)!r}" for k, v in entries)
        more = f"; {held} more since the last report" if held else ""
        fields = {"rule": rule.name, "domain": rule.domain, "descriptor": dict(entries)}
        client = next((v for k, v in entries if k == "remote_address"), None)
        if client is not None:
            fields["client"] = client
        if kind == "shadow":
            log.info(
                "shadow_mode rule %r (domain %s, %s) would have limited %s, retry after %.3gs%s",
                rule.name,
                rule.domain,
                rule.description,
                desc,
                dec.retry_after,
                more,
                extra=fields,
            )
        else:
            log.info(
                "rule %r (domain %s, %s) over limit for %s, retry after %.3gs%s",
                rule.name,
                rule.domain,
                rule.description,
                desc,
                dec.retry_after,
                more,
                extra=fields,
            )


#: the rule label of the limit overrides' budgets (metrics, log)
OVERRIDES = "(overrides)"


def rule_budgets(rules: RuleSet) -> tuple[dict[str, int], int, dict[str, tuple[str, str]]]:
    """The memory budgets of a rule set: ``({limit namespace: most states},
    the share of every other limit (the overrides'), {namespace: (domain, rule)})``.
    A rule's descriptor may set its own ``max_keys``; the rules without one and
    the overrides split ``http.max_keys`` evenly (at least 1 each)."""
    cfg = rules.config
    total = cfg.max_keys if cfg is not None else 100_000
    own: dict[str, int] = {}
    shared: set[str] = set()
    names: dict[str, tuple[str, str]] = {}
    for r in rules.all_rules:
        lim = r.limit
        if lim is None:
            continue
        ns = lim._ns
        names.setdefault(ns, (r.domain, r.name))
        if r.max_keys is not None:
            own[ns] = own.get(ns, 0) + r.max_keys
        else:
            shared.add(ns)
    shared -= own.keys()
    share = max(1, total // (len(shared) + 1))  # + 1: the overrides
    budgets = dict.fromkeys(shared, share)
    budgets.update(own)
    return budgets, share, names
