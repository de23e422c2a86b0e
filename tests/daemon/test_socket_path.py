"""netlimitd's --socket PATH (issue 29): it creates what is missing, changes no
directory it did not create, and deletes nothing at PATH but a stale socket of
its own -- a regular file, a directory or a symlink there is refused before the
kernel is touched."""

from __future__ import annotations

import os
import signal
import socket
import stat
import subprocess

import pytest
from daemon_proc import EXE, Daemon, config_text, owned_rules

pytestmark = [pytest.mark.netns, pytest.mark.timeout(120)]


def _mode(path) -> int:
    return stat.S_IMODE(os.lstat(path).st_mode)


def _refused(d: Daemon) -> str:
    """Start the daemon, which must exit 1 at once; its log."""
    argv = [EXE, "daemon", "--config", str(d.config), "--netns", d.ns, "--socket", d.sock]
    with open(d.log, "a") as log:
        rc = subprocess.run(argv, stdout=subprocess.DEVNULL, stderr=log, timeout=60).returncode
    assert rc == 1, d.log.read_text()
    return d.log.read_text()


def test_a_regular_file_at_the_socket_path_is_refused_untouched(tmp_path, netns):
    d = Daemon(tmp_path, netns, config_text())
    with open(d.sock, "w") as f:
        f.write("someone's data\n")
    log = _refused(d)
    assert f"--socket {d.sock}: a regular file is there, not a socket" in log
    assert "remove it, or pass another --socket path" in log
    assert "Traceback" not in log
    with open(d.sock) as f:
        assert f.read() == "someone's data\n"
    assert owned_rules(netns) == []  # refused before the kernel was touched


@pytest.mark.parametrize("kind", ["directory", "symbolic link"])
def test_a_directory_or_a_symlink_at_the_socket_path_is_refused(tmp_path, netns, kind):
    d = Daemon(tmp_path, netns, config_text())
    target = tmp_path / "precious"
    target.write_text("x")
    if kind == "directory":
        os.mkdir(d.sock)
    else:
        os.symlink(target, d.sock)
    log = _refused(d)
    assert f"a {kind} is there, not a socket" in log
    assert os.path.lexists(d.sock) and target.read_text() == "x"
    assert owned_rules(netns) == []


def test_an_existing_parent_directory_keeps_its_mode(tmp_path, netns):
    shared = tmp_path / "shared"
    shared.mkdir()
    os.chmod(shared, 0o1777)  # a /tmp-like directory others use
    d = Daemon(tmp_path, netns, config_text())
    d.sock = str(shared / "netlimitd.sock")
    try:
        d.start()
        assert _mode(shared) == 0o1777
        assert stat.S_ISSOCK(os.lstat(d.sock).st_mode) and _mode(d.sock) == 0o600
        assert d.status()["pid"] == d.proc.pid
    finally:
        assert d.stop(signal.SIGTERM) == 0
    assert not os.path.lexists(d.sock)  # its own socket is removed at the stop
    assert _mode(shared) == 0o1777


def test_a_missing_parent_directory_is_created_root_only(tmp_path, netns):
    d = Daemon(tmp_path, netns, config_text())
    d.sock = str(tmp_path / "run" / "netlimit" / "netlimitd.sock")
    try:
        d.start()
        assert _mode(tmp_path / "run" / "netlimit") == 0o700
        assert _mode(d.sock) == 0o600
    finally:
        assert d.stop(signal.SIGTERM) == 0


def test_a_stale_socket_of_a_crashed_daemon_is_replaced(tmp_path, netns):
    d = Daemon(tmp_path, netns, config_text())
    stale = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    stale.bind(d.sock)  # bound, nobody listening: what a killed daemon leaves
    stale.close()
    try:
        d.start()
        assert d.status()["pid"] == d.proc.pid
    finally:
        assert d.stop(signal.SIGTERM) == 0
