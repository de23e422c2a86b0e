"""iptables / ip6tables backend through python-iptables (legacy x_tables).

Import this module only when a command touches the kernel: it loads libiptc.

Every function here works on the namespace of the *calling thread*; use
netns.run_in_netns to aim it at another namespace. Callers hold
netns.kernel_lock(); writes also take the xtables lock (flock), as iptables does.

Comparison: a desired IptRule and a live rule are the same when their
`kspec` — the rule spelt from python-iptables' view of the kernel blob
(libxtables' own save functions) — is equal. The desired side is built
through exactly the objects `apply` installs, so there is one spelling.
"""

from __future__ import annotations

import os
from collections.abc import Iterable
from dataclasses import dataclass, field

from .netns import proc_net, xtables_lock
from .objects import (
    CHAIN_FORWARD,
    CHAIN_INPUT,
    COMMENT_PREFIX,
    IptChain,
    IptRule,
    Match,
    owned_chain,
    owned_comment,
)

BUILTIN_OF = {CHAIN_INPUT: "INPUT", CHAIN_FORWARD: "FORWARD"}
BUILTINS = ("INPUT", "FORWARD", "OUTPUT")
TABLE = "filter"


class IptablesError(Exception):
    """The kernel (or libiptc) refused; `rule` names the netlimit rule if known."""

    def __init__(self, message: str, rule: str | None = None):
        super().__init__(message)
        self.rule = rule


def _iptc():
    import iptc  # heavy, needs libiptc

    return iptc


# --- python-iptables <-> IptRule -----------------------------------------------------


def _table(family: int):
    iptc = _iptc()
    t = iptc.Table(TABLE) if family == 4 else iptc.Table6(TABLE)
    t.autocommit = False  # errors must raise (autocommit swallows them), one commit per table
    t.refresh()  # a handle in this thread's namespace, fresh state
    return t


def to_iptc(r: IptRule):
    """The python-iptables rule apply installs for `r`."""
    iptc = _iptc()
    rule = iptc.Rule() if r.family == 4 else iptc.Rule6()
    try:
        if r.src:
            rule.src = r.src
        if r.dst:
            rule.dst = r.dst
        if r.in_iface:
            rule.in_interface = r.in_iface
        if r.protocol:
            # python-iptables' Rule6 knows ICMPv6 as "icmpv6" or 58, not /etc/protocols' "ipv6-icmp"
            rule.protocol = "58" if r.family == 6 and r.protocol == "ipv6-icmp" else r.protocol
        for m in r.all_matches:
            match = rule.create_match(m.module)
            for k, v in m.options:
                match.set_parameter(k, v if v is not None else "")
        if r.target and owned_chain(r.target):
            # a jump: python-iptables only builds chain targets for chains that
            # already exist, so spell it as the standard target it is
            target = rule.create_target("")
            target.standard_target = r.target
        else:
            target = rule.create_target(r.target or "")
        for k, v in r.target_options:
            target.set_parameter(k, v if v is not None else "")
    except Exception as exc:  # python-iptables raises ValueError/XTablesError/...
        raise IptablesError(f"rule {r.rule or r.comment!r}: cannot build {r.chain} rule: {exc}", r.rule) from exc
    return rule


def _params(obj) -> list[tuple[str, str]]:
    try:
        params = obj.parameters
    except Exception:  # standard targets (DROP, RETURN, chain jumps) have no save()
        return []
    return [(k, v) for k, v in params.items()]


_ANY = {"0.0.0.0/0.0.0.0", "0.0.0.0/0", "::/0", "::/::"}


def kspec(rule) -> str:
    """A python-iptables rule spelt canonically (the fingerprint compared by diff)."""
    parts: list[str] = []
    if rule.src not in _ANY:
        parts += ["-s", rule.src]
    if rule.dst not in _ANY:
        parts += ["-d", rule.dst]
    if rule.in_interface:
        parts += ["-i", rule.in_interface]
    if rule.out_interface:
        parts += ["-o", rule.out_interface]
    if rule.protocol and rule.protocol not in ("ip", "all", "0"):
        parts += ["-p", str(rule.protocol)]
    for m in rule.matches:
        parts += ["-m", m.name]
        for k, v in _params(m):
            parts += [f"--{k.replace('_', '-')}"] + ([v] if v != "" else [])
    tname = rule.target.name if rule.target is not None else ""
    if tname:
        parts += ["-j", tname]
        for k, v in _params(rule.target):
            parts += [f"--{k.replace('_', '-')}"] + ([v] if v != "" else [])
    return " ".join(parts)


def from_iptc(rule, family: int, chain: str) -> IptRule:
    """A live rule as an IptRule (for rollback and `list`); round-trips through to_iptc."""
    comment = ""
    matches: list[Match] = []
    for m in rule.matches:
        opts = tuple((k.replace("_", "-"), v if v != "" else None) for k, v in _params(m))
        if m.name == "comment" and not comment:
            comment = dict(_params(m)).get("comment", "")
            continue
        matches.append(Match(m.name, opts))
    tname = rule.target.name if rule.target is not None else ""
    topts = tuple((k.replace("_", "-"), v if v != "" else None) for k, v in _params(rule.target)) if tname else ()
    src = _cidr(rule.src) if rule.src not in _ANY else None
    dst = _cidr(rule.dst) if rule.dst not in _ANY else None
    proto = rule.protocol if rule.protocol and rule.protocol not in ("ip", "all", "0") else None
    if family == 6 and proto == "icmpv6":
        proto = "ipv6-icmp"  # as compile and iptables-save spell it
    name = (
        comment[len(COMMENT_PREFIX) :]
        if comment.startswith(COMMENT_PREFIX) and not comment.startswith(COMMENT_PREFIX + " ")
        else ""
    )
    return IptRule(
        family=family,
        table=TABLE,
        chain=chain,
        rule=name,
        comment=comment,
        src=src,
        dst=dst,
        in_iface=rule.in_interface or None,
        protocol=proto,
        matches=tuple(matches),
        target=tname or None,
        target_options=topts,
    )


def _cidr(addr: str) -> str:
    """python-iptables spells 10.0.0.0/255.255.255.0; iptables-save (and we) 10.0.0.0/24."""
    import ipaddress

    try:
        return str(ipaddress.ip_network(addr, strict=False))
    except ValueError:
        return addr


def desired_kspecs(rules: Iterable[IptRule]) -> list[str]:
    return [kspec(to_iptc(r)) for r in rules]


# --- reading ------------------------------------------------------------------------


@dataclass
class LiveRule:
    rule: IptRule  # as read back (restorable through to_iptc)
    kspec: str
    index: int  # position in its chain
    packets: int = 0
    bytes: int = 0
    text: str = ""  # the spec as iptables-save printed it (restore backend; "" here)


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


def _is_owned_rule(rule, chain_names: set[str]) -> bool:
    for m in rule.matches:
        if m.name == "comment" and owned_comment(dict(_params(m)).get("comment")):
            return True
    t = rule.target.name if rule.target is not None else ""
    return t in chain_names  # a jump to one of our chains is ours, comment or not


def read_family(family: int) -> FamilyState:
    t = _table(family)
    iptc = _iptc()
    st = FamilyState(family)
    names = [c.name for c in t.chains]
    owned = [n for n in names if owned_chain(n)]
    owned_set = set(owned)
    st.chains = owned
    for n in owned:
        ch = iptc.Chain(t, n)
        st.rules[n] = [_live(r, family, n, i) for i, r in enumerate(ch.rules)]
    for n in BUILTINS:
        if n not in names:
            continue
        ch = iptc.Chain(t, n)
        rules = ch.rules
        st.builtin_counts[n] = len(rules)
        st.jumps[n] = [_live(r, family, n, i) for i, r in enumerate(rules) if _is_owned_rule(r, owned_set)]
    return st


def _live(r, family: int, chain: str, index: int) -> LiveRule:
    pk, by = r.get_counters()
    return LiveRule(rule=from_iptc(r, family, chain), kspec=kspec(r), index=index, packets=pk, bytes=by)


def available(family: int) -> str | None:
    """None if the legacy table can be opened here, else the reason."""
    try:
        _table(family)
    except Exception as exc:
        return str(exc)
    return None


# --- diff --------------------------------------------------------------------------


@dataclass
class FamilyPlan:
    family: int
    create_chains: list[str] = field(default_factory=list)
    rewrite_chains: dict[str, list[IptRule]] = field(default_factory=dict)  # chain -> desired rules
    delete_chains: list[str] = field(default_factory=list)
    delete_jumps: list[LiveRule] = field(default_factory=list)
    add_jumps: list[IptRule] = field(default_factory=list)
    # for reporting: (op, chain, rule name, line)
    changes: list[tuple[str, str, str, str]] = field(default_factory=list)
    # hashlimit rules whose table must be dropped before re-adding (kernel keeps a
    # table's first config while any rule with that name exists)
    pre_remove: dict[str, list[str]] = field(default_factory=dict)  # chain -> kspecs to drop first

    @property
    def empty(self) -> bool:
        return not (
            self.create_chains or self.rewrite_chains or self.delete_chains or self.delete_jumps or self.add_jumps
        )


def match_jumps(live: dict[str, list[LiveRule]], wanted: dict) -> tuple[list[tuple[str, LiveRule]], list]:
    """Jumps from the built-in chains: exactly one per wanted ``(built-in chain,
    kspec)``, wherever it stands. Returns the live jumps to delete, as ``(built-in
    chain, jump)`` (not wanted, or a second copy), and the wanted values with no live
    jump yet. Both backends use it."""
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


def _hashlimit_names(spec: str) -> set[str]:
    parts = spec.split()
    return {parts[i + 1] for i, p in enumerate(parts[:-1]) if p == "--hashlimit-name"}


def diff_family(
    family: int, chains: list[IptChain], rules: list[IptRule], state: FamilyState, kspecs: dict[IptRule, str]
) -> FamilyPlan:
    from .render import rule_line

    plan = FamilyPlan(family)
    want_chains = [c.name for c in chains]
    by_chain: dict[str, list[IptRule]] = {c: [] for c in want_chains}
    jumps: list[IptRule] = []
    for r in rules:
        if r.chain in by_chain:
            by_chain[r.chain].append(r)
        else:
            jumps.append(r)
    want_specs_all = {kspecs[r] for r in rules}
    want_hl = set().union(*(_hashlimit_names(s) for s in want_specs_all)) if want_specs_all else set()
    for c in want_chains:
        if c not in state.chains:
            plan.create_chains.append(c)
            plan.changes.append(("+", c, "", f":{c} - [0:0]"))
        want = [kspecs[r] for r in by_chain[c]]
        live = [lr.kspec for lr in state.rules.get(c, [])]
        if want != live:
            plan.rewrite_chains[c] = by_chain[c]
            live_set, want_set = set(live), set(want)
            for lr in state.rules.get(c, []):
                if lr.kspec not in want_set:
                    plan.changes.append(("-", c, lr.rule.rule or lr.rule.comment, rule_line(lr.rule)))
                    stale = _hashlimit_names(lr.kspec) & want_hl
                    if stale:
                        plan.pre_remove.setdefault(c, []).append(lr.kspec)
            for r in by_chain[c]:
                if kspecs[r] not in live_set:
                    plan.changes.append(("+", c, r.rule or r.comment, rule_line(r)))
            if live_set == want_set and want != live:
                plan.changes.append(("~", c, "", f"reorder {len(want)} rules of {c}"))
    for c in state.chains:
        if c not in want_chains:
            plan.delete_chains.append(c)
            for lr in state.rules.get(c, []):
                plan.changes.append(("-", c, lr.rule.rule or lr.rule.comment, rule_line(lr.rule)))
            plan.changes.append(("-", c, "", f"delete chain {c}"))
    # jumps: exactly one per wanted chain, anywhere in the built-in chain (inserted at the top once)
    gone, new = match_jumps(state.jumps, {(j.chain, kspecs[j]): j for j in jumps})
    for bchain, lr in gone:
        plan.delete_jumps.append(lr)
        plan.changes.append(("-", bchain, "", rule_line(lr.rule)))
    for j in new:
        plan.add_jumps.append(j)
        plan.changes.append(("+", j.chain, "", rule_line(j)))
    return plan


# --- writing ------------------------------------------------------------------------


def _commit(t, family: int, what: str, rule: str | None = None) -> None:
    try:
        t.commit()
    except Exception as exc:
        raise IptablesError(f"{'ip6tables' if family == 6 else 'iptables'} refused {what}: {exc}", rule) from exc


def _guess_rule(rules: list[IptRule]) -> str | None:
    names = [r.rule for r in rules if r.rule]
    return ", ".join(dict.fromkeys(names)) or None


def apply_family(plan: FamilyPlan, lock_timeout: float = 10.0) -> None:
    """Make the table match the plan in one commit (two when a hashlimit table must be recreated)."""
    if plan.empty:
        return
    iptc = _iptc()
    fam = plan.family
    with xtables_lock(lock_timeout):
        if plan.pre_remove:
            t = _table(fam)
            for chain, specs in plan.pre_remove.items():
                ch = iptc.Chain(t, chain)
                drop = set(specs)
                for r in list(ch.rules):
                    if kspec(r) in drop:
                        ch.delete_rule(r)
            _commit(t, fam, "removing hashlimit rules whose settings changed")
        t = _table(fam)
        for lr in sorted(plan.delete_jumps, key=lambda x: -x.index):
            ch = iptc.Chain(t, lr.rule.chain)
            live = ch.rules
            # find it again by spec (indexes are from the read; the table is fresh)
            for r in live:
                if kspec(r) == lr.kspec:
                    ch.delete_rule(r)
                    break
        for c in plan.create_chains:
            t.create_chain(c)
        # new chains are all created before any rule that may jump to them
        for c, rules in plan.rewrite_chains.items():
            ch = iptc.Chain(t, c)
            ch.flush()
            for r in rules:
                try:
                    ch.append_rule(to_iptc(r))
                except IptablesError:
                    raise
                except Exception as exc:
                    raise IptablesError(f"rule {r.rule!r}: libiptc refused {r.chain} rule: {exc}", r.rule) from exc
        for c in plan.delete_chains:
            ch = iptc.Chain(t, c)
            ch.flush()
        for c in plan.delete_chains:
            t.delete_chain(c)
        for j in plan.add_jumps:
            iptc.Chain(t, j.chain).insert_rule(to_iptc(j), 0)
        all_rules = [r for rs in plan.rewrite_chains.values() for r in rs]
        _commit(t, fam, "the new rule set", _guess_rule(all_rules))


def restore_family(state: FamilyState, lock_timeout: float = 10.0) -> None:
    """Put back exactly the owned chains, rules and jumps of `state` (rollback)."""
    iptc = _iptc()
    fam = state.family
    with xtables_lock(lock_timeout):
        t = _table(fam)
        cur = read_family(fam)
        # as in apply: a hashlimit table keeps its first settings while a rule uses its
        # name, so rules whose settings differ from the state's go in a first commit
        keep = {lr.kspec for lst in state.rules.values() for lr in lst}
        names = set().union(*(_hashlimit_names(k) for k in keep)) if keep else set()
        stale = {
            c: {lr.kspec for lr in lst if lr.kspec not in keep and _hashlimit_names(lr.kspec) & names}
            for c, lst in cur.rules.items()
        }
        if any(stale.values()):
            for c, specs in stale.items():
                ch = iptc.Chain(t, c)
                for r in list(ch.rules):
                    if kspec(r) in specs:
                        ch.delete_rule(r)
            _commit(t, fam, "removing hashlimit rules whose settings changed (rollback)")
            cur = read_family(fam)
        t = _table(fam)
        for bchain, lst in cur.jumps.items():
            ch = iptc.Chain(t, bchain)
            specs = {lr.kspec for lr in lst}
            for r in list(ch.rules):
                if kspec(r) in specs:
                    ch.delete_rule(r)
        for c in cur.chains:
            iptc.Chain(t, c).flush()
        for c in cur.chains:
            if c not in state.chains:
                t.delete_chain(c)
        for c in state.chains:
            if c not in cur.chains:
                t.create_chain(c)
        for c in state.chains:
            ch = iptc.Chain(t, c)
            for lr in state.rules.get(c, []):
                ch.append_rule(to_iptc(lr.rule))
        for bchain, lst in state.jumps.items():
            ch = iptc.Chain(t, bchain)
            for lr in sorted(lst, key=lambda x: x.index):
                ch.insert_rule(to_iptc(lr.rule), min(lr.index, len(ch.rules)))
        _commit(t, fam, "the rollback")


def flush_family(family: int, lock_timeout: float = 10.0) -> int:
    """Remove every owned jump, rule and chain; returns how many objects went."""
    st = read_family(family)
    if st.empty:
        return 0
    plan = FamilyPlan(
        family, delete_chains=list(st.chains), delete_jumps=[lr for lst in st.jumps.values() for lr in lst]
    )
    apply_family(plan, lock_timeout)
    return len(st.chains) + sum(len(v) for v in st.rules.values()) + len(plan.delete_jumps)


# --- live table contents (for `list`) ---------------------------------------------------


def hashlimit_entries(name: str, family: int) -> int | None:
    path = proc_net("ipt_hashlimit" if family == 4 else "ip6t_hashlimit", name)
    return _count_lines(path)


def recent_entries(name: str) -> int | None:
    return _count_lines(proc_net("xt_recent", name))


def _count_lines(path: str) -> int | None:
    try:
        with open(path) as fh:
            return sum(1 for line in fh if line.strip())
    except OSError:
        return None


# --- which iptables does the host use ---------------------------------------------------


def host_iptables_variant() -> tuple[str, str]:
    """('nf_tables' | 'legacy' | 'unknown', version line) of the `iptables` on PATH."""
    import shutil
    import subprocess

    exe = shutil.which("iptables")
    if not exe:
        return "unknown", "no iptables command on PATH"
    try:
        out = subprocess.run([exe, "-V"], capture_output=True, text=True, timeout=5).stdout.strip()
    except (OSError, subprocess.TimeoutExpired) as exc:
        return "unknown", str(exc)
    if "nf_tables" in out:
        return "nf_tables", out
    if "legacy" in out:
        return "legacy", out
    real = os.path.realpath(exe)
    return ("legacy" if "legacy" in real else "unknown"), out
