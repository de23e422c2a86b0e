"""iptables / ip6tables backend through python-iptables (libiptc, legacy x_tables).

The fallback where iptables-legacy-restore is not installed (registry.get_backend).
Loads libiptc: imported only when a command touches the kernel.

Every function here works on the namespace of the *calling thread*; use
netns.run_in_netns to aim it at another namespace. Callers hold
netns.kernel_lock(); writes also take the xtables lock (flock), as iptables does
(python-iptables takes none).

Comparison: a desired IptRule and a live rule are the same when their
`kspec` — the rule spelt from python-iptables' view of the kernel blob
(libxtables' own save functions) — is equal. The desired side is built
through exactly the objects `apply` installs, so there is one spelling.

Write: the shared planner's steps (netlimit/kernel/xtables/plan.py) as libiptc
calls on one table handle, one commit per family (two for a hashlimit settings
change); `table.autocommit = False`, or libiptc would swallow errors.
"""

from __future__ import annotations

from collections.abc import Callable

from ...errors import ApplyError
from ..netns import xtables_lock
from ..objects import COMMENT_PREFIX, IptRule, Match, owned_chain, owned_comment, rule_of_comment
from .backend import XtablesBackend
from .plan import (
    BUILTINS,
    TABLE,
    TOOL,
    FamilyPlan,
    FamilyState,
    IptablesError,
    LiveRule,
    Op,
    Want,
    commit_ops,
    pre_remove_ops,
    want_of,
)


def _iptc():
    try:
        import iptc  # heavy, needs libiptc
    except ModuleNotFoundError as exc:
        if exc.name != "iptc":
            raise
        from ...extras import MissingExtra

        raise ImportError(str(MissingExtra("iptables", "iptc"))) from None
    return iptc


# --- python-iptables <-> IptRule -----------------------------------------------------


def _value(option: str, value: str | None) -> str | list[str]:
    """An option's value as python-iptables takes it: several words ("--match-set
    netlimit-bans4 src") as a list of arguments, a flag as ""."""
    if value is None:
        return ""
    return value.split(" ") if option in ("match-set", "add-set", "del-set") else value


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
                match.set_parameter(k, _value(k, v))
        if r.target and owned_chain(r.target):
            # a jump: python-iptables only builds chain targets for chains that
            # already exist, so spell it as the standard target it is
            target = rule.create_target("")
            target.standard_target = r.target
        else:
            target = rule.create_target(r.target or "")
        for k, v in r.target_options:
            target.set_parameter(k, _value(k, v))
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
        rule_of_comment(comment)
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


# --- reading ------------------------------------------------------------------------


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


# --- writing ---------------------------------------------------------------------


def _delete_num(t, chain: str, num: int) -> None:
    """Delete rule `num` (1-based) of `chain`: libiptc's iptc_delete_num_entry, which
    python-iptables binds but wraps in no method (Chain.delete_rule deletes the first
    rule with the same spec, which is not always the one at that place)."""
    if t._iptc.iptc_delete_num_entry(chain.encode(), num - 1, t._handle) != 1:
        raise IptablesError(f"can't delete rule {num} of chain {chain}: {t.strerror()}")


def _built(w: Want):
    assert w.source is not None, "a libiptc write builds each rule from its IptRule"
    rule = to_iptc(w.source)
    if w.counters:
        rule.counters = w.counters
    return rule


def _do(t, op: Op) -> None:
    iptc = _iptc()
    if op.kind == ":":
        t.create_chain(op.chain)
    elif op.kind == "-F":
        iptc.Chain(t, op.chain).flush()
    elif op.kind == "-X":
        t.delete_chain(op.chain)
    elif op.kind == "-D" and op.live is not None:
        ch = iptc.Chain(t, op.chain)
        for r in ch.rules:  # the jump by spec: other tools may have moved it since the read
            if kspec(r) == op.live.kspec:
                ch.delete_rule(r)
                break
    elif op.kind == "-D":
        _delete_num(t, op.chain, op.num or 0)
    elif op.want is not None:
        ch = iptc.Chain(t, op.chain)
        if op.kind == "-A":
            ch.append_rule(_built(op.want))
        else:
            ch.insert_rule(_built(op.want), (op.num or 1) - 1)


def _commit(t, family: int, what: str, rule: str | None = None) -> None:
    try:
        t.commit()
    except Exception as exc:  # python-iptables raises IPTCError and others: each becomes an IptablesError
        raise IptablesError(f"{TOOL[family]} refused {what}: {exc}", rule) from exc


def _run(family: int, ops: list[Op], what: str) -> None:
    """The ops on one fresh table handle, then one commit (the kernel replaces the table once)."""
    t = _table(family)
    for op in ops:
        try:
            _do(t, op)
        except IptablesError:
            raise
        except Exception as exc:  # python-iptables raises ValueError/XTablesError/...: each an IptablesError
            head = f"rule {op.rule!r}: " if op.rule else ""
            raise IptablesError(f"{head}libiptc refused `{op.text()}`: {exc}", op.rule) from exc
    names = [op.rule for op in ops if op.want is not None and op.rule]
    _commit(t, family, what, ", ".join(dict.fromkeys(names)) or None)


# --- the backend ---------------------------------------------------------------------


class LibiptcBackend(XtablesBackend):
    name = "python-iptables (legacy x_tables)"
    key = "python-iptables"

    def __init__(self, lock_timeout: float = 10.0) -> None:
        self.lock_timeout = lock_timeout

    def family_unavailable(self, family: int) -> str | None:
        """None if the legacy table can be opened here, else the reason."""
        try:
            _table(family)
        except Exception as exc:  # ImportError (no libiptc), IPTCError (no table, no privilege)
            return str(exc)
        return None

    def plan(self, desired, state):
        if desired.ipsets:
            # libxt_set resolves a set's name to its kernel index while it builds the rule, so a
            # rule that matches an ipset cannot be built (nor compared) before the set exists
            raise ApplyError(
                "the ban list (bans:, escalate) needs the restore or the nftables backend: python-iptables "
                "cannot build a rule that matches an ipset before the set exists (apt-get install iptables "
                "for iptables-legacy-restore)",
                None,
                rolled_back=False,
            )
        return super().plan(desired, state)

    def read_family(self, family: int) -> FamilyState:
        return read_family(family)

    def wants(self, family: int, state: FamilyState) -> Callable[[IptRule], Want]:
        return lambda r: want_of(r, known=kspec(to_iptc(r)))

    def write_family(self, plan: FamilyPlan) -> None:
        if plan.empty:
            return
        with xtables_lock(self.lock_timeout):
            if plan.pre_remove:
                _run(plan.family, pre_remove_ops(plan), "removing hashlimit rules whose settings changed")
            _run(plan.family, commit_ops(plan), "the new rule set")
