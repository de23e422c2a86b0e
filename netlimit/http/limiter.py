"""The limiter core: descriptors in, a decision per descriptor out.

Transport-free on purpose: the HTTP sidecar (app.py) and, later, an Envoy RLS
gRPC front door call the same :meth:`Limiter.check`::

    result = await limiter.check("api", [[("remote_address", "10.0.0.1")],
                                         [("path", "/login"), ("remote_address", "10.0.0.1")]],
                                 cost=1)
    result.code            # OK (1) or OVER_LIMIT (2), Lyft's numbering
    result.statuses        # one DescriptorStatus per descriptor, in order
    result.report          # the most constraining enforced status (for headers)

Semantics
---------
* Every descriptor that matches a rule is charged (also when another one is
  over the limit), as Lyft does; ``replaces`` removes the replaced limits
  first.  ``unlimited`` rules match and are never charged.
* The request is over the limit when any non-shadow rule says so.  The
  reported status is, among the enforced (non-shadow) rules, the denied one
  with the longest ``retry_after``; when all allow, the one with the fewest
  ``remaining`` (then the smallest limit).
* ``shadow_mode`` rules are charged and counted exactly like the others, but
  their denials become OK with ``shadow_over = True``; they never appear in
  ``report`` (clients never see a dark-launched limit) nor delay a request.
* Store failures (:class:`StoreError`, or anything a store raises) open a
  circuit breaker: for ``retry_interval`` seconds decisions skip the primary
  store; then one request probes it, and success closes the breaker.  While
  open, ``on_store_failure`` decides: ``local`` (default) uses a process-local
  :class:`MemoryStore`, ``open`` allows (no decision, no headers), ``closed``
  denies with ``retry_after = retry_interval``.
"""

from __future__ import annotations

import asyncio
import logging
import time
from dataclasses import dataclass
from typing import Any, Callable, Sequence

from .algorithms import Decision
from .rules import Entry, Rule, RuleSet
from .store import MemoryStore, StoreError

log = logging.getLogger("netlimit.sidecar")

# Lyft's RateLimitResponse.Code numbering
UNKNOWN = 0
OK = 1
OVER_LIMIT = 2
CODE_NAMES = {UNKNOWN: "UNKNOWN", OK: "OK", OVER_LIMIT: "OVER_LIMIT"}

# DescriptorStatus.source
SRC_NONE = ""          # no rule matched, or unlimited
SRC_STORE = "store"    # the configured store decided
SRC_LOCAL = "local"    # the local fallback store decided (primary unavailable)
SRC_OPEN = "open"      # primary unavailable, on_store_failure: open
SRC_CLOSED = "closed"  # primary unavailable, on_store_failure: closed


@dataclass(slots=True)
class DescriptorStatus:
    code: int
    rule: Rule | None = None
    decision: Decision | None = None
    shadow_over: bool = False   # over the limit, but the rule is in shadow mode
    near: bool = False          # allowed with >= 80% of the limit used
    source: str = SRC_NONE


@dataclass(slots=True)
class CheckResult:
    code: int
    statuses: list[DescriptorStatus]
    report: DescriptorStatus | None = None
    delay: float = 0.0          # leaky bucket queue mode: hold the request this long

    @property
    def allowed(self) -> bool:
        return self.code != OVER_LIMIT


class Hooks:
    """Metric callbacks; the default does nothing.  metrics.py implements them."""

    def rules_changed(self, rules: RuleSet) -> None: ...

    def rule_hit(self, rule: Rule, cost: int, over: bool, near: bool, shadow_over: bool) -> None:
        """``over``: over the limit (shadow_mode rules too); ``shadow_over``: over, not enforced."""

    def store_error(self, reason: str) -> None: ...

    def fallback(self, mode: str) -> None: ...

    def store_up(self, up: bool) -> None: ...

    def latency(self, seconds: float) -> None: ...


class _LogEvery:
    """At most one log line per key per interval; counts the ones held back."""

    __slots__ = ("interval", "clock", "_next", "_held")

    def __init__(self, interval: float, clock: Callable[[], float]):
        self.interval = interval
        self.clock = clock
        self._next: dict[str, float] = {}
        self._held: dict[str, int] = {}

    def due(self, key: str) -> int:
        """-1 when this event should not be logged; else how many were held back."""
        now = self.clock()
        if now < self._next.get(key, 0.0):
            self._held[key] = self._held.get(key, 0) + 1
            return -1
        if len(self._next) > 10_000:  # keys are rule paths; bounded anyway
            self._next.clear()
            self._held.clear()
        self._next[key] = now + self.interval
        return self._held.pop(key, 0)


def _reason(exc: BaseException) -> str:
    """A bounded label for a store failure: timeout | connection | error."""
    seen = 0
    e: BaseException | None = exc
    while e is not None and seen < 5:
        if isinstance(e, (TimeoutError, asyncio.TimeoutError)) or type(e).__name__ == "TimeoutError":
            return "timeout"
        if isinstance(e, (ConnectionError, OSError)) or type(e).__name__ == "ConnectionError":
            return "connection"
        e = e.__cause__ or e.__context__
        seen += 1
    return "error"


class Limiter:
    """Charge every matching descriptor; report the most constraining.

    ``store`` is the primary store (a :class:`MemoryStore` is called
    synchronously; anything else, e.g. RedisStore, through the breaker).
    ``local`` is the fallback store (created when not given).
    """

    def __init__(self, rules: RuleSet, store: Any = None, *, local: MemoryStore | None = None,
                 on_store_failure: str = "local", hooks: Hooks | None = None,
                 retry_interval: float = 1.0, log_interval: float = 10.0,
                 clock: Callable[[], float] = time.monotonic):
        if on_store_failure not in ("open", "local", "closed"):
            raise ValueError(f"on_store_failure must be open, local or closed, not {on_store_failure!r}")
        self.hooks = hooks if hooks is not None else Hooks()
        cfg = rules.config
        if store is None:
            store = MemoryStore(max_keys=cfg.max_keys if cfg else 100_000,
                                max_key_length=cfg.max_key_length if cfg else 256)
        self.store = store
        self._mem: MemoryStore | None = store if isinstance(store, MemoryStore) else None
        if local is None and self._mem is None:
            local = MemoryStore(max_keys=cfg.max_keys if cfg else 100_000,
                                max_key_length=cfg.max_key_length if cfg else 256)
        self.local = local
        self.on_store_failure = on_store_failure
        self.retry_interval = float(retry_interval)
        self._clock = clock
        self._down_until = 0.0       # breaker open until (clock time); 0 = closed
        self._down_since = 0.0
        self._probing = False
        self._fallbacks = 0          # decisions made without the primary since it went down
        self._fail_log = _LogEvery(log_interval, clock)
        self._rule_log = _LogEvery(log_interval, clock)
        self.rules = rules
        self.hooks.rules_changed(rules)
        self.hooks.store_up(True)

    # -- configuration -------------------------------------------------------

    def set_rules(self, rules: RuleSet, on_store_failure: str | None = None) -> None:
        """Swap the rules (hot reload); one attribute store, so atomic for check()."""
        self.hooks.rules_changed(rules)
        self.rules = rules
        if on_store_failure is not None:
            self.on_store_failure = on_store_failure

    @property
    def store_available(self) -> bool:
        """False while the breaker is open (the primary store is skipped)."""
        return self._down_until == 0.0

    async def close(self) -> None:
        await self.store.close()
        if self.local is not None and self.local is not self.store:
            await self.local.close()

    # -- the decision ----------------------------------------------------------

    async def check(self, domain: str, descriptors: Sequence[Sequence[Entry]], cost: int = 1) -> CheckResult:
        """Decide one request.  ``descriptors`` are lists of (key, value) entries;
        ``cost`` (>= 0) is charged to every matching rule."""
        t0 = time.perf_counter()
        rs = self.rules
        if domain != rs.domain:
            return CheckResult(OK, [DescriptorStatus(OK) for _ in descriptors])
        rules = [rs.match(d) for d in descriptors]
        if rs.has_replaces:
            replaced = {name for r in rules if r is not None for name in r.replaces}
            if replaced:
                rules = [None if r is not None and r.name in replaced else r for r in rules]
        statuses: list[DescriptorStatus] = []
        mem = self._mem
        if mem is not None:
            for d, rule in zip(descriptors, rules):
                if rule is None or rule.limit is None:
                    statuses.append(DescriptorStatus(OK, rule))
                else:
                    statuses.append(self._status(rule, mem.hit_sync(rs.store_key(rule, d), rule.limit, cost),
                                                 SRC_STORE, cost, d))
        else:
            pending = [(i, rule, rs.store_key(rule, d)) for i, (d, rule) in enumerate(zip(descriptors, rules))
                       if rule is not None and rule.limit is not None]
            if len(pending) == 1:
                _, rule, key = pending[0]
                decided = [await self._hit(key, rule, cost)]
            elif pending:
                decided = await asyncio.gather(*[self._hit(key, rule, cost) for _, rule, key in pending])
            else:
                decided = []
            j = 0
            for i, (d, rule) in enumerate(zip(descriptors, rules)):
                if j < len(pending) and pending[j][0] == i:
                    dec, src = decided[j]
                    j += 1
                    statuses.append(self._status(rule, dec, src, cost, d))
                else:
                    statuses.append(DescriptorStatus(OK, rule))
        result = self._combine(statuses)
        self.hooks.latency(time.perf_counter() - t0)
        return result

    def _status(self, rule: Rule, dec: Decision | None, src: str, cost: int, entries) -> DescriptorStatus:
        if dec is None:  # on_store_failure: open
            self.hooks.rule_hit(rule, cost, False, False, False)
            return DescriptorStatus(OK, rule, None, False, False, src)
        if dec.allowed:
            near = dec.remaining <= rule.near_threshold
            self.hooks.rule_hit(rule, cost, False, near, False)
            return DescriptorStatus(OK, rule, dec, False, near, src)
        if rule.shadow:
            self.hooks.rule_hit(rule, cost, True, False, True)
            self._log_rule("shadow", rule, entries, dec)
            return DescriptorStatus(OK, rule, dec, True, False, src)
        self.hooks.rule_hit(rule, cost, True, False, False)
        self._log_rule("over", rule, entries, dec)
        return DescriptorStatus(OVER_LIMIT, rule, dec, False, False, src)

    @staticmethod
    def _combine(statuses: list[DescriptorStatus]) -> CheckResult:
        report: DescriptorStatus | None = None
        code = OK
        delay = 0.0
        for st in statuses:
            dec = st.decision
            if dec is None or st.rule is None or st.rule.shadow:
                continue
            if st.code == OVER_LIMIT:
                if code != OVER_LIMIT or dec.retry_after > report.decision.retry_after:  # type: ignore[union-attr]
                    report = st
                code = OVER_LIMIT
            elif code == OK:
                if dec.delay > delay:
                    delay = dec.delay
                if report is None:
                    report = st
                else:
                    rd = report.decision
                    if dec.remaining < rd.remaining or (dec.remaining == rd.remaining and dec.limit < rd.limit):  # type: ignore[union-attr]
                        report = st
        return CheckResult(code, statuses, report, delay if code == OK else 0.0)

    # -- store access with the breaker ------------------------------------------

    async def _hit(self, key: str, rule: Rule, cost: int) -> tuple[Decision | None, str]:
        probe = False
        if self._down_until:
            if self._clock() < self._down_until or self._probing:
                return self._fallback(key, rule, cost)
            self._probing = probe = True
        try:
            dec = await self.store.hit(key, rule.limit, cost)
        except Exception as exc:  # noqa: BLE001 - StoreError or a store bug: either way the store is sick
            self._failed(exc)
            return self._fallback(key, rule, cost)
        finally:
            if probe:
                self._probing = False
        if self._down_until:
            self._recovered()
        return dec, SRC_STORE

    def _fallback(self, key: str, rule: Rule, cost: int) -> tuple[Decision | None, str]:
        mode = self.on_store_failure
        self._fallbacks += 1
        self.hooks.fallback(mode)
        if mode == "local":
            return self.local.hit_sync(key, rule.limit, cost), SRC_LOCAL  # type: ignore[union-attr]
        if mode == "open":
            return None, SRC_OPEN
        ri = self.retry_interval
        return Decision(False, rule.limit.capacity, 0, ri, ri), SRC_CLOSED  # type: ignore[union-attr]

    def _failed(self, exc: BaseException) -> None:
        now = self._clock()
        reason = _reason(exc)
        self.hooks.store_error(reason)
        if not self._down_until:
            self._down_since = now
            self._fallbacks = 0
            self.hooks.store_up(False)
        self._down_until = now + self.retry_interval
        held = self._fail_log.due("store")
        if held >= 0:
            what = {"local": "deciding with the local in-memory store",
                    "open": "allowing every request",
                    "closed": "denying every limited request"}[self.on_store_failure]
            msg = exc.args[0] if isinstance(exc, StoreError) and exc.args else repr(exc)
            log.warning("store failure (%s): %s; %s (on_store_failure: %s), retrying every %gs%s",
                        reason, msg, what, self.on_store_failure, self.retry_interval,
                        f"; {held} more failures since the last report" if held else "")

    def _recovered(self) -> None:
        down_for = self._clock() - self._down_since
        log.warning("store is back after %.1fs; %d decisions were made without it (on_store_failure: %s)",
                    down_for, self._fallbacks, self.on_store_failure)
        self._down_until = 0.0
        self._fallbacks = 0
        self.hooks.store_up(True)

    def _log_rule(self, kind: str, rule: Rule, entries, dec: Decision) -> None:
        held = self._rule_log.due(kind + "|" + rule.path)
        if held < 0:
            return
        desc = ", ".join(f"{k}={v!r}" for k, v in entries)
        more = f"; {held} more since the last report" if held else ""
        if kind == "shadow":
            log.info("shadow_mode rule %r (domain %s, %s) would have limited %s, retry after %.3gs%s",
                     rule.name, rule.domain, rule.description, desc, dec.retry_after, more)
        else:
            log.info("rule %r (domain %s, %s) over limit for %s, retry after %.3gs%s",
                     rule.name, rule.domain, rule.description, desc, dec.retry_after, more)
