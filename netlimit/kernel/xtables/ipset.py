"""The ipsets of the legacy x_tables backends: netlimit's ban sets, through the `ipset`
program (Debian package `ipset`).

netlimit owns the sets named `netlimit-*` (objects.IPSET_PREFIX) and nothing else:

* `netlimit-bans4` / `netlimit-bans6`: `hash:net ... timeout 0`, the ban list the daemon
  writes (each element with its own timeout; prefixes inside each other are fine);
* `netlimit-k4-<rule>` / `-k6-`: `hash:ip ... netmask P timeout B`, the sources a
  network rule's escalation banned (the packet path adds them with `-j SET`).

Sets are created before the iptables rules that reference them (the kernel refuses a
`-m set` of a missing set) and destroyed after the rules are gone (a referenced set
cannot be destroyed). A set whose header must change is filled anew and swapped in
(`ipset swap`: the rules keep pointing at the same name), then its elements are the
daemon's to write again. Elements: `ipset restore` reads a batch; a whole reload fills
a fresh set and swaps it in, so the rules never see an empty set.

Every call runs in the calling thread's network namespace (netns.run_in_netns; a child
forked from that thread starts in it).
"""

from __future__ import annotations

import ipaddress
import math
import os
import shutil
import subprocess
import tempfile
from dataclasses import dataclass

from ...errors import NetlimitError
from ..objects import IPSET_BAN_SETS, IPSET_PREFIX, IpSet

IPSET = "ipset"
TIMEOUT_S = 60
#: ipset's longest element timeout
MAX_TIMEOUT_S = 2_147_483

IPNetwork = ipaddress.IPv4Network | ipaddress.IPv6Network


class IpsetError(NetlimitError):
    def __init__(self, message: str, rule: str | None = None):
        super().__init__(message)
        self.rule = rule


def missing() -> str | None:
    """None when the ipset program is here, else how to get it."""
    return None if shutil.which(IPSET) else "the ipset program is not installed (apt-get install ipset)"


def _run(args: list[str], input: str | None = None, check: bool = True) -> subprocess.CompletedProcess:
    why = missing()
    if why is not None:
        raise IpsetError(why)
    env = dict(os.environ, LC_ALL="C")
    if input is None:
        p = subprocess.run([IPSET, *args], capture_output=True, text=True, timeout=TIMEOUT_S, env=env)
    else:
        with tempfile.TemporaryFile("w+", encoding="utf-8") as fh:  # whole before the child reads it
            fh.write(input)
            fh.flush()
            fh.seek(0)
            p = subprocess.run([IPSET, *args], stdin=fh, capture_output=True, text=True, timeout=TIMEOUT_S, env=env)
    if check and p.returncode != 0:
        raise IpsetError(f"ipset {' '.join(args[:2])} failed: {(p.stderr or p.stdout).strip()[:500]}")
    return p


# --- the sets -------------------------------------------------------------------------------


@dataclass(frozen=True)
class LiveSet:
    name: str
    type: str
    header: str  # "family inet hashsize 1024 maxelem 1000 timeout 0 ..."
    entries: int
    references: int

    def fields(self) -> dict[str, str]:
        toks = self.header.split()
        return {toks[i]: toks[i + 1] for i in range(0, len(toks) - 1, 2)}


def read_sets() -> dict[str, LiveSet]:
    """netlimit's ipsets in this namespace (headers only, no elements)."""
    if missing() is not None:
        return {}
    out: dict[str, LiveSet] = {}
    text = _run(["list", "-t"]).stdout
    for block in text.split("\n\n"):
        f: dict[str, str] = {}
        for line in block.splitlines():
            k, _, v = line.partition(":")
            f[k.strip()] = v.strip()
        name = f.get("Name", "")
        if name.startswith(IPSET_PREFIX):
            out[name] = LiveSet(
                name,
                f.get("Type", ""),
                f.get("Header", ""),
                int(f.get("Number of entries", "0") or 0),
                int(f.get("References", "0") or 0),
            )
    return out


def same(want: IpSet, live: LiveSet) -> bool:
    """The live set is the one `want` describes (type and the header fields netlimit sets)."""
    if want.type != live.type:
        return False
    have = live.fields()
    return all(have.get(k) == v for k, v in want.header_fields().items())


def create_lines(s: IpSet, name: str | None = None) -> str:
    return f"create {name or s.name} {s.type} {s.header}\n"


@dataclass
class IpsetPlan:
    create: list[IpSet]  # before the rules
    replace: list[IpSet]  # a changed header: a fresh set swapped in (before the rules)
    destroy: list[str]  # after the rules

    @property
    def empty(self) -> bool:
        return not (self.create or self.replace or self.destroy)

    def lines(self) -> list[str]:
        out = [f"+ {'ipset':9} create {s.name} {s.type} {s.header}" for s in self.create]
        out += [
            f"~ {'ipset':9} recreate {s.name} {s.type} {s.header} (its elements are written again)"
            for s in self.replace
        ]
        out += [f"- {'ipset':9} destroy {n}" for n in self.destroy]
        return out


def plan(want: tuple[IpSet, ...], live: dict[str, LiveSet]) -> IpsetPlan:
    names = {s.name for s in want}
    return IpsetPlan(
        create=[s for s in want if s.name not in live],
        replace=[s for s in want if s.name in live and not same(s, live[s.name])],
        destroy=sorted(n for n in live if n not in names),
    )


def _tmp(name: str) -> str:
    return (name[:27] + "-new") if len(name) > 27 else name + "-new"


def write_before(p: IpsetPlan) -> None:
    """Create the new sets and swap in the changed ones (before the iptables write)."""
    lines = [create_lines(s) for s in p.create]
    for s in p.replace:
        tmp = _tmp(s.name)
        lines += [create_lines(s, tmp), f"flush {tmp}\n", f"swap {tmp} {s.name}\n", f"destroy {tmp}\n"]
    script = "".join(lines)
    if script:
        _run(["restore", "-exist"], script)


def write_after(p: IpsetPlan) -> None:
    """Destroy the sets no rule references any more (after the iptables write)."""
    if p.destroy:
        _run(["restore"], "".join(f"destroy {n}\n" for n in p.destroy))


def restore_sets(sets: list[LiveSet]) -> None:
    """Create sets as they were read (rollback; their elements are the daemon's)."""
    _run(["restore", "-exist"], "".join(f"create {s.name} {s.type} {s.header}\n" for s in sets))


def undo_before(p: IpsetPlan) -> None:
    """Roll back write_before: the sets it created go (nothing references them yet)."""
    if p.create:
        _run(["restore"], "".join(f"destroy {s.name}\n" for s in p.create), check=False)


# --- the elements of the ban sets (netlimitd) -------------------------------------------------


def _elements(name: str) -> dict[IPNetwork, float | None] | None:
    p = _run(["list", name, "-o", "save"], check=False)
    if p.returncode != 0:
        return None
    out: dict[IPNetwork, float | None] = {}
    for line in p.stdout.splitlines():
        parts = line.split()
        if len(parts) >= 3 and parts[0] == "add":
            try:
                net = ipaddress.ip_network(parts[2], strict=False)
            except ValueError:
                continue
            left: float | None = None
            if "timeout" in parts:
                i = parts.index("timeout")
                if i + 1 < len(parts) and parts[i + 1].isdigit():
                    left = float(parts[i + 1])
            out[net] = left
    return out


def _secs(left: float) -> int:
    """ipset counts whole seconds: rounded up, so a ban never ends early (at most 1 s late)."""
    return max(1, min(MAX_TIMEOUT_S, math.ceil(left)))


class IpsetBanSets:
    key = "ipset"
    cover = False  # hash:net holds prefixes inside each other

    def replace(self, bans: dict[IPNetwork, float]) -> None:
        live = read_sets()
        lines: list[str] = []
        for fam, name in IPSET_BAN_SETS.items():
            ls = live.get(name)
            if ls is None:
                raise IpsetError(f"ipset {name} is missing")
            tmp = _tmp(name)
            lines.append(f"create {tmp} {ls.type} {ls.header}\n")
            lines.append(f"flush {tmp}\n")
            lines.extend(f"add {tmp} {n} timeout {_secs(left)}\n" for n, left in bans.items() if n.version == fam)
            lines.append(f"swap {tmp} {name}\n")
            lines.append(f"destroy {tmp}\n")
        _run(["restore", "-exist"], "".join(lines))

    def change(self, add: dict[IPNetwork, float], remove: list[IPNetwork]) -> None:
        sets = IPSET_BAN_SETS
        lines = [f"del {sets[n.version]} {n} -exist\n" for n in remove]
        lines += [f"add {sets[n.version]} {n} timeout {_secs(left)} -exist\n" for n, left in add.items()]
        if lines:
            _run(["restore"], "".join(lines))

    def read(self) -> dict[IPNetwork, float | None] | None:
        out: dict[IPNetwork, float | None] = {}
        for name in IPSET_BAN_SETS.values():
            els = _elements(name)
            if els is None:
                return None
            out.update(els)
        return out

    def count(self) -> int | None:
        live = read_sets()
        if any(n not in live for n in IPSET_BAN_SETS.values()):
            return None
        return sum(live[n].entries for n in IPSET_BAN_SETS.values())

    def kernel_bans(self, rules: list[tuple[str, int, int]]) -> list[tuple[str, IPNetwork, float]]:
        from ..compile import kernel_ban_ipset

        out: list[tuple[str, IPNetwork, float]] = []
        for name, p4, p6 in rules:
            for fam, plen in ((4, p4), (6, p6)):
                for net, left in (_elements(kernel_ban_ipset(name, fam)) or {}).items():
                    if left:
                        out.append((name, ipaddress.ip_network(f"{net.network_address}/{plen}", strict=False), left))
        return out


def entries(name: str) -> int | None:
    """How many elements an ipset holds (None: no such set)."""
    s = read_sets().get(name)
    return None if s is None else s.entries
