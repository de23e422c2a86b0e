"""netlimitd's own option reading (netlimit/daemon/main.py): what it makes of a command
line is what `netlimit daemon` (typer) gives the daemon, and whatever typer must answer
(help, a misspelt option, a refused value) goes to typer."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from typer.testing import CliRunner

import netlimit.daemon.main as dmain
from netlimit.cli import app

VALUE = st.text(alphabet="abcdefghijklmnopqrstuvwxyz0123456789_./:", min_size=1, max_size=12)
OPTION = st.sampled_from(sorted(dmain._OPTIONS))


def by_typer(argv: list[str], env: dict[str, str] | None = None) -> dict | None:
    """The arguments `netlimit daemon ARGV` hands to daemon/main.run (None: typer refused)."""
    got: dict = {}

    def run(config, resync, metrics, netns, socket_path, backend, log_level, log_format, err=None):
        got.update(
            config=config, resync=resync, metrics=metrics, netns=netns, socket_path=socket_path,
            backend=backend, log_level=log_level, log_format=log_format,
        )  # fmt: skip
        return 0

    mp = pytest.MonkeyPatch()
    try:
        mp.setattr(dmain, "run", run)
        for k in ("NETLIMIT_LOG_LEVEL", "NETLIMIT_LOG_FORMAT"):
            mp.delenv(k, raising=False)
        for k, v in (env or {}).items():
            mp.setenv(k, v)
        res = CliRunner().invoke(app, ["daemon", *argv], prog_name="netlimit")
        mine = dmain.parse(argv)
    finally:
        mp.undo()
    if res.exit_code != 0 or not got:
        return {"refused": res.exit_code, "mine": mine}
    return {"typer": got, "mine": mine}


@pytest.mark.parametrize(
    "argv",
    [
        [],
        ["--config", "x.yaml"],
        ["-c", "x.yaml", "--resync", "0.5", "--netns", "ns1"],
        ["--resync=2", "--metrics=127.0.0.1:9732", "--socket", "/run/s.sock", "--backend", "nftables"],
        ["--log-level", "debug", "--log-format", "json", "--config", "a", "--config", "b"],
    ],
)
def test_the_options_are_typers(argv):
    out = by_typer(argv)
    assert "typer" in out and out["mine"] == out["typer"], out


def test_the_log_variables_are_typers():
    out = by_typer(["--config", "x"], {"NETLIMIT_LOG_LEVEL": "warning", "NETLIMIT_LOG_FORMAT": "json"})
    assert out["mine"]["log_level"] == "warning" and out["mine"] == out["typer"], out


@pytest.mark.parametrize(
    "argv",
    [["--help"], ["--resync", "0.1"], ["--resync", "x"], ["--confg", "x"], ["--config"], ["extra"], ["-c=x"]],
)
def test_what_typer_must_answer_goes_to_typer(argv):
    assert dmain.parse(argv) is None


@settings(max_examples=60, deadline=None)
@given(st.lists(st.tuples(OPTION, VALUE, st.booleans()), max_size=5), st.floats(0.0, 100.0))
def test_any_plain_command_line_reads_as_typer_reads_it(opts, resync):
    argv: list[str] = []
    for name, value, joined in opts:
        if name == "--resync":
            value = repr(resync)
        if joined and name.startswith("--"):
            argv.append(f"{name}={value}")
        else:
            argv += [name, value]
    out = by_typer(argv)
    if "typer" in out:
        assert out["mine"] == out["typer"], (argv, out)
    else:  # typer refused (a resync under 0.2): netlimitd hands it to typer
        assert out["mine"] is None, (argv, out)


def test_netlimitd_starts_without_the_command_line_framework(tmp_path: Path):
    """The start path up to the config's check imports neither typer nor netlimit.cli
    (a cheap guard of issue 35's imports; the READY test checks a whole start)."""
    bad = tmp_path / "netlimit.yaml"
    bad.write_text("version: 1\nnetwork: [{name: x}]\n")
    env = dict(os.environ, PYTHONPROFILEIMPORTTIME="1", PYTHONPATH=str(Path(dmain.__file__).parents[2]))
    res = subprocess.run(
        [sys.executable, "-m", "netlimit.daemon", "--config", str(bad), "--socket", str(tmp_path / "s.sock")],
        capture_output=True, text=True, timeout=60, env=env,
    )  # fmt: skip
    imported = {line.rsplit("|", 1)[1].strip() for line in res.stderr.splitlines() if "import time:" in line}
    said = "\n".join(line for line in res.stderr.splitlines() if "import time:" not in line)
    if os.geteuid() == 0:
        assert res.returncode == 1 and "invalid, not starting" in said, said
        assert "netlimit.config.validate" in imported and "netlimit.daemon.service" in imported
    else:
        assert res.returncode == 64 and "must run as root" in said, said
    assert not {m for m in imported if m.split(".")[0] in ("typer", "click", "rich")}, said
    assert "netlimit.cli" not in imported and "prometheus_client" not in imported


@pytest.mark.parametrize(("argv", "rc", "said"), [(["--help"], 0, "Usage:"), (["--resync", "0.1"], 64, "--resync")])
def test_typer_answers_what_netlimitd_hands_it(argv, rc, said):
    env = dict(os.environ, PYTHONPATH=str(Path(dmain.__file__).parents[2]))
    res = subprocess.run(
        [sys.executable, "-m", "netlimit.daemon", *argv], capture_output=True, text=True, timeout=60, env=env
    )
    assert res.returncode == rc and said in res.stdout + res.stderr, (res.returncode, res.stdout, res.stderr)
