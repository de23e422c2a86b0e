"""Shared pieces of the benchmark sections: the size presets, side-by-side
interleaved timing, result rows, free ports, bounded child processes.

Every figure a section reports is measured beside its peer in the same run,
interleaved round by round where the two can alternate, because the machine
is shared and noisy: the ratios (median of the per-round ratios) are the
figures to trust, the absolute numbers only describe this run.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import zipfile
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
PY = sys.executable


@dataclass
class Mode:
    """Sizes for one run (``--quick`` or full)."""

    quick: bool

    def pick(self, quick: Any, full: Any) -> Any:
        return quick if self.quick else full


def median(xs: list[float]) -> float:
    return statistics.median(xs) if xs else float("nan")


def row(
    case: str,
    netlimit: float | None,
    peer: float | None,
    *,
    unit: str,
    peer_name: str,
    better: str = "higher",
    goal: str = "",
    met: bool | None = None,
    note: str = "",
    ratio: float | None = None,
    **extra: Any,
) -> dict[str, Any]:
    """One comparison: netlimit's figure, the peer's, their ratio (netlimit / peer
    for "higher is better", peer / netlimit for "lower is better" -- so a ratio
    above 1 always means netlimit is ahead), the goal and whether it was met."""
    if ratio is None and netlimit is not None and peer is not None and netlimit > 0 and peer > 0:
        ratio = netlimit / peer if better == "higher" else peer / netlimit
    r = {
        "case": case,
        "netlimit": netlimit,
        "peer": peer,
        "peer_name": peer_name,
        "unit": unit,
        "better": better,
        "ratio": ratio,
        "goal": goal,
        "met": met,
        "note": note,
    }
    r.update(extra)
    return r


def interleaved_rates(
    runners: dict[str, Callable[[int], tuple[int, float]]],
    rounds: int,
) -> dict[str, Any]:
    """Run each runner once per round, alternating (and reversing the order every
    other round so that neither always goes first).  A runner takes the round
    number and returns (operations, seconds).  Returns per-runner rates of every
    round and their medians (see round_ratio for the ratios)."""
    names = list(runners)
    rates: dict[str, list[float]] = {n: [] for n in names}
    for r in range(rounds):
        order = names if r % 2 == 0 else list(reversed(names))
        for n in order:
            ops, secs = runners[n](r)
            rates[n].append(ops / secs if secs > 0 else float("nan"))
    return {"rates": rates, "median": {n: median(v) for n, v in rates.items()}}


def round_ratio(rates: dict[str, list[float]], a: str, b: str) -> float:
    """Median over rounds of rates[a] / rates[b] (both measured in the same round)."""
    return median([x / y for x, y in zip(rates[a], rates[b]) if y > 0])


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_port(port: int, proc: subprocess.Popen | None, timeout: float = 15.0) -> None:
    deadline = time.monotonic() + timeout
    while True:
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=0.2):
                return
        except OSError:
            if proc is not None and proc.poll() is not None:
                raise RuntimeError(f"{proc.args[0]} exited with {proc.returncode} before listening on {port}")
            if time.monotonic() > deadline:
                raise RuntimeError(f"nothing listens on 127.0.0.1:{port} after {timeout} s")
            time.sleep(0.02)


def stop(proc: subprocess.Popen | None, timeout: float = 5.0) -> None:
    """Terminate a child we started (then kill it) and reap it."""
    if proc is None or proc.poll() is not None:
        return
    proc.terminate()
    try:
        proc.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait(timeout=5)


def need(tool: str, apt: str | None = None) -> str:
    path = shutil.which(tool) or (f"/usr/sbin/{tool}" if os.path.exists(f"/usr/sbin/{tool}") else None)
    if not path:
        raise RuntimeError(f"{tool} is not installed (apt-get install {apt or tool}); scripts/setup.sh installs it")
    return path


@dataclass
class Section:
    """What a section returns: rows for the table plus anything else worth keeping."""

    name: str
    title: str
    rows: list[dict[str, Any]] = field(default_factory=list)
    details: dict[str, Any] = field(default_factory=dict)
    seconds: float = 0.0
    error: str | None = None

    def to_json(self) -> dict[str, Any]:
        return {
            "title": self.title,
            "rows": self.rows,
            "details": self.details,
            "seconds": round(self.seconds, 2),
            "error": self.error,
        }


def redis_argv(exe: str, port: int, d: str, bus: int | None = None) -> list[str]:
    """A throw-away redis-server on loopback: no persistence, in the foreground; a
    cluster node when ``bus`` (its cluster bus port) is given."""
    args = [exe, "--port", str(port), "--bind", "127.0.0.1", "--dir", d, "--save", "", "--appendonly", "no",
            "--protected-mode", "no", "--daemonize", "no"]  # fmt: skip
    if bus is not None:
        args += ["--cluster-enabled", "yes", "--cluster-config-file", f"{d}/nodes.conf", "--cluster-port", str(bus)]
    return args


@contextlib.contextmanager
def redis_server(prefix: str = "nlbench-redis-") -> Iterator[tuple[int, subprocess.Popen]]:
    """One redis-server of the section's own (port, process); stopped and its
    directory removed on the way out."""
    exe = need("redis-server")
    port = free_port()
    d = tempfile.mkdtemp(prefix=prefix)
    proc = subprocess.Popen(redis_argv(exe, port, d), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        wait_port(port, proc)
        yield port, proc
    finally:
        stop(proc)
        shutil.rmtree(d, ignore_errors=True)


def free_ports(n: int) -> list[int]:
    """``n`` distinct free loopback ports (held together while chosen)."""
    socks = []
    try:
        for _ in range(n):
            s = socket.socket()
            socks.append(s)
            s.bind(("127.0.0.1", 0))
        return [s.getsockname()[1] for s in socks]
    finally:
        for s in socks:
            s.close()


@contextlib.contextmanager
def redis_cluster(primaries: int = 3, replicas: int = 1, timeout: float = 60.0) -> Iterator[list[int]]:
    """A Redis Cluster of the section's own (``redis-cli --cluster create``): yields
    the primaries' ports once every node says cluster_state:ok and every primary
    has its replicas linked (ROLE); every process stopped on the way out."""
    import redis

    exe = need("redis-server")
    cli = need("redis-cli", "redis-tools")
    n = primaries * (1 + replicas)
    ports = free_ports(2 * n)
    dirs = [tempfile.mkdtemp(prefix="nlbench-cl-") for _ in range(n)]
    procs: list[subprocess.Popen] = []
    try:
        for i in range(n):
            procs.append(
                subprocess.Popen(
                    redis_argv(exe, ports[i], dirs[i], ports[n + i]),
                    stdout=subprocess.DEVNULL,
                    stderr=subprocess.DEVNULL,
                )
            )
        for p, proc in zip(ports, procs):
            wait_port(p, proc)
        subprocess.run(
            [cli, "--cluster", "create", *(f"127.0.0.1:{p}" for p in ports[:n]), "--cluster-replicas", str(replicas),
             "--cluster-yes"],
            check=True, capture_output=True, timeout=timeout,
        )  # fmt: skip
        deadline = time.monotonic() + timeout
        while True:
            prim: list[int] = []
            ok = True
            for p in ports[:n]:
                c = redis.Redis(port=p, socket_timeout=2)
                try:
                    info = c.cluster("info")
                    ok = ok and info.get("cluster_state") == "ok" and int(info.get("cluster_known_nodes", 0)) == n
                    role = c.execute_command("ROLE")
                    if role[0] == b"master":
                        prim.append(p)
                        ok = ok and len(role[2]) >= replicas
                except redis.RedisError:
                    ok = False
                finally:
                    c.close()
            if ok and len(prim) == primaries:
                break
            if time.monotonic() > deadline:
                raise RuntimeError(f"the benchmark's cluster on {ports[:n]} did not come up in {timeout} s")
            time.sleep(0.1)
        yield prim
    finally:
        for proc in procs:
            stop(proc)
        for d in dirs:
            shutil.rmtree(d, ignore_errors=True)


def door(mode: Mode, where: Path) -> tuple[dict[str, str] | None, str]:
    """The sidecar's environment for the door a release ships, and a note saying which
    door ran.  Full runs build the compiled door as the .deb and the image do
    (``NETLIMIT_MYPYC=1``: netlimit/compiled.py) into ``where`` and put it first on
    PYTHONPATH; ``--quick`` runs keep the source tree's Python (the build takes
    about 45 s, and quick figures are not judged).  ``NETLIMIT_BENCH_DOOR=TREE``
    uses a compiled tree built beforehand (an unpacked release wheel of the same
    source) instead of building one."""
    if mode.quick:
        return None, "door in Python (--quick)"
    given = os.environ.get("NETLIMIT_BENCH_DOOR")  # a compiled tree built beforehand (the same source)
    if given:
        return {**os.environ, "PYTHONPATH": given}, f"door compiled (mypyc), prebuilt in {given}"
    out = where / "door-wheel"
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    env["NETLIMIT_MYPYC"] = "1"
    r = subprocess.run(
        [PY, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q", "-w", str(out), str(REPO)],
        capture_output=True, text=True, timeout=900, env=env,
    )  # fmt: skip
    if r.returncode != 0:
        raise RuntimeError(f"building the compiled door failed: {r.stderr[-2000:]}")
    (whl,) = out.glob("netlimit-*.whl")
    tree = where / "door"
    with zipfile.ZipFile(whl) as z:
        z.extractall(tree)
    return {**os.environ, "PYTHONPATH": str(tree)}, "door compiled (mypyc), as the .deb and the image ship it"


def process_tree(pid: int) -> list[int]:
    """``pid`` and its descendants, as they are now (/proc's children lists)."""
    out = [pid]
    for p in out:
        try:
            with open(f"/proc/{p}/task/{p}/children") as f:
                out += [int(c) for c in f.read().split()]
        except OSError:
            pass
    return out


def cpu_seconds(pids: list[int]) -> float:
    """Seconds of CPU (user and system) the processes took so far; a gone one counts 0."""
    total = 0
    for p in pids:
        try:
            with open(f"/proc/{p}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
            total += int(fields[11]) + int(fields[12])
        except (OSError, IndexError, ValueError):
            continue
    return total / os.sysconf("SC_CLK_TCK")
