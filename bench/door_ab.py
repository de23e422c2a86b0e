"""The decision door of two netlimit trees side by side in ONE process: a
baseline (e.g. main before a change) and this tree, each driven through
``HttpConnection.data_received`` (llhttp parse, descriptors, decision, answer
encoding) with a transport that drops the answers -- no socket, no event loop:
the sidecar's own CPU per request.  Batches of 30,000 requests alternate
between the two so that a shared machine's load drift hits both alike; CPU
time is summed per side and the ratio printed.

    git archive main netlimit | tar -x -C /tmp/base && mv /tmp/base/netlimit /tmp/base/netlimit_old
    python bench/door_ab.py --old /tmp/base --uri /login --peer 198.51.100.7
    python bench/door_ab.py --old /tmp/base --uri '/Api/Orders/{i}/;jsessionid=1'   # a new path per request

The rules file has a path rule and a per-address rule (every request is
admitted); ``{i}`` in ``--uri`` is replaced by the request's number.
"""

from __future__ import annotations

import argparse
import importlib
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

RULES = """\
version: 1
http:
  domain: bench
  actions:
    - [path, remote_address]
    - [remote_address]
  descriptors:
    - key: path
      value: /login
      descriptors:
        - key: remote_address
          rate_limit: {unit: second, requests_per_unit: 100000000}
    - key: remote_address
      rate_limit: {unit: second, requests_per_unit: 100000000}
"""


class _Transport:
    def __init__(self, peer: str) -> None:
        self.peer = peer
        self.n = 0

    def get_extra_info(self, k: str) -> Any:
        return (self.peer, 1234) if k == "peername" else None

    def set_write_buffer_limits(self, *a: Any) -> None:
        pass

    def write(self, b: bytes) -> None:
        self.n += 1

    def is_closing(self) -> bool:
        return False

    def get_write_buffer_size(self) -> int:
        return 0

    def pause_reading(self) -> None:
        pass

    def resume_reading(self) -> None:
        pass

    def close(self) -> None:
        pass


def _door(pkg: str, rules: str, peer: str) -> tuple[Any, _Transport]:
    app = importlib.import_module(pkg + ".sidecar.app")
    ep = importlib.import_module(pkg + ".sidecar.endpoints")
    try:  # the server split into sidecar/http11/ (connection, state, ...), or the one module of older trees
        conn_cls = importlib.import_module(pkg + ".sidecar.http11.connection").HttpConnection
        limits_cls = importlib.import_module(pkg + ".sidecar.http11.limits").Limits
    except ModuleNotFoundError:
        h = importlib.import_module(pkg + ".sidecar.http11")
        conn_cls, limits_cls = h.HttpConnection, h.Limits
    sc = app.Sidecar(rules)
    conn = conn_cls(sc.state, ep.Endpoints(sc), limits_cls(max_pipeline=1000))
    t = _Transport(peer)
    conn.connection_made(t)
    return conn, t


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--old", required=True, help="a directory holding the baseline tree as package netlimit_old")
    ap.add_argument("--uri", default="/login", help="X-Original-URI; {i}: the request's number")
    ap.add_argument("--peer", default="198.51.100.7")
    ap.add_argument("--rounds", type=int, default=10)
    a = ap.parse_args()
    sys.path.insert(0, a.old)
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
    with tempfile.TemporaryDirectory() as d:
        rules = Path(d) / "n.yaml"
        rules.write_text(RULES)
        sides = {"baseline": _door("netlimit_old", str(rules), a.peer), "this": _door("netlimit", str(rules), a.peer)}

        def batch(j: int) -> bytes:
            return b"".join(
                (
                    f"GET /v1/check HTTP/1.1\r\nHost: a\r\nX-Original-URI: {a.uri.replace('{i}', str(j * 100 + i))}\r\n"
                    "User-Agent: wrk\r\nAccept: */*\r\n\r\n"
                ).encode()
                for i in range(100)
            )

        batches = [batch(j) for j in range(300)]
        cpu = dict.fromkeys(sides, 0.0)
        done = dict.fromkeys(sides, 0)
        for rnd in range(a.rounds):
            for k in ("baseline", "this") if rnd % 2 == 0 else ("this", "baseline"):
                conn, t = sides[k]
                n0, t0 = t.n, time.process_time()
                for b in batches:
                    conn.data_received(b)
                cpu[k] += time.process_time() - t0
                done[k] += t.n - n0
    rate = {k: done[k] / cpu[k] for k in sides}
    print(
        f"{a.uri!r} peer {a.peer}: baseline {rate['baseline']:.0f}/s, this {rate['this']:.0f}/s, "
        f"this/baseline {rate['this'] / rate['baseline']:.3f}"
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
