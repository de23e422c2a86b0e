"""A REAL Redis Cluster on loopback: ``primaries`` redis-server processes in
cluster mode plus ``replicas`` per primary, joined by ``redis-cli --cluster
create``, optionally over TLS and with an ACL user.  Free ports (the cluster bus
port is set apart with ``cluster-port``), bounded waits, every process killed
in :meth:`RedisCluster.stop` (use it as a context manager).
"""

from __future__ import annotations

import shutil
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path

import pytest
from redis_nodes import Auth, RedisNode, free_ports, wait_for
from tls_certs import TlsFiles


@dataclass
class ShardView:
    primary: RedisNode
    replicas: list[RedisNode]
    ranges: list[tuple[int, int]]

    def owns(self, slot: int) -> bool:
        return any(a <= slot <= b for a, b in self.ranges)


class RedisCluster:
    def __init__(
        self,
        base: Path,
        primaries: int = 3,
        replicas: int = 1,
        node_timeout_ms: int = 2000,
        tls: TlsFiles | None = None,
        auth: Auth | None = None,
        tls_auth_clients: str = "optional",
        full_coverage: bool = True,
    ) -> None:
        """``full_coverage=False``: cluster-require-full-coverage no, so the shards that
        are up go on answering while a slot has no primary (with yes, every node answers
        CLUSTERDOWN from the dead primary's FAIL until its replica is promoted)."""
        self.base = base
        self.n_primaries = primaries
        self.n_replicas = replicas
        self.node_timeout_ms = node_timeout_ms
        self.tls = tls
        self.auth = auth
        self.nodes: list[RedisNode] = []
        n = primaries * (1 + replicas)
        ports = free_ports(2 * n)
        for i in range(n):
            d = base / f"node{i}"
            bus = ports[n + i]
            self.nodes.append(
                RedisNode(
                    d,
                    [
                        "cluster-enabled yes",
                        f"cluster-config-file {d / 'nodes.conf'}",
                        f"cluster-node-timeout {node_timeout_ms}",
                        f"cluster-port {bus}",
                        f"cluster-require-full-coverage {'yes' if full_coverage else 'no'}",
                        "repl-diskless-sync yes",
                        "repl-diskless-sync-delay 0",
                    ]
                    + (["tls-cluster yes"] if tls is not None else []),
                    tls=tls,
                    auth=auth,
                    tls_auth_clients=tls_auth_clients,
                    port=ports[i],
                )
            )

    # -- life cycle -----------------------------------------------------------------------

    def __enter__(self) -> RedisCluster:
        try:
            return self.start()
        except BaseException:
            self.stop()
            raise

    def __exit__(self, *exc) -> None:
        self.stop()

    def cli_args(self) -> list[str]:
        exe = shutil.which("redis-cli")
        if exe is None:
            pytest.fail("redis-cli is not installed (it comes with redis-server: apt-get install redis-tools)")
        args = [exe]
        if self.tls is not None:
            t = self.tls
            args += ["--tls", "--cacert", str(t.ca), "--cert", str(t.client_cert), "--key", str(t.client_key)]
        if self.auth is not None:
            args += ["-a", self.auth.admin_password, "--no-auth-warning"]
        return args

    def cli(self, *args: str, timeout: float = 60) -> str:
        p = subprocess.run(self.cli_args() + list(args), capture_output=True, text=True, timeout=timeout)
        if p.returncode != 0:
            raise RuntimeError(
                f"redis-cli {' '.join(args)} failed ({p.returncode}): {p.stdout[-2000:]}{p.stderr[-2000:]}"
            )
        return p.stdout

    def start(self) -> RedisCluster:
        for n in self.nodes:
            n.start(wait=False)
        for n in self.nodes:
            n.wait_ping()
        self.cli("--cluster", "create", *(n.address for n in self.nodes),
                 "--cluster-replicas", str(self.n_replicas), "--cluster-yes")  # fmt: skip
        self.wait_healthy()
        return self

    def stop(self) -> None:
        for n in self.nodes:
            n.stop()

    # -- state --------------------------------------------------------------------------

    def by_port(self, port: int) -> RedisNode:
        return next(n for n in self.nodes if n.port == port)

    def shards(self, via: RedisNode | None = None) -> list[ShardView]:
        """The shards as ``via`` (default: the first live primary-ish node) sees them."""
        node = via or next(n for n in self.nodes if n.alive)
        out = []
        for raw in node.call("CLUSTER", "SHARDS"):
            d = dict(zip(raw[::2], raw[1::2]))
            sl = [int(x) for x in d[b"slots"]]
            primary, replicas = None, []
            for rn in d[b"nodes"]:
                nd = dict(zip(rn[::2], rn[1::2]))
                port = int(nd.get(b"tls-port") or nd[b"port"]) if self.tls else int(nd[b"port"])
                member = self.by_port(port)
                if nd[b"role"] == b"master" and nd[b"health"] != b"fail":
                    primary = member
                else:
                    replicas.append(member)
            if primary is not None and sl:
                out.append(ShardView(primary, replicas, list(zip(sl[::2], sl[1::2]))))
        return out

    @property
    def primaries(self) -> list[RedisNode]:
        return [s.primary for s in self.shards()]

    @property
    def url(self) -> str:
        """redis+cluster:// with two seed nodes (rediss+cluster:// with the CA and client certificate on TLS)."""
        if self.tls is not None:
            return self.make_url("rediss+cluster", query=self.tls.query())
        return self.make_url()

    def make_url(self, scheme: str = "redis+cluster", seeds: int = 2, userinfo: str = "", query: str = "") -> str:
        hosts = ",".join(n.address for n in self.nodes[:seeds])
        return f"{scheme}://{userinfo}{hosts}/" + (f"?{query}" if query else "")

    def shard_of(self, slot: int) -> ShardView:
        return next(s for s in self.shards() if s.owns(slot))

    def node_id(self, node: RedisNode) -> str:
        return node.call("CLUSTER", "MYID").decode()

    def wait_healthy(self, timeout: float = 40.0) -> None:
        """Every live node says cluster_state:ok and knows every live node; every
        shard has its replicas linked."""
        live = [n for n in self.nodes if n.alive]

        def ok() -> bool:
            for n in live:
                info = cluster_info(n)
                if info.get("cluster_state") != "ok" or int(info.get("cluster_known_nodes", 0)) != len(self.nodes):
                    return False
            shards = self.shards()
            if len(shards) != self.n_primaries or sum(len(s.replicas) for s in shards) + len(shards) != len(live):
                return False
            for s in shards:
                if len(s.replicas) < self.n_replicas:
                    return False
                up = [r for r in s.replicas if r.alive]
                for r in up:
                    if info_of(r, "replication").get("master_link_status") != "up":
                        return False
            return True

        wait_for(ok, timeout, "the cluster to be healthy", interval=0.1)


def info_of(node: RedisNode, section: str) -> dict:
    c = node.client()
    try:
        return c.info(section)
    finally:
        c.close()


def cluster_info(node: RedisNode) -> dict:
    raw = node.call("CLUSTER", "INFO")
    if isinstance(raw, dict):
        return {k: str(v) for k, v in raw.items()}
    text = raw.decode() if isinstance(raw, bytes) else str(raw)
    return dict(line.split(":", 1) for line in text.split("\r\n") if ":" in line)


def wait_role(node: RedisNode, role: bytes, timeout: float) -> float:
    """Wait until ``node`` says ROLE ``role`` (b"master" / b"slave"); returns when (monotonic)."""
    wait_for(lambda: node.call("ROLE")[0] == role, timeout, f"{node.address} to become {role.decode()}")
    return time.monotonic()
