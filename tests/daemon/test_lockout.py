"""The lock-out guard (issue 31, item 1): validate / plan warn, apply refuses,
netlimitd warns, when a rule could cut off SSH -- the session running the
command (SSH_CONNECTION) or a port sshd listens on -- unless the client is
exempt.

The kernel cases run the real CLI inside a fresh namespace (`ip netns exec`),
so that the session in SSH_CONNECTION is one of that namespace, and a stand-in
sshd (a process named sshd, listening) gives the namespace an SSH port."""

from __future__ import annotations

import ipaddress
import os
import subprocess
import sys
import textwrap
from pathlib import Path

from daemon_proc import EXE, config_text, sh, wait_for
from hypothesis import given, settings
from hypothesis import strategies as st
from typer.testing import CliRunner

from netlimit.cli import app
from netlimit.config.validate import load_string
from netlimit.kernel.lockout import Target, lockout_hits, session_target, sshd_listeners

runner = CliRunner()

LOCKING = textwrap.dedent("""\
    version: 1
    exempt: [192.0.2.0/24]
    network:
      - name: ssh-slow
        protocol: tcp
        ports: [22]
        limit: 1/minute
      - name: host-cap
        limit: 1/second
        per: all
      - name: web
        protocol: tcp
        ports: [80]
        limit: 10/second
      - name: dns
        protocol: udp
        limit: 10/second
      - name: ssh-shadow
        protocol: tcp
        ports: [22]
        limit: 1/minute
        action: log
    bandwidth:
      - name: trickle
        interface: eth0
        direction: ingress
        rate: 100kbit
      - name: roomy
        interface: eth0
        rate: 100mbit
    """)
SESSION = "203.0.113.7 51000 198.51.100.1 22"


def hits(text: str, env: str) -> list[str]:
    t = session_target({"SSH_CONNECTION": env})
    assert t is not None
    return [h.rule for h in lockout_hits(load_string(text, "f.yaml").config, [t])]


def test_which_rules_could_cut_the_session_off():
    # the port-22 limit, the host-wide cap (per: all, every port), the slow tc class;
    # not port 80, not udp, not a log-only rule, not a 100mbit class
    assert hits(LOCKING, SESSION) == ["ssh-slow", "host-cap", "trickle"]


def test_an_exempt_client_is_never_hit():
    assert hits(LOCKING, "192.0.2.9 51000 198.51.100.1 22") == []
    assert hits(LOCKING, "::ffff:192.0.2.9 51000 198.51.100.1 22") == []  # IPv4-mapped, as sshd may say


def test_sources_destinations_and_ports_narrow_the_match():
    text = LOCKING.replace(
        "ports: [22]\n    limit: 1/minute\n  - name: host-cap",
        "ports: [22]\n    limit: 1/minute\n    sources: [10.0.0.0/8]\n  - name: host-cap",
        1,
    )
    text = text.replace("per: all\n", "per: all\n    destinations: [198.51.100.2/32]\n", 1)
    assert hits(text, SESSION) == ["trickle"]
    assert hits(LOCKING, "203.0.113.7 51000 198.51.100.1 2222") == ["host-cap", "trickle"]


@settings(max_examples=200, deadline=None)
@given(
    client=st.ip_addresses(v=4),
    port=st.integers(1, 65535),
    action=st.sampled_from(["drop", "reject", "log"]),
    exempt=st.booleans(),
)
def test_log_rules_and_exempt_clients_never_lock_out(client, port, action, exempt):
    net = ipaddress.ip_network(f"{client}/32")
    text = (
        "version: 1\n"
        + (f"exempt: [{net}]\n" if exempt else "")
        + f"network:\n  - {{name: r, protocol: tcp, ports: [{port}], limit: 1/minute, action: {action}}}\n"
    )
    got = hits(text, f"{client} 40000 198.51.100.1 {port}")
    assert got == ([] if exempt or action == "log" else ["r"])


def test_validate_warns_naming_the_rule_and_the_session(tmp_path: Path):
    f = tmp_path / "lock.yaml"
    f.write_text(LOCKING)
    res = runner.invoke(app, ["validate", str(f)], env={"SSH_CONNECTION": SESSION})
    assert res.exit_code == 0, res.output
    lines = res.output.splitlines()
    assert lines[0] == f"{f}: valid (5 network, 2 bandwidth)"
    session = "could lock out your SSH session from 203.0.113.7 to port 22 (SSH_CONNECTION)"
    assert [line for line in lines if "(SSH_CONNECTION)" in line] == [
        f"{f}:4:11: ssh-slow: warning: drops packets above 1/minute per source: {session}",
        f"{f}:8:11: host-cap: warning: drops packets above 1/second for all clients together (per: all): {session}",
        f"{f}:24:11: trickle: warning: caps ingress traffic on eth0 at 100kbit: {session}",
    ]
    quiet = runner.invoke(app, ["validate", str(f)], env={"SSH_CONNECTION": "192.0.2.9 51000 198.51.100.1 22"})
    assert "(SSH_CONNECTION)" not in quiet.output


# --- in a namespace: the real CLI, a stand-in sshd, netlimitd -------------------------


class FakeSshd:
    """A process named sshd listening on a TCP port inside the namespace."""

    def __init__(self, ns: str, port: int):
        code = (
            "import socket, sys\n"
            "open('/proc/self/comm', 'w').write('sshd')\n"
            "s = socket.socket(socket.AF_INET6)\n"
            "s.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 0)\n"
            f"s.bind(('::', {port})); s.listen()\n"
            "print('ready', flush=True)\n"
            "sys.stdin.read()\n"
        )
        self.proc = subprocess.Popen(
            ["ip", "netns", "exec", ns, sys.executable, "-c", code],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
        )
        assert self.proc.stdout is not None and self.proc.stdout.readline().strip() == "ready"

    def stop(self) -> None:
        self.proc.kill()
        self.proc.wait(timeout=10)


def in_ns(ns: str, *args: str, env: dict | None = None) -> subprocess.CompletedProcess:
    """The CLI run inside the namespace; SSH_CONNECTION only when given."""
    full = {k: v for k, v in os.environ.items() if k != "SSH_CONNECTION"}
    full.update(env or {})
    return subprocess.run(
        ["ip", "netns", "exec", ns, EXE, *args], capture_output=True, text=True, timeout=120, env=full
    )


def table(ns: str) -> str:
    return sh("ip", "netns", "exec", ns, "nft", "list", "table", "inet", "netlimit", check=False).stdout


def test_apply_refuses_a_file_that_cuts_off_the_session(tmp_path: Path, netns: str):
    f = tmp_path / "lock.yaml"
    f.write_text(LOCKING.replace("eth0", "nlta"))
    env = {"SSH_CONNECTION": SESSION}
    res = in_ns(netns, "apply", str(f), "--backend", "nftables", env=env)
    assert res.returncode == 1, res.stderr
    err = res.stderr.splitlines()
    assert (
        f"{f}:4:11: ssh-slow: drops packets above 1/minute per source: could lock out your SSH session from 203.0.113.7 to port 22 (SSH_CONNECTION)"
        in err
    )
    assert any(line.startswith(f"{f}:8:11: host-cap: ") for line in err)
    assert err[-1].startswith(
        f"{f}: refused: 3 rules could cut off the SSH session running this command. Add 203.0.113.7"
    )
    assert "--allow-lockout" in err[-1] and "nothing was changed" in err[-1]
    assert table(netns) == ""  # nothing was installed
    assert "htb" not in sh("ip", "netns", "exec", netns, "tc", "qdisc", "show").stdout

    # the same file from an exempt client, and with --allow-lockout: applied
    ok = in_ns(
        netns, "apply", str(f), "--backend", "nftables", "-q", env={"SSH_CONNECTION": "192.0.2.9 5 198.51.100.1 22"}
    )
    assert ok.returncode == 0, ok.stderr
    assert "ssh-slow" in table(netns)
    sh("ip", "netns", "exec", netns, EXE, "flush", "-q")
    assert table(netns) == ""
    forced = in_ns(netns, "apply", str(f), "--backend", "nftables", "-q", "--allow-lockout", env=env)
    assert forced.returncode == 0, forced.stderr
    assert "ssh-slow" in table(netns)
    # warned all the same, naming the rule
    assert (
        "ssh-slow: warning: drops packets above 1/minute per source: could lock out your SSH session" in forced.stderr
    )


def test_after_sudo_the_session_is_found_in_the_shell_that_ran_it(tmp_path: Path, netns: str):
    """sudo resets the environment: the shell above it still has SSH_CONNECTION."""
    f = tmp_path / "lock.yaml"
    f.write_text(LOCKING.replace("eth0", "nlta"))
    env = {k: v for k, v in os.environ.items() if k != "SSH_CONNECTION"}
    env["SSH_CONNECTION"] = SESSION
    # the shell has it; the command it runs (as sudo would) does not
    res = subprocess.run(
        ["sh", "-c", 'env -u SSH_CONNECTION ip netns exec "$0" "$1" apply "$2" --backend nftables', netns, EXE, str(f)],
        capture_output=True,
        text=True,
        timeout=120,
        env=env,
    )
    assert res.returncode == 1, res.stderr
    assert "could lock out your SSH session from 203.0.113.7 to port 22" in res.stderr
    assert table(netns) == ""


def test_apply_with_confirm_goes_through_the_try_and_rollback(tmp_path: Path, netns: str):
    f = tmp_path / "lock.yaml"
    f.write_text(LOCKING.replace("eth0", "nlta"))
    res = in_ns(
        netns, "apply", str(f), "--backend", "nftables", "-q", "--confirm", "1", env={"SSH_CONNECTION": SESSION}
    )
    # no terminal to answer on: applied, then rolled back (exit 2), not refused up front (exit 1)
    assert res.returncode == 2, res.stderr
    assert "the previous rules were restored" in res.stderr
    assert table(netns) == ""


def test_an_sshd_port_is_found_and_warned_about(tmp_path: Path, netns: str):
    f = tmp_path / "alt.yaml"
    f.write_text("version: 1\nnetwork:\n  - {name: alt-ssh, protocol: tcp, ports: [2222], limit: 2/minute}\n")
    sshd = FakeSshd(netns, 2222)
    try:
        # plan --netns reads sshd's sockets in that namespace, from outside it
        assert [t.port for t in sshd_listeners(netns)] == [2222]
        assert sshd_listeners(netns)[0] == Target(port=2222)
        res = subprocess.run([EXE, "plan", str(f), "--netns", netns], capture_output=True, text=True, timeout=60)
        assert res.returncode == 0, res.stderr
        warning = f"{f}:3:12: alt-ssh: warning: drops packets above 2/minute per source: could lock out sshd listening on port 2222"
        assert warning in res.stderr.splitlines()
        # validate inside the namespace sees it too; outside it, it does not
        inside = in_ns(netns, "validate", str(f))
        assert warning in inside.stdout.splitlines()
        assert (
            "2222"
            not in subprocess.run([EXE, "validate", str(f)], capture_output=True, text=True, timeout=60).stdout.split(
                "\n", 1
            )[1]
        )
        # no session involved: apply warns and applies
        applied = in_ns(netns, "apply", str(f), "--backend", "nftables", "-q")
        assert applied.returncode == 0 and warning in applied.stderr.splitlines()
    finally:
        sshd.stop()


def test_netlimitd_applies_and_warns_at_start_and_reload(daemon_factory, netns: str):
    rule = "  - {name: alt-ssh, protocol: tcp, ports: [2222], limit: 2/minute}\n"
    sshd = FakeSshd(netns, 2222)
    try:
        d = daemon_factory(config_text(extra=rule))
        d.start()
        assert "alt-ssh" in table(netns)  # applied anyway
        warn = "start: " + f"{d.config}:"
        wait_for(
            lambda: warn in d.log.read_text() and "alt-ssh: warning: drops packets above 2/minute" in d.log.read_text(),
            10,
            "the start warning",
        )
        record = logged_lockout(netns, d.config)
        assert record == (
            "WARNING",
            f"start: {d.config}:10:12: alt-ssh: warning: drops packets above 2/minute per source: could lock out sshd listening on port 2222",
        )
        d.edit(config_text(extra=rule.replace("2/minute", "3/minute")))
        wait_for(
            lambda: "alt-ssh: warning: drops packets above 3/minute" in d.log.read_text(), 30, "the reload warning"
        )
    finally:
        sshd.stop()


def logged_lockout(netns: str, config: Path) -> tuple[str, str]:
    """The level and text Daemon._lockout_warn logs for the daemon's file (in-process)."""
    import logging
    from types import SimpleNamespace

    from netlimit.config.validate import load_file
    from netlimit.daemon.service import Daemon

    got: list[logging.LogRecord] = []

    class Grab(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            got.append(record)

    lg = logging.getLogger("netlimit")
    h = Grab()
    lg.addHandler(h)
    try:
        Daemon._lockout_warn(SimpleNamespace(status=SimpleNamespace(netns=netns)), load_file(config), "start")  # type: ignore[arg-type]
    finally:
        lg.removeHandler(h)
    assert len(got) == 1, [r.getMessage() for r in got]
    return got[0].levelname, got[0].getMessage()


def test_a_rule_from_an_included_file_is_warned_at_its_own_file_and_line(tmp_path: Path):
    """`include:` carries an included file's positions encoded (line + k * LINE_BASE)
    through the checks: the lock-out warning and apply's refusal name the included
    file and its real line, as every other problem does."""
    main = tmp_path / "netlimit.yaml"
    main.write_text("version: 1\ninclude: [conf.d/*.yaml]\nnetwork:\n  - name: web\n    protocol: tcp\n")
    main.write_text(main.read_text() + "    ports: [80]\n    limit: 10/second\n")
    (tmp_path / "conf.d").mkdir()
    ssh = tmp_path / "conf.d" / "10-ssh.yaml"
    ssh.write_text("# ssh\nnetwork:\n  - name: ssh-slow\n    protocol: tcp\n    ports: [22]\n    limit: 1/minute\n")
    session = "could lock out your SSH session from 203.0.113.7 to port 22 (SSH_CONNECTION)"
    res = runner.invoke(app, ["validate", str(main)], env={"SSH_CONNECTION": SESSION})
    assert res.exit_code == 0, res.output
    warned = [line for line in res.output.splitlines() if "(SSH_CONNECTION)" in line]
    assert warned == [f"{ssh}:3:11: ssh-slow: warning: drops packets above 1/minute per source: {session}"]
    plan = runner.invoke(app, ["plan", str(main), "--backend", "nftables"], env={"SSH_CONNECTION": SESSION})
    assert f"{ssh}:3:11: ssh-slow: warning: drops packets" in plan.output, plan.output
    assert str(10_000_000) not in res.output + plan.output  # no encoded line anywhere


def test_apply_refuses_naming_the_included_file(tmp_path: Path, netns: str):
    main = tmp_path / "netlimit.yaml"
    main.write_text("version: 1\ninclude: [conf.d/*.yaml]\n")
    (tmp_path / "conf.d").mkdir()
    ssh = tmp_path / "conf.d" / "10-ssh.yaml"
    ssh.write_text("network:\n  - name: ssh-slow\n    protocol: tcp\n    ports: [22]\n    limit: 1/minute\n")
    res = in_ns(netns, "apply", str(main), "--backend", "nftables", env={"SSH_CONNECTION": SESSION})
    assert res.returncode == 1, res.stderr
    assert f"{ssh}:2:11: ssh-slow: drops packets above 1/minute per source: could lock out" in res.stderr, res.stderr
    assert table(netns) == ""  # nothing was installed
