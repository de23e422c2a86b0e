"""``netlimit suggest``: limits from a log and a stated target.

Per rule of the file (or, without one, per client address) the log is replayed
once to learn each client's **peak** -- the most requests it made in one
window of the rule's period -- and the limit is set from their distribution:

* ``--deny-clients P%``: the smallest limit that at most P% of the clients
  ever exceed (a client is ever denied by a sliding-window log at limit L
  exactly when its peak is above L);
* ``--headroom F`` (default ``2x`` over ``p99``): F times the peak of the
  given percentile of clients.

The log is then replayed again with that limit under every algorithm (token
and leaky buckets with ``burst`` = the limit).  Of the algorithms that deny no
client whose peak stayed within the limit (buckets of that size, the fixed
window and the log never do; the sliding counter's estimate may), the one
denying the most requests is proposed -- the most protective against the
clients above the target -- preferring on ties the token bucket, then the
sliding counter, the log and the fixed window; the leaky bucket as a meter is
the token bucket's twin and the log is left out above
:data:`LOG_MAX_LIMIT` (it keeps a timestamp per admitted request).
"""

from __future__ import annotations

import copy
import math
import re
from dataclasses import dataclass, field
from typing import Any

import yaml

from ..config.validate import Loaded, load_string
from ..limit.algorithms import (
    FIXED_WINDOW,
    LEAKY_BUCKET,
    REGISTRY,
    SLIDING_WINDOW_COUNTER,
    SLIDING_WINDOW_LOG,
    TOKEN_BUCKET,
)
from .logs import LogError
from .report import shown
from .results import RuleResult, SimResult

#: above this limit the sliding log is not proposed (memory per key grows with the limit)
LOG_MAX_LIMIT = 1000
#: a client whose peak is above both this many times the median client's peak and Tukey's
#: far-out fence (Q3 + 3 IQR) is an outlier: set aside when the percentile is taken
OUTLIER_FACTOR = 10
#: ... as long as the outliers are at most this share of the clients (more is a second population)
MAX_OUTLIER_SHARE = 0.05
#: the order ties are broken in
PREFERENCE = (TOKEN_BUCKET, SLIDING_WINDOW_COUNTER, SLIDING_WINDOW_LOG, FIXED_WINDOW)


@dataclass(frozen=True)
class Target:
    """What the user asked for: a share of clients that may be denied, or a
    headroom factor over a percentile of the clients' peaks."""

    deny_clients: float | None = None  # percent
    headroom: float = 2.0
    percentile: float = 99.0

    def describe(self) -> str:
        if self.deny_clients is not None:
            return f"at most {self.deny_clients:g}% of the clients ever denied"
        return f"{self.headroom:g}x the peak of p{self.percentile:g} of the clients"


def parse_target(deny_clients: str | None, headroom: str | None, over: str | None) -> Target:
    """``--deny-clients 0.1%`` | ``--headroom 1.5x [--over p99.9]``; LogError on nonsense."""
    if deny_clients is not None and (headroom is not None or over is not None):
        raise LogError("say either --deny-clients or --headroom/--over, not both")
    if deny_clients is not None:
        m = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*%?\s*", deny_clients)
        if not m or not 0 <= float(m.group(1)) < 100:
            raise LogError(f"--deny-clients {deny_clients!r}: expected a percentage from 0 to 100, e.g. 0.1%")
        return Target(deny_clients=float(m.group(1)))
    t = Target()
    if headroom is not None:
        m = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*x?\s*", headroom)
        if not m or float(m.group(1)) < 1:
            raise LogError(f"--headroom {headroom!r}: expected a factor of at least 1, e.g. 1.5x")
        t = Target(headroom=float(m.group(1)), percentile=t.percentile)
    if over is not None:
        m = re.fullmatch(r"\s*p?(\d+(?:\.\d+)?)\s*", over)
        if not m or not 0 < float(m.group(1)) <= 100:
            raise LogError(f"--over {over!r}: expected a percentile like p99 or p99.9")
        t = Target(headroom=t.headroom, percentile=float(m.group(1)))
    return t


def _pct(counts: list[tuple[int, int]], p: float) -> int:
    """The p-th percentile of the peaks in ``counts`` ((peak, clients), ascending; nearest rank)."""
    n = sum(c for _, c in counts)
    rank = max(1, math.ceil(p / 100.0 * n - 1e-9))
    seen = 0
    for v, c in counts:
        seen += c
        if seen >= rank:
            return v
    return counts[-1][0] if counts else 0


def split_outliers(counts: list[tuple[int, int]]) -> tuple[list[tuple[int, int]], list[tuple[int, int]]]:
    """(the clients the percentile is taken over, the outliers set aside): clients whose peak
    is above OUTLIER_FACTOR x the median client's peak and above Q3 + 3 IQR, as long as they
    are at most MAX_OUTLIER_SHARE of the clients (a credential stuffer among a few dozen
    clients would otherwise *be* the p99)."""
    n = sum(c for _, c in counts)
    if n < 2:
        return counts, []
    q1, med, q3 = _pct(counts, 25), _pct(counts, 50), _pct(counts, 75)
    fence = max(q3 + 3 * (q3 - q1), OUTLIER_FACTOR * med)
    out = [(v, c) for v, c in counts if v > fence]
    if not out or sum(c for _, c in out) > MAX_OUTLIER_SHARE * n:
        return counts, []
    return [(v, c) for v, c in counts if v <= fence], out


def _who(r: RuleResult, peak: int) -> str:
    """The client with this peak, when the replay's top list knows it."""
    for c in r.top:
        if c.peak == peak:
            return f"{shown(c.key)}, "
    return ""


def limit_and_warnings(r: RuleResult, target: Target) -> tuple[int | None, list[str]]:
    """The proposed requests per unit for one rule from its clients' peaks (None: no traffic),
    and what the operator must know about the figure: outliers set aside, or a figure that
    one client decides."""
    counts = r.peak_counts
    n = sum(c for _, c in counts)
    if not n:
        return None, []
    warnings: list[str] = []
    if target.deny_clients is not None:
        allowed = math.floor(target.deny_clients / 100.0 * n + 1e-9)
        value = counts[-1][0]
        above = n
        for v, c in counts:
            above -= c
            if above <= allowed:
                value = v
                break
        holders = dict(counts).get(value, 0)
        if holders == 1 and n > 1 and value == counts[-1][0]:
            warnings.append(
                f"the limit is one client's peak ({_who(r, value)}{value}/{r.unit}, the busiest of {n:,}): at most "
                f"{target.deny_clients:g}% of {n:,} clients lets none be denied, so the busiest -- maybe the "
                "attacker -- sets it; --headroom (the default) sets outliers aside"
            )
        return max(1, value), warnings
    kept, outliers = split_outliers(counts)
    value = _pct(kept, target.percentile)
    if outliers:
        k = sum(c for _, c in outliers)
        peaks = ", ".join(
            f"{_who(r, v)}{v}/{r.unit}" if c == 1 else f"{v}/{r.unit} ({c} clients)" for v, c in reversed(outliers)
        )
        warnings.append(
            f"set aside {k} outlier client{'s' if k != 1 else ''} of {n:,} (peak {peaks}; over "
            f"{OUTLIER_FACTOR}x the median client's {_pct(counts, 50)}/{r.unit}): p{target.percentile:g} of every "
            f"client would have been {_pct(counts, target.percentile)}/{r.unit}; the limit comes from the other "
            f"{n - k:,}"
        )
    m = sum(c for _, c in kept)
    holders = sum(c for v, c in kept if v >= value)
    if holders == 1 and m > 1:
        warnings.append(
            f"p{target.percentile:g} of {m:,} clients is the peak of one client ({_who(r, value)}{value}/{r.unit}): "
            "that one client decides the limit; a longer log or a lower --over (e.g. p90) gives a broader figure"
        )
    return max(1, math.ceil(target.headroom * value - 1e-9)), warnings


def limit_for(r: RuleResult, target: Target) -> int | None:
    """The proposed requests per unit for one rule, from its clients' peaks (None: no traffic)."""
    return limit_and_warnings(r, target)[0]


def choose_algorithm(r: RuleResult, limit: int) -> str:
    """The proposed algorithm from the second replay's comparison (see the module doc)."""
    ok = [
        c
        for c in r.compare
        if c.algorithm in PREFERENCE
        and c.within_denied == 0
        and not (c.algorithm == SLIDING_WINDOW_LOG and limit > LOG_MAX_LIMIT)
    ]
    if not ok:
        return TOKEN_BUCKET
    best = max(c.denied for c in ok)
    return next(a for a in PREFERENCE if any(c.algorithm == a and c.denied == best for c in ok))


def default_config(unit: str, domain: str) -> Loaded:
    """The file suggested without one: one limit per client address."""
    text = (
        "version: 1\n"
        "http:\n"
        f"  domain: {domain}\n"
        "  actions:\n"
        "    - [remote_address]\n"
        "  descriptors:\n"
        "    - key: remote_address\n"
        f"      rate_limit: {{unit: {unit}, requests_per_unit: 1}}\n"
        "      algorithm: token_bucket\n"
    )
    return load_string(text, "<per remote_address>")


@dataclass
class Proposal:
    """One rule's proposal."""

    path: str
    name: str
    unit: str
    limit: int | None  # None: no traffic, unchanged
    algorithm: str = ""
    burst: int | None = None
    basis: str = ""
    figures: RuleResult | None = None  # the second replay's (at the proposed limit)
    warnings: list[str] = field(default_factory=list)  # outliers set aside, one client deciding


@dataclass
class Suggestion:
    proposals: list[Proposal] = field(default_factory=list)
    target: Target = field(default_factory=Target)


def _descriptor_nodes(http: Any, data: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """rule path -> the (raw) descriptor mapping in ``data``, walking the model ``http`` beside it
    (the paths are built as netlimit.limit.rules builds them)."""
    raw = data["http"]["descriptors"]
    out: dict[str, dict[str, Any]] = {}

    def walk(models: Any, raws: list[Any], stat: tuple[str, ...]) -> None:
        for d, node in zip(models, raws):
            s2 = stat + (f"{d.key}_{d.value}" if d.value else d.key,)
            out[".".join(s2)] = node
            if d.descriptors:
                walk(d.descriptors, node.get("descriptors") or [], s2)

    walk(http.descriptors, raw, ())
    return out


def with_limits(loaded: Loaded, limits: dict[str, tuple[int, str, int | None]]) -> dict[str, Any]:
    """The file's data with ``{rule path: (requests per unit, algorithm, burst)}`` applied."""
    data = copy.deepcopy(loaded.doc.data)
    nodes = _descriptor_nodes(loaded.config.http, data)
    for path, (n, alg, burst) in limits.items():
        node = nodes[path]
        rl = node.get("rate_limit")
        if isinstance(rl, dict):
            rl["requests_per_unit"] = n
        node["algorithm"] = alg
        if REGISTRY[alg].bucket and burst is not None:
            node["burst"] = burst
        else:
            node.pop("burst", None)
        if alg != LEAKY_BUCKET:
            node.pop("delay", None)
    return data


def candidate(loaded: Loaded, first: SimResult, target: Target) -> tuple[Loaded, list[Proposal]]:
    """The file of the second replay: every rule with traffic at its proposed limit, as a token
    bucket of that size (the replay compares the five algorithms at that limit)."""
    proposals = []
    limits: dict[str, tuple[int, str, int | None]] = {}
    for r in first.rules:
        if r.unlimited:
            continue
        n, warnings = limit_and_warnings(r, target)
        p = Proposal(r.path, r.name, r.unit, n, warnings=warnings)
        if n is not None:
            if target.deny_clients is not None:
                p.basis = f"at most {target.deny_clients:g}% of {r.clients:,} clients above {n}/{r.unit}"
            else:
                kept, outliers = split_outliers(r.peak_counts)
                pv = _pct(kept, target.percentile)
                of = f"{r.clients:,} clients" + (
                    f", {sum(c for _, c in outliers)} outliers set aside" if outliers else ""
                )
                p.basis = f"{target.headroom:g} x p{target.percentile:g} peak ({pv}/{r.unit}) of {of}"
            limits[r.path] = (n, TOKEN_BUCKET, n)
        proposals.append(p)
    data = with_limits(loaded, limits)
    text = yaml.safe_dump(data, sort_keys=False, default_flow_style=None, width=120, allow_unicode=True)
    return load_string(text, loaded.path), proposals


def finish(loaded: Loaded, proposals: list[Proposal], second: SimResult) -> str:
    """Choose each rule's algorithm from the second replay; the YAML of the whole file."""
    by_path = {r.path: r for r in second.rules}
    limits: dict[str, tuple[int, str, int | None]] = {}
    for p in proposals:
        if p.limit is None:
            continue
        r = by_path[p.path]
        p.algorithm = choose_algorithm(r, p.limit)
        p.burst = p.limit if REGISTRY[p.algorithm].bucket else None
        p.figures = r
        limits[p.path] = (p.limit, p.algorithm, p.burst)
    return rewrite(loaded, limits)


def rewrite(loaded: Loaded, limits: dict[str, tuple[int, str, int | None]]) -> str:
    """The file's own text with the limits written in (ruamel.yaml round trip): its
    comments, key order, flow mappings and quoting stay as the operator wrote them."""
    import io

    from ruamel.yaml import YAML
    from ruamel.yaml.util import load_yaml_guess_indent

    _, seq, offset = load_yaml_guess_indent(loaded.text)  # a sequence's items: their indent, the dash's
    keyed = [len(ln) - len(ln.lstrip(" ")) for ln in loaded.text.splitlines() if re.match(r"^ +[^ #-]", ln)]
    rt = YAML(typ="rt")
    rt.preserve_quotes = True
    rt.width = 120
    rt.indent(mapping=min(keyed, default=2), sequence=seq or 2, offset=offset or 0)
    data = rt.load(loaded.text)
    nodes = _descriptor_nodes(loaded.config.http, data)
    for path, (n, alg, burst) in limits.items():
        node: Any = nodes[path]  # a ruamel CommentedMap: insert() keeps the key order
        rl = node.get("rate_limit")
        if isinstance(rl, dict):
            rl["requests_per_unit"] = n
        keys = list(node)
        after = keys.index("rate_limit") + 1 if "rate_limit" in keys else len(keys)
        if "algorithm" in node:
            node["algorithm"] = alg
        else:
            node.insert(after, "algorithm", alg)
        if REGISTRY[alg].bucket and burst is not None:
            if "burst" in node:
                node["burst"] = burst
            else:
                node.insert(list(node).index("algorithm") + 1, "burst", burst)
        else:
            node.pop("burst", None)
        if alg != LEAKY_BUCKET:
            node.pop("delay", None)
    buf = io.StringIO()
    rt.dump(data, buf)
    text = buf.getvalue()
    return text if text.endswith("\n") else text + "\n"


def header(source: str, logs: list[str], target: Target, proposals: list[Proposal], first: SimResult) -> str:
    """The comment block above the YAML: where the numbers come from."""
    lines = [
        f"# netlimit suggest: limits for {source} from {first.requests:,} requests of {', '.join(logs)}",
        f"# target: {target.describe()}",
    ]
    for p in proposals:
        if p.limit is None:
            lines.append(f"# {p.name}: no request of the log matched it; left as it was")
        else:
            lines.append(f"# {p.name}: {p.limit} per {p.unit} ({p.basis}), {p.algorithm}")
        lines.extend(f"#   warning: {w}" for w in p.warnings)
    return "\n".join(lines) + "\n"


def what_it_denies(proposals: list[Proposal]) -> list[str]:
    """The stderr lines: per rule, what the proposal would have denied on the same log."""
    out: list[str] = []
    for p in proposals:
        out.extend(f"warning: {p.name}: {w}" for w in p.warnings)
        r = p.figures
        if p.limit is None or r is None:
            continue
        chosen = next(c for c in r.compare if c.algorithm == p.algorithm)
        pct = 100.0 * chosen.denied / r.requests if r.requests else 0.0
        burst = f" burst {p.burst}" if p.burst else ""
        out.append(
            f"{p.name}: {p.limit} per {p.unit}, {p.algorithm}{burst}: would have denied {chosen.denied:,} of "
            f"{r.requests:,} requests ({pct:.3f}%) from {chosen.clients_denied:,} of {r.clients:,} clients"
        )
        others = ", ".join(
            f"{c.algorithm} {c.denied:,} ({c.clients_denied:,} clients"
            + (f", {c.within_denied:,} within the limit" if c.within_denied else "")
            + ")"
            for c in r.compare
            if c.algorithm != p.algorithm
        )
        out.append(f"  the same limit under the others: {others}")
        # the second replay ran every rule as a token bucket of the proposed size
        for c in r.top[:5]:
            out.append(
                f"  most denied (as a token bucket of that size): {shown(c.key)}: {c.denied:,} of "
                f"{c.requests:,} requests, peak {c.peak:,} per {p.unit}"
            )
    return out
