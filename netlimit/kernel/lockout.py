"""The lock-out guard: which rules of a file could cut off SSH.

Two kinds of target:

* the SSH session running the command, from ``SSH_CONNECTION`` ("client_ip
  client_port server_ip server_port"; after ``sudo``, which resets the
  environment, from the nearest ancestor process that has it): its client
  address, server address and server port are known exactly;
* every TCP port an ``sshd`` process listens on in the network namespace the
  rules go to (its sockets matched against ``/proc/<pid>/net/tcp{,6}``), whose
  clients are unknown. Without the right to read other processes' descriptors
  (not root), a socket listening on port 22 stands in for sshd.

A network rule could hit a target when it blocks (action drop or reject, not
log), sits on the input chain, matches TCP (protocol tcp or all), covers the
port (no ports: every port), and its sources / destinations cover the client /
server address (none: every address) -- unless the client is in the file's
``exempt`` list, which is matched before any rule. A bandwidth rule (tc class)
could hit when it would carry the session's packets at under 1 mbit/s (below
that an interactive session stalls behind any bulk transfer); a faster cap
slows, it does not lock out.

Pure apart from ``ssh_targets`` (which reads the environment and /proc), so
that validate, plan, apply and netlimitd give the same verdict on the same
inputs.
"""

from __future__ import annotations

import ipaddress
import os
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

#: a tc cap below this (bit/s) could make an SSH session unusable
SLOW_BPS = 1_000_000

IPAddr = ipaddress.IPv4Address | ipaddress.IPv6Address


@dataclass(frozen=True)
class Target:
    """An SSH endpoint a rule could cut off."""

    port: int
    #: the session's client (None: any client of a listening sshd)
    client: IPAddr | None = None
    #: the address the client connected to (None: any, a wildcard listener)
    server: IPAddr | None = None

    @property
    def session(self) -> bool:
        return self.client is not None

    def describe(self) -> str:
        if self.client is not None:
            return f"your SSH session from {self.client} to port {self.port} (SSH_CONNECTION)"
        where = f"{self.server}:{self.port}" if self.server is not None else f"port {self.port}"
        return f"sshd listening on {where}"


@dataclass(frozen=True)
class Hit:
    rule: str
    target: Target
    what: str

    def __str__(self) -> str:
        return f"{self.rule}: {self.what} could lock out {self.target.describe()}"


def session_target(env: Mapping[str, str]) -> Target | None:
    """The session in ``SSH_CONNECTION`` (None when unset or unreadable)."""
    parts = env.get("SSH_CONNECTION", "").split()
    if len(parts) != 4:
        return None
    try:
        client = ipaddress.ip_address(parts[0].split("%")[0])
        server = ipaddress.ip_address(parts[2].split("%")[0])
        port = int(parts[3])
    except ValueError:
        return None
    if not 0 < port < 65536:
        return None
    return Target(port=port, client=_unmap(client), server=_unmap(server))


def _unmap(a: IPAddr) -> IPAddr:
    if isinstance(a, ipaddress.IPv6Address) and a.ipv4_mapped is not None:
        return a.ipv4_mapped
    return a


# --- sshd's listening sockets ---------------------------------------------------


def _netns_ino(path: str) -> int | None:
    try:
        return os.stat(path).st_ino
    except OSError:
        return None


def _listening(table: str) -> dict[int, tuple[IPAddr, int]]:
    """LISTEN sockets of one /proc/.../net/tcp{,6} file: inode -> (address, port)."""
    out: dict[int, tuple[IPAddr, int]] = {}
    try:
        lines = Path(table).read_text().splitlines()[1:]
    except OSError:
        return out
    v6 = table.endswith("6")
    for line in lines:
        f = line.split()
        if len(f) < 10 or f[3] != "0A":
            continue
        addr_hex, port_hex = f[1].split(":")
        raw = bytes.fromhex(addr_hex)
        # the kernel prints each 32-bit word in host (little-endian) order
        raw = b"".join(raw[i : i + 4][::-1] for i in range(0, len(raw), 4))
        addr: IPAddr = ipaddress.IPv6Address(raw) if v6 else ipaddress.IPv4Address(raw)
        out[int(f[9])] = (_unmap(addr), int(port_hex, 16))
    return out


def sshd_listeners(netns: str | None = None, proc: str = "/proc") -> list[Target]:
    """TCP ports sshd listens on in ``netns`` (a /run/netns name; None: ours)."""
    want = _netns_ino(f"/run/netns/{netns}" if netns else f"{proc}/self/ns/net")
    found: set[tuple[int, IPAddr | None]] = set()
    readable = False
    try:
        pids = [p for p in os.listdir(proc) if p.isdigit()]
    except OSError:
        pids = []
    for pid in pids:
        base = f"{proc}/{pid}"
        try:
            if Path(f"{base}/comm").read_text().strip() != "sshd":
                continue
            if want is not None and _netns_ino(f"{base}/ns/net") != want:
                continue
            inodes = set()
            for fd in os.listdir(f"{base}/fd"):
                link = os.readlink(f"{base}/fd/{fd}")
                if link.startswith("socket:["):
                    inodes.add(int(link[8:-1]))
        except OSError:
            continue
        readable = True
        for table in ("tcp", "tcp6"):
            for ino, (addr, port) in _listening(f"{base}/net/{table}").items():
                if ino in inodes:
                    found.add((port, None if addr.is_unspecified else addr))
    if not readable and netns is None:
        # no sshd we may look into: a socket listening on 22 stands in for it
        for table in ("tcp", "tcp6"):
            for addr, port in _listening(f"{proc}/net/{table}").values():
                if port == 22:
                    found.add((22, None if addr.is_unspecified else addr))
    # a wildcard listener covers the specific ones on the same port
    wild = {port for port, addr in found if addr is None}
    return [
        Target(port=port, server=addr)
        for port, addr in sorted(found, key=lambda t: (t[0], str(t[1])))
        if addr is None or port not in wild
    ]


def inherited_ssh_connection(proc: str = "/proc", pid: int | None = None, depth: int = 32) -> str | None:
    """SSH_CONNECTION of the nearest ancestor that has it: `sudo` resets the
    environment, but the shell it was typed in still carries the variable
    (root may read /proc/<pid>/environ). None when no ancestor has it."""
    pid = os.getppid() if pid is None else pid
    for _ in range(depth):
        if pid <= 1:
            return None
        try:
            with open(f"{proc}/{pid}/environ", "rb") as f:
                environ = f.read(1 << 20)
            for item in environ.split(b"\0"):
                if item.startswith(b"SSH_CONNECTION="):
                    return item[len(b"SSH_CONNECTION=") :].decode("ascii", "replace")
            with open(f"{proc}/{pid}/stat") as f:
                stat = f.read()
            pid = int(stat[stat.rindex(")") + 2 :].split()[1])
        except (OSError, ValueError, IndexError):
            return None
    return None


def ssh_targets(env: Mapping[str, str] | None = None, netns: str | None = None) -> list[Target]:
    """The session (when the command runs in the namespace the rules go to) and
    sshd's listening ports there. Without ``env``: this process's environment,
    else (after sudo) the nearest ancestor's SSH_CONNECTION."""
    if env is None:
        env = os.environ
        if "SSH_CONNECTION" not in env:
            inherited = inherited_ssh_connection()
            if inherited is not None:
                env = {"SSH_CONNECTION": inherited}
    out: list[Target] = []
    s = session_target(env)
    if s is not None and (netns is None or _netns_ino(f"/run/netns/{netns}") == _netns_ino("/proc/self/ns/net")):
        out.append(s)
    out.extend(sshd_listeners(netns))
    return out


# --- which rules hit them -----------------------------------------------------------


def _covers(nets: list[Any], addr: IPAddr | None) -> bool:
    """An address list (empty: every address) covers addr (None: some address)."""
    if not nets or addr is None:
        return True
    return any(addr.version == n.version and addr in n for n in nets)


def _port_in(ports: list[Any], port: int) -> bool:
    return not ports or any(p.first <= port <= p.last for p in ports)


def _exempt(config: Any, client: IPAddr | None) -> bool:
    return client is not None and any(client.version == n.version and client in n for n in config.exempt)


def _network_what(r: Any) -> str:
    verb = "rejects" if r.action == "reject" else "drops"
    if r.max_connections is not None:
        return f"{verb} connections beyond {r.max_connections} at once per source"
    scope = {
        "all": "for all clients together (per: all)",
        "source": "per source",
        "destination": "per destination",
        "source+port": "per source and port",
    }[r.per]
    what = "new connections" if r.new_connections else "packets"
    return f"{verb} {what} above {r.limit} {scope}"


def lockout_hits(config: Any, targets: list[Target]) -> list[Hit]:
    """Every (rule, target) where the rule could cut the target off, in file order."""
    hits: list[Hit] = []
    for r in config.network:
        if r.action not in ("drop", "reject") or r.chain != "input" or r.protocol not in ("tcp", "all"):
            continue
        for t in targets:
            if _exempt(config, t.client):
                continue
            if not _port_in(r.ports, t.port) or not _covers(r.sources, t.client):
                continue
            if not _covers(r.destinations, t.server):
                continue
            hits.append(Hit(r.name, t, _network_what(r)))
    for b in config.bandwidth:
        if b.rate >= SLOW_BPS or b.protocol == "udp":
            continue
        for t in targets:
            if _exempt(config, t.client):
                continue
            # ingress: destination port and source address; egress: the local
            # (source) port and the destination address -- the session either way
            if not _port_in(b.ports, t.port) or not _covers(b.sources, t.client):
                continue
            hits.append(Hit(b.name, t, f"caps {b.direction} traffic on {b.interface} at {_bits(b.rate)}"))
    return hits


def _bits(bps: float) -> str:
    for unit, div in (("mbit", 1e6), ("kbit", 1e3)):
        if bps >= div:
            return f"{bps / div:g}{unit}"
    return f"{bps:g}bit"


def problems(loaded: Any, hits: list[Hit]) -> list[Any]:
    """The hits as FILE:LINE:COL warnings (Problem), at each rule's name."""
    from ..config.loader import Problem

    where: dict[str, tuple[int, int]] = {}
    for section in ("network", "bandwidth"):
        for i, r in enumerate(getattr(loaded.config, section)):
            where.setdefault(r.name, loaded.position(section, i, "name"))
    out = []
    for h in hits:
        line, col = where.get(h.rule, (1, 1))
        out.append(Problem(loaded.path, line, col, h.rule, f"warning: {h.what}: could lock out {h.target.describe()}"))
    # a rule of an `include:`d file: its own file and line, not the merged document's encoding
    return loaded.decode(out)
