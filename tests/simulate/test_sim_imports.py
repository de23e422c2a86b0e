"""netlimit.simulate imports the engine and the config, never a door; the CLI
loads nothing heavy (matplotlib, the replay) until a command runs."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

PKG = Path(__file__).resolve().parents[2] / "netlimit" / "simulate"
DOORS = ("netlimit.sidecar", "netlimit.rls", "netlimit.daemon", "netlimit.kernel")
DOOR_LIBRARIES = ("aiohttp", "grpc", "grpc_health", "httptools", "uvloop")


def _imports(path: Path) -> set[str]:
    out = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            out |= {a.name for a in node.names}
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = ["netlimit", "simulate"][: 3 - node.level]
                out.add(".".join(base + ([node.module] if node.module else [])))
            else:
                out.add(node.module or "")
    return out


def test_simulate_imports_no_door():
    bad = []
    for path in sorted(PKG.glob("*.py")):
        for mod in _imports(path):
            if mod.startswith(DOORS) or mod.split(".")[0] in DOOR_LIBRARIES:
                bad.append(f"{path.name} -> {mod}")
    assert not bad, bad
    assert any("netlimit.limit" in m for m in _imports(PKG / "replay.py"))


def test_the_cli_starts_without_matplotlib_or_the_replay():
    code = (
        "import sys, netlimit.cli; "
        "print(sorted(m for m in sys.modules if m.startswith(('matplotlib', 'netlimit.simulate.', 'numpy'))))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "['netlimit.simulate.cli']"
