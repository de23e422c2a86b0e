"""Read what netlimit owns, diff it against the compiled file, make them equal.

The API a daemon calls (all kernel work runs in `netns` when given):

    desired = compile_config(config)              # pure (compile.py)
    state   = read_owned(netns)                   # what is installed now
    changes = diff(desired, state)                # .empty, .lines()
    result  = apply(desired, netns)               # read + diff + write, rollback on failure
    flush(netns)                                  # remove everything netlimit owns
    rows    = list_owned(netns)                   # objects + counters, by rule

Order of writes: iptables (one commit per family, under the xtables lock),
then tc. If any step fails, every family already written and every tc change
are put back to the state read at the start, and ApplyError names the rule
and the kernel's answer.
"""

from __future__ import annotations

import os
import time
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any, Protocol

from ..errors import ApplyError
from .netns import LockTimeout, kernel_lock, run_in_netns, writer_lock
from .objects import Desired, IptChain, IptRule, rule_of_comment

# --- the packet-filter backend interface -----------------------------------------------


class FilterBackend(Protocol):
    """What reconcile needs from a packet-filter backend: RestoreBackend
    (restore_backend.py, iptables-legacy-save/-restore; the default) and
    PythonIptablesBackend (libiptc through python-iptables). An nftables backend
    would implement the same five calls. A state comes back to the backend that read it."""

    name: str

    def read(self, family: int) -> Any: ...
    def plan(self, family: int, chains: list[IptChain], rules: list[IptRule], state: Any) -> Any: ...
    def write(self, plan: Any) -> None: ...
    def restore(self, state: Any) -> None: ...
    def available(self, family: int) -> str | None: ...


class PythonIptablesBackend:
    name = "python-iptables (legacy x_tables)"
    key = "python-iptables"

    def read(self, family: int):
        from . import iptables as ipt

        return ipt.read_family(family)

    def plan(self, family, chains, rules, state):
        from . import iptables as ipt

        kspecs = {r: ipt.kspec(ipt.to_iptc(r)) for r in rules}
        return ipt.diff_family(family, chains, rules, state, kspecs)

    def write(self, plan) -> None:
        from . import iptables as ipt

        ipt.apply_family(plan)

    def restore(self, state) -> None:
        from . import iptables as ipt

        ipt.restore_family(state)

    def available(self, family: int) -> str | None:
        from . import iptables as ipt

        return ipt.available(family)


BACKENDS = ("restore", "python-iptables")
BACKEND_ENV = "NETLIMIT_BACKEND"


def backend_name(name: str | None = None) -> str:
    """'restore' or 'python-iptables': `name`, else $NETLIMIT_BACKEND, else 'restore' when
    iptables-legacy-save/-restore (and ip6tables-) are installed, else python-iptables."""
    choice = (name or os.environ.get(BACKEND_ENV) or "auto").strip().lower()
    if choice in ("auto", ""):
        from .restore_backend import binaries_missing

        return "python-iptables" if binaries_missing() else "restore"
    if choice in ("iptables-restore", "iptables-legacy-restore"):
        choice = "restore"
    if choice in ("python-iptables", "iptc", "pyiptc"):
        choice = "python-iptables"
    if choice not in BACKENDS:
        raise ApplyError(
            f"unknown iptables backend {choice!r} (from {'--backend' if name else BACKEND_ENV}): "
            f"choose one of {', '.join(BACKENDS)} or auto",
            None,
            rolled_back=False,
        )
    return choice


def get_backend(name: str | None = None) -> FilterBackend:
    if backend_name(name) == "restore":
        from .restore_backend import RestoreBackend

        return RestoreBackend()
    return PythonIptablesBackend()


@contextmanager
def _nolock():
    yield


# --- state and changes ------------------------------------------------------------


@dataclass
class State:
    netns: str | None
    iptables: dict[int, Any] = field(default_factory=dict)  # family -> FamilyState
    tc: Any = None  # TcState
    unavailable: dict[int, str] = field(default_factory=dict)
    backend: str | None = None  # the backend that read it

    @property
    def empty(self) -> bool:
        return all(s.empty for s in self.iptables.values()) and (self.tc is None or self.tc.empty)


@dataclass
class Changes:
    iptables: dict[int, Any] = field(default_factory=dict)  # family -> FamilyPlan
    tc: Any = None  # TcPlan

    @property
    def empty(self) -> bool:
        return all(p.empty for p in self.iptables.values()) and (self.tc is None or self.tc.empty)

    def lines(self) -> list[str]:
        out: list[str] = []
        for fam, p in sorted(self.iptables.items()):
            tool = "iptables" if fam == 4 else "ip6tables"
            for op, _chain, _rule, line in p.changes:
                out.append(f"{op} {tool:9} {line}")
        if self.tc is not None:
            for op, _dev, _rule, cmd in self.tc.changes:
                out.append(f"{op} {'tc':9} {cmd}")
        return out

    def counts(self) -> dict[str, int]:
        lines = self.lines()
        return {
            "add": sum(1 for x in lines if x.startswith("+")),
            "remove": sum(1 for x in lines if x.startswith("-")),
            "reorder": sum(1 for x in lines if x.startswith("~")),
        }


def _read(backend: FilterBackend, families=(4, 6)) -> State:
    from . import tc

    st = State(netns=None, backend=getattr(backend, "key", None))
    prefetch = getattr(backend, "prefetch", None)
    if prefetch is not None:  # start reading every family at once (restore: one -save process each)
        prefetch(families)
    st.tc = tc.read_state()
    for fam in families:
        why = backend.available(fam)
        if why is not None:
            st.unavailable[fam] = why
            continue
        st.iptables[fam] = backend.read(fam)
    return st


def _diff(backend: FilterBackend, desired: Desired, state: State) -> Changes:
    from . import tc

    ch = Changes()
    for fam in (4, 6):
        rules = list(desired.family_rules(fam))
        if fam in state.unavailable:
            if rules:
                raise ApplyError(
                    f"{'ip6tables' if fam == 6 else 'iptables'} (legacy) is not usable here: {state.unavailable[fam]}",
                    rules[0].rule or None,
                    rolled_back=False,
                )
            continue
        ch.iptables[fam] = backend.plan(fam, list(desired.family_chains(fam)), rules, state.iptables[fam])
    ch.tc = tc.diff(desired.devices, state.tc)
    return ch


def read_owned(netns: str | None = None, *, backend: str | None = None) -> State:
    def work() -> State:
        with kernel_lock():
            st = _read(get_backend(backend))
        st.netns = netns
        return st

    return run_in_netns(netns, work)


def diff(desired: Desired, state: State) -> Changes:
    """Compare; no writes. Both sides are compared in the kernel's spelling (the
    backend that read `state` spells the desired rules); runs in the state's namespace."""

    def work() -> Changes:
        with kernel_lock():
            return _diff(get_backend(state.backend), desired, state)

    return run_in_netns(state.netns, work)


@dataclass
class ApplyResult:
    changes: Changes
    before: State
    timings: dict[str, float] = field(default_factory=dict)

    @property
    def changed(self) -> bool:
        return not self.changes.empty


def apply(
    desired: Desired, netns: str | None = None, *, dry_run: bool = False, backend: str | None = None
) -> ApplyResult:
    """Make the kernel (in `netns`) equal to `desired`. Idempotent; rolls back on failure.
    `backend`: 'restore' | 'python-iptables' (default: see backend_name)."""
    chosen = get_backend(backend)

    def work() -> ApplyResult:
        from . import tc

        backend = chosen
        t0 = time.monotonic()
        with kernel_lock(), writer_lock(netns) if not dry_run else _nolock():
            state = _read(backend)
            state.netns = netns
            t_read = time.monotonic()
            changes = _diff(backend, desired, state)
            t_diff = time.monotonic()
            res = ApplyResult(changes, state, {"read": t_read - t0, "diff": t_diff - t_read})
            if dry_run or changes.empty:
                return res
            touched: list[int] = []
            tc_touched = False
            try:
                for fam in (4, 6):
                    plan = changes.iptables.get(fam)
                    if plan is None or plan.empty:
                        continue
                    touched.append(fam)
                    backend.write(plan)
                res.timings["iptables"] = time.monotonic() - t_diff
                t1 = time.monotonic()
                if not changes.tc.empty:
                    tc_touched = True
                    tc.apply(changes.tc, state.tc)
                res.timings["tc"] = time.monotonic() - t1
            except Exception as exc:
                rule = getattr(exc, "rule", None)
                problems = []
                for fam in reversed(touched):
                    try:
                        backend.restore(state.iptables[fam])
                    except Exception as rexc:  # pragma: no cover - reported, not hidden
                        problems.append(f"restoring {'ip6tables' if fam == 6 else 'iptables'} failed: {rexc}")
                if tc_touched:
                    try:
                        tc.restore(state.tc)
                    except Exception as rexc:  # pragma: no cover
                        problems.append(f"restoring tc failed: {rexc}")
                msg = str(exc)
                if rule and f"'{rule}'" not in msg:
                    msg = f"rule {rule!r}: {msg}"
                if problems:
                    msg += "; ROLLBACK INCOMPLETE: " + "; ".join(problems)
                else:
                    msg += "; the previous state was restored"
                raise ApplyError(msg, rule, rolled_back=not problems) from exc
            res.timings["total"] = time.monotonic() - t0
            return res

    try:
        result = run_in_netns(netns, work)
    except LockTimeout as exc:
        raise ApplyError(str(exc), None, rolled_back=True) from None
    if not dry_run:
        save_names(netns, desired)
    return result


def flush(netns: str | None = None, *, backend: str | None = None) -> State:
    """Remove everything netlimit owns (both families, tc trees, ingress redirects, IFBs).
    Returns the state that was removed."""
    chosen = get_backend(backend)

    def work() -> State:
        from . import tc

        with kernel_lock(), writer_lock(netns):
            st = _read(chosen)
            st.netns = netns
            for fam, fst in st.iptables.items():
                if not fst.empty:
                    chosen.write(chosen.plan(fam, [], [], fst))  # the diff against nothing
            tc.flush(st.tc)
            return st

    st = run_in_netns(netns, work)
    forget_names(netns)
    return st


# --- list -----------------------------------------------------------------------


def _rows(st: State) -> list[dict[str, Any]]:
    from . import iptables as ipt
    from .render import rule_line, tc_command
    from .tc import TcClass, TcFilter, TcLink, TcQdisc

    rows: list[dict[str, Any]] = []
    for fam, fst in sorted(st.iptables.items()):
        layer = "iptables" if fam == 4 else "ip6tables"
        lists = [(c, fst.rules.get(c, [])) for c in fst.chains] + list(fst.jumps.items())
        for chain, lst in lists:
            for lr in lst:
                r = lr.rule
                name = rule_of_comment(r.comment) if r.comment else "(jump)"
                dropping = r.target in ("DROP", "REJECT")
                row: dict[str, Any] = {
                    "rule": name,
                    "layer": layer,
                    "object": rule_line(r),
                    "chain": chain,
                    "packets": lr.packets,
                    "bytes": lr.bytes,
                    "dropped": lr.packets if dropping else 0,
                }
                for m in r.matches:
                    opts = dict(m.options)
                    if m.module == "hashlimit" and "hashlimit-name" in opts:
                        row["table"] = f"hashlimit {opts['hashlimit-name']}"
                        row["table_entries"] = ipt.hashlimit_entries(opts["hashlimit-name"], fam)
                    elif m.module == "recent" and "name" in opts:
                        row["table"] = f"recent {opts['name']}"
                        row["table_entries"] = ipt.recent_entries(opts["name"])
                rows.append(row)
    if st.tc is not None:
        for x in st.tc.objects():
            o = x.obj
            kind = (
                "link"
                if isinstance(o, TcLink)
                else "qdisc"
                if isinstance(o, TcQdisc)
                else "class"
                if isinstance(o, TcClass)
                else "filter"
                if isinstance(o, TcFilter)
                else "?"
            )
            key = (
                f"class {o.dev} {o.classid:#x}"
                if isinstance(o, TcClass)
                else f"filter {o.dev} {o.parent:#x} {o.prio}"
                if isinstance(o, TcFilter)
                else f"{kind} {o.dev}"
            )
            rows.append(
                {
                    "rule": o.rule or "",
                    "layer": "tc",
                    "object": tc_command(o),
                    "dev": o.dev,
                    "kind": kind,
                    "key": key,
                    "packets": x.packets,
                    "bytes": x.bytes,
                    "dropped": x.drops,
                    "overlimits": x.overlimits,
                    "backlog": x.backlog,
                }
            )
    return rows


NAMES_DIR = "/run/netlimit"


def _names_path(netns: str | None) -> str:
    import os

    return os.path.join(NAMES_DIR, f"tc-names-{netns or '_root'}.json")


def tc_names(desired: Desired) -> dict[str, str]:
    """tc objects carry no comment: map their keys (as in list rows) to rule names."""
    from .objects import TcClass, TcFilter

    out: dict[str, str] = {}
    for o in desired.tc_objects:
        if isinstance(o, TcClass) and o.rule:
            out[f"class {o.dev} {o.classid:#x}"] = o.rule
        elif isinstance(o, TcFilter) and o.rule:
            out[f"filter {o.dev} {o.parent:#x} {o.prio}"] = o.rule
    return out


def save_names(netns: str | None, desired: Desired) -> None:
    """Remember which rule each tc class/filter belongs to (only for `list`; the kernel stays the truth)."""
    import json
    import os

    names = tc_names(desired)
    try:
        _prune_names()
        if not names:
            forget_names(netns)
            return
        os.makedirs(NAMES_DIR, exist_ok=True)
        tmp = _names_path(netns) + ".tmp"
        with open(tmp, "w") as fh:
            json.dump(names, fh, indent=1, sort_keys=True)
        os.replace(tmp, _names_path(netns))
    except OSError:
        pass


def _prune_names() -> None:
    """Drop the name files of namespaces that no longer exist."""
    import os

    from .netns import NETNS_DIR

    try:
        entries = os.listdir(NAMES_DIR)
    except OSError:
        return
    for e in entries:
        if not (e.startswith("tc-names-") and e.endswith(".json")):
            continue
        ns = e[len("tc-names-") : -len(".json")]
        if ns != "_root" and not os.path.exists(os.path.join(NETNS_DIR, ns)):
            try:
                os.unlink(os.path.join(NAMES_DIR, e))
            except OSError:
                pass


def forget_names(netns: str | None) -> None:
    import os

    try:
        os.unlink(_names_path(netns))
    except OSError:
        pass


def load_names(netns: str | None) -> dict[str, str]:
    import json

    try:
        with open(_names_path(netns)) as fh:
            data = json.load(fh)
        return data if isinstance(data, dict) else {}
    except (OSError, ValueError):
        return {}


def list_owned(
    netns: str | None = None, desired: Desired | None = None, *, backend: str | None = None
) -> list[dict[str, Any]]:
    """Every owned object with its counters, named by rule (tc names come from
    `desired` if given, else from what the last apply remembered)."""
    chosen = get_backend(backend)

    def work() -> list[dict[str, Any]]:
        with kernel_lock():
            st = _read(chosen)
            rows = _rows(st)
        return rows

    rows = run_in_netns(netns, work)
    names = tc_names(desired) if desired is not None else load_names(netns)
    for row in rows:
        if row["layer"] == "tc" and not row["rule"]:
            row["rule"] = names.get(row.get("key", ""), "")
    return rows


def restore(state: State, netns: str | None = None) -> None:
    """Put back exactly what `state` (from read_owned / ApplyResult.before) held:
    the confirm-or-roll-back of `apply --confirm`, and a daemon's undo."""

    def work() -> None:
        from . import tc

        with kernel_lock(), writer_lock(netns):
            backend = get_backend(state.backend)
            for fst in state.iptables.values():
                backend.restore(fst)
            if state.tc is not None:
                tc.restore(state.tc)

    run_in_netns(netns, work)
