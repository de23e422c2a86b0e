"""Which versions of the peers a benchmark ran against (issue 35: `limits`' async
client doubled its speed with a newer redis-py, and nothing said which one a
figure was measured with).

``peers()`` asks every peer for its version: the Python packages through their
installed metadata, the tools through their own ``--version``.  ``pins()``
reads bench/constraints.txt, the pins of the ``bench`` extra's Python peers:

    pip install -e '.[bench]' -c bench/constraints.txt

The report shows each version beside its pin and marks a Python peer that
differs from its pin (a figure measured so is not the committed setup's).
"""

from __future__ import annotations

import re
import shutil
import subprocess
from importlib import metadata
from pathlib import Path

CONSTRAINTS = Path(__file__).resolve().parent / "constraints.txt"

# (name shown, python distribution) -- what the sections import as peers or clients
PYTHON_PEERS = (
    ("limits", "limits"),  # inproc, redis, cluster: the peer
    ("redis-py", "redis"),  # limits' Redis client (async and sync)
    ("hiredis", "hiredis"),  # the parser redis-py and netlimit's RESP client use
    ("matplotlib", "matplotlib"),  # the kernel apply plot
)

# (name shown, argv, regex for the version in stdout+stderr)
TOOL_PEERS = (
    ("nginx", ["nginx", "-v"], r"nginx/(\S+)"),
    ("redis-server", ["redis-server", "--version"], r"v=(\S+)"),
    ("nft", ["nft", "--version"], r"v(\d[\w.\-]*)"),
    ("iptables", ["iptables", "--version"], r"v(\d\S*(?: \([^)]*\))?)"),
    ("iptables-legacy", ["iptables-legacy", "--version"], r"v(\d\S*)"),
    ("wrk", ["wrk", "-v"], r"wrk (\S+)"),
    ("iperf3", ["iperf3", "--version"], r"iperf (\S+)"),
    ("goaccess", ["goaccess", "--version"], r"GoAccess - (\S+?)\.?$"),
)


def _tool_version(argv: list[str], pattern: str) -> str | None:
    if shutil.which(argv[0]) is None:
        return None
    try:
        p = subprocess.run(argv, capture_output=True, text=True, timeout=10)
    except (OSError, subprocess.SubprocessError):
        return None
    m = re.search(pattern, p.stdout + "\n" + p.stderr, re.M)
    return m.group(1) if m else None


def peers() -> dict[str, str | None]:
    """Every peer's version on this host (None: not installed / not answering)."""
    out: dict[str, str | None] = {}
    for name, dist in PYTHON_PEERS:
        try:
            out[name] = metadata.version(dist)
        except metadata.PackageNotFoundError:
            out[name] = None
    for name, argv, pattern in TOOL_PEERS:
        out[name] = _tool_version(argv, pattern)
    return out


def pins(path: Path = CONSTRAINTS) -> dict[str, str]:
    """bench/constraints.txt as {distribution: version}; only `name==version` lines."""
    got: dict[str, str] = {}
    for n, raw in enumerate(path.read_text().splitlines(), 1):
        line = raw.split("#", 1)[0].strip()
        if not line:
            continue
        m = re.fullmatch(r"([A-Za-z0-9][A-Za-z0-9._-]*)==([\w.!+-]+)", line)
        if not m:
            raise ValueError(f"{path}:{n}: expected 'name==version', got {raw.strip()!r}")
        got[m.group(1).lower()] = m.group(2)
    return got


def off_pin(found: dict[str, str | None], pinned: dict[str, str]) -> dict[str, tuple[str | None, str]]:
    """The Python peers whose installed version is not their pin: {shown name: (installed, pinned)}."""
    out = {}
    for name, dist in PYTHON_PEERS:
        want = pinned.get(dist)
        if want is not None and found.get(name) != want:
            out[name] = (found.get(name), want)
    return out


def markdown_line(found: dict[str, str | None], pinned: dict[str, str] | None) -> str:
    parts = []
    dists = dict(PYTHON_PEERS)
    for name, v in found.items():
        text = f"{name} {v or 'not found'}"
        if pinned is not None and name in dists and dists[name] in pinned and pinned[dists[name]] != v:
            text += f" (**pinned {pinned[dists[name]]}**)"
        parts.append(text)
    return "Peers: " + ", ".join(parts) + "."
