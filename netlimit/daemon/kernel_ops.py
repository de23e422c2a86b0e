"""What the daemon needs from the kernel layer, behind one small facade
(netlimit.kernel.reconcile and the backend choice)."""

from __future__ import annotations

import logging
from typing import Any

log = logging.getLogger("netlimit.daemon")


class KernelOps:
    """What the daemon needs from the kernel layer (netlimit.kernel.reconcile)."""

    def __init__(self, netns: str | None, backend: str | None = None):
        self.netns = netns
        self.flag = backend  # --backend; else $NETLIMIT_BACKEND, the file's `backend:`, auto
        self.backend: str | None = None  # the backend of the last apply
        self.backend_reason = ""
        self.desired: Any = None  # the last compiled config (Desired), to name tc objects in counters
        self.config: Any = None  # the last config compiled (for configured rates in metrics)
        #: where bans_held_ahead's read was begun: "imports" (netlimitd, before its imports)
        #: or "apply" (beside the first apply); status and the ready line say it
        self.ahead_from: str | None = None
        self.ahead_miss: str | None = None  # why the read begun before the imports gave nothing

    def _compile(self, config):
        from ..kernel.compile import compile_config
        from ..kernel.registry import choose

        choice = choose(self.flag, config.backend)
        if choice.key != self.backend:
            log.info("backend: %s (%s)", choice.key, choice.why)
        self.backend, self.backend_reason = choice.key, choice.why
        self.desired = compile_config(config)
        self.config = config
        return self.desired

    def apply(self, config) -> dict[str, Any]:
        """Make the kernel equal to `config` (a changed backend moves the rules: the new
        ones first). Raises (ApplyError ...) on failure, state rolled back."""
        from ..kernel import reconcile

        res = reconcile.apply(self._compile(config), self.netns, backend=self.backend)
        found = res.before.count()
        if not res.changed:
            return {"changed": 0, "found": found, "summary": f"no changes ({found} owned objects in place)"}
        c = res.changes.counts()
        return {
            "changed": c["add"] + c["remove"] + c["reorder"],
            "found": found,
            "summary": f"applied {c['add']} additions, {c['remove']} removals, {c['reorder']} moves "
            f"(found {found} owned objects in the kernel)",
        }

    def drift(self, config) -> list[str]:
        """How the kernel differs from `config`, as plan lines (empty: equal)."""
        from ..kernel import reconcile

        desired = self._compile(config)
        return reconcile.diff(desired, reconcile.read_owned(self.netns, backend=self.backend)).lines()

    def flush(self) -> dict[str, Any]:
        from ..kernel import reconcile

        res = reconcile.flush(self.netns, backend=self.backend or self.flag)  # raises if anything remains
        removed = res.removed()
        if not removed:
            return {"removed": 0, "summary": "nothing was installed"}
        what = ", ".join(f"{n} {k}" for k, n in removed.items())
        return {
            "removed": sum(removed.values()),
            "summary": f"removed {sum(removed.values())} owned objects ({what}); read back: none remain",
        }

    def counters(self, wait: float | None = None, ban_sizes: dict[str, int] | None = None) -> list[dict[str, Any]]:
        """[{rule, layer, object, packets, bytes, dropped, ...}] for every owned object.
        `wait`: how long to wait for an apply in progress (then LockTimeout).
        `ban_sizes`: the ban sets' sizes as the daemon knows them (set name -> prefixes):
        the kernel's sets are then not counted (on nftables a dump of every element)."""
        from ..kernel import reconcile

        rows = reconcile.list_owned(
            self.netns, self.desired, backend=self.backend or self.flag, wait=wait, ban_sizes=ban_sizes is None
        )
        if ban_sizes is not None:
            for r in rows:
                name = str(r.get("table", "")).split(" ")[-1]
                if name in ban_sizes:
                    r["table_entries"] = ban_sizes[name]
        return rows

    def hot(self, limit: int = 10) -> list[dict[str, Any]]:
        """The busiest per-source entries of the rules' kernel tables (netlimit.kernel.hot)."""
        from ..kernel.hot import hot_entries

        if self.config is None:
            return []
        names = [r.name for r in self.config.network]
        return hot_entries(self.netns, self.backend, names, limit)

    # --- the ban sets' elements (netlimit.kernel.banset; the sets are the apply's) ---

    def _bans(self, fn, *args):
        from ..kernel.banset import ban_sets
        from ..kernel.netns import kernel_lock, run_in_netns

        sets = ban_sets(self.backend)
        if self.desired is not None and self.desired.xdp is not None:  # `xdp:`: the program's bans map too
            from ..kernel.banset import xdp_mirror

            sets = xdp_mirror(sets, self.netns)

        def work():
            with kernel_lock():
                return fn(sets, *args)

        return run_in_netns(self.netns, work)

    def ban_sets_cover(self) -> bool:
        from ..kernel.banset import ban_sets

        return ban_sets(self.backend).cover

    def bans_sync_prefixes(self, prefixes, held: Any = None) -> dict:
        """Make the ban sets hold `prefixes` (every whole write of the list: a start, a
        reload), writing only the difference from what they hold where the backend can
        (`held`: what bans_held_ahead read, if it still stands)."""
        from ..kernel.banset import sync_prefixes

        return self._bans(sync_prefixes, prefixes, held)

    def bans_held_ahead(self, config) -> Any:
        """What the ban sets hold, read before the first apply chose the backend (a start,
        issue 35: the dump runs beside the apply and the list's read): for
        bans_sync_prefixes(held=...). No kernel lock: a read over netlink of its own,
        checked against the ruleset's generation when it is used. None where the backend
        cannot (the legacy ones). Run in a ReadAhead, which takes a failure as no read (the
        sync then reads the sets itself). The read netlimitd began before its imports is
        taken where it was made for this namespace and backend (daemon/readahead.py)."""
        from ..kernel.banset import ban_sets, held_ahead
        from ..kernel.netns import run_in_netns
        from ..kernel.registry import choose
        from .readahead import EARLY_WAIT, take_early

        key = choose(self.flag, config.backend).key
        early = take_early(self.netns, key)  # netlimitd began it before its imports
        if early is not None:
            self.ahead_from = "imports"
            held = early.take(EARLY_WAIT)
            if held is None:
                self.ahead_miss = early.why_none(EARLY_WAIT)
            return held
        self.ahead_from = "apply"
        return run_in_netns(self.netns, held_ahead, ban_sets(key))

    def bans_change(self, add, remove) -> None:
        self._bans(lambda s, a, r: s.change(a, r), add, remove)

    def bans_read(self):
        return self._bans(lambda s: s.read())

    def bans_count(self):
        return self._bans(lambda s: s.count())

    def kernel_bans(self, rules):
        return self._bans(lambda s, r: s.kernel_bans(r), rules)

    def bans_xdp_count(self) -> int | None:
        """Prefixes in the XDP program's bans map (None: no `xdp:` or no program loaded)."""
        if self.desired is None or self.desired.xdp is None:
            return None
        return self._bans(lambda s: s.xdp_count())

    def bans_xdp_expire(self) -> int:
        """Remove expired bans from the XDP program's bans map (the sets time out by themselves)."""
        if self.desired is None or self.desired.xdp is None:
            return 0
        return self._bans(lambda s: s.expire())

    def bandwidth(self) -> dict[str, float]:
        """Configured rate of each bandwidth rule, bytes per second."""
        return {b.name: b.rate / 8 for b in self.config.bandwidth} if self.config is not None else {}
