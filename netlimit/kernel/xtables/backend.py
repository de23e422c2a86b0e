"""What the two legacy x_tables backends (restore.py, libiptc.py) share: the family
loop around the planner (xtables/plan.py), rollback, and `list`
rows with the live hashlimit / recent table sizes from /proc.

A backend subclass provides four per-family primitives: `family_unavailable`,
`read_family`, `want` (a desired rule in its canonical spelling) and
`write_family` (one plan, atomically).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from ...errors import ApplyError
from ..netns import proc_net
from ..objects import Desired, IptRule, rule_of_comment
from ..render import rule_line
from . import present
from .ipset import IpsetPlan, LiveSet, read_sets, restore_sets, undo_before, write_after, write_before
from .ipset import entries as ipset_entries
from .ipset import missing as ipset_missing
from .ipset import plan as plan_ipsets
from .plan import TOOL, FamilyPlan, FamilyState, Want, plan_back, plan_rules

FAMILIES = (4, 6)


@dataclass
class XtablesState:
    families: dict[int, FamilyState] = field(default_factory=dict)
    unavailable: dict[int, str] = field(default_factory=dict)  # family -> why it cannot be read
    ipsets: dict[str, LiveSet] = field(default_factory=dict)  # netlimit's ipsets (the ban sets)

    @property
    def empty(self) -> bool:
        return all(s.empty for s in self.families.values()) and not self.ipsets

    def count(self) -> int:
        return sum(s.count() for s in self.families.values()) + len(self.ipsets)


@dataclass
class XtablesPlan:
    families: dict[int, FamilyPlan] = field(default_factory=dict)
    ipsets: IpsetPlan = field(default_factory=lambda: IpsetPlan([], [], []))

    @property
    def empty(self) -> bool:
        return all(p.empty for p in self.families.values()) and self.ipsets.empty

    def lines(self) -> list[str]:
        out = [line for _fam, p in sorted(self.families.items()) for line in p.lines()]
        return self.ipsets.lines() + out


class XtablesBackend:
    key = ""
    name = ""
    layer = "iptables"
    kind = "iptables/ip6tables"
    write_unit = "one commit per family"
    tools = ("iptables-legacy",)

    # --- what callers ask instead of comparing names (registry.FilterBackend) ---
    def ban_sets(self):
        from .ipset import IpsetBanSets

        return IpsetBanSets()

    def hot(self, rule_names: list[str]) -> list[dict[str, Any]]:
        return present.hot_entries(rule_names)

    def plan_summary(self, desired: Desired) -> tuple[int, str]:
        return present.plan_summary(desired)

    def plan_sections(self, desired: Desired) -> list[str]:
        return present.plan_sections(desired)

    def plan_doc(self, desired: Desired) -> dict[str, Any]:
        return present.plan_doc(desired)

    def warnings(self, loaded: Any) -> list[Any]:
        from ...config.validate import ingress_ignored_warnings

        return ingress_ignored_warnings(loaded)

    def note(self, netns: str | None) -> str | None:
        return present.host_note(netns)

    def prune_state(self) -> None:
        pass

    # --- per-family primitives (the subclass) ---
    def family_unavailable(self, family: int) -> str | None:
        raise NotImplementedError

    def read_family(self, family: int) -> FamilyState:
        raise NotImplementedError

    def wants(self, family: int, state: FamilyState) -> Callable[[IptRule], Want]:
        """A function IptRule -> Want in this backend's spelling (it may look at `state`)."""
        raise NotImplementedError

    def write_family(self, plan: FamilyPlan) -> None:
        raise NotImplementedError

    # --- the FilterBackend interface ---
    def available(self) -> str | None:
        whys = [w for w in (self.family_unavailable(f) for f in FAMILIES) if w]
        return "; ".join(whys) if len(whys) == len(FAMILIES) else None

    def read(self) -> XtablesState:
        st = XtablesState()
        for fam in FAMILIES:
            why = self.family_unavailable(fam)
            if why is not None:
                st.unavailable[fam] = why
            else:
                st.families[fam] = self.read_family(fam)
        st.ipsets = read_sets()
        return st

    def plan(self, desired: Desired, state: XtablesState) -> XtablesPlan:
        if desired.ipsets and ipset_missing() is not None:
            raise ApplyError(
                f"the ban list needs ipset on the legacy backends: {ipset_missing()}", None, rolled_back=False
            )
        out = XtablesPlan(ipsets=plan_ipsets(desired.ipsets, state.ipsets))
        for fam in FAMILIES:
            rules = desired.family_rules(fam)
            if fam in state.unavailable:
                if rules:
                    raise ApplyError(
                        f"{TOOL[fam]} (legacy) is not usable here: {state.unavailable[fam]}",
                        rules[0].rule or None,
                        rolled_back=False,
                    )
                continue
            fst = state.families[fam]
            out.families[fam] = plan_rules(fam, desired.family_chains(fam), rules, fst, self.wants(fam, fst))
        return out

    def write(self, plan: XtablesPlan) -> None:
        """Sets the rules will match first, then the rules, then the sets no rule matches."""
        write_before(plan.ipsets)
        try:
            for _fam, p in sorted(plan.families.items()):
                if not p.empty:
                    self.write_family(p)
        except Exception:  # whatever failed: the sets written first are undone, then re-raised
            undo_before(plan.ipsets)
            raise
        write_after(plan.ipsets)

    def restore(self, state: XtablesState) -> None:
        live = read_sets()
        back = [s for n, s in state.ipsets.items() if n not in live]
        if back:  # the sets the earlier rules match, before those rules
            restore_sets(back)
        for fam, fst in sorted(state.families.items()):
            p = plan_back(fst, self.read_family(fam))
            if not p.empty:
                self.write_family(p)
        extra = [n for n in read_sets() if n not in state.ipsets]
        if extra:
            write_after(IpsetPlan([], [], extra))

    def rows(self, state: XtablesState) -> list[dict[str, Any]]:
        rows: list[dict[str, Any]] = []
        for fam, fst in sorted(state.families.items()):
            layer = TOOL[fam]
            lists = [(c, fst.rules.get(c, [])) for c in fst.chains] + list(fst.jumps.items())
            for chain, lst in lists:
                for lr in lst:
                    r = lr.rule
                    row: dict[str, Any] = {
                        "rule": rule_of_comment(r.comment) if r.comment else "(jump)",
                        "layer": layer,
                        "object": rule_line(r),
                        "chain": chain,
                        "packets": lr.packets,
                        "bytes": lr.bytes,
                        "dropped": lr.packets if r.target in ("DROP", "REJECT") else 0,
                    }
                    _table_entries(row, r, fam)
                    rows.append(row)
        return rows


def _table_entries(row: dict[str, Any], r: IptRule, family: int) -> None:
    """The live size of the rule's hashlimit / recent table (from /proc) or ipset."""
    for m in r.matches:
        opts = dict(m.options)
        if m.module == "set" and opts.get("match-set"):
            name = (opts["match-set"] or "").split(" ")[0]
            row["table"] = f"ipset {name}"
            row["table_entries"] = ipset_entries(name)
        if m.module == "hashlimit" and "hashlimit-name" in opts:
            row["table"] = f"hashlimit {opts['hashlimit-name']}"
            proc = "ipt_hashlimit" if family == 4 else "ip6t_hashlimit"
            row["table_entries"] = _count_lines(proc_net(proc, opts["hashlimit-name"] or ""))
        elif m.module == "recent" and "name" in opts:
            row["table"] = f"recent {opts['name']}"
            row["table_entries"] = _count_lines(proc_net("xt_recent", opts["name"] or ""))


def _count_lines(path: str) -> int | None:
    try:
        with open(path) as fh:
            return sum(1 for line in fh if line.strip())
    except OSError:
        return None
