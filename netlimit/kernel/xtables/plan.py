"""The iptables planner both legacy x_tables backends share. Pure: no kernel, no subprocess.

A backend reads what netlimit owns into a `FamilyState` (per family: the owned
chains with their rules, and netlimit's rules in the built-in chains), spells the
desired rules as `Want`s in its own canonical spelling (`kspec`: what
iptables-legacy-save prints, or what python-iptables reads back), and calls
`plan_family`. The plan is the smallest edit that makes the live state equal to
the desired one:

* in owned chains the rules that went are deleted by number and the new ones
  inserted at their place (edit.py over the canonical specs), so untouched rules
  keep their counters;
* new chains are declared, dropped chains flushed and deleted;
* the jumps from built-in chains match by spec wherever they stand (other tools
  may have moved them): one per wanted jump, extra copies deleted, a missing one
  inserted at its index;
* hashlimit: the kernel keeps a hashlimit table's first settings while any rule
  uses its name, so a rule that goes while its table is wanted with other
  settings is removed in a first commit (`pre_remove_ops`), the new one added in
  the second (`commit_ops`).

`commit_ops` / `pre_remove_ops` turn a plan into an ordered list of `Op`s (create,
delete by number or by spec, insert, append, flush, delete chain) that a backend
carries out one to one: as iptables-restore lines (restore.py) or as
libiptc calls (libiptc.py). `FamilyPlan.changes` are the lines `plan
--live` and `apply` print.
"""

from __future__ import annotations

import re
from collections import Counter
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field

from ...errors import NetlimitError
from ..edit import edit
from ..objects import IptChain, IptRule
from ..render import rule_line, rule_spec

BUILTINS = ("INPUT", "FORWARD", "OUTPUT")
TABLE = "filter"
TOOL = {4: "iptables", 6: "ip6tables"}


class IptablesError(NetlimitError):
    """The kernel (or iptables-restore, or libiptc) refused; `rule` names the netlimit rule if known."""

    def __init__(self, message: str, rule: str | None = None):
        super().__init__(message)
        self.rule = rule


# --- the live state ------------------------------------------------------------------------


@dataclass
class LiveRule:
    rule: IptRule  # as read back
    kspec: str  # the canonical spec the backend compares
    index: int  # position in its chain
    packets: int = 0
    bytes: int = 0
    text: str = ""  # the spec as iptables-save printed it (restore backend; "" for libiptc)


@dataclass
class FamilyState:
    family: int
    chains: list[str] = field(default_factory=list)  # owned chains that exist
    rules: dict[str, list[LiveRule]] = field(default_factory=dict)  # owned chain -> all its rules
    jumps: dict[str, list[LiveRule]] = field(default_factory=dict)  # built-in chain -> owned rules in it
    builtin_counts: dict[str, int] = field(default_factory=dict)  # built-in chain -> number of rules

    @property
    def empty(self) -> bool:
        return not self.chains and not any(self.jumps.values())

    def count(self) -> int:
        """Owned objects: chains, their rules and the jumps."""
        return len(self.chains) + sum(len(v) for v in self.rules.values()) + sum(len(v) for v in self.jumps.values())


# --- the desired state -------------------------------------------------------------------------


@dataclass(slots=True)
class Want:
    """One rule as it should be: the text to write (`rule_spec` spelling), the rule it
    belongs to (for messages), its canonical spec `kspec` (compared; `spell` computes it
    when first needed: a full apply into an empty chain compares nothing) and what plan
    output shows."""

    chain: str
    text: str
    name: str
    family: int = 4
    source: IptRule | None = None  # the rule to write (libiptc builds from it; its position: -I at the top)
    counters: tuple[int, int] | None = None  # written back with the rule (rollback)
    known: str | None = None  # the canonical spec, when already known
    spell: Callable[[str, int], str] | None = None  # text, family -> canonical spec

    @property
    def kspec(self) -> str:
        if self.known is None:
            self.known = self.spell(self.text, self.family) if self.spell is not None else self.text
        return self.known

    @property
    def line(self) -> str:
        """As render.rule_line spells it."""
        if self.source is not None and self.source.position == 0:
            return f"-I {self.chain} 1 {self.text}"
        return f"-A {self.chain} {self.text}"


def label(r: IptRule) -> str:
    return r.rule or r.comment


def want_of(r: IptRule, known: str | None = None, spell: Callable[[str, int], str] | None = None) -> Want:
    return Want(r.chain, rule_spec(r), label(r), r.family, r, None, known, spell)


def want_of_live(lr: LiveRule) -> Want:
    """A live rule as it should come back (rollback), counters included. A rule read from
    -save text is written back as that text (its IptRule is not needed: not parsed)."""
    r = lr.rule
    source = None if lr.text else r
    return Want(r.chain, lr.text or rule_spec(r), label(r), r.family, source, (lr.packets, lr.bytes), lr.kspec)


# --- planning ------------------------------------------------------------------------------


@dataclass
class FamilyPlan:
    family: int
    create_chains: list[str] = field(default_factory=list)
    # chain -> (live indexes to delete, [(final index, rule)] to insert, ascending)
    chain_ops: dict[str, tuple[list[int], list[tuple[int, Want]]]] = field(default_factory=dict)
    delete_chains: list[str] = field(default_factory=list)
    delete_jumps: list[LiveRule] = field(default_factory=list)
    add_jumps: list[tuple[int, Want]] = field(default_factory=list)  # (index in its chain, rule)
    pre_remove: dict[str, list[int]] = field(default_factory=dict)  # chain -> live indexes, commit 1
    changes: list[tuple[str, str, str, str]] = field(default_factory=list)  # (op, chain, rule, line)
    live_len: dict[str, int] = field(default_factory=dict)  # chain -> rules at read time
    builtin_counts: dict[str, int] = field(default_factory=dict)
    wanted_chains: list[str] = field(default_factory=list)
    live_rules: dict[str, list[LiveRule]] = field(default_factory=dict)  # chain -> its rules at read time

    def live_name(self, chain: str, index: int) -> str | None:
        lst = self.live_rules.get(chain, [])
        return (label(lst[index].rule) or None) if index < len(lst) else None

    @property
    def empty(self) -> bool:
        return not (self.create_chains or self.chain_ops or self.delete_chains or self.delete_jumps or self.add_jumps)

    @property
    def counters(self) -> bool:
        """True when a rule comes back with its counters (a rollback)."""
        return any(w.counters for _, ins in self.chain_ops.values() for _, w in ins) or any(
            w.counters for _, w in self.add_jumps
        )

    def lines(self) -> list[str]:
        tool = TOOL[self.family]
        return [f"{op} {tool:9} {line}" for op, _chain, _rule, line in self.changes]


_HL_SEG = re.compile(r"-m hashlimit (.*?)(?= -m | -j | -g |$)")
_HL_NAME = re.compile(r"--hashlimit-name (\S+)")


def hashlimit_settings(kspec: str) -> dict[str, str]:
    """{table name: that match's whole canonical option text} of a rule's hashlimit matches."""
    if "-m hashlimit" not in kspec:
        return {}
    out = {}
    for seg in _HL_SEG.findall(kspec):
        m = _HL_NAME.search(seg)
        if m:
            out[m.group(1)] = seg
    return out


def _settings_change(kspec: str, want_hl: Callable[[], dict[str, set[str]]]) -> bool:
    """True if a going rule's hashlimit table is wanted with other settings: the kernel
    would keep this rule's settings for the new rule, so it must go in a first commit."""
    if "-m hashlimit" not in kspec:
        return False
    wanted = want_hl()
    return any(name in wanted and wanted[name] != {seg} for name, seg in hashlimit_settings(kspec).items())


def match_jumps(
    live: dict[str, list[LiveRule]], wanted: dict[tuple[str, str], tuple[int, Want]]
) -> tuple[list[tuple[str, LiveRule]], list[tuple[int, Want]]]:
    """Jumps from the built-in chains: exactly one per wanted ``(built-in chain, kspec)``,
    wherever it stands. Returns the live jumps to delete, as ``(built-in chain, jump)``
    (not wanted, or a second copy), and the wanted ones with no live jump yet."""
    seen: set[tuple[str, str]] = set()
    gone: list[tuple[str, LiveRule]] = []
    for bchain, lst in live.items():
        for lr in lst:
            key = (bchain, lr.kspec)
            if key in wanted and key not in seen:
                seen.add(key)
            else:
                gone.append((bchain, lr))
    return gone, [v for key, v in wanted.items() if key not in seen]


def plan_family(
    family: int, chains: list[str], want: dict[str, list[Want]], jumps: list[tuple[int, Want]], state: FamilyState
) -> FamilyPlan:
    """The smallest edit that turns `state` into: `chains` holding `want[chain]` in order,
    and each of `jumps` ((index, rule) in a built-in chain) present once."""
    plan = FamilyPlan(family, builtin_counts=dict(state.builtin_counts), wanted_chains=list(chains))
    hl_cache: list[dict[str, set[str]]] = []

    def want_hl() -> dict[str, set[str]]:  # hashlimit name -> settings the new rules give it
        if not hl_cache:
            names: dict[str, set[str]] = {}
            for c in chains:
                for w in want.get(c, []):
                    for name, seg in hashlimit_settings(w.kspec).items():
                        names.setdefault(name, set()).add(seg)
            hl_cache.append(names)
        return hl_cache[0]

    for c in chains:
        if c not in state.chains:
            plan.create_chains.append(c)
            plan.changes.append(("+", c, "", f":{c} - [0:0]"))
        live = state.rules.get(c, [])
        wl = want.get(c, [])
        if not live:  # an empty or new chain: everything is appended, nothing to compare
            if wl:
                plan.chain_ops[c] = ([], list(enumerate(wl)))
                plan.live_len[c] = 0
                plan.changes.extend(("+", c, w.name, w.line) for w in wl)
            continue
        lk = [lr.kspec for lr in live]
        wk = [w.kspec for w in wl]
        if lk == wk:
            continue
        dels, ins_at = edit(lk, wk)
        ins = [(j, wl[j]) for j in ins_at]
        plan.chain_ops[c] = (dels, ins)
        plan.live_len[c] = len(live)
        plan.live_rules[c] = live
        gone = Counter(lk[i] for i in dels)
        new = Counter(w.kspec for _, w in ins)
        want_set = set(wk)
        removed, added = gone - new, new - gone
        for i in dels:
            lr = live[i]
            if removed[lr.kspec] > 0:
                removed[lr.kspec] -= 1
                plan.changes.append(("-", c, label(lr.rule), rule_line(lr.rule)))
                if lr.kspec not in want_set and _settings_change(lr.kspec, want_hl):
                    plan.pre_remove.setdefault(c, []).append(i)
        for _, w in ins:
            if added[w.kspec] > 0:
                added[w.kspec] -= 1
                plan.changes.append(("+", c, w.name, w.line))
        if gone & new:
            plan.changes.append(("~", c, "", f"reorder {len(wk)} rules of {c}"))
    for c in state.chains:
        if c not in chains:
            plan.delete_chains.append(c)
            for lr in state.rules.get(c, []):
                plan.changes.append(("-", c, label(lr.rule), rule_line(lr.rule)))
            plan.changes.append(("-", c, "", f"delete chain {c}"))
    gone_jumps, new_jumps = match_jumps(state.jumps, {(w.chain, w.kspec): (idx, w) for idx, w in jumps})
    for bchain, lr in gone_jumps:
        plan.delete_jumps.append(lr)
        plan.changes.append(("-", bchain, "", rule_line(lr.rule)))
    for idx, w in new_jumps:
        plan.add_jumps.append((idx, w))
        plan.changes.append(("+", w.chain, "", w.line))
    return plan


def plan_rules(
    family: int,
    chains: Iterable[IptChain],
    rules: Iterable[IptRule],
    state: FamilyState,
    want: Callable[[IptRule], Want],
) -> FamilyPlan:
    """plan_family for compiled rules: those in owned chains keep their order, the others
    are jumps from built-in chains at their `position`. `want` spells a rule for the backend."""
    names = [c.name for c in chains]
    wanted: dict[str, list[Want]] = {c: [] for c in names}
    jumps: list[tuple[int, Want]] = []
    for r in rules:
        w = want(r)
        if r.chain in wanted:
            wanted[r.chain].append(w)
        else:
            jumps.append((r.position or 0, w))
    return plan_family(family, names, wanted, jumps, state)


def plan_back(state: FamilyState, current: FamilyState) -> FamilyPlan:
    """The edit that turns `current` back into `state` (rollback), counters included."""
    want = {c: [want_of_live(lr) for lr in state.rules.get(c, [])] for c in state.chains}
    jumps = [(lr.index, want_of_live(lr)) for lst in state.jumps.values() for lr in lst]
    return plan_family(state.family, list(state.chains), want, jumps, current)


# --- the edit, step by step ------------------------------------------------------------------


@dataclass(slots=True)
class Op:
    """One step of a commit, in order. kind: ":" declare a chain, "-D" delete (by 1-based
    `num`, or the live rule `live` by spec), "-I" insert at 1-based `num`, "-A" append,
    "-F" flush a chain, "-X" delete a chain. `rule` names the netlimit rule it writes or
    removes (None: netlimit's own chains and jumps)."""

    kind: str
    chain: str
    num: int | None = None
    want: Want | None = None
    live: LiveRule | None = None
    rule: str | None = None

    def text(self, counters: bool = False) -> str:
        """The iptables-restore line."""
        if self.kind == ":":
            return f":{self.chain} - [0:0]"
        if self.kind in ("-F", "-X"):
            return f"{self.kind} {self.chain}"
        if self.kind == "-D":
            return f"-D {self.chain} {self.num}" if self.live is None else f"-D {self.chain} {self.live.text}"
        w = self.want
        assert w is not None
        pre = f"[{w.counters[0]}:{w.counters[1]}] " if counters and w.counters else ""
        pos = f"{self.num} " if self.kind == "-I" else ""
        return f"{pre}{self.kind} {self.chain} {pos}{w.text}".rstrip()


def commit_ops(plan: FamilyPlan) -> list[Op]:
    """The main commit: chains declared, jumps and rules deleted, new rules in place,
    dropped chains flushed and deleted, missing jumps inserted."""
    out: list[Op] = []
    for c in plan.create_chains:
        out.append(Op(":", c))
    for lr in plan.delete_jumps:
        out.append(Op("-D", lr.rule.chain, live=lr, rule=lr.rule.rule or None))
    for c, (dels, ins) in plan.chain_ops.items():
        pre = sorted(plan.pre_remove.get(c, []))
        left = plan.live_len.get(c, 0) - len(pre)
        for i in sorted(set(dels) - set(pre), reverse=True):
            shift = sum(1 for p in pre if p < i)
            out.append(Op("-D", c, i - shift + 1, rule=plan.live_name(c, i)))
            left -= 1
        for j, w in ins:
            if j >= left:
                out.append(Op("-A", c, want=w, rule=w.name))
            else:
                out.append(Op("-I", c, j + 1, want=w, rule=w.name))
            left += 1
    for c in plan.delete_chains:
        out.append(Op("-F", c))
    for c in plan.delete_chains:
        out.append(Op("-X", c))
    lens = dict(plan.builtin_counts)
    for lr in plan.delete_jumps:
        lens[lr.rule.chain] = lens.get(lr.rule.chain, 1) - 1
    for idx, w in sorted(plan.add_jumps, key=lambda x: x[0]):
        n = lens.get(w.chain, 0)
        out.append(Op("-I", w.chain, min(idx, n) + 1, want=w, rule=w.name or None))
        lens[w.chain] = n + 1
    return out


def pre_remove_ops(plan: FamilyPlan) -> list[Op]:
    """The first commit of a hashlimit settings change: the going rules, by number."""
    out = []
    for c, idxs in plan.pre_remove.items():
        for i in sorted(idxs, reverse=True):
            out.append(Op("-D", c, i + 1, rule=plan.live_name(c, i)))
    return out
