"""The decisions, and the per-client figures of every rule.

The replay (replay.py) sends, per batch of log lines and per rule, each
charged descriptor as ``(key id, time, line)`` in log order; :class:`Figures`
decides it with the engine (the rule's Limit on a MemoryStore, the time as
``now``; the rules' decisions are independent of each other, as in the
Limiter), counts the lines an enforced rule denied, and turns the decisions
into what report.py shows:

* requests and denials over time (a timeline whose bucket width doubles
  whenever the log's span would need more than :data:`MAX_BUCKETS`);
* per key ("client": the descriptor's values): requests, denials and its
  **peak** -- the most requests it made in any window ``(t - period, t]``,
  exactly what a sliding-window-log limit compares with its limit, so a key
  is ever denied by ``sliding_window_log`` at limit L iff its peak > L;
* what the same limit does under each of the five algorithms, with the
  engine's own functions.  That would be four more decisions per request;
  instead a key's requests are cut into *sessions* separated by gaps long
  enough for every algorithm's state to be idle (it then decides exactly like
  no state).  A session of at most ``K = min(limit, bucket capacities)``
  requests is admitted whole by every algorithm (no window holds more than
  K, a full bucket holds K), so only its timestamps are kept (at most K);
  when a session grows past K the states are built by replaying them, and
  the key is decided by each algorithm until it goes idle again.  The
  configured algorithm's answers are the replay's own, and a leaky bucket in
  meter mode is the token bucket of its size (one function): at most three
  run here.  ``tests/simulate`` holds all of it to running the pure functions
  over every key's whole history.

:class:`FiguresProcess` runs the same in a forked helper process fed through
a pipe (bounded: the replay waits when the helper lags), so reading and
parsing, and deciding and counting, use two cores.
"""

from __future__ import annotations

import math
import multiprocessing
import pickle
import signal
import traceback
from array import array
from bisect import insort
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from ..limit.algorithms import CONFIG_ALGORITHMS as ALGORITHMS
from ..limit.algorithms import DECIDERS, REGISTRY, Limit, is_idle
from ..limit.selection import answer_over
from ..limit.stores import MemoryStore
from .results import AlgorithmResult, Client, Offender, Timeline

#: the timeline's bucket width doubles past this many buckets
MAX_BUCKETS = 2048
#: keys per rule whose timelines are kept (the most denied ones are drawn)
MAX_OFFENDER_TIMELINES = 256
#: the longest window a key's peak is measured over, in requests (a peak beyond it is reported as this)
PEAK_CAP = 1 << 20
#: the percentiles of the per-key peaks
PERCENTILES = (50.0, 90.0, 99.0, 99.9)


@dataclass(frozen=True)
class RuleSpec:
    """What the figures need of one rule (plain data: it crosses to the helper)."""

    name: str
    algorithm: str
    limit: int
    period: float
    burst: int | None
    delay: bool
    shadow: bool = False
    #: a quota descriptor's rule (Lyft's quota_mode): its denial alone does not deny the request
    quota: bool = False


class KeyStats:
    """One counter key of one rule."""

    __slots__ = ("text", "n", "d", "peak", "last", "sess", "w", "wi", "st", "cmask", "tl")

    def __init__(self, text: str):
        self.text = text
        self.n = 0
        self.d = 0
        self.peak = 1  # made with its first request
        self.last = -math.inf
        #: the current session's timestamps while it is quiet (<= K of them); None while active
        self.sess: list[float] | None = []
        #: while active: the timestamps of the last period (from index wi)
        self.w: list[float] | None = None
        self.wi = 0
        #: while active: the states of the algorithms run here
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
    if ts[-1] - ts[0] < period:
        return len(ts)
    best = 1
    i = 0
    for j, t in enumerate(ts):
        lo = t - period
        while ts[i] <= lo:
            i += 1
        if j - i + 1 > best:
            best = j - i + 1
    return best


class RuleFigures:
    """Everything gathered for one rule."""

    def __init__(self, spec: RuleSpec):
        self.spec = spec
        # the rule's Limit as the engine builds it (netlimit.limit.rules: equal fields, equal Limit)
        self.limit = Limit(spec.algorithm, spec.limit, spec.period, spec.burst, spec.delay, spec.name)
        self.skeys: list[str] = []  # store key by key id
        self.recs: list[KeyStats] = []
        self.untracked = 0
        self.delayed = 0  # leaky bucket queue mode: admitted with a delay
        self.tl: dict[int, list[int]] = {}
        #: keys with a timeline: offenders, and keys in an active session (one may become one)
        self.timelined: set[KeyStats] = set()
        self.T = spec.period
        #: the five algorithms at the rule's limit
        self.cmp: list[tuple[str, Limit]] = []
        #: the ones decided here: (decide function, Limit, the indexes into cmp it answers for);
        #: the configured algorithm is the replay's own decision (``main``), and a meter-mode
        #: leaky bucket is the token bucket of the same size (one function, the same numbers)
        self.run: list[tuple[Callable[..., Any], Limit, tuple[int, ...]]] = []
        self.main: tuple[int, ...] = ()
        self.main_mask = 0
        # the five a file can name, and the rule's own engine algorithm where it is another
        # (fixed_window with count_denied: false runs fixed_window_admitted)
        algs = ALGORITHMS if spec.algorithm in ALGORITHMS else (*ALGORITHMS, spec.algorithm)
        self.cden = [0] * len(algs)
        for alg in algs:
            bucket = REGISTRY[alg].bucket
            lm = Limit(
                algorithm=alg,
                limit=spec.limit,
                period=spec.period,
                burst=spec.burst if bucket else None,
                delay=spec.delay if alg == spec.algorithm else False,
                name=f"{spec.name} (simulate: {alg})",
            )
            self.cmp.append((alg, lm))
        groups: dict[Any, list[int]] = {}
        for j, (alg, lm) in enumerate(self.cmp):
            # equal signatures decide alike: the buckets in meter mode with one capacity
            sig = ("bucket" if REGISTRY[alg].bucket and not lm.delay else alg, lm.capacity)
            groups.setdefault(sig, []).append(j)
        j0 = algs.index(spec.algorithm)
        for js in groups.values():
            if j0 in js:
                self.main = tuple(js)
                continue
            alg, lm = self.cmp[js[0]]
            # the per-Limit function the engine calls (REGISTRY's public decider); the
            # documented pure function for a limit of 0 (it denies everything)
            fn = REGISTRY[alg].decider(lm) if lm.limit else DECIDERS[alg]
            self.run.append((fn, lm, tuple(js)))
        self.main_mask = sum(1 << j for j in self.main)
        caps = [lm.capacity for _, lm in self.cmp]
        # quiet sessions: at most K requests are admitted by every algorithm from idle
        self.K = min([spec.limit, *caps])
        # a gap this long leaves every state idle (buckets refilled from empty, both
        # sliding windows past); the margin keeps float rounding out of it
        if spec.limit > 0:
            refill = max(caps) * spec.period / spec.limit
            self.G = max(2 * spec.period, refill) * (1 + 1e-9) + 1e-6
        else:
            self.G = 2 * spec.period * (1 + 1e-9) + 1e-6

    # -- the batch ---------------------------------------------------------------------

    def add(self, part: BatchPart, width: float, hit: Callable[..., Any]) -> set[int]:
        """Decide a batch's requests of this rule (``hit``: the store's ``hit_sync``) and
        count them; the line numbers an enforced denial fell on."""
        recs = self.recs
        skeys = self.skeys
        for skey, text in part.new_keys:
            skeys.append(skey)
            recs.append(KeyStats(text))
        untracked_keys = iter(part.untracked)
        lim = self.limit
        queue = lim.delay
        enforced = not self.spec.shadow
        denied_lines: set[int] = set()
        tl = self.tl
        idle_gap = self.G
        quiet_max = self.K
        cb = None
        ca = cd = 0
        untracked = 0
        for kid, t, ln in zip(part.kids, part.times, part.lines):
            dec = hit(skeys[kid] if kid >= 0 else next(untracked_keys), lim, 1, t)
            if dec.allowed:
                den = 0
                if queue and dec.delay > 0.0:
                    self.delayed += 1
            else:
                den = 1
                if enforced:
                    denied_lines.add(ln)
            b = int(t // width)
            if b != cb:
                if cb is not None:
                    cell = tl.get(cb)
                    if cell is None:
                        tl[cb] = [ca, cd]
                    else:
                        cell[0] += ca
                        cell[1] += cd
                cb = b
                ca = cd = 0
            if den:
                cd += 1
            else:
                ca += 1
            if kid < 0:
                untracked += 1
                continue
            rec = recs[kid]
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
                    self.close_session(rec)
                    s = rec.sess = [t]
                if len(s) > quiet_max:
                    self.activate(rec, t, width)
            elif gap >= idle_gap and self.all_idle(rec, t):
                self.deactivate(rec, t)
                if quiet_max < 1:
                    self.activate(rec, t, width)
            else:
                self.step_active(rec, t)
            if gap > 0:
                rec.last = t
            if den:
                rec.d += 1
                for j in self.main:
                    self.cden[j] += 1
                rec.cmask |= self.main_mask
            rtl = rec.tl
            if rtl is not None:
                cell = rtl.get(b)
                if cell is None:
                    rtl[b] = [0, 1] if den else [1, 0]
                else:
                    cell[den] += 1
        if cb is not None:
            cell = tl.get(cb)
            if cell is None:
                tl[cb] = [ca, cd]
            else:
                cell[0] += ca
                cell[1] += cd
        self.untracked += untracked
        return denied_lines

    # -- sessions -----------------------------------------------------------------------

    def close_session(self, rec: KeyStats) -> None:
        """The key went quiet: fold the session into its peak."""
        s = rec.sess
        if s:
            p = _peak_of(s, self.T) if len(s) > 1 else 1
            if p > rec.peak:
                rec.peak = p

    def activate(self, rec: KeyStats, now: float, width: float) -> None:
        """A session outgrew K: build the states from its timestamps, in the order they came."""
        s = rec.sess
        assert s is not None
        st: list[Any] = [None] * len(self.run)
        cden = self.cden
        for t in s:
            for i, (fn, lm, js) in enumerate(self.run):
                d, st[i] = fn(lm, st[i], t, 1)
                if not d.allowed:
                    for j in js:
                        cden[j] += 1
                        rec.cmask |= 1 << j
        rec.st = st
        if rec.tl is None and len(self.timelined) < MAX_OFFENDER_TIMELINES:
            # a timeline in case the key is denied in this session (dropped if not): this
            # session so far, without the request being decided now (the caller adds it)
            tl: dict[int, list[int]] = {}
            for x in s:
                b = int(x // width)
                cell = tl.get(b)
                if cell is None:
                    tl[b] = [1, 0]
                else:
                    cell[0] += 1
            tl[int(now // width)][0] -= 1
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
        return all(is_idle(lm, st[i], now) for i, (_, lm, _) in enumerate(self.run))

    def deactivate(self, rec: KeyStats, t: float) -> None:
        if rec.tl is not None and not rec.d:  # never denied: not an offender after all
            rec.tl = None
            self.timelined.discard(rec)
        rec.st = None
        rec.w = None
        rec.wi = 0
        rec.sess = [t]

    def step_active(self, rec: KeyStats, t: float) -> None:
        """One more request of an active key: the algorithms' decisions, its window."""
        st = rec.st
        assert st is not None
        cden = self.cden
        for i, (fn, lm, js) in enumerate(self.run):
            d, st[i] = fn(lm, st[i], t, 1)
            if not d.allowed:
                for j in js:
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

    # -- the figures ----------------------------------------------------------------------

    def coarsen(self) -> None:
        """Halve the timelines' resolution (the width doubles)."""
        self.tl = _merge(self.tl)
        for rec in self.timelined:
            if rec.tl is not None:
                rec.tl = _merge(rec.tl)

    def finish(self, width: float, top: int) -> dict[str, Any]:
        recs = self.recs
        for rec in recs:  # close every open session: its peak
            if rec.sess is not None:
                self.close_session(rec)
        out: dict[str, Any] = {
            "requests": sum(a + d for a, d in self.tl.values()),
            "denied": sum(d for _, d in self.tl.values()),
            "untracked": self.untracked,
            "clients": len(recs),
            "clients_denied": sum(1 for rec in recs if rec.d),
        }
        peaks = sorted(rec.peak for rec in recs)
        out["peaks"] = {}
        out["peak_counts"] = []
        if peaks:
            n = len(peaks)
            for p in PERCENTILES:
                out["peaks"][f"p{p:g}"] = peaks[max(0, math.ceil(p / 100.0 * n) - 1)]
            out["peaks"]["max"] = peaks[-1]
            counts: dict[int, int] = {}
            for v in peaks:
                counts[v] = counts.get(v, 0) + 1
            out["peak_counts"] = sorted(counts.items())
        denied = sorted((rec for rec in recs if rec.d), key=lambda x: (-x.d, -x.n, x.text))
        out["top"] = [Client(rec.text, rec.n, rec.d, rec.peak) for rec in denied[:top]]
        compare = []
        for j, (alg, lm) in enumerate(self.cmp):
            hit_by = [rec for rec in recs if rec.cmask >> j & 1]
            compare.append(
                AlgorithmResult(
                    algorithm=alg,
                    denied=self.cden[j],
                    clients_denied=len(hit_by),
                    configured=alg == self.spec.algorithm,
                    within_denied=sum(1 for rec in hit_by if rec.peak <= lm.limit),
                    burst=lm.burst,
                    delay=lm.delay,
                )
            )
        out["compare"] = compare
        out["timeline"] = _timeline(self.tl, width)
        out["offenders"] = [
            Offender(Client(rec.text, rec.n, rec.d, rec.peak), _timeline(rec.tl, width) if rec.tl else None)
            for rec in denied[:top]
        ]
        return out


def _merge(tl: dict[int, list[int]]) -> dict[int, list[int]]:
    out: dict[int, list[int]] = {}
    for k, (a, d) in tl.items():
        cell = out.get(k >> 1)
        if cell is None:
            out[k >> 1] = [a, d]
        else:
            cell[0] += a
            cell[1] += d
    return out


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


class BatchPart:
    """One rule's requests in a batch, in log order: ``kids[i]`` the key's id
    (-1: a key beyond max_clients, whose store key is the next of ``untracked``),
    ``times[i]`` and ``lines[i]`` its line's time and number; ``new_keys`` the keys
    first seen, (store key, text), in id order."""

    __slots__ = ("kids", "times", "lines", "new_keys", "untracked")

    def __init__(self) -> None:
        self.kids = array("q")
        self.times = array("d")
        self.lines = array("q")
        self.new_keys: list[tuple[str, str]] = []
        self.untracked: list[str] = []

    def clear(self) -> None:
        del self.kids[:]
        del self.times[:]
        del self.lines[:]
        self.new_keys = []
        self.untracked = []


class Figures:
    """Decides every charged descriptor with the engine -- the rule's :class:`Limit`
    on a :class:`MemoryStore` of the file's ``max_keys``, the line's time as
    ``now`` -- and gathers the figures; fed in batches (:meth:`add`: one
    :class:`BatchPart` per rule), in this process."""

    def __init__(self, specs: list[RuleSpec], top: int, max_keys: int, max_key_length: int, shadow_mode: bool = False):
        self.rules = [RuleFigures(s) for s in specs]
        #: http.shadow_mode (Lyft's SHADOW_MODE): every answer OK, whatever the rules decide
        self.shadow_mode = shadow_mode
        self.store = MemoryStore(max_keys=max_keys, max_key_length=max_key_length)
        self.top = top
        self.width = 1.0
        self.tmin = math.inf
        self.tmax = -math.inf
        self.denied = 0  # lines an enforced rule denied

    def add(self, parts: list[BatchPart], quotas: dict[int, int] | None = None) -> None:
        """Decide a batch; ``quotas``: the number of quota descriptors of each line
        that has some (Lyft's quota_mode; the engine's selection.quota_count)."""
        for part in parts:
            if len(part.times):
                lo, hi = min(part.times), max(part.times)
                if lo < self.tmin:
                    self.tmin = lo
                if hi > self.tmax:
                    self.tmax = hi
        while (self.tmax - self.tmin) / self.width > MAX_BUCKETS:
            for r in self.rules:
                r.coarsen()
            self.width *= 2
        # a batch holds whole lines: the lines any rule denied are counted once, and a
        # line whose denials are all quota ones only when every quota descriptor was
        # (the engine's answer_over, as the Limiter combines a request's statuses)
        denied: set[int] = set()
        quota_over: dict[int, int] = {}
        hit = self.store.hit_sync
        for r, part in zip(self.rules, parts):
            if len(part.times):
                lines = r.add(part, self.width, hit)
                if not lines:
                    continue
                if r.spec.quota:
                    for ln in lines:
                        quota_over[ln] = quota_over.get(ln, 0) + 1
                else:
                    denied |= lines
        if quota_over:
            q = quotas or {}
            denied.update(ln for ln, n in quota_over.items() if answer_over(0, q.get(ln, 0), n))
        if not self.shadow_mode:
            self.denied += len(denied)

    def finish(self) -> dict[str, Any]:
        return {
            "rules": [r.finish(self.width, self.top) for r in self.rules],
            "denied": self.denied,
            "delayed": [r.delayed for r in self.rules],
            "evictions": self.store.evictions,
        }

    def close(self) -> None:
        pass


def _serve(conn: Any, specs: list[RuleSpec], top: int, max_keys: int, max_key_length: int, shadow_mode: bool) -> None:
    """The helper process: batches in, the figures out (or the error, as text).  Ctrl-C
    is the replay's to handle: it closes the pipe, which ends this."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    figures = Figures(specs, top, max_keys, max_key_length, shadow_mode)
    parts = [BatchPart() for _ in specs]
    try:
        while True:
            msg = pickle.loads(conn.recv_bytes())
            if msg[0] == "add":
                for part, (kids, times, lines, new_keys, untracked) in zip(parts, msg[1]):
                    part.kids.frombytes(kids)
                    part.times.frombytes(times)
                    part.lines.frombytes(lines)
                    part.new_keys = new_keys
                    part.untracked = untracked
                figures.add(parts, msg[2])
                for part in parts:
                    part.clear()
            else:
                conn.send_bytes(pickle.dumps(("ok", figures.finish()), protocol=pickle.HIGHEST_PROTOCOL))
                return
    except EOFError:  # the replay went away
        return
    except BaseException:  # a bug: tell the replay, which raises it
        try:
            conn.send_bytes(pickle.dumps(("error", traceback.format_exc())))
        except OSError:
            pass
    finally:
        conn.close()


class FiguresProcess:
    """:class:`Figures` in a forked helper process (same results)."""

    def __init__(self, specs: list[RuleSpec], top: int, max_keys: int, max_key_length: int, shadow_mode: bool = False):
        ctx = multiprocessing.get_context("fork")
        self.conn, child = ctx.Pipe()
        self.proc = ctx.Process(
            target=_serve,
            args=(child, specs, top, max_keys, max_key_length, shadow_mode),
            name="netlimit-figures",
            daemon=True,
        )
        self.proc.start()
        child.close()

    def add(self, parts: list[BatchPart], quotas: dict[int, int] | None = None) -> None:
        msg = (
            "add",
            [(p.kids.tobytes(), p.times.tobytes(), p.lines.tobytes(), p.new_keys, p.untracked) for p in parts],
            quotas,
        )
        try:
            self.conn.send_bytes(pickle.dumps(msg, protocol=pickle.HIGHEST_PROTOCOL))
        except OSError as exc:
            raise RuntimeError(f"the figures' helper process ended ({exc}); {self._why()}") from None

    def finish(self) -> dict[str, Any]:
        try:
            self.conn.send_bytes(pickle.dumps(("finish",)))
            kind, payload = pickle.loads(self.conn.recv_bytes())
        except (OSError, EOFError) as exc:
            raise RuntimeError(f"the figures' helper process ended ({exc}); {self._why()}") from None
        if kind != "ok":
            raise RuntimeError(f"the figures' helper process failed:\n{payload}")
        return payload

    def _why(self) -> str:
        self.proc.join(timeout=1)
        return f"exit code {self.proc.exitcode}"

    def close(self) -> None:
        self.conn.close()
        self.proc.join(timeout=5)
        if self.proc.is_alive():
            self.proc.kill()
            self.proc.join(timeout=5)
