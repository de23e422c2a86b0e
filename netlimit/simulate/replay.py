"""Replay requests through a rules file with the sidecar's engine, in log time.

Each request goes the way the sidecar takes it: :class:`ActionPlan` makes its
descriptors, :meth:`RuleSet.match` finds each one's rule (``replaces`` applied
as :class:`Limiter` applies it), :meth:`RuleSet.store_key` names its counter and
:meth:`MemoryStore.hit_sync` decides, with the request's logged time as
``now`` and the file's ``max_keys`` (so the store forgets what the sidecar's
would).  ``tests/simulate`` holds the result to ``Limiter.check_nowait`` on a
store whose clock is set per line.

Around that, per rule and per counter key ("client": the descriptor's values,
e.g. one address), it gathers:

* requests, denials (and leaky-bucket delays), per key and over time (a
  timeline whose bucket width doubles whenever it would exceed
  :data:`MAX_BUCKETS`);
* each key's **peak**: the most requests it made in any window ``(t - period, t]``
  -- exactly what a sliding-window-log limit compares with its limit, so a
  key is ever denied by ``sliding_window_log`` at limit L iff its peak > L;
* what the same limit does under each of the five algorithms, with the pure
  functions of :mod:`netlimit.limit.algorithms`.  That would be five more
  decisions per request; instead a key's requests are cut into *sessions*
  separated by gaps long enough for every algorithm's state to be idle (it
  then decides exactly like no state).  A session of at most ``K = min(limit,
  bucket capacities)`` requests is admitted whole by every algorithm (no window
  holds more than K, a full bucket holds K), so only its timestamps are kept
  (at most K); when a session grows past K the five states are built by
  replaying them, and the key is decided five times per request until it goes
  idle again.  Quiet keys -- nearly all of them -- cost a list append.

Memory: the store holds state per active key (bounded by ``max_keys``); the
figures hold a small record per distinct key (at most ``max_clients`` per rule;
beyond that, requests are counted but not attributed) and a timestamp per
request of a key's current window or session.
"""

from __future__ import annotations

import math
import time
from bisect import insort
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

from ..config.validate import Loaded
from ..limit.actions import ActionPlan, path_of_uri
from ..limit.algorithms import ALGORITHMS, DECIDERS, REGISTRY, Limit, is_idle
from ..limit.rules import Rule, RuleSet, from_loaded
from ..limit.stores import MemoryStore
from .logs import MAX_LINE, OVERLONG, Needs, OpenLog

#: the timeline's bucket width doubles past this many buckets
MAX_BUCKETS = 2048
#: unreadable lines kept as examples
MAX_EXAMPLES = 5
#: offenders per rule whose timelines are kept (the most denied ones are drawn)
MAX_OFFENDER_TIMELINES = 256
#: distinct descriptors (or paths) cached between a request's fields and its counters
CACHE_MAX = 200_000
#: the longest window a key's peak is measured over, in requests (a peak beyond it is reported as this)
PEAK_CAP = 1 << 20
#: the percentiles of the per-key peaks
PERCENTILES = (50.0, 90.0, 99.0, 99.9)


# --------------------------------------------------------------------------- results


@dataclass
class Unreadable:
    """One line that is not a request: where, why, and its beginning."""

    file: str
    line: int
    reason: str
    text: str

    def __str__(self) -> str:
        return f"{self.file}:{self.line}: {self.reason}: {self.text!r}"


@dataclass
class Client:
    """One counter key of a rule (its descriptor's values)."""

    key: str
    requests: int
    denied: int
    peak: int  # most requests in one period


@dataclass
class AlgorithmResult:
    """What one algorithm, at the rule's limit, would have done."""

    algorithm: str
    denied: int
    clients_denied: int
    configured: bool
    #: clients it denied although they never exceeded the limit in any window of one period
    #: (a bucket smaller than the limit, the sliding counter's estimate)
    within_denied: int = 0
    burst: int | None = None
    delay: bool = False


@dataclass
class Timeline:
    """Requests per bucket: ``admitted[i]``, ``denied[i]`` in ``[start + i*width, start + (i+1)*width)``."""

    start: float
    width: float
    admitted: list[int]
    denied: list[int]


@dataclass
class Offender:
    client: Client
    #: its requests per bucket of the rule's timeline width, from its first denied session
    timeline: Timeline | None


@dataclass
class RuleResult:
    name: str
    path: str
    keys: tuple[str, ...]
    description: str
    algorithm: str
    unit: str
    requests_per_unit: int
    period: float
    burst: int | None
    shadow: bool
    unlimited: bool
    requests: int = 0
    denied: int = 0
    delayed: int = 0
    clients: int = 0
    clients_denied: int = 0
    #: requests of keys beyond max_clients (counted, not attributed)
    untracked: int = 0
    peaks: dict[str, int] = field(default_factory=dict)
    #: (peak, how many keys had it), ascending: the whole distribution, compactly
    peak_counts: list[tuple[int, int]] = field(default_factory=list)
    top: list[Client] = field(default_factory=list)
    compare: list[AlgorithmResult] = field(default_factory=list)
    timeline: Timeline | None = None
    offenders: list[Offender] = field(default_factory=list)

    @property
    def denied_pct(self) -> float:
        return 100.0 * self.denied / self.requests if self.requests else 0.0


@dataclass
class SimResult:
    config: str
    files: list[str]
    formats: list[str]
    lines: int = 0
    requests: int = 0
    unreadable: int = 0
    examples: list[Unreadable] = field(default_factory=list)
    first: float | None = None
    last: float | None = None
    #: requests an enforced (non-shadow) rule denied
    denied: int = 0
    #: requests no rule matched
    unmatched: int = 0
    #: states the memory store dropped because it was full (as the sidecar's would)
    evictions: int = 0
    rules: list[RuleResult] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)
    seconds: float = 0.0


# --------------------------------------------------------------------------- per rule, per key


class KeyStats:
    """One counter key of one rule."""

    __slots__ = ("text", "n", "d", "peak", "last", "sess", "w", "wi", "st", "cmask", "tl")

    def __init__(self, text: str, t: float):
        self.text = text
        self.n = 0
        self.d = 0
        self.peak = 1  # made with its first request
        self.last = t
        #: the current session's timestamps while it is quiet (<= K of them); None while active
        self.sess: list[float] | None = []
        #: while active: the timestamps of the last period (from index wi)
        self.w: list[float] | None = None
        self.wi = 0
        #: while active: the five algorithms' states
        self.st: list[Any] | None = None
        #: bit j set: algorithm j denied this key at least once
        self.cmask = 0
        #: bucket -> [admitted, denied] from the first active session on (offenders' timelines)
        self.tl: dict[int, list[int]] | None = None


def _peak_of(ts: list[float], period: float) -> int:
    """The most timestamps in one window ``(t - period, t]`` (two pointers)."""
    if len(ts) < 2:
        return len(ts)
    ts = sorted(ts)
    best = 1
    i = 0
    for j, t in enumerate(ts):
        lo = t - period
        while ts[i] <= lo:
            i += 1
        if j - i + 1 > best:
            best = j - i + 1
    return best


class RuleTrack:
    """Everything gathered for one rule."""

    __slots__ = (
        "rule",
        "limit",
        "shadow",
        "max_clients",
        "keys",
        "untracked",
        "delayed",
        "ca",
        "cd",
        "tl",
        "timelined",
        "offenders",
        "width",
        "T",
        "cmp",
        "cden",
        "K",
        "G",
    )

    def __init__(self, rule: Rule, max_clients: int):
        self.rule = rule
        self.limit: Limit | None = rule.limit
        self.shadow = rule.shadow
        self.max_clients = max_clients
        self.keys: dict[str, KeyStats] = {}
        self.untracked = 0
        self.delayed = 0
        self.ca = 0  # admitted in the current timeline bucket
        self.cd = 0  # denied in the current timeline bucket
        self.tl: dict[int, list[int]] = {}
        #: keys with a timeline: offenders, and keys in an active session (one may become one)
        self.timelined: set[KeyStats] = set()
        self.offenders: list[KeyStats] = []
        #: the replay's current timeline bucket width (set by Replay)
        self.width = 1.0
        lim = self.limit
        self.T = lim.period if lim is not None else 1.0
        self.cmp: list[tuple[str, Limit, Callable[..., Any]]] = []
        self.cden = [0] * len(ALGORITHMS)
        self.K = 0
        self.G = math.inf
        if lim is not None:
            burst = lim.burst
            for alg in ALGORITHMS:
                bucket = REGISTRY[alg].bucket
                lm = Limit(
                    algorithm=alg,
                    limit=lim.limit,
                    period=lim.period,
                    burst=burst if bucket else None,
                    delay=lim.delay if alg == lim.algorithm else False,
                    name=f"{rule.name} (simulate: {alg})",
                )
                self.cmp.append((alg, lm, DECIDERS[alg]))
            caps = [lm.capacity for _, lm, _ in self.cmp]
            # quiet sessions: at most K requests are admitted by every algorithm from idle
            self.K = min([lim.limit, *caps])
            # a gap this long leaves every state idle (buckets refilled from empty,
            # both sliding windows past); the margin keeps float rounding out of it
            if lim.limit > 0:
                refill = max(caps) * lim.period / lim.limit
                self.G = max(2 * lim.period, refill) * (1 + 1e-9) + 1e-6
            else:
                self.G = 2 * lim.period * (1 + 1e-9) + 1e-6

    def new_key(self, skey: str, text: str, t: float) -> KeyStats | None:
        if len(self.keys) >= self.max_clients:
            return None
        rec = self.keys[skey] = KeyStats(text, t)
        return rec

    # -- sessions ---------------------------------------------------------------

    def close_session(self, rec: KeyStats) -> None:
        """The key went quiet: fold the session into its peak."""
        s = rec.sess
        if s:
            p = _peak_of(s, self.T) if len(s) > 1 else 1
            if p > rec.peak:
                rec.peak = p

    def activate(self, rec: KeyStats, now: float) -> None:
        """A session outgrew K: build the five states from its timestamps, in the order they came."""
        s = rec.sess
        assert s is not None
        st: list[Any] = [None] * len(self.cmp)
        cden = self.cden
        for t in s:
            for j, (_, lm, fn) in enumerate(self.cmp):
                d, st[j] = fn(lm, st[j], t, 1)
                if not d.allowed:
                    cden[j] += 1
                    rec.cmask |= 1 << j
        rec.st = st
        if rec.tl is None and len(self.timelined) < MAX_OFFENDER_TIMELINES:
            # a timeline in case the key is denied in this session (dropped if not):
            # this session so far, without the request being decided now (the caller adds it)
            w = self.width
            tl: dict[int, list[int]] = {}
            for x in s:
                b = int(x // w)
                cell = tl.get(b)
                if cell is None:
                    tl[b] = [1, 0]
                else:
                    cell[0] += 1
            tl[int(now // w)][0] -= 1
            rec.tl = tl
            self.timelined.add(rec)
        p = _peak_of(s, self.T)
        if p > rec.peak:
            rec.peak = p
        lo = max(s) - self.T
        rec.w = sorted(x for x in s if x > lo)
        rec.wi = 0
        rec.sess = None

    def all_idle(self, rec: KeyStats, now: float) -> bool:
        st = rec.st
        assert st is not None
        return all(is_idle(lm, st[j], now) for j, (_, lm, _) in enumerate(self.cmp))

    def deactivate(self, rec: KeyStats, t: float) -> None:
        if rec.tl is not None and not rec.d:  # never denied: not an offender after all
            rec.tl = None
            self.timelined.discard(rec)
        rec.st = None
        rec.w = None
        rec.wi = 0
        rec.sess = [t]

    def step_active(self, rec: KeyStats, t: float) -> None:
        """One more request of an active key: five decisions and its window."""
        st = rec.st
        assert st is not None
        cden = self.cden
        for j, (_, lm, fn) in enumerate(self.cmp):
            d, st[j] = fn(lm, st[j], t, 1)
            if not d.allowed:
                cden[j] += 1
                rec.cmask |= 1 << j
        w = rec.w
        assert w is not None
        if w and t < w[-1]:
            insort(w, t)
        else:
            w.append(t)
        lo = w[-1] - self.T
        i = rec.wi
        n = len(w)
        while i < n and w[i] <= lo:
            i += 1
        c = n - i
        if c > PEAK_CAP:
            i = n - PEAK_CAP
            c = PEAK_CAP
        if c > rec.peak:
            rec.peak = c
        if i > 32 and i + i > n:
            del w[:i]
            i = 0
        rec.wi = i

    def first_denied(self, rec: KeyStats) -> None:
        """A key is denied for the first time: its timeline (kept since its session
        became active) is an offender's; without one (all slots taken), none."""
        if rec.tl is not None:
            self.offenders.append(rec)


# --------------------------------------------------------------------------- the replay

#: (track, store key, key text, limit, the track's keys, G, K, shadow)
Entry = tuple[RuleTrack, str, str, Limit | None, dict[str, KeyStats], float, int, bool]


class Replay:
    """Feed it logs (:meth:`feed`), then take the figures (:meth:`result`)."""

    def __init__(self, loaded: Loaded, *, max_clients: int = 500_000, top: int = 10):
        http = loaded.config.http
        self.ruleset: RuleSet = from_loaded(loaded)  # ConfigError when there is no http: section
        assert http is not None
        self.loaded = loaded
        self.plan = ActionPlan(http.actions, http.trusted_proxies)
        self.store = MemoryStore(max_keys=http.max_keys, max_key_length=http.max_key_length)
        self.top = top
        self.tracks: dict[str, RuleTrack] = {r.path: RuleTrack(r, max_clients) for r in self.ruleset.rules}
        plan = self.plan
        headers = set(plan.header_names)
        if plan.needs_remote and plan.trusted:
            headers.add("x-forwarded-for")
        self.needs = Needs(
            peer=plan.needs_remote, request=plan.needs_path or plan.needs_method, headers=frozenset(headers)
        )
        self._header_names = tuple(sorted(headers))
        #: the request fields that decide the descriptors are just the client address
        self._by_peer = not self.needs.request and not headers
        self._cache: dict[Any, tuple[Entry, ...]] = {}
        self._paths: dict[str, str] = {}
        self.lines = 0
        self.requests = 0
        self.unreadable = 0
        self.examples: list[Unreadable] = []
        self.denied = 0
        self.unmatched = 0
        self.first: float | None = None
        self.last: float | None = None
        self.width = 1.0
        self.bidx = 0
        self.bstart = math.inf  # nothing in the current bucket yet
        self.bend = -math.inf
        self.tmin = math.inf  # the span of the timeline (to bucket precision)
        self.tmax = -math.inf
        self.warnings: list[str] = []
        self.files: list[str] = []
        self.formats: list[str] = []
        self._t0 = time.perf_counter()

    # -- descriptors ----------------------------------------------------------------

    def _resolve(self, peer: str, method: str, target: str, headers: Any) -> tuple[Entry, ...]:
        """What each descriptor of a request charges, as the Limiter picks the rules:
        (rule's track, store key, key text) and the track's constants the loop reads."""
        rs = self.ruleset
        path = "/"
        if self.plan.needs_path:
            p = self._paths.get(target)
            if p is None:
                p = path_of_uri(target)
                if len(self._paths) >= CACHE_MAX:
                    self._paths.clear()
                self._paths[target] = p
            path = p
        descs = self.plan.build(peer, method or "GET", path, headers, None)
        rules = [rs.match(d) for d in descs]
        if rs.has_replaces:
            replaced = {name for r in rules if r is not None for name in r.replaces}
            if replaced:
                rules = [None if r is not None and r.name in replaced else r for r in rules]
        out: list[Entry] = []
        for d, r in zip(descs, rules):
            if r is None:
                continue
            text = d[0][1] if len(d) == 1 else ", ".join(v for _, v in d)
            tr = self.tracks[r.path]
            skey = "" if r.limit is None else rs.store_key(r, d)
            out.append((tr, skey, text, tr.limit, tr.keys, tr.G, tr.K, tr.shadow))
        return tuple(out)

    # -- the timeline -----------------------------------------------------------------

    def _bucket(self, t: float) -> None:
        """Close the current timeline bucket and open the one of ``t``."""
        b = self.bidx
        tracks = self.tracks.values()
        if self.bend > self.bstart:
            for tr in tracks:
                if tr.ca or tr.cd:
                    cell = tr.tl.get(b)
                    if cell is None:
                        tr.tl[b] = [tr.ca, tr.cd]
                    else:
                        cell[0] += tr.ca
                        cell[1] += tr.cd
                    tr.ca = tr.cd = 0
        if t < self.tmin:
            self.tmin = t
        if t > self.tmax:
            self.tmax = t
        while (self.tmax - self.tmin) / self.width > MAX_BUCKETS:
            self._coarsen()
        w = self.width
        self.bidx = int(t // w)
        self.bstart = self.bidx * w
        self.bend = self.bstart + w

    def _coarsen(self) -> None:
        """Double the bucket width (every timeline merges pairs of buckets)."""

        def merge(tl: dict[int, list[int]]) -> dict[int, list[int]]:
            out: dict[int, list[int]] = {}
            for k, (a, d) in tl.items():
                cell = out.get(k >> 1)
                if cell is None:
                    out[k >> 1] = [a, d]
                else:
                    cell[0] += a
                    cell[1] += d
            return out

        for tr in self.tracks.values():
            tr.tl = merge(tr.tl)
            for rec in tr.timelined:
                if rec.tl is not None:
                    rec.tl = merge(rec.tl)
        self.width *= 2
        for tr in self.tracks.values():
            tr.width = self.width
        self.bidx >>= 1

    # -- feeding ------------------------------------------------------------------------

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
        hit = self.store.hit_sync
        by_peer = self._by_peer
        names = self._header_names
        needs_method = self.plan.needs_method
        resolve = self._resolve
        requests = 0
        denied_requests = 0
        unmatched = 0
        first = self.first
        last = self.last
        for chunk in log.chunks():
            for line in chunk:
                lineno += 1
                r = parse(line)
                if r.__class__ is str:
                    self._unreadable(label, lineno, r, line)
                    continue
                t = r[0]
                requests += 1
                if t >= self.bend or t < self.bstart:
                    self._bucket(t)
                if first is None or t < first:
                    first = t
                if last is None or t > last:
                    last = t
                if by_peer:
                    ck: Any = r[1]
                else:
                    hd = r[4]
                    ck = (r[1], r[2] if needs_method else "", r[3], *[hd.get(h) for h in names])
                ents = cache.get(ck)
                if ents is None:
                    ents = resolve(r[1], r[2], r[3], r[4])
                    if len(cache) >= CACHE_MAX:
                        cache.clear()
                    cache[ck] = ents
                if not ents:
                    unmatched += 1
                    continue
                req_denied = False
                for tr, skey, text, lim, keys, idle_gap, quiet_max, shadow in ents:
                    if lim is None:  # unlimited: counted, never charged
                        tr.ca += 1
                        continue
                    dec = hit(skey, lim, 1, t)
                    ok = dec.allowed
                    if ok:
                        tr.ca += 1
                        if dec.delay > 0.0:
                            tr.delayed += 1
                    else:
                        tr.cd += 1
                        if not shadow:
                            req_denied = True
                    rec = keys.get(skey)
                    if rec is None:
                        rec = tr.new_key(skey, text, t)
                        if rec is None:
                            tr.untracked += 1
                            continue
                    rec.n += 1
                    # sessions: a quiet key only keeps its timestamps
                    gap = t - rec.last
                    s = rec.sess
                    if s is not None:
                        if gap < idle_gap:
                            s.append(t)
                        elif len(s) == 1:  # one request, then quiet (most keys): peak 1, as it was made
                            s[0] = t
                        else:
                            tr.close_session(rec)
                            s = rec.sess = [t]
                        if len(s) > quiet_max:
                            tr.activate(rec, t)
                    elif gap >= idle_gap and tr.all_idle(rec, t):
                        tr.deactivate(rec, t)
                        if quiet_max < 1:
                            tr.activate(rec, t)
                    else:
                        tr.step_active(rec, t)
                    if gap > 0:
                        rec.last = t
                    if not ok:
                        if not rec.d:
                            tr.first_denied(rec)
                        rec.d += 1
                    tl = rec.tl
                    if tl is not None:
                        b = int(t // tr.width)
                        cell = tl.get(b)
                        if cell is None:
                            tl[b] = [1, 0] if ok else [0, 1]
                        elif ok:
                            cell[0] += 1
                        else:
                            cell[1] += 1
                if req_denied:
                    denied_requests += 1
            if progress is not None:
                progress(log.done())
        self.first = first
        self.last = last
        self.lines += lineno
        self.requests += requests
        self.denied += denied_requests
        self.unmatched += unmatched
        if log.error:
            self.warnings.append(log.error)

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
        if self.bend > self.bstart:
            self._bucket(self.bstart)  # flush the current bucket
        res = SimResult(
            config=self.loaded.path,
            files=list(self.files),
            formats=list(self.formats),
            lines=self.lines,
            requests=self.requests,
            unreadable=self.unreadable,
            examples=list(self.examples),
            first=self.first,
            last=self.last,
            denied=self.denied,
            unmatched=self.unmatched,
            evictions=self.store.evictions,
            warnings=list(self.warnings),
        )
        if self.store.evictions:
            res.warnings.append(
                f"the memory store was full ({self.store.evictions} states dropped, as the sidecar's would with "
                f"http.max_keys = {self.store._max_keys}): raise max_keys if that is not what you want"
            )
        for tr in self.tracks.values():
            res.rules.append(self._rule_result(tr))
        res.seconds = time.perf_counter() - self._t0
        return res

    def _rule_result(self, tr: RuleTrack) -> RuleResult:
        r = tr.rule
        lim = tr.limit
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
        )
        adm = sum(a for a, _ in tr.tl.values())
        den = sum(d for _, d in tr.tl.values())
        rr.requests = adm + den
        rr.denied = den
        rr.delayed = tr.delayed
        rr.untracked = tr.untracked
        recs = list(tr.keys.values())
        for rec in recs:  # close every open session: its peak
            if rec.sess is not None:
                tr.close_session(rec)
        rr.clients = len(recs)
        rr.clients_denied = sum(1 for rec in recs if rec.d)
        peaks = sorted(rec.peak for rec in recs)
        if peaks:
            n = len(peaks)
            for p in PERCENTILES:
                rr.peaks[f"p{p:g}"] = peaks[max(0, math.ceil(p / 100.0 * n) - 1)]
            rr.peaks["max"] = peaks[-1]
            counts: dict[int, int] = {}
            for v in peaks:
                counts[v] = counts.get(v, 0) + 1
            rr.peak_counts = sorted(counts.items())
        denied_recs = sorted((rec for rec in recs if rec.d), key=lambda x: (-x.d, -x.n, x.text))
        rr.top = [Client(rec.text, rec.n, rec.d, rec.peak) for rec in denied_recs[: self.top]]
        if lim is not None:
            for j, (alg, lm, _) in enumerate(tr.cmp):
                hit_by = [rec for rec in recs if rec.cmask >> j & 1]
                rr.compare.append(
                    AlgorithmResult(
                        algorithm=alg,
                        denied=tr.cden[j],
                        clients_denied=len(hit_by),
                        configured=alg == lim.algorithm,
                        within_denied=sum(1 for rec in hit_by if rec.peak <= lim.limit),
                        burst=lm.burst,
                        delay=lm.delay,
                    )
                )
        rr.timeline = _timeline(tr.tl, self.width)
        for rec in denied_recs[: self.top]:
            rr.offenders.append(
                Offender(Client(rec.text, rec.n, rec.d, rec.peak), _timeline(rec.tl, self.width) if rec.tl else None)
            )
        return rr


def _timeline(tl: dict[int, list[int]], width: float) -> Timeline | None:
    if not tl:
        return None
    lo = min(tl)
    hi = max(tl)
    adm = [0] * (hi - lo + 1)
    den = [0] * (hi - lo + 1)
    for k, (a, d) in tl.items():
        adm[k - lo] = a
        den[k - lo] = d
    return Timeline(lo * width, width, adm, den)


def replay_all(
    loaded: Loaded,
    logs: Iterable[tuple[OpenLog, Callable[[str], Any], str]],
    *,
    max_clients: int = 500_000,
    top: int = 10,
    progress: Callable[[int], None] | None = None,
) -> SimResult:
    """Replay ``(open log, parser, format)`` in order; the figures."""
    rp = Replay(loaded, max_clients=max_clients, top=top)
    for log, parse, fmt in logs:
        rp.feed(log, parse, fmt, progress)
    return rp.result()
