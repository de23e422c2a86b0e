"""One fresh network namespace with only its loopback up, for tests that must
bind the wildcard address (0.0.0.0, ::) without exposing anything on the
machine's own interfaces; processes and probes run inside it.

Import explicitly: ``from lone_netns import LoneNetns``."""

from __future__ import annotations

import itertools
import json
import os
import subprocess
import sys

_seq = itertools.count()

_PROBE = """
import json, socket, sys
out = {}
for host, port in json.loads(sys.argv[1]):
    fam = socket.AF_INET6 if ":" in host else socket.AF_INET
    s = socket.socket(fam, socket.SOCK_STREAM)
    s.settimeout(3)
    try:
        s.connect((host, port))
        out[f"{host} {port}"] = "answers"
    except OSError as exc:
        out[f"{host} {port}"] = type(exc).__name__
    finally:
        s.close()
print(json.dumps(out))
"""


class LoneNetns:
    """``with LoneNetns("tag") as ns:`` -- ``ns.name``; removed on exit."""

    def __init__(self, tag: str):
        self.name = f"nlt-{tag}-{os.getpid() % 100000}-{next(_seq)}"[:30]

    def __enter__(self) -> LoneNetns:
        subprocess.run(["ip", "netns", "add", self.name], check=True, capture_output=True, timeout=30)
        try:
            self.run("ip", "link", "set", "lo", "up")
        except BaseException:
            self.__exit__()
            raise
        return self

    def __exit__(self, *exc: object) -> None:
        subprocess.run(["ip", "netns", "del", self.name], capture_output=True, timeout=30)

    def argv(self, *cmd: str) -> list[str]:
        return ["ip", "netns", "exec", self.name, *cmd]

    def run(self, *cmd: str) -> str:
        return subprocess.run(self.argv(*cmd), check=True, capture_output=True, text=True, timeout=60).stdout

    def connect(self, *addrs: tuple[str, int]) -> dict[str, str]:
        """TCP connects from inside the namespace: {"host port": "answers" or the error's name}."""
        return json.loads(self.run(sys.executable, "-c", _PROBE, json.dumps(addrs)))

    def listening(self) -> list[str]:
        """The listening TCP sockets' local addresses (``ss -ltnH``)."""
        return [line.split()[3] for line in self.run("ss", "-ltnH").splitlines() if line.strip()]
