"""The Lyft descriptor tree, precompiled into dict lookups.

A request descriptor is a list of ``(key, value)`` entries.  It is matched
against the tree of the configured ``descriptors`` as envoyproxy/ratelimit
does (``config_impl.go: GetLimit``):

* at each depth the entry ``(key, value)`` is looked up first as key+value,
  then against the trailing-``*`` wildcard values of that key (config order,
  first prefix that matches wins), then as key alone (any value);
* there is no backtracking: once a node is chosen at a depth, deeper entries
  are matched only below it;
* only the node reached by the **last** entry can give the limit: a request
  with more entries than the tree is deep does not match, nor does one that
  stops above a node carrying ``rate_limit``;
* ``unlimited: true`` matches but never limits; ``replaces`` drops the named
  limits when both match the same request.

Unlike Lyft, the wildcard test compares the value of the same key only (Lyft
compares the concatenated ``key_value`` string, so a wildcard could match an
entry of a different key that shares a prefix).

Everything a decision needs per rule (the :class:`Limit`, the store-key
prefix, the header policy name) is built once here, at load time.
"""

from __future__ import annotations

import hashlib
import logging
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

from ..config.loader import Problem
from ..config.model import Descriptor, HttpConfig
from ..config.validate import ConfigError, Loaded
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
    them at scrape time.  A reload hands them to the new rule of the same name."""

    __slots__ = ("hits", "within", "over", "near", "shadow")

    def __init__(self) -> None:
        self.hits = 0
        self.within = 0
        self.over = 0  # over the limit, shadow_mode rules included (as Lyft counts)
        self.near = 0  # allowed with >= 80% of the limit used
        self.shadow = 0  # over the limit but not enforced (shadow_mode)


@dataclass(eq=False, slots=True)
class Rule:
    """One node of the tree that carries ``rate_limit`` or ``unlimited``."""

    name: str  # rate_limit.name, else the Lyft stat path "key_value.key"
    path: str  # the Lyft stat path, unique per rule
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
    #: allowed decisions with used >= 80% of the limit count as near_limit
    near_threshold: int = 0
    stats: RuleStats = field(default_factory=RuleStats)
    #: a limit override's unit multiplier (requests per ``multiplier`` units)
    multiplier: int = 1

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
        self.wild: dict[str, list[tuple[str, Node]]] = {}
        self.by_key: dict[str, Node] = {}
        self.rule: Rule | None = None
        self.has_children = False


class RuleSet:
    """A compiled ``http:`` section: the domain, its tree and its rules."""

    __slots__ = ("domain", "root", "rules", "has_replaces", "max_key_length", "config")

    def __init__(
        self, domain: str, root: Node, rules: list[Rule], max_key_length: int = 256, config: HttpConfig | None = None
    ):
        self.domain = domain
        self.root = root
        self.rules = rules
        self.has_replaces = any(r.replaces for r in rules)
        self.max_key_length = max_key_length
        self.config = config

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
                for prefix, n in w:
                    if value.startswith(prefix):
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
                    for prefix, n in w:
                        if value.startswith(prefix):
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
        concrete value apart, as Lyft does).

        Injective, because clients choose the values (a header action, a gRPC
        descriptor): a value holding ``\\`` or the separator is escaped
        (``\\`` -> ``\\\\``, separator -> ``\\s``) before values are joined, so no
        two descriptors share a key.  A key longer than ``max_key_length`` becomes
        the prefix + ``\\h`` + a BLAKE2b digest of the values: an escaped value
        never starts with ``\\h``, so a client cannot forge another key's digest."""
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

    def describe(self) -> list[dict[str, Any]]:
        out = []
        for r in self.rules:
            d: dict[str, Any] = {"name": r.name, "path": r.path, "keys": list(r.keys), "shadow_mode": r.shadow}
            if r.unlimited:
                d["unlimited"] = True
            else:
                d.update(unit=r.unit, requests_per_unit=r.requests_per_unit, algorithm=r.algorithm)
                if r.limit is not None and r.limit.burst is not None:
                    d["burst"] = r.limit.burst
            if r.replaces:
                d["replaces"] = list(r.replaces)
            out.append(d)
        return out


# --- building ------------------------------------------------------------------


def _stat_part(d: Descriptor) -> str:
    return f"{d.key}_{d.value}" if d.value else d.key


def build(http: HttpConfig, loaded: Loaded | None = None, *, base: tuple[Any, ...] = ("http",)) -> RuleSet:
    """Compile an ``http:`` section.  Raises :class:`ConfigError` (FILE:LINE:COL
    problems when ``loaded`` is given) for what the model alone cannot see:
    duplicate siblings, limits the algorithms refuse."""
    filename = loaded.path if loaded is not None else "<config>"
    problems: list[Problem] = []

    def problem(path: tuple[Any, ...], msg: str) -> None:
        line, col = loaded.position(*path) if loaded is not None else (0, 0)
        problems.append(Problem(filename, line, col, "http", msg))

    root = Node()
    rules: list[Rule] = []
    domain = http.domain

    def walk(
        node: Node, descs: Iterable[Descriptor], keys: tuple[str, ...], stat: tuple[str, ...], where: tuple[Any, ...]
    ) -> None:
        seen: dict[tuple[str, str | None], int] = {}
        for i, d in enumerate(descs):
            here = where + ("descriptors", i)
            sig = (d.key, d.value)
            if sig in seen:
                what = f"key {d.key!r}" + (f" value {d.value!r}" if d.value else " (no value)")
                problem(
                    here + ("key",),
                    f"duplicate descriptor: {what} already appears as sibling #{seen[sig] + 1} at this level",
                )
                continue
            seen[sig] = i
            child = Node()
            if d.value is None or d.value == "":
                node.by_key[d.key] = child
            elif d.value.endswith("*"):
                node.wild.setdefault(d.key, []).append((d.value[:-1], child))
            else:
                node.exact.setdefault(d.key, {})[d.value] = child
            node.has_children = True
            k2 = keys + (d.key,)
            s2 = stat + (_stat_part(d),)
            if d.detailed_metric:
                log.warning(
                    "%s: descriptor %s: detailed_metric is ignored: metrics are labelled by rule "
                    "only, never by request values",
                    filename,
                    ".".join(s2),
                )
            if d.rate_limit is not None or d.unlimited:
                rule = _make_rule(d, domain, k2, ".".join(s2), here, problem)
                if rule is not None:
                    child.rule = rule
                    rules.append(rule)
            elif d.shadow_mode and not d.descriptors:
                problem(here + ("shadow_mode",), "shadow_mode on a descriptor without rate_limit does nothing")
            if d.descriptors:
                walk(child, d.descriptors, k2, s2, here)

    walk(root, http.descriptors, (), (), base)
    if problems:
        raise ConfigError(problems)
    shared: dict[str, RuleStats] = {}
    for r in rules:  # rules sharing a name (Lyft allows it, for `replaces`) share one set of counters
        r.stats = shared.setdefault(r.name, r.stats)
    return RuleSet(domain, root, rules, http.max_key_length, http)


def _make_rule(
    d: Descriptor, domain: str, keys: tuple[str, ...], path: str, where: tuple[Any, ...], problem
) -> Rule | None:
    if d.unlimited:
        return Rule(
            name=path,
            path=path,
            domain=domain,
            keys=keys,
            unit="",
            requests_per_unit=0,
            period=0,
            algorithm="",
            limit=None,
            unlimited=True,
            shadow=d.shadow_mode,
            replaces=tuple(r.name for r in d.replaces),
            key_prefix="",
            sf_name=sf_string(path),
        )
    rl = d.rate_limit
    assert rl is not None
    name = rl.name or path
    try:
        limit = Limit(
            algorithm=d.algorithm,
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
        path=path,
        domain=domain,
        keys=keys,
        unit=rl.unit,
        requests_per_unit=rl.requests_per_unit,
        period=rl.period,
        algorithm=d.algorithm,
        limit=limit,
        shadow=d.shadow_mode,
        replaces=tuple(r.name for r in d.replaces),
        key_prefix=prefix,
        sf_name=sfn,
        policy=f"{sfn};q={rl.requests_per_unit};w={rl.period}",
        # used >= 0.8 * capacity  <=>  remaining <= capacity - ceil(0.8 * capacity)
        near_threshold=limit.capacity - (4 * limit.capacity + 4) // 5,
    )


def from_loaded(loaded: Loaded) -> RuleSet:
    """The rule set of a loaded file; ConfigError when it has no ``http:`` section."""
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
    return build(http, loaded)
