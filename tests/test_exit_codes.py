"""README's exit codes, for every command as a user hits them:
0 ok, 1 invalid input (nothing changed), 2 the operation failed (previous state
restored), 64 usage (bad flags, not root, missing tool).

Usage errors go through the real parser (CliRunner on the app); the rest run the
console entry point in a subprocess, as root or as nobody (setpriv), with files in
a directory nobody can read."""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import sys
import tempfile
import threading
from pathlib import Path

import pytest
import typer.main
from typer.testing import CliRunner

from netlimit.cli import EXIT_FAILED, EXIT_INVALID, EXIT_USAGE, app

ROOT = Path(__file__).resolve().parents[1]
NETLIMIT = [sys.executable, "-m", "netlimit.cli"]
runner = CliRunner()


def command_paths() -> list[list[str]]:
    """Every leaf command as the words that reach it (`ban add` is ["ban", "add"])."""
    out: list[list[str]] = []

    def walk(group, prefix: list[str]) -> None:
        for name, cmd in sorted(group.commands.items()):
            if hasattr(cmd, "commands"):
                walk(cmd, [*prefix, name])
            else:
                out.append([*prefix, name])

    walk(typer.main.get_command(app), [])
    return out


def test_the_codes_are_the_documented_ones():
    assert (EXIT_INVALID, EXIT_FAILED, EXIT_USAGE) == (1, 2, 64)
    readme = " ".join((ROOT / "docs/cli.md").read_text().split())  # the command reference, lines joined
    assert "Exit codes: 0 ok, 1 invalid input (nothing changed), 2 the operation failed" in readme
    assert "64 usage (bad flags, not root, missing tool)" in readme


@pytest.mark.parametrize("words", command_paths(), ids=" ".join)
def test_an_unknown_flag_exits_64_for_every_command(words):
    res = runner.invoke(app, [*words, "--no-such-flag"])
    assert res.exit_code == 64, res.output
    assert "No such option" in res.output and "--no-such-flag" in res.output


@pytest.mark.parametrize(
    "argv, says",
    [
        (["no-such-command"], "No such command"),
        (["ban", "no-such-command"], "No such command"),
        (["validate"], "Missing argument"),
        (["plan"], "Missing argument"),
        (["apply"], "Missing argument"),
        (["ban", "add", "192.0.2.1"], "Missing option '--ttl'"),
        (["apply", "x.yaml", "--confirm", "0"], "--confirm"),
        (["apply", "x.yaml", "--confirm", "soon"], "--confirm"),
        (["top", "--interval", "0"], "--interval"),
        (["daemon", "--resync", "0"], "--resync"),
        (["suggest"], "Missing option '--log'"),
        ([], "Usage:"),  # no command: the help, as a usage error
        (["ban"], "Usage:"),
    ],
    ids=lambda v: " ".join(v) if isinstance(v, list) else None,
)
def test_usage_errors_exit_64(argv, says):
    res = runner.invoke(app, argv)
    assert res.exit_code == 64, res.output
    assert says in res.output


def test_the_console_script_exits_64_on_a_usage_error():
    exe = Path(sys.executable).with_name("netlimit")
    p = subprocess.run([str(exe), "valdiate", "x.yaml"], capture_output=True, text=True, timeout=60)
    assert p.returncode == 64 and "No such command 'valdiate'" in p.stderr, p.stderr
    assert p.stdout == ""


def test_help_and_version_exit_0():
    for argv in (["--help"], ["-h"], ["--version"], ["ban", "--help"], ["apply", "--help"]):
        res = runner.invoke(app, argv)
        assert res.exit_code == 0, (argv, res.output)


# --- 1, 2 and 64 from the commands themselves ----------------------------------------------

BAD = "version: 1\nnetwork:\n  - name: a\n    limit: 5/fortnight\n"
GOOD = "version: 1\nnetwork:\n  - name: a\n    limit: 5/second\n"


@pytest.fixture
def files():
    """good.yaml, bad.yaml, a log and a ban file (memory store, a socket path) in a directory nobody can read."""
    d = Path(tempfile.mkdtemp(prefix="netlimit-exit-"))
    try:
        os.chmod(d, 0o755)
        (d / "good.yaml").write_text(GOOD)
        (d / "bad.yaml").write_text(BAD)
        (d / "http.yaml").write_text("version: 1\nnetwork:\n  - name: a\n    limit: 5/second\n")
        (d / "access.log").write_text('192.0.2.1 - - [27/Nov/2026:10:00:00 +0000] "GET / HTTP/1.1" 200 1 "-" "curl"\n')
        (d / "bans.yaml").write_text(f"version: 1\nbans: {{store: memory, socket: {d}/netlimitd.sock}}\n")
        for f in d.iterdir():
            os.chmod(f, 0o644)
        yield d
    finally:
        shutil.rmtree(d, ignore_errors=True)


def run(*argv: str, nobody: bool = False, stdin: str | None = None) -> subprocess.CompletedProcess:
    pre = ["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups"] if nobody else []
    env = {**os.environ, "PYTHONPATH": str(ROOT), "PYTHONDONTWRITEBYTECODE": "1"}
    return subprocess.run(
        [*pre, *NETLIMIT, *argv],
        capture_output=True,
        text=True,
        timeout=120,
        env=env,
        input=stdin,
        cwd="/",
    )


def test_invalid_input_exits_1_for_every_command_that_reads_a_file(files):
    bad = str(files / "bad.yaml")
    cases = [
        ["validate", bad],
        ["plan", bad],
        ["apply", bad],
        ["list", "--file", bad],
        ["daemon", "--config", bad, "--socket", str(files / "d.sock")],
        ["sidecar", "--config", bad, "--listen", "127.0.0.1:0"],
        ["simulate", "--config", bad, str(files / "access.log")],
        ["simulate", "--config", str(files / "http.yaml"), str(files / "access.log")],  # no http: section
        ["suggest", "--config", bad, "--log", str(files / "access.log")],
        ["ban", "list", "--config", bad],
        ["ban", "list", "--config", str(files / "good.yaml")],  # no bans: section
        ["ban", "add", "not-an-address", "--ttl", "1m", "--config", str(files / "bans.yaml")],
        ["ban", "add", "192.0.2.1", "--ttl", "1fortnight", "--config", str(files / "bans.yaml")],
    ]
    for argv in cases:
        p = run(*argv)
        assert p.returncode == 1, (argv, p.stdout, p.stderr)
        assert "Traceback" not in p.stderr, (argv, p.stderr)


def test_not_root_exits_64(files):
    good = str(files / "good.yaml")
    cases = {
        ("apply", good): "run it as root",
        ("plan", good, "--live"): "run it as root",
        ("list",): "run it as root",
        ("flush",): "run it as root",
        ("demo",): "run it as root",
        ("daemon", "--config", good): "must run as root",
        ("install-service",): "run as root",
        ("status", "--socket", str(files / "none.sock")): "needs root",
    }
    for argv, says in cases.items():
        p = run(*argv, nobody=True)
        assert p.returncode == 64, (argv, p.stdout, p.stderr)
        assert says in p.stderr, (argv, p.stderr)
    # the daemon's socket is root-only: `ban` and `status` say so with 64
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as s:
        s.bind(str(files / "netlimitd.sock"))
        os.chmod(files / "netlimitd.sock", 0o600)
        s.listen(1)
        p = run("ban", "list", "--config", str(files / "bans.yaml"), nobody=True)
        assert p.returncode == 64 and "root-only" in p.stderr, p.stderr
        p = run("status", "--socket", str(files / "netlimitd.sock"), nobody=True)
        assert p.returncode == 64 and "root-only" in p.stderr, p.stderr


def test_a_missing_namespace_or_backend_exits_64(files):
    good = str(files / "good.yaml")
    p = run("apply", good, "--netns", "netlimit-no-such-ns")
    assert p.returncode == 64 and "netlimit-no-such-ns" in p.stderr, p.stderr
    p = run("plan", good, "--backend", "no-such-backend")
    assert p.returncode == 64 and "no-such-backend" in p.stderr, p.stderr


def test_a_failed_operation_exits_2(files):
    # a daemon socket that answers nonsense: status failed
    path = str(files / "odd.sock")
    srv = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    srv.bind(path)
    srv.listen(4)
    srv.settimeout(60)

    def answer() -> None:
        try:
            conn, _ = srv.accept()
            with conn:
                conn.recv(100)
                conn.sendall(b"not json\n")
        except OSError:
            pass

    t = threading.Thread(target=answer, daemon=True)
    t.start()
    try:
        p = run("status", "--socket", path)
        assert p.returncode == 2 and "did not answer properly" in p.stderr, p.stderr
    finally:
        srv.close()
        t.join(10)
    # the host's netlimitd keeps a memory ban list; without one the ban cannot be written
    p = run("ban", "add", "192.0.2.1", "--ttl", "1m", "--config", str(files / "bans.yaml"))
    assert p.returncode == 2 and "no netlimitd listens" in p.stderr, p.stderr
