"""A ban list kept by this host's netlimitd (`bans.store: memory`), reached over the
daemon's status socket (root-only, 0600): one JSON request line, one JSON answer per
connection. The CLI uses it blocking; a sidecar's escalation from its event loop
(:class:`AsyncSocketBanList` runs the call in a worker thread)."""

from __future__ import annotations

import asyncio
import json
import socket
from typing import Any

from ..errors import NetlimitError
from .model import Ban, IPNetwork, parse_target
from .store import AddResult, Snapshot

TIMEOUT_S = 5.0
MAX_ANSWER = 64 << 20  # a list of 1,000,000 bans in JSON stays below it


class BanRefused(NetlimitError):
    """The holder refused the ban (an exempt address or a trusted proxy)."""


class SocketBanList:
    def __init__(self, path: str, timeout: float = TIMEOUT_S):
        self.path = path
        self.timeout = timeout

    def _ask(self, req: dict[str, Any]) -> dict[str, Any]:
        line = json.dumps(req, separators=(",", ":")).encode() + b"\n"
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as s:
            s.settimeout(self.timeout)
            try:
                s.connect(self.path)
            except FileNotFoundError:
                raise NetlimitError(
                    f"no netlimitd listens on {self.path}: with bans.store: memory the host's netlimitd keeps the "
                    "list (start it, or point bans.socket at its --socket)"
                ) from None
            s.sendall(line)
            buf = bytearray()
            while not buf.endswith(b"\n"):
                chunk = s.recv(1 << 16)
                if not chunk:
                    break
                buf += chunk
                if len(buf) > MAX_ANSWER:
                    raise NetlimitError(f"netlimitd on {self.path} answered more than {MAX_ANSWER} bytes")
        try:
            ans = json.loads(buf)
        except ValueError:
            raise NetlimitError(f"netlimitd on {self.path} gave no JSON answer") from None
        if not isinstance(ans, dict):
            raise NetlimitError(f"netlimitd on {self.path} gave a strange answer")
        if not ans.get("ok"):
            err = str(ans.get("error") or "refused")
            raise BanRefused(err) if ans.get("refused") else NetlimitError(f"netlimitd: {err}")
        return ans

    def add(
        self,
        net: IPNetwork,
        ttl: float,
        *,
        rule: str = "",
        reason: str = "",
        by: str = "",
        origin: str = "manual",
        extend: bool = False,
        repeat: tuple[float, float] | None = None,
    ) -> AddResult:
        a = self._ask(
            {
                "ban": "add",
                "net": str(net),
                "ttl": ttl,
                "rule": rule,
                "reason": reason,
                "by": by,
                "origin": origin,
                "extend": extend,
                **({"repeat": list(repeat)} if repeat is not None else {}),
            }
        )
        return AddResult(bool(a.get("added")), float(a.get("left", 0)), [parse_target(n) for n in a.get("evicted", [])])

    def delete(self, net: IPNetwork) -> bool:
        return bool(self._ask({"ban": "del", "net": str(net)}).get("removed"))

    def flush(self) -> int:
        return int(self._ask({"ban": "flush"}).get("removed", 0))

    def snapshot(self) -> Snapshot:
        a = self._ask({"ban": "list"})
        out: list[tuple[Ban, float]] = []
        for d in a.get("bans", []):
            try:
                left = float(d["left"])
                ban = Ban.make(
                    parse_target(d["net"]),
                    left,
                    rule=str(d.get("rule") or ""),
                    reason=str(d.get("reason") or ""),
                    by=str(d.get("by") or ""),
                    added=-float(d["age"]) if d.get("age") is not None else 0.0,
                    origin=str(d.get("origin") or "manual"),
                )
            except (KeyError, TypeError, ValueError):
                continue
            out.append((ban, left))
        return Snapshot(out, int(a.get("evicted", 0)))

    def close(self) -> None:
        pass


class AsyncSocketBanList:
    """:class:`SocketBanList` for an event loop: `add` in a worker thread."""

    def __init__(self, path: str):
        self.sync = SocketBanList(path)

    async def add(self, net: IPNetwork, ttl: float, **kw: Any) -> AddResult:
        return await asyncio.to_thread(lambda: self.sync.add(net, ttl, **kw))

    async def close(self) -> None:
        pass
