"""Shell completion and man pages come from the command line itself: bash completes
commands, sub-commands and flags through `netlimit --show-completion`'s script,
`--install-completion` puts it in place, and scripts/manpages.py writes one page per
command that groff reads without a warning."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import typer.main

from netlimit.cli import app

ROOT = Path(__file__).resolve().parents[1]
BIN = Path(sys.executable).parent


def env(**extra: str) -> dict[str, str]:
    return {**os.environ, "PATH": f"{BIN}:{os.environ['PATH']}", "PYTHONPATH": str(ROOT), **extra}


def complete(*words: str) -> list[str]:
    """What bash offers after `words` (the last one being typed), through the real script."""
    arr = " ".join(words)
    script = (
        'eval "$(netlimit --show-completion bash)"\n'
        f"COMP_WORDS=({arr}); COMP_CWORD={len(words) - 1}; _netlimit_completion netlimit\n"
        'printf "%s\\n" "${COMPREPLY[@]}"\n'
    )
    p = subprocess.run(["bash", "-c", script], capture_output=True, text=True, timeout=120, env=env())
    assert p.returncode == 0, p.stderr
    return p.stdout.split()


def test_bash_completes_commands_subcommands_and_flags():
    assert complete("netlimit", "va") == ["validate"]
    assert set(complete("netlimit", "s")) == {"schema", "sidecar", "simulate", "status", "suggest"}
    assert complete("netlimit", "ban", "f") == ["flush"]
    assert complete("netlimit", "apply", "--con") == ["--confirm"]


def test_install_completion_writes_the_script_for_the_shell(tmp_path):
    p = subprocess.run(
        [str(BIN / "netlimit"), "--install-completion", "bash"],
        capture_output=True,
        text=True,
        timeout=120,
        env=env(HOME=str(tmp_path), SHELL="/bin/bash"),
    )
    assert p.returncode == 0, p.stderr
    script = tmp_path / ".bash_completions" / "netlimit.sh"
    assert "_NETLIMIT_COMPLETE=complete_bash" in script.read_text()
    assert f"source '{script}'" in (tmp_path / ".bashrc").read_text()


def test_man_pages_for_every_command_read_cleanly(tmp_path):
    p = subprocess.run(
        [sys.executable, str(ROOT / "scripts" / "manpages.py"), str(tmp_path)],
        capture_output=True,
        text=True,
        timeout=120,
        env=env(),
    )
    assert p.returncode == 0, p.stderr
    names = {f.name for f in tmp_path.iterdir()}
    group = typer.main.get_command(app)
    want = {"netlimit.1"}
    for name, cmd in group.commands.items():
        want.add(f"netlimit-{name}.1")
        for sub in getattr(cmd, "commands", {}):
            want.add(f"netlimit-{name}-{sub}.1")
    assert names == want
    for name in sorted(names):
        lint = subprocess.run(
            ["groff", "-man", "-Tutf8", "-ww", "-z", str(tmp_path / name)], capture_output=True, text=True, timeout=60
        )
        assert lint.returncode == 0 and lint.stderr == "", (name, lint.stderr)
    shown = subprocess.run(
        ["groff", "-man", "-Tascii", "-P-cbou", str(tmp_path / "netlimit-apply.1")],
        capture_output=True,
        text=True,
        timeout=60,
    ).stdout
    for words in ("netlimit apply [OPTIONS] {FILE}", "--confirm SECONDS", "EXIT STATUS", "--backend"):
        assert words in shown, (words, shown[:2000])
    top = subprocess.run(
        ["groff", "-man", "-Tascii", "-P-cbou", str(tmp_path / "netlimit.1")], capture_output=True, text=True
    ).stdout
    assert "netlimit ban" in top and "netlimit-validate(1)" in top
