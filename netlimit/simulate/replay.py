"""Replay requests through a rules file with the sidecar's engine, in log time.

Each request goes the way the sidecar takes it: :class:`ActionPlan` makes its
descriptors, the engine's :func:`~netlimit.limit.selection.select` picks each
one's rule (matching and ``replaces``: the very function the Limiter calls)
and :meth:`RuleSet.store_key` names its counter; the decision itself -- :meth:`MemoryStore.hit_sync` with the line's
logged time as ``now`` and the file's ``max_keys``, so the store forgets what
the sidecar's would -- is taken where the figures are gathered (figures.py),
in log order.  ``tests/simulate`` holds the result to ``Limiter.check_nowait``
on a store whose clock is set per line.

The descriptors of a request depend only on the fields the actions read, so
they are computed once per distinct combination (bounded cache); a path that
no top-level ``path`` descriptor matches is not told apart from another such
path.  The charged descriptors go to the figures as ``(key id, time, line)`` per
rule in batches -- to a helper process when there are two cores, so parsing and
deciding run side by side.

Memory: a key id per distinct counter key (at most ``max_clients`` per rule;
beyond that, requests are counted but not attributed); the figures' side holds
the store (state per active key, bounded by ``max_keys``) and a small record
per key.
"""

from __future__ import annotations

import math
import os
import time
from collections.abc import Callable
from typing import Any

from ..config.validate import Loaded
from ..limit.actions import ActionPlan, BadAddress
from ..limit.rules import Rule, RuleSet, from_loaded
from ..limit.selection import quota_count, select
from .figures import BatchPart, Figures, FiguresProcess, RuleSpec
from .logs import MAX_LINE, OVERLONG, Needs, OpenLog
from .results import RuleResult, SimResult, Unreadable

#: unreadable lines kept as examples
MAX_EXAMPLES = 5
#: distinct descriptors (or paths) cached between a request's fields and its counters
CACHE_MAX = 200_000
#: seconds a line may be logged earlier than a line above it before the replay says so:
#: logs stamped to the second by several workers step back by one now and then
STEP_BACK = 1.0


class RuleFront:
    """One rule as the replay charges it: its key ids."""

    __slots__ = ("rule", "limit", "index", "ids", "max_clients", "matched")

    def __init__(self, rule: Rule, index: int, max_clients: int):
        self.rule = rule
        self.limit = rule.limit
        self.index = index  # in the figures (rules with a limit), -1 for unlimited rules
        self.ids: dict[str, int] = {}
        self.max_clients = max_clients
        self.matched = 0  # unlimited rules: requests they exempted

    def new_id(self, skey: str, text: str, part: BatchPart) -> int:
        """The id of a new key, or -1 past max_clients (then it is counted, not tracked)."""
        n = len(self.ids)
        if n >= self.max_clients:
            part.untracked.append(skey)
            return -1
        self.ids[skey] = n
        part.new_keys.append((skey, text))
        return n


#: (rule, store key, key text, the rule's key ids, its batch part (None: unlimited),
#: and that part's kids.append, times.append, lines.append)
Entry = tuple[RuleFront, str, str, dict[str, int], BatchPart | None, Any, Any, Any]


class Replay:
    """Feed it logs (:meth:`feed`), then take the figures (:meth:`result`); :meth:`close`
    it (it may hold a helper process).  ``jobs``: 2 runs the figures in a helper
    process, 1 in this one; None: 2 when the machine has two cores or more."""

    def __init__(self, loaded: Loaded, *, max_clients: int = 500_000, top: int = 10, jobs: int | None = None):
        http = loaded.config.http
        self.ruleset: RuleSet = from_loaded(loaded)  # ConfigError when there is no http: section
        assert http is not None
        self.loaded = loaded
        self.plan = ActionPlan.of(http)
        self.fronts: dict[str, RuleFront] = {}
        specs: list[RuleSpec] = []
        self.max_keys = http.max_keys
        for r in self.ruleset.rules:
            idx = -1
            if r.limit is not None:
                idx = len(specs)
                lm = r.limit
                quota = self.ruleset.quota_mode or r.quota
                specs.append(RuleSpec(r.name, lm.algorithm, lm.limit, lm.period, lm.burst, lm.delay, r.shadow, quota))
            self.fronts[r.path] = RuleFront(r, idx, max_clients)
        if jobs is None:
            jobs = 2 if (os.cpu_count() or 1) >= 2 else 1
        store = (specs, top, http.max_keys, http.max_key_length, self.ruleset.shadow_mode)
        self.figures: Figures | FiguresProcess = FiguresProcess(*store) if jobs >= 2 else Figures(*store)
        self.parts = [BatchPart() for _ in specs]
        self.needs = self.needs_of(loaded)
        self._header_names = tuple(sorted(self.needs.headers))
        #: the request fields that decide the descriptors are just the client address
        self._by_peer = not self.needs.request and not self.needs.headers
        self._cache: dict[Any, tuple[Entry, ...]] = {}
        #: Lyft's quota_mode is in the file: each request's number of quota descriptors
        #: (selection.quota_count, by the same cache key), per line of a batch (the lines that have some)
        self._quota_on = self.ruleset.quota_mode or any(r.quota for r in self.ruleset.rules)
        self._nq: dict[Any, int] = {}
        self._last_nq = 0
        self.quotas: dict[int, int] = {}
        self._paths: dict[str, str] = {}
        self._path_gate = _path_gate(http, self.plan)
        self.lines = 0
        self.requests = 0
        self.unreadable = 0
        self.examples: list[Unreadable] = []
        self.unmatched = 0
        self.first = math.inf  # the earliest and latest request times
        self.last = -math.inf
        self.back = 0  # lines logged more than STEP_BACK earlier than the latest above them
        self.back_max = 0.0
        self.back_at = ""  # where the largest step back was (file:line)
        self.warnings: list[str] = []
        self.files: list[str] = []
        self.formats: list[str] = []
        self._t0 = time.perf_counter()

    @staticmethod
    def needs_of(loaded: Loaded) -> Needs:
        """The request fields the file's actions read (what a parser must extract)."""
        http = loaded.config.http
        assert http is not None
        plan = ActionPlan.of(http)
        headers = set(plan.header_names)
        if plan.needs_remote and plan.trusted:
            headers.add("x-forwarded-for")
        return Needs(peer=plan.needs_remote, request=plan.needs_path or plan.needs_method, headers=frozenset(headers))

    def close(self) -> None:
        self.figures.close()

    # -- descriptors ----------------------------------------------------------------

    def _path(self, target: str) -> str:
        """The path the sidecar's actions see for a logged request target (cached)."""
        p = self._paths.get(target)
        if p is None:
            p = self.plan.path_of(target)  # the sidecar's function (http.path_match)
            if len(self._paths) >= CACHE_MAX:
                self._paths.clear()
            self._paths[target] = p
        return p

    def _resolve(self, peer: str, method: str, path: str, headers: Any) -> tuple[Entry, ...]:
        """What each descriptor of a request charges, as the Limiter picks the rules."""
        rs = self.ruleset
        try:
            descs = self.plan.build(peer, method or "GET", path, headers, None)
        except BadAddress:  # the sidecar refuses the request (400): nothing is charged
            return ()
        rules = select(rs, descs)  # the engine's own selection, as every door makes it
        self._last_nq = quota_count(rs, rules) if self._quota_on else 0
        out: list[Entry] = []
        for d, r in zip(descs, rules):
            if r is None:
                continue
            text = d[0][1] if len(d) == 1 else ", ".join(v for _, v in d)
            fr = self.fronts[r.path]
            if r.limit is None:
                out.append((fr, "", text, fr.ids, None, None, None, None))
            else:
                part = self.parts[fr.index]
                skey = rs.store_key(r, d)
                entry = (fr, skey, text, fr.ids, part, part.kids.append, part.times.append, part.lines.append)
                out.append(entry)
        return tuple(out)

    # -- feeding ------------------------------------------------------------------------

    def _flush(self) -> None:
        """The charged descriptors so far to the figures (decided there)."""
        self.figures.add(self.parts, self.quotas or None)
        for part in self.parts:
            part.clear()
        self.quotas = {}

    def feed(
        self,
        log: OpenLog,
        parse: Callable[[str], Any],
        fmt: str,
        progress: Callable[[int], None] | None = None,
    ) -> None:
        """Replay one open log through the rules."""
        label = log.source.label
        self.files.append(label)
        self.formats.append(fmt)
        lineno = 0
        cache = self._cache
        by_peer = self._by_peer
        names = self._header_names
        no_headers = not names
        needs_method = self.plan.needs_method
        needs_path = self.plan.needs_path
        paths = self._paths
        to_path = self._path
        gate = self._path_gate
        resolve = self._resolve
        quota_on = self._quota_on
        nq_of = self._nq
        unreadable0 = self.unreadable
        unmatched = 0
        first = self.first
        last = self.last
        step_back = STEP_BACK
        for chunk in log.chunks():
            for line in chunk:
                lineno += 1
                r = parse(line)
                if r.__class__ is str:
                    self._unreadable(label, lineno, r, line)
                    continue
                t = r[0]
                if t > last:
                    last = t
                elif last - t > step_back:
                    self._stepped_back(last - t, label, lineno)
                if t < first:
                    first = t
                if by_peer:
                    ck: Any = r[1]
                    path = "/"
                else:
                    # the descriptors depend on the normalised path, not on the query string
                    path = "/"
                    kp: str | None = path
                    if needs_path:
                        kp = path = paths.get(r[3]) or to_path(r[3])
                        if gate is not None and path not in gate[0] and not path.startswith(gate[1]):
                            kp = None  # no rule's path: every such path makes the same descriptors match
                    if no_headers:
                        ck = (r[1], r[2] if needs_method else "", kp)
                    else:
                        hd = r[4]
                        ck = (r[1], r[2] if needs_method else "", kp, *[hd.get(h) for h in names])
                ents = cache.get(ck)
                if ents is None:
                    ents = resolve(r[1], r[2], path, r[4])
                    if len(cache) >= CACHE_MAX:
                        cache.clear()
                        nq_of.clear()
                    cache[ck] = ents
                    if quota_on:
                        nq_of[ck] = self._last_nq
                if quota_on:
                    nq = nq_of[ck]
                    if nq:
                        self.quotas[lineno] = nq
                if not ents:
                    unmatched += 1
                    continue
                for fr, skey, text, ids, part, add_kid, add_time, add_line in ents:
                    if part is None:  # unlimited: counted, never charged
                        fr.matched += 1
                        continue
                    kid = ids.get(skey)
                    if kid is None:
                        kid = fr.new_id(skey, text, part)
                    add_kid(kid)
                    add_time(t)
                    add_line(lineno)
            self._flush()
            if progress is not None:
                progress(log.done())
        self.first = first
        self.last = last
        self.lines += lineno
        self.requests += lineno - (self.unreadable - unreadable0)
        self.unmatched += unmatched
        if log.error:
            self.warnings.append(log.error)

    def _stepped_back(self, by: float, label: str, lineno: int) -> None:
        self.back += 1
        if by > self.back_max:
            self.back_max, self.back_at = by, f"{label}:{lineno}"

    def _unreadable(self, label: str, lineno: int, reason: str, line: str) -> None:
        self.unreadable += 1
        if len(self.examples) < MAX_EXAMPLES:
            if line is OVERLONG:
                reason, text = f"longer than {MAX_LINE} characters", ""
            else:
                text = line[:120]
            self.examples.append(Unreadable(label, lineno, reason, text))

    # -- the figures -------------------------------------------------------------------

    def result(self) -> SimResult:
        self._flush()
        out = self.figures.finish()
        figures = out["rules"]
        res = SimResult(
            config=self.loaded.path,
            files=list(self.files),
            formats=list(self.formats),
            lines=self.lines,
            requests=self.requests,
            unreadable=self.unreadable,
            examples=list(self.examples),
            first=self.first if self.requests else None,
            last=self.last if self.requests else None,
            denied=out["denied"],
            unmatched=self.unmatched,
            evictions=out["evictions"],
            warnings=list(self.warnings),
        )
        if self.back:
            # the sidecar's clock never goes back; fed an earlier time, an algorithm keeps
            # its later state (limit/algorithms/__init__.py): never refilled, so it can deny
            # what a replay in time order would admit
            res.warnings.append(
                f"{self.back} request{'s are' if self.back > 1 else ' is'} logged more than {STEP_BACK:g} s earlier "
                f"than a request above {'them' if self.back > 1 else 'it'} (by up to {self.back_max:g} s, at "
                f"{self.back_at}); the replay takes lines in log order and a counter never goes back in time, "
                "so it may deny what a replay in time order would admit: merge or sort the logs by time "
                "(several servers' logs, or a format that stamps when a request began)"
            )
        if res.evictions:
            res.warnings.append(
                f"the memory store was full ({res.evictions} states dropped, as the sidecar's would with "
                f"http.max_keys = {self.max_keys}): raise max_keys if that is not what you want"
            )
        for fr in self.fronts.values():
            r = fr.rule
            lim = fr.limit
            rr = RuleResult(
                name=r.name,
                path=r.path,
                keys=r.keys,
                description=r.description,
                algorithm=r.algorithm or "unlimited",
                unit=r.unit,
                requests_per_unit=r.requests_per_unit,
                period=float(r.period),
                burst=lim.burst if lim is not None else None,
                shadow=r.shadow,
                unlimited=lim is None,
                delayed=out["delayed"][fr.index] if fr.index >= 0 else 0,
            )
            if fr.index < 0:
                rr.requests = fr.matched
            else:
                for k, v in figures[fr.index].items():
                    setattr(rr, k, v)
            res.rules.append(rr)
        res.seconds = time.perf_counter() - self._t0
        return res


def _path_gate(http: Any, plan: ActionPlan) -> tuple[frozenset[str], tuple[str, ...]] | None:
    """(exact paths, path prefixes) of the top-level ``path`` descriptors, when every
    action list that reads the path starts with it and no top-level descriptor takes
    any path: then a path none of them matches makes no descriptor with it match
    (the tree is entered at its first entry), so it need not be told apart in the
    cache.  None when that does not hold."""
    groups = [g for g in http.actions if "path" in g]
    if not groups or any(g[0] != "path" for g in groups):
        return None
    # the values as the rules hold them (http.path_match: RuleSet.build normalizes them)
    values = [plan.rule_value("path", d.value) for d in http.descriptors if d.key == "path"]
    if any(not v or "*" in v.rstrip("*") or v.count("*") > 1 for v in values):
        return None  # a key-only node, or a wildcard that is not a plain prefix
    exact = frozenset(v for v in values if not v.endswith("*"))
    prefixes = tuple(v[:-1] for v in values if v.endswith("*"))
    return exact, prefixes
