"""What the Redis routers (one server, a cluster, a sentinel set-up) share: the
counters /metrics exports, the redirect replies they parse, the errors that
mean "a failover is under way".

Counters are plain integers bumped on the slow paths only (a redirect, a
failed node, a refresh); labels are node addresses, bounded by the topology
(at most :data:`MAX_NODES` distinct ones, the rest counted as ``other``).
"""

from __future__ import annotations

from dataclasses import dataclass

#: distinct node labels kept in the per-node counters
MAX_NODES = 64

#: error replies that mean "not now, a failover or a reshard is under way"
#: (the store-failure policy decides, and the topology is looked at again)
FAILOVER_ERRORS = ("READONLY", "LOADING", "MASTERDOWN", "CLUSTERDOWN", "TRYAGAIN")


class TopologyStats:
    """Counters of a Redis store's routing (read by netlimit/limit/metrics.py)."""

    __slots__ = ("redirects", "failovers", "refreshes", "node_errors")

    def __init__(self) -> None:
        self.redirects = {"moved": 0, "ask": 0}
        self.failovers = 0  # the primary of a service / of some slots changed
        self.refreshes = 0  # topology look-ups (CLUSTER SHARDS, SENTINEL get-master-addr-by-name)
        self.node_errors: dict[str, int] = {}  # failed commands by node address

    def node_error(self, node: str) -> None:
        errs = self.node_errors
        if node not in errs and len(errs) >= MAX_NODES:
            node = "other"
        errs[node] = errs.get(node, 0) + 1


@dataclass(frozen=True)
class Redirect:
    """A ``-MOVED <slot> <host>:<port>`` or ``-ASK <slot> <host>:<port>`` reply."""

    kind: str  # moved | ask
    slot: int
    host: str  # "" when the node did not know its own address: the one that answered
    port: int


def parse_redirect(msg: str) -> Redirect | None:
    """The redirect an error reply carries, or None if it is not one."""
    if msg.startswith("MOVED "):
        kind = "moved"
    elif msg.startswith("ASK "):
        kind = "ask"
    else:
        return None
    parts = msg.split()
    if len(parts) != 3:
        return None
    host, _, port = parts[2].rpartition(":")  # IPv6 addresses come without brackets
    if not (parts[1].isdigit() and port.isdigit()):
        return None
    slot = int(parts[1])
    if not 0 <= slot < 16384 or not 0 < int(port) < 65536:
        return None
    return Redirect(kind, slot, host.strip("[]"), int(port))


def is_failover_error(msg: str) -> bool:
    return msg.startswith(FAILOVER_ERRORS)
