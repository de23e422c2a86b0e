"""Where a start's time goes up to READY=1 (issue 35: ready with 100,000 bans within
1.5 s): netlimitd logs it at READY (`ready: ...`) and `netlimit status --json` shows it
(`start_phases`), so that a slow start on a busy host can be explained -- the
interpreter and the imports, the config, the first apply, the ban list (its read
beside the apply, the filter, the kernel write) -- and the CPU the process used
(less the host's load than the wall time)."""

from __future__ import annotations

import os
import time
from typing import Any


def process_age() -> float | None:
    """Seconds since this process was made (the kernel's start time of it, 10 ms steps):
    the interpreter's start and the imports before any of our code ran. None where
    /proc does not say."""
    try:
        with open("/proc/self/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
        start = int(fields[19]) / os.sysconf("SC_CLK_TCK")  # field 22: starttime, in ticks since boot
        return max(0.0, time.clock_gettime(time.CLOCK_BOOTTIME) - start)
    except (OSError, ValueError, IndexError):
        return None


class StartPhases:
    """Where a start's time went up to READY=1 (issue 35): a mark at the end of each
    phase; `imports` is the process's age when the first mark was made."""

    def __init__(self) -> None:
        self.age = process_age()
        self.t0 = self.last = time.monotonic()
        self.marks: dict[str, float] = {}

    def mark(self, name: str) -> None:
        now = time.monotonic()
        self.marks[name] = now - self.last
        self.last = now

    def seconds(self) -> dict[str, float]:
        out = {"imports": round(self.age, 3)} if self.age is not None else {}
        out.update({k: round(v, 3) for k, v in self.marks.items()})
        out["total"] = round((self.age or 0.0) + self.last - self.t0, 3)
        t = os.times()  # the CPU the process used (every thread, its system calls too): less the host's load
        out["cpu"] = round(t.user + t.system, 3)
        return out

    def describe(self, bans: dict[str, Any]) -> str:
        s = self.seconds()
        parts = [f"{s['total']:.2f} s after the process started"]
        if "imports" in s:
            parts.append(f"interpreter and imports {s['imports']:.2f}")
        parts += [f"{k} {s[k]:.2f}" for k in ("config", "apply") if k in s]
        if "bans" in s:
            read = bans.get("read_s")
            ban = f"the ban list {s['bans']:.2f}"
            if read is not None:
                ban += (
                    f" (its read {read:.2f}, beside the apply; filter {bans.get('filter_s', 0):.2f},"
                    f"{_ahead(bans)} kernel {bans.get('kernel_s', 0):.2f}{_write(bans)})"
                )
            parts.append(ban)
        parts.append(f"the rest {s.get('rest', 0):.2f}")
        return ", ".join(parts) + f" s; CPU {s['cpu']:.2f} s"


def _ahead(bans: dict[str, Any]) -> str:
    """The wait for the read of the kernel's sets begun beside the apply (when it waited)."""
    wait = bans.get("ahead_wait_s")
    return f" waiting for the sets' read {wait:.2f}," if wait else ""


def _ahead_source(bans: dict[str, Any]) -> str:
    """Where what the sets held was read: ahead (before the imports, beside the apply),
    or, when the read ahead could not be used, why."""
    where = "before the imports" if bans.get("ahead_from") == "imports" else "beside the apply"
    if bans.get("held_from") == "prefetch":
        return f", read {where}"
    if bans.get("ahead_miss"):
        return f", the read begun {where} not used ({bans['ahead_miss']})"
    if bans.get("ahead_from"):
        return f", the read begun {where} out of date (a commit since)"
    return ""


def difference(done: dict[str, Any]) -> str:
    """What a difference written to the ban sets was (banset.sync_prefixes' report, a
    "diff"): for the ready line and netlimitd's log lines of every load."""
    steps = done.get("steps") or 1
    foreign = done.get("foreign") or 0
    return (
        f"{done.get('added', 0)} written, {done.get('removed', 0)} removed"
        + (f" ({foreign} of them not written by netlimit)" if foreign else "")
        + (f" in {steps} steps" if steps > 1 else "")
    )


def _write(bans: dict[str, Any]) -> str:
    """How the kernel write went: the difference from what the sets held (a restart that
    found the list there), or the sets written whole."""
    if bans.get("write") == "diff":
        return f": {difference(bans)}, {bans.get('held', 0)} held before{_ahead_source(bans)}"
    if bans.get("write") == "whole":
        why = {"empty": "the sets were empty", "refused": "a write refused twice", "unread": "the sets unreadable"}
        more = f" ({why.get(bans.get('why', ''), bans.get('why'))}, {bans.get('held_from')})" if "why" in bans else ""
        return f", written whole{more}"
    return ""
