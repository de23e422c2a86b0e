"""The Lyft descriptor tree, precompiled into dict lookups.

A request descriptor is a list of ``(key, value)`` entries.  It is matched
against the tree of the configured ``descriptors`` as envoyproxy/ratelimit
does (``config_impl.go: GetLimit``):

* at each depth the entry ``(key, value)`` is looked up first as key+value,
  then against the wildcard values of that key (config order, the first that
  matches wins; each ``*`` matches any text, also none, wherever it stands:
  ``foo*``, ``bar*b``, ``foo*bar*baz``), then as key alone (any value);
* there is no backtracking: once a node is chosen at a depth, deeper entries
  are matched only below it;
* only the node reached by the **last** entry can give the limit: a request
  with more entries than the tree is deep does not match, nor does one that
  stops above a node carrying ``rate_limit``;
* ``unlimited: true`` matches but never limits; ``replaces`` drops the limits
  whose ``rate_limit.name`` it names when both match the same request;
* a wildcard node with ``share_threshold: true`` counts every value it matches
  in one counter (its pattern stands for the value in the store key);
* ``quota_mode`` marks a rule whose denial alone does not make the answer
  OVER_LIMIT (limiter.py), ``metadata`` is kept with the rule.

Unlike Lyft, keys and values are compared as pairs, never as the joined
``key_value`` text: a wildcard matches values of its own key only (Lyft's
could match an entry of another key sharing the prefix), and key ``a_b`` is
not key ``a`` with value ``b``.

Each rule's counters (``RuleStats``) are per rule; a rule whose Lyft stat key
depends on the request's values (``detailed_metric``, ``value_to_metric``)
also counts per stat key (:meth:`RuleSet.stat_key`), at most
``http.max_metric_values`` of them, the rest under ``(other)``.

Everything a decision needs per rule (the :class:`Limit`, the store-key
prefix, the header policy name) is built once here, at load time.  One
:class:`RuleSet` per domain; the one built from the ``http:`` section holds
those of ``http.lyft_config_dir`` in :attr:`RuleSet.domains`.
"""

from __future__ import annotations

import hashlib
import logging
import math
import struct
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

from ..config.loader import Problem
from ..config.model import Descriptor, HttpConfig
from ..config.validate import ConfigError, Loaded, LyftLoaded
from .actions import ActionPlan
from .algorithms import Limit

log = logging.getLogger("netlimit.limit")

Entry = tuple[str, str]
#: separates the values of a multi-entry descriptor in store keys
_SEP = "\x1f"


def _escape(value: str) -> str:
    return value.replace("\\", "\\\\").replace(_SEP, "\\s")


def sf_string(text: str) -> str:
    """``text`` as an HTTP structured-field sf-string (RFC 8941 §3.3.3):
    printable ASCII only, ``\\`` and ``"`` escaped; anything else becomes ``?``."""
    out = []
    for ch in text:
        o = ord(ch)
        if ch in ('"', "\\"):
            out.append("\\" + ch)
        elif 0x20 <= o <= 0x7E:
            out.append(ch)
        else:
            out.append("?")
    return '"' + "".join(out) + '"'


class RuleStats:
    """Per-rule counters (Lyft's total_hits / within / over / near / shadow), in
    hits (request cost).  Plain ints bumped on the decision path; metrics.py reads
    them at scrape time.  A reload hands them to the new rule of the same name.
    ``values``: the same counters per Lyft stat key, for rules whose stat key
    carries request values (bounded; None for the others)."""

    __slots__ = ("hits", "within", "over", "near", "shadow", "values")

    def __init__(self) -> None:
        self.hits = 0
        self.within = 0
        self.over = 0  # over the limit, shadow_mode and quota_mode rules included (as Lyft counts them)
        self.near = 0  # allowed past http.near_limit_ratio of the limit
        self.shadow = 0  # over the limit but not enforced (shadow_mode)
        self.values: dict[str, RuleStats] | None = None


#: the per-value counters past http.max_metric_values
OTHER = "(other)"


class Step:
    """One level of a rule's path, for its Lyft stat key: how the request's
    value at that depth shows in the key (config_impl.go ``GetLimit``)."""

    __slots__ = ("key", "kind", "pattern", "to_metric", "share")

    def __init__(self, d: Descriptor) -> None:
        self.key = d.key
        v = d.value or ""
        self.kind = "key" if not v else "wild" if "*" in v else "exact"
        self.pattern = v
        self.to_metric = d.value_to_metric
        self.share = d.share_threshold and self.kind == "wild"


@dataclass(eq=False, slots=True)
class Rule:
    """One node of the tree that carries ``rate_limit`` or ``unlimited``."""

    name: str  # rate_limit.name, else the Lyft stat path "key_value.key"
    path: str  # the Lyft stat path, unique per rule (and domain)
    domain: str
    keys: tuple[str, ...]  # descriptor keys from the root to this node
    unit: str
    requests_per_unit: int
    period: int
    algorithm: str
    limit: Limit | None  # None when unlimited
    unlimited: bool = False
    shadow: bool = False
    replaces: tuple[str, ...] = ()
    key_prefix: str = ""  # store key = key_prefix + values
    policy: str = ""  # 'RateLimit-Policy' item, e.g. '"api";q=10;w=60'
    sf_name: str = '""'  # the rule name as an sf-string
    #: allowed decisions with remaining <= this count as near_limit (http.near_limit_ratio)
    near_threshold: int = 0
    stats: RuleStats = field(default_factory=RuleStats)
    #: a limit override's unit multiplier (requests per ``multiplier`` units)
    multiplier: int = 1
    #: rate_limit.name as written ("" when none): what ``replaces`` names
    lyft_name: str = ""
    #: quota_mode: over its limit, it makes the answer OVER_LIMIT only when every quota descriptor is
    quota: bool = False
    metadata: dict[str, Any] | None = None
    #: per depth, the wildcard pattern that stands for the value in the store key
    #: (share_threshold), else None; None when no depth shares
    share: tuple[str | None, ...] | None = None
    #: the path's levels when the Lyft stat key carries request values
    #: (detailed_metric, value_to_metric), else None
    steps: tuple[Step, ...] | None = None
    detailed: bool = False
    #: the descriptor's own ``max_keys`` (memory store budget), None: a share of http.max_keys
    max_keys: int | None = None
    #: http.leases: False for a descriptor with ``lease: off`` (always the one-trip path)
    lease: bool = True

    @property
    def description(self) -> str:
        if self.unlimited or self.limit is None:
            return "unlimited"
        s = f"{self.requests_per_unit} per {self.unit} ({self.algorithm}"
        if self.limit.burst is not None:
            s += f", burst {self.limit.burst}"
        return s + ")"


class Node:
    __slots__ = ("exact", "wild", "by_key", "rule", "has_children")

    def __init__(self) -> None:
        self.exact: dict[str, dict[str, Node]] = {}
        #: key -> [(first part, None | (middle parts, last part, fixed length), node)], config order
        self.wild: dict[str, list[tuple[str, Any, Node]]] = {}
        self.by_key: dict[str, Node] = {}
        self.rule: Rule | None = None
        self.has_children = False


def wildcard(pattern: str) -> tuple[str, Any]:
    """A wildcard value, split once: ``(first part, None)`` for a trailing ``*``
    only (a prefix test), else ``(first, (middle parts, last, fixed length))``."""
    parts = pattern.split("*")
    if len(parts) == 2 and not parts[1]:
        return parts[0], None
    return parts[0], (tuple(parts[1:-1]), parts[-1], sum(map(len, parts)))


def wild_match(first: str, rest: Any, value: str) -> bool:
    """Whether ``value`` matches a wildcard split by :func:`wildcard`: it starts
    with the first part, ends with the last, and holds the middle parts in order
    between them (config_impl.go ``wildcardMatch``)."""
    if not value.startswith(first):
        return False
    if rest is None:
        return True
    middle, last, fixed = rest
    if len(value) < fixed or not value.endswith(last):
        return False
    i = len(first)
    end = len(value) - len(last)
    for part in middle:
        j = value.find(part, i, end)
        if j < 0:
            return False
        i = j + len(part)
    return True


class RuleSet:
    """A compiled domain: its tree and its rules; ``domains`` every domain the
    sidecar serves (this one and those of ``http.lyft_config_dir``), by name."""

    __slots__ = (
        "domain",
        "root",
        "rules",
        "has_replaces",
        "max_key_length",
        "config",
        "domains",
        "all_rules",
        "shadow_mode",
        "quota_mode",
        "max_metric_values",
    )

    def __init__(
        self, domain: str, root: Node, rules: list[Rule], max_key_length: int = 256, config: HttpConfig | None = None
    ):
        self.domain = domain
        self.root = root
        self.rules = rules
        self.has_replaces = any(r.replaces for r in rules)
        self.max_key_length = max_key_length
        self.config = config
        self.domains: dict[str, RuleSet] = {domain: self}
        #: the rules of every domain (metrics, reload, health)
        self.all_rules: list[Rule] = rules
        #: Lyft's SHADOW_MODE / QUOTA_MODE for the whole sidecar (http.shadow_mode / quota_mode)
        self.shadow_mode = config.shadow_mode if config is not None else False
        self.quota_mode = config.quota_mode if config is not None else False
        self.max_metric_values = config.max_metric_values if config is not None else 100

    # -- matching ---------------------------------------------------------------

    def match(self, entries: Sequence[Entry]) -> Rule | None:
        """The rule for one request descriptor (a list of (key, value)), or None."""
        node = self.root
        last = len(entries) - 1
        if last == 0:  # one entry (the common descriptor): the loop below, unrolled
            key, value = entries[0]
            m = node.exact.get(key)
            if m is not None:
                nxt = m.get(value)
                if nxt is not None:
                    return nxt.rule
            w = node.wild.get(key)
            if w is not None:
                for first, rest, n in w:
                    if value.startswith(first) and (rest is None or wild_match(first, rest, value)):
                        return n.rule
            nxt = node.by_key.get(key)
            return None if nxt is None else nxt.rule
        if last < 0:
            return None
        for i, (key, value) in enumerate(entries):
            nxt = None
            m = node.exact.get(key)
            if m is not None:
                nxt = m.get(value)
            if nxt is None:
                w = node.wild.get(key)
                if w is not None:
                    for first, rest, n in w:
                        if value.startswith(first) and (rest is None or wild_match(first, rest, value)):
                            nxt = n
                            break
                if nxt is None:
                    nxt = node.by_key.get(key)
                    if nxt is None:
                        return None
            if i == last:
                return nxt.rule
            if not nxt.has_children:
                return None
            node = nxt
        return None  # pragma: no cover

    def store_key(self, rule: Rule, entries: Sequence[Entry]) -> str:
        """The counter key of one request descriptor under ``rule``: the rule's
        prefix + the request's values (a wildcard or key-only node counts each
        concrete value apart, as Lyft does; a ``share_threshold`` wildcard counts
        the values it matches together, its pattern standing for them).

        Injective, because clients choose the values (a header action, a gRPC
        descriptor): a value holding ``\\`` or the separator is escaped
        (``\\`` -> ``\\\\``, separator -> ``\\s``) before values are joined, so no
        two descriptors share a key.  A key longer than ``max_key_length`` becomes
        the prefix + ``\\h`` + a BLAKE2b digest of the values: an escaped value
        never starts with ``\\h``, so a client cannot forge another key's digest."""
        share = rule.share
        if share is not None:
            entries = [(k, v if p is None else p) for (k, v), p in zip(entries, share)]
        if len(entries) == 1:
            v = entries[0][1]
            if "\\" in v or _SEP in v:
                v = _escape(v)
        else:
            v = _SEP.join([_escape(e[1]) if "\\" in e[1] or _SEP in e[1] else e[1] for e in entries])
        key = rule.key_prefix + v
        if len(key) > self.max_key_length:
            key = (
                rule.key_prefix
                + "\\h"
                + hashlib.blake2b(v.encode("utf-8", "surrogatepass"), digest_size=16).hexdigest()
            )
        return key

    def stat_key(self, rule: Rule, entries: Sequence[Entry]) -> str:
        """Lyft's stat key of a request descriptor matched by ``rule``
        (``RateLimit.Stats.Key``): the domain and the rule's path, where
        ``detailed_metric`` (on the rule) puts every request value and
        ``value_to_metric`` (on a level) that level's value; a
        ``share_threshold`` wildcard always shows its pattern."""
        steps = rule.steps
        if steps is None:
            return f"{rule.domain}.{rule.path}"
        parts = [rule.domain]
        if rule.detailed:
            shared = any(s.share for s in steps)
            for s, (k, v) in zip(steps, entries):
                if s.share:
                    parts.append(f"{k}_{s.pattern}")
                elif shared:
                    parts.append(f"{k}_{v}" if v else k)
                else:
                    parts.append(f"{k}_{v}")  # as Lyft writes it: "key_" for an empty value
            return ".".join(parts)
        for s, (k, v) in zip(steps, entries):
            if s.kind == "wild":
                v = s.pattern if s.share or not s.to_metric else v
            elif s.kind == "key" and not s.to_metric:
                v = ""
            parts.append(f"{k}_{v}" if v else k)
        return ".".join(parts)

    def value_stats(self, rule: Rule, entries: Sequence[Entry]) -> RuleStats:
        """The counters of ``rule`` for this request's stat key (the rule has
        ``steps``): at most ``max_metric_values`` keys per rule, then ``(other)``."""
        st = rule.stats
        values = st.values
        if values is None:
            values = st.values = {}
        key = self.stat_key(rule, entries)
        out = values.get(key)
        if out is None:
            if len(values) >= self.max_metric_values:
                key = OTHER
                out = values.get(key)
            if out is None:
                out = values[key] = RuleStats()
        return out

    def describe(self) -> list[dict[str, Any]]:
        out = []
        for r in self.all_rules:
            d: dict[str, Any] = {"name": r.name, "path": r.path, "keys": list(r.keys), "shadow_mode": r.shadow}
            if r.domain != self.domain:
                d["domain"] = r.domain
            if r.unlimited:
                d["unlimited"] = True
            else:
                d.update(unit=r.unit, requests_per_unit=r.requests_per_unit, algorithm=r.algorithm)
                if r.limit is not None and r.limit.burst is not None:
                    d["burst"] = r.limit.burst
            if r.replaces:
                d["replaces"] = list(r.replaces)
            if r.quota:
                d["quota_mode"] = True
            if r.metadata:
                d["metadata"] = r.metadata
            out.append(d)
        return out


# --- building ------------------------------------------------------------------


def _stat_part(d: Descriptor) -> str:
    return f"{d.key}_{d.value}" if d.value else d.key


def _f32(x: float) -> float:
    return struct.unpack("f", struct.pack("f", x))[0]


def near_threshold(capacity: int, ratio: float) -> int:
    """The ``remaining`` at or below which an allowed decision is near the limit:
    Lyft's ``after > floor(limit * NEAR_LIMIT_RATIO)``, in its float32 arithmetic."""
    return capacity - math.floor(_f32(_f32(capacity) * _f32(ratio))) - 1


def build(
    http: HttpConfig,
    loaded: Loaded | None = None,
    *,
    base: tuple[Any, ...] = ("http",),
    domain: str | None = None,
    descriptors: Sequence[Descriptor] | None = None,
    filename: str | None = None,
    position: Any = None,
) -> RuleSet:
    """Compile a domain: the ``http:`` section's (default) or ``descriptors`` of
    ``domain`` with the section's settings (a file of its lyft_config_dir).
    The file has been validated (config/validate.py: duplicates, ``replaces``,
    ...); what is left is what only the engine can say (a limit an algorithm
    refuses), a ConfigError naming FILE:LINE:COL."""
    if filename is None:
        filename = loaded.path if loaded is not None else "<config>"
    if position is None and loaded is not None:
        position = loaded.position
    problems: list[Problem] = []

    def problem(path: tuple[Any, ...], msg: str) -> None:
        line, col = position(*path) if position is not None else (0, 0)
        problems.append(Problem(filename, line, col, "http", msg))

    root = Node()
    rules: list[Rule] = []
    if domain is None:
        domain = http.domain
    #: the http: section's domain is matched against what its actions build: its
    #: path and address values are written as those are (http.path_match,
    #: http.client_prefix); lyft_config_dir domains get the doors' descriptors as sent
    value_of = None
    if descriptors is None:
        descriptors = http.descriptors
        value_of = ActionPlan.of(http).rule_value
    ratio = http.near_limit_ratio

    def walk(
        node: Node,
        descs: Iterable[Descriptor],
        keys: tuple[str, ...],
        stat: tuple[str, ...],
        path: tuple[Descriptor, ...],
        where: tuple[Any, ...],
    ) -> None:
        for i, d in enumerate(descs):
            here = where + ("descriptors", i)
            child = Node()
            value = d.value if value_of is None or not d.value else value_of(d.key, d.value)
            if not value:
                node.by_key.setdefault(d.key, child)
            elif "*" in value:
                first, rest = wildcard(value)
                node.wild.setdefault(d.key, []).append((first, rest, child))
            else:
                node.exact.setdefault(d.key, {}).setdefault(value, child)
            node.has_children = True
            k2 = keys + (d.key,)
            s2 = stat + (_stat_part(d),)
            p2 = path + (d,)
            if d.rate_limit is not None or d.unlimited:
                rule = _make_rule(d, domain, k2, ".".join(s2), p2, ratio, here, problem)
                if rule is not None:
                    child.rule = rule
                    rules.append(rule)
            if d.descriptors:
                walk(child, d.descriptors, k2, s2, p2, here)

    walk(root, descriptors, (), (), (), base)
    if problems:
        raise ConfigError(problems)
    shared: dict[str, RuleStats] = {}
    for r in rules:  # rules sharing a name (Lyft allows it, for `replaces`) share one set of counters
        r.stats = shared.setdefault(r.name, r.stats)
    return RuleSet(domain, root, rules, http.max_key_length, http)


def _make_rule(
    d: Descriptor,
    domain: str,
    keys: tuple[str, ...],
    path: str,
    nodes: tuple[Descriptor, ...],
    ratio: float,
    where: tuple[Any, ...],
    problem,
) -> Rule | None:
    share = tuple(n.value if n.share_threshold and n.value and "*" in n.value else None for n in nodes)
    steps = tuple(Step(n) for n in nodes)
    by_value = d.detailed_metric or any(s.to_metric and s.kind != "exact" and not s.share for s in steps)
    common: dict[str, Any] = dict(
        path=path,
        domain=domain,
        keys=keys,
        shadow=d.shadow_mode,
        replaces=tuple(r.name for r in d.replaces if r.name),
        quota=d.quota_mode,
        metadata=d.metadata,
        share=share if any(p is not None for p in share) else None,
        steps=steps if by_value else None,
        detailed=d.detailed_metric,
        max_keys=d.max_keys,
        lease=d.lease,
    )
    if d.unlimited:
        return Rule(
            name=path,
            unit="",
            requests_per_unit=0,
            period=0,
            algorithm="",
            limit=None,
            unlimited=True,
            key_prefix="",
            sf_name=sf_string(path),
            **common,
        )
    rl = d.rate_limit
    assert rl is not None
    name = rl.name or path
    algorithm = d.engine_algorithm
    try:
        limit = Limit(
            algorithm=algorithm,
            limit=rl.requests_per_unit,
            period=float(rl.period),
            burst=d.burst,
            delay=d.delay,
            name=name,
        )
    except ValueError as exc:
        problem(where + ("rate_limit",), f"descriptor {path}: {exc}")
        return None
    sfn = sf_string(name)
    # Store keys: domain, rule path (unique per rule) and the request's values.
    prefix = f"{domain}|{path}|"
    return Rule(
        name=name,
        unit=rl.unit,
        requests_per_unit=rl.requests_per_unit,
        period=rl.period,
        algorithm=algorithm,
        limit=limit,
        key_prefix=prefix,
        sf_name=sfn,
        policy=f"{sfn};q={rl.requests_per_unit};w={rl.period}",
        near_threshold=near_threshold(limit.capacity, ratio),
        lyft_name=rl.name or "",
        **common,
    )


def build_lyft(http: HttpConfig, files: Sequence[LyftLoaded]) -> RuleSet:
    """The RuleSet of a domain of ``http.lyft_config_dir`` (one file, or several
    with ``merge_domains``), with the section's settings."""
    lf = files[0]
    return build(
        http,
        base=(),
        domain=lf.config.domain,
        descriptors=[d for f in files for d in f.config.descriptors],
        filename=lf.path,
        position=lf.position,
    )


def from_loaded(loaded: Loaded) -> RuleSet:
    """The rule set of a loaded file, with the domains of its lyft_config_dir;
    ConfigError when it has no ``http:`` section."""
    http = loaded.config.http
    if http is None:
        raise ConfigError(
            [
                Problem(
                    loaded.path,
                    1,
                    1,
                    "http",
                    "the file has no 'http:' section: the sidecar needs one (domain, actions, descriptors)",
                )
            ]
        )
    rs = build(http, loaded)
    if not rs.domain:  # the domains are all in lyft_config_dir
        del rs.domains[""]
    if loaded.lyft:
        problems: list[Problem] = []
        by_domain: dict[str, list[LyftLoaded]] = {}
        for lf in loaded.lyft:
            by_domain.setdefault(lf.config.domain, []).append(lf)
        for files in by_domain.values():
            try:
                other = build_lyft(http, files)
            except ConfigError as exc:
                problems.extend(exc.problems)
                continue
            rs.domains[other.domain] = other
        if problems:
            raise ConfigError(problems)
        everything = rs.rules + [r for d in rs.domains.values() if d is not rs for r in d.rules]
        for d in rs.domains.values():
            d.domains = rs.domains
            d.all_rules = everything
        rs.all_rules = everything
    return rs
