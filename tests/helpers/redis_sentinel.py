"""A REAL Redis Sentinel set-up on loopback: one primary, one replica, three
sentinels (quorum 2, ``down-after-milliseconds`` 1000, a short
``failover-timeout``), free ports, bounded waits, every process killed in
:meth:`SentinelSetup.stop` (use it as a context manager).
"""

from __future__ import annotations

from pathlib import Path

from redis_nodes import RedisNode, free_ports, wait_for


class SentinelSetup:
    def __init__(
        self,
        base: Path,
        service: str = "mymaster",
        sentinels: int = 3,
        down_after_ms: int = 1000,
        failover_timeout_ms: int = 2000,
    ) -> None:
        self.service = service
        ports = free_ports(2 + sentinels)
        self.primary = RedisNode(base / "primary", ["repl-diskless-sync yes", "repl-diskless-sync-delay 0"],
                                 port=ports[0])  # fmt: skip
        self.replica = RedisNode(
            base / "replica",
            [f"replicaof 127.0.0.1 {ports[0]}", "repl-diskless-sync yes", "repl-diskless-sync-delay 0"],
            port=ports[1],
        )
        self.data = [self.primary, self.replica]
        self.sentinels = [
            RedisNode(
                base / f"sentinel{i}",
                [
                    "sentinel resolve-hostnames no",
                    f"sentinel monitor {service} 127.0.0.1 {ports[0]} 2",
                    f"sentinel down-after-milliseconds {service} {down_after_ms}",
                    f"sentinel failover-timeout {service} {failover_timeout_ms}",
                    f"sentinel parallel-syncs {service} 1",
                ],
                port=ports[2 + i],
                sentinel=True,
            )
            for i in range(sentinels)
        ]

    def __enter__(self) -> SentinelSetup:
        try:
            return self.start()
        except BaseException:
            self.stop()
            raise

    def __exit__(self, *exc) -> None:
        self.stop()

    def start(self) -> SentinelSetup:
        self.primary.start()
        self.replica.start()
        wait_for(lambda: self.replica.client().info("replication").get("master_link_status") == "up", 20,
                 "the replica to sync")  # fmt: skip
        for s in self.sentinels:
            s.start(wait=False)
        for s in self.sentinels:
            s.wait_ping()
        self.wait_settled()
        return self

    def wait_settled(self, timeout: float = 30.0) -> None:
        """Every live sentinel knows the replica and the other sentinels."""
        live = [s for s in self.sentinels if s.alive]

        def ok() -> bool:
            for s in live:
                m = self.master_info(s)
                if int(m.get("num-slaves", 0)) < 1 or int(m.get("num-other-sentinels", 0)) < len(live) - 1:
                    return False
            return True

        wait_for(ok, timeout, "the sentinels to know the replica and each other", interval=0.1)

    def master_info(self, s: RedisNode) -> dict:
        raw = s.call("SENTINEL", "MASTER", self.service)
        if isinstance(raw, dict):
            return {str(k): v for k, v in raw.items()}
        items = [x.decode() if isinstance(x, bytes) else x for x in raw]
        return dict(zip(items[::2], items[1::2]))

    def stop(self) -> None:
        for n in self.sentinels + self.data:
            n.stop()

    @property
    def url(self) -> str:
        return f"redis+sentinel://{','.join(s.address for s in self.sentinels)}/{self.service}"

    def named_primary(self) -> int:
        """The port the first live sentinel names as the primary."""
        s = next(x for x in self.sentinels if x.alive)
        host, port = s.call("SENTINEL", "GET-MASTER-ADDR-BY-NAME", self.service)
        return int(port)

    def node(self, port: int) -> RedisNode:
        return next(n for n in self.data if n.port == port)
