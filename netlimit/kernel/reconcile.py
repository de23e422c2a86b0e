"""Read what netlimit owns, diff it against the compiled file, make them equal.

The API a daemon calls (all kernel work runs in `netns` when given):

    desired = compile_config(config)              # pure (compile.py)
    state   = read_owned(netns)                   # what is installed now
    changes = diff(desired, state)                # .empty, .lines()
    result  = apply(desired, netns)               # read + diff + write, rollback on failure
    flush(netns)                                  # remove everything netlimit owns
    rows    = list_owned(netns)                   # objects + counters, by rule

Order of writes: the packet filter through its backend (netlimit/kernel/registry.py:
one atomic commit per table), then tc. If any step fails, the filter and tc are
put back to the state read at the start, and ApplyError names the rule and the
kernel's answer.
"""

from __future__ import annotations

import logging
import time
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from ..errors import ApplyError
from .netns import LockTimeout, kernel_lock, prune_state_files, run_in_netns, writer_lock
from .objects import Desired
from .registry import BACKEND_ENV, BACKENDS, FilterBackend, FilterPlan, FilterState, backend_name, get_backend, others

if TYPE_CHECKING:
    from .tc.shaping import TcPlan, TcState
    from .xdp.stage import XdpPlan, XdpState

__all__ = [
    "BACKENDS",
    "BACKEND_ENV",
    "ApplyError",
    "ApplyResult",
    "Changes",
    "FlushResult",
    "State",
    "apply",
    "backend_name",
    "diff",
    "flush",
    "get_backend",
    "layer_counts",
    "list_owned",
    "read_owned",
    "restore",
]

log = logging.getLogger("netlimit.kernel")


@contextmanager
def _nolock():
    yield


# --- state and changes ------------------------------------------------------------


@dataclass
class State:
    netns: str | None
    filter: FilterState  # as the filter backend read it
    tc: TcState
    backend: str  # the key of the backend that read it
    # what netlimit owns through the other kind of backend (nftables vs legacy x_tables):
    # left by a switch of backend, removed once the new rules are in
    others: dict[str, FilterState] = field(default_factory=dict)
    xdp: XdpState | None = None  # netlimit's XDP program, attachments and maps (kernel/xdp/stage.py)

    @property
    def empty(self) -> bool:
        return (
            self.filter.empty
            and self.tc.empty
            and all(s.empty for s in self.others.values())
            and (self.xdp is None or self.xdp.empty)
        )

    def count(self) -> int:
        """Owned objects found in the kernel (what an apply adopts: a diff keeps those that
        match the file, e.g. after a crash or a kill -9 mid-apply)."""
        n = self.filter.count() + len(self.tc.objects()) + sum(s.count() for s in self.others.values())
        return n + (self.xdp.count() if self.xdp is not None else 0)


@dataclass
class Changes:
    filter: FilterPlan  # as the filter backend planned it
    tc: TcPlan
    cleanup: dict[str, FilterPlan] = field(default_factory=dict)  # the other backends' objects going
    xdp: XdpPlan | None = None

    @property
    def empty(self) -> bool:
        return (
            self.filter.empty
            and self.tc.empty
            and all(p.empty for p in self.cleanup.values())
            and (self.xdp is None or self.xdp.empty)
        )

    def lines(self) -> list[str]:
        out = self.filter.lines()
        for p in self.cleanup.values():
            out.extend(p.lines())
        return out + self.tc.lines() + (self.xdp.lines() if self.xdp is not None else [])

    def counts(self) -> dict[str, int]:
        lines = self.lines()
        return {
            "add": sum(1 for x in lines if x.startswith("+")),
            "remove": sum(1 for x in lines if x.startswith("-")),
            "reorder": sum(1 for x in lines if x.startswith("~")),
        }


def _read(backend: FilterBackend, netns: str | None) -> State:
    from .tc import shaping as tc
    from .xdp import stage as xdp

    st = State(netns, backend.read(), tc.read_state(), backend.key, xdp=xdp.read(netns))
    for other in others(backend.key):
        try:
            ost = other.read()
        except Exception as exc:  # the other kind of packet filter may simply not work here
            log.debug("not reading %s: %s", other.name, exc)
            continue
        if not ost.empty:
            st.others[other.key] = ost
    return st


def _diff(backend: FilterBackend, desired: Desired, state: State) -> Changes:
    from .tc import shaping as tc
    from .xdp import stage as xdp

    cleanup = {k: get_backend(k).plan(Desired(), ost) for k, ost in state.others.items()}
    xplan = xdp.plan(desired.xdp, state.xdp) if state.xdp is not None else None
    return Changes(backend.plan(desired, state.filter), tc.diff(desired.devices, state.tc), cleanup, xplan)


def read_owned(netns: str | None = None, *, backend: str | None = None) -> State:
    def work() -> State:
        with kernel_lock():
            return _read(get_backend(backend), netns)

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
    `backend`: 'nftables' | 'restore' | 'python-iptables' (default: see registry.choose).
    Switching backends installs the new rules first, then removes the old ones."""
    chosen = get_backend(backend)

    def work() -> ApplyResult:
        from .tc import shaping as tc
        from .xdp.stage import restore as xdp_restore
        from .xdp.stage import write as xdp_write

        t0 = time.monotonic()
        with kernel_lock(), writer_lock(netns) if not dry_run else _nolock():
            state = _read(chosen, netns)
            t_read = time.monotonic()
            changes = _diff(chosen, desired, state)
            t_diff = time.monotonic()
            res = ApplyResult(changes, state, {"read": t_read - t0, "diff": t_diff - t_read})
            if dry_run or changes.empty:
                return res
            if changes.xdp is not None and changes.xdp.refused:  # before any write: nothing changes
                raise ApplyError(f"xdp: {changes.xdp.refused}; nothing was changed", None, rolled_back=True)
            filter_touched = tc_touched = xdp_touched = False
            cleaned: list[str] = []
            try:
                if not changes.filter.empty:
                    filter_touched = True
                    chosen.write(changes.filter)
                for key, plan in changes.cleanup.items():  # the new rules are in: the old ones go
                    if not plan.empty:
                        cleaned.append(key)
                        log.info("removing netlimit's rules from %s (now in %s)", key, chosen.key)
                        get_backend(key).write(plan)
                res.timings["filter"] = time.monotonic() - t_diff
                t1 = time.monotonic()
                if not changes.tc.empty:
                    tc_touched = True
                    tc.apply(changes.tc, state.tc)
                res.timings["tc"] = time.monotonic() - t1
                if changes.xdp is not None and not changes.xdp.empty:
                    t2 = time.monotonic()
                    xdp_touched = True
                    xdp_write(changes.xdp)  # last: attach/replace is atomic per interface
                    res.timings["xdp"] = time.monotonic() - t2
            except Exception as exc:  # any failure mid-write rolls back, then becomes an ApplyError
                rule = getattr(exc, "rule", None)
                problems = []
                for key in reversed(cleaned):
                    try:
                        get_backend(key).restore(state.others[key])
                    except Exception as rexc:  # pragma: no cover - reported, not hidden
                        problems.append(f"restoring {key} failed: {rexc}")
                if filter_touched:
                    try:
                        chosen.restore(state.filter)
                    except Exception as rexc:  # pragma: no cover - reported, not hidden
                        problems.append(f"restoring {chosen.name} failed: {rexc}")
                if tc_touched:
                    try:
                        tc.restore(state.tc)
                    except Exception as rexc:  # pragma: no cover - reported, not hidden
                        problems.append(f"restoring tc failed: {rexc}")
                if xdp_touched:
                    try:
                        xdp_restore(state.xdp)
                    except Exception as rexc:  # pragma: no cover - reported, not hidden
                        problems.append(f"restoring xdp failed: {rexc}")
                msg = str(exc)
                if rule and f"'{rule}'" not in msg:
                    msg = f"rule {rule!r}: {msg}"
                if problems:
                    msg += "; ROLLBACK INCOMPLETE: " + "; ".join(problems)
                else:
                    msg += "; the previous state was restored"
                log.debug("apply failed: %s", msg)
                raise ApplyError(msg, rule, rolled_back=not problems) from exc
            res.timings["total"] = time.monotonic() - t0
            return res

    try:
        result = run_in_netns(netns, work)
    except LockTimeout as exc:
        raise ApplyError(str(exc), None, rolled_back=True) from None
    if not dry_run:
        from . import listing

        save_names(netns, desired)
        listing.save(netns, desired)
        from .xdp import prune_stale

        prune_stale()  # where listing.save prunes the state files of namespaces that are gone
    return result


def layer_counts(st: State) -> dict[str, int]:
    """How many objects netlimit owns in `st`, per layer: the filter backends by key, "tc"."""
    counts = {st.backend: st.filter.count()} | {k: s.count() for k, s in st.others.items()}
    counts["tc"] = len(st.tc.objects())
    if st.xdp is not None:
        counts["xdp"] = st.xdp.count()
    return counts


@dataclass
class FlushResult:
    before: State  # what was there, as the first read saw it
    after: State  # read back from the kernel after the last write: what the flush really left
    removed_counts: dict[str, int] = field(default_factory=dict)  # per layer, counted from the kernel

    def removed(self) -> dict[str, int]:
        """Per layer, objects gone between each read and the read back after its writes."""
        return {k: n for k, n in self.removed_counts.items() if n > 0}

    def remaining(self) -> dict[str, int]:
        return {k: n for k, n in layer_counts(self.after).items() if n}

    def unreadable(self) -> dict[int, str]:
        return dict(getattr(self.after.filter, "unavailable", {}))


FLUSH_ATTEMPTS = 3


def flush(netns: str | None = None, *, backend: str | None = None) -> FlushResult:
    """Remove everything netlimit owns (both families, nftables and legacy x_tables, tc
    trees, ingress redirects, IFBs) and read the kernel back to prove it: up to
    FLUSH_ATTEMPTS rounds of read -> remove -> read. Returns what was removed, counted
    from the kernel; raises ApplyError naming what remains (or could not be read)."""
    chosen = get_backend(backend)

    def work() -> FlushResult:
        from .tc import shaping as tc
        from .xdp import stage as xdp

        with kernel_lock(), writer_lock(netns):
            first: State | None = None
            removed: dict[str, int] = {}
            for attempt in range(1, FLUSH_ATTEMPTS + 1):
                st = _read(chosen, netns)
                first = first or st
                if not st.filter.empty:
                    chosen.write(chosen.plan(Desired(), st.filter))  # the diff against nothing
                for key, ost in st.others.items():
                    other = get_backend(key)
                    other.write(other.plan(Desired(), ost))
                tc.flush(st.tc)
                xdp.flush(netns)
                after = _read(chosen, netns)
                b, a = layer_counts(st), layer_counts(after)
                for k, n in b.items():
                    removed[k] = removed.get(k, 0) + max(0, n - a.get(k, 0))
                res = FlushResult(first, after, removed)
                if not res.remaining() and not res.unreadable():
                    return res
                log.warning(
                    "flush: attempt %d of %d left %s%s",
                    attempt,
                    FLUSH_ATTEMPTS,
                    ", ".join(f"{n} {k} objects" for k, n in res.remaining().items()) or "nothing",
                    "".join(f"; IPv{f} unreadable: {why}" for f, why in res.unreadable().items()),
                )
            problems = [f"{n} owned {k} objects remain" for k, n in res.remaining().items()]
            problems += [f"IPv{f} could not be read back ({why})" for f, why in res.unreadable().items()]
            raise ApplyError(f"flush incomplete after {FLUSH_ATTEMPTS} attempts: " + "; ".join(problems), None)

    res = run_in_netns(netns, work)
    from . import listing

    forget_names(netns)
    listing.forget(netns)
    prune_state()
    return res


def prune_state() -> None:
    """Drop what /run/netlimit remembers about namespaces that no longer exist (tc rule
    names, nftables records): `ip netns del` leaves them behind, a flush clears them."""
    from .registry import prune_state as prune_backends

    prune_state_files(NAMES_DIR, "tc-names-")
    prune_state_files(NAMES_DIR, "rules-")  # what `list` keeps of the last apply (listing.py)
    prune_backends()  # nftables: its records of what it wrote
    from .xdp import prune_stale

    prune_stale()  # the XDP pins of namespaces that are gone (/sys/fs/bpf/netlimit/ns-*)


# --- list -----------------------------------------------------------------------


def _rows(backend: FilterBackend, st: State) -> list[dict[str, Any]]:
    from .tc import shaping as tc

    rows = backend.rows(st.filter)
    for key, ost in st.others.items():
        rows.extend(get_backend(key).rows(ost))
    return rows + tc.rows(st.tc)


NAMES_DIR = "/run/netlimit"


def _names_path(netns: str | None) -> str:
    import os

    return os.path.join(NAMES_DIR, f"tc-names-{netns or '_root'}.json")


def tc_names(desired: Desired) -> dict[str, str]:
    """tc objects carry no comment: map their keys (as in list rows) to rule names."""
    from .objects import TcClass, TcFilter
    from .tc.shaping import row_key

    return {row_key(o): o.rule for o in desired.tc_objects if isinstance(o, (TcClass, TcFilter)) and o.rule}


def save_names(netns: str | None, desired: Desired) -> None:
    """Remember which rule each tc class/filter belongs to (only for `list`; the kernel stays the truth)."""
    import json
    import os

    names = tc_names(desired)
    try:
        prune_state_files(NAMES_DIR, "tc-names-")
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
    netns: str | None = None,
    desired: Desired | None = None,
    *,
    backend: str | None = None,
    wait: float | None = None,
    ban_sizes: bool = True,
) -> list[dict[str, Any]]:
    """Every owned object with its counters, named by rule (tc names come from
    `desired` if given, else from what the last apply remembered). `wait`: at most
    that long for this process's own kernel work (LockTimeout). `ban_sizes=False`:
    leave the ban list's sets uncounted (a dump of every element on nftables;
    netlimitd knows their size)."""
    chosen = get_backend(backend)
    if not ban_sizes and hasattr(chosen, "count_bans"):
        chosen.count_bans = False

    def work() -> list[dict[str, Any]]:
        with kernel_lock(wait):
            return _rows(chosen, _read(chosen, netns))

    from . import listing

    rows = run_in_netns(netns, work)
    from .xdp import stage as xdp

    slots = list(desired.xdp.slot_rule) if desired is not None and desired.xdp is not None else None
    rows += xdp.rows(netns, slots if slots is not None else listing.load(netns).get("xdp_slots", []))
    names = tc_names(desired) if desired is not None else load_names(netns)
    spelled = listing.tc_spelling(desired) if desired is not None else listing.load(netns).get("tc", {})
    for row in rows:
        if row["layer"] == "tc" and not row["rule"]:
            row["rule"] = names.get(row.get("key", ""), "")
        # tc reads back its own spelling of a planned object: print the plan's (not drift)
        plan = spelled.get(row.pop("norm", None)) if row["layer"] == "tc" else None
        if plan is not None and plan != row["object"]:
            row["read_back"], row["object"] = row["object"], plan
    return rows


def restore(state: State, netns: str | None = None) -> None:
    """Put back exactly what `state` (from read_owned / ApplyResult.before) held:
    the confirm-or-roll-back of `apply --confirm`, and a daemon's undo."""

    def work() -> None:
        from .tc import shaping as tc
        from .xdp.stage import restore as xdp_restore

        with kernel_lock(), writer_lock(netns):
            get_backend(state.backend).restore(state.filter)
            for key, ost in state.others.items():
                get_backend(key).restore(ost)
            tc.restore(state.tc)
            xdp_restore(state.xdp)

    run_in_netns(netns, work)
