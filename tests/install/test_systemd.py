"""The systemd units: verified, and run under a real systemd (systemd-nspawn).

The container boots in a network namespace this test creates, so netlimitd
inside it configures that namespace only; we read the kernel from outside
with `ip netns exec`.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest
from nspawn import Container

from netlimit.install import UNITS, render_unit

ROOT = Path(__file__).resolve().parents[2]
BIN = Path(sys.executable).parent


def _need(tool: str) -> str:
    path = shutil.which(tool)
    if not path:
        pytest.fail(f"{tool} is not installed: apt-get install systemd systemd-container debootstrap")
    return path


@pytest.mark.parametrize("unit", UNITS)
def test_unit_verifies_without_any_output(tmp_path, unit):
    """systemd-analyze verify exits 0 even for misspelt directives: any output is a failure."""
    _need("systemd-analyze")
    dest = tmp_path / unit
    dest.write_text(render_unit((ROOT / "systemd" / unit).read_text(), BIN))
    res = subprocess.run(["systemd-analyze", "verify", str(dest)], capture_output=True, text=True, timeout=60)
    assert (res.returncode, res.stdout + res.stderr) == (0, "")


def test_the_xdp_drop_in_verifies_and_is_read(tmp_path):
    """systemd/netlimitd-xdp.conf (docs/xdp.md) as /etc/systemd/system/netlimitd.service.d/xdp.conf:
    verified without output, and systemd really reads it (the debug log names it)."""
    _need("systemd-analyze")
    dest = tmp_path / "netlimitd.service"
    dest.write_text(render_unit((ROOT / "systemd" / "netlimitd.service").read_text(), BIN))
    (tmp_path / "netlimitd.service.d").mkdir()
    text = (ROOT / "systemd" / "netlimitd-xdp.conf").read_text()
    assert "CAP_BPF" in text and "SystemCallFilter=bpf" in text and "ReadWritePaths=-/sys/fs/bpf" in text
    (tmp_path / "netlimitd.service.d" / "xdp.conf").write_text(text)
    res = subprocess.run(["systemd-analyze", "verify", str(dest)], capture_output=True, text=True, timeout=60)
    assert (res.returncode, res.stdout + res.stderr) == (0, "")
    env = dict(os.environ, SYSTEMD_LOG_LEVEL="debug")
    res = subprocess.run(["systemd-analyze", "verify", str(dest)], capture_output=True, text=True, timeout=60, env=env)
    assert "netlimitd.service.d/xdp.conf" in res.stdout + res.stderr


@pytest.mark.parametrize("unit,limit", [("netlimitd.service", 4.0), ("netlimit-sidecar.service", 2.0)])
def test_unit_security_exposure(tmp_path, unit, limit):
    _need("systemd-analyze")
    dest = tmp_path / unit
    dest.write_text(render_unit((ROOT / "systemd" / unit).read_text(), BIN))
    res = subprocess.run(
        ["systemd-analyze", "security", "--offline=true", str(dest)], capture_output=True, text=True, timeout=60
    )
    line = [x for x in res.stdout.splitlines() if "Overall exposure level" in x]
    assert line, res.stdout + res.stderr
    score = float(line[0].split(":")[1].split()[0])
    print(f"{unit}: exposure {score}")
    assert score <= limit


CONFIG = """\
version: 1
exempt: [127.0.0.0/8]
network:
  - name: udp-flood
    protocol: udp
    ports: [5000]
    limit: 100/second
    burst: 10
{extra}http:
  domain: api
  actions:
    - [remote_address]
  descriptors:
    - key: remote_address
      rate_limit: {{unit: second, requests_per_unit: 2}}
"""
EXTRA = """\
  - name: ssh-guard
    protocol: tcp
    ports: [22]
    new_connections: true
    limit: 3/minute
    method: recent
"""


def owned(ns: str) -> list[str]:
    out = subprocess.run(
        ["ip", "netns", "exec", ns, "iptables-legacy-save"], capture_output=True, text=True, timeout=30
    ).stdout
    return [x for x in out.splitlines() if x.startswith("-A") and "netlimit" in x]


def wait_for(pred, timeout: float, what: str):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if pred():
            return
        time.sleep(0.2)
    raise AssertionError(f"timed out waiting for {what}")


@pytest.fixture
def container():
    for tool in ("systemd-nspawn", "debootstrap", "nsenter"):
        _need(tool)
    ns = f"nlt-sd{os.getpid() % 100000}"
    subprocess.run(["ip", "netns", "add", ns], check=True, timeout=30)
    c = Container(f"nlt-sd{os.getpid() % 100000}", ns)
    try:
        c.prepare()
        c.boot()
        yield c
    finally:
        try:
            c.close()
        finally:
            subprocess.run(["ip", "netns", "del", ns], timeout=30)


@pytest.mark.netns
@pytest.mark.systemd
@pytest.mark.timeout(1500)  # the first run builds the cached root file system (about 3 minutes)
def test_netlimitd_and_sidecar_under_systemd(container):
    c = container
    assert "installed /etc/systemd/system/netlimitd.service (ExecStart from /opt/netlimit/bin)" in c.install_output
    c.write("/etc/netlimit/netlimit.yaml", CONFIG.format(extra=""))
    c.run(["systemctl", "daemon-reload"])

    c.run(["systemctl", "start", "netlimitd"], timeout=90)
    assert c.run(["systemctl", "is-active", "netlimitd"], check=False).stdout.strip() == "active", c.journal(
        "netlimitd"
    )
    assert any('"netlimit:udp-flood"' in r for r in owned(c.netns)), c.journal("netlimitd")
    show = c.run(
        [
            "systemctl",
            "show",
            "netlimitd",
            "-p",
            "StatusText",
            "-p",
            "NoNewPrivileges",
            "-p",
            "ProtectSystem",
            "-p",
            "CapabilityBoundingSet",
            "-p",
            "KillMode",
        ]
    ).stdout
    assert "StatusText=1 rules from /etc/netlimit/netlimit.yaml" in show
    assert "ProtectSystem=strict" in show and "NoNewPrivileges=yes" in show
    assert "CapabilityBoundingSet=cap_net_admin cap_net_raw" in show
    # SIGTERM to the main process only: the group-wide SIGTERM of the default KillMode
    # killed the -save the on_stop flush had just started (issue 24)
    assert "KillMode=mixed" in show
    status = c.run(["/opt/netlimit/bin/netlimit", "status"]).stdout
    assert "config:      /etc/netlimit/netlimit.yaml" in status and "udp-flood" in status

    # edit + systemctl reload -> the new rule is live
    c.write("/etc/netlimit/netlimit.yaml", CONFIG.format(extra=EXTRA))
    c.run(["systemctl", "reload", "netlimitd"], timeout=60)
    wait_for(lambda: any('"netlimit:ssh-guard"' in r for r in owned(c.netns)), 10, "the reloaded rule")

    # the sidecar: no capabilities, a dynamic user, answers on loopback
    c.run(["systemctl", "start", "netlimit-sidecar"], timeout=60)
    probe = (
        "import urllib.request,time\n"
        "for i in range(100):\n"
        "    try:\n"
        "        print(urllib.request.urlopen('http://127.0.0.1:8081/healthz', timeout=2).status); break\n"
        "    except OSError: time.sleep(0.1)\n"
    )
    out = c.run(["/opt/netlimit/bin/python", "-c", probe], timeout=60).stdout.strip()
    assert out == "200", c.journal("netlimit-sidecar")
    user = c.run(["systemctl", "show", "netlimit-sidecar", "-p", "DynamicUser", "-p", "CapabilityBoundingSet"]).stdout
    assert "DynamicUser=yes" in user and "CapabilityBoundingSet=\n" in user + "\n"

    # a bad edit is rejected at error priority: `journalctl -p err` shows it, and not the routine lines
    c.write("/etc/netlimit/netlimit.yaml", CONFIG.format(extra=EXTRA).replace("limit: 3/minute", "limit: 3/fortnight"))
    c.run(["systemctl", "reload", "netlimitd"], timeout=60)

    def errors() -> str:
        cmd = ["journalctl", "-u", "netlimitd", "-p", "err", "--no-pager", "-o", "cat"]
        return c.run(cmd, check=False).stdout

    wait_for(lambda: "new config rejected" in errors(), 20, "the rejection at priority err")
    assert "bad rate unit 'fortnight'" in errors() and "start: applied" not in errors(), errors()
    c.write("/etc/netlimit/netlimit.yaml", CONFIG.format(extra=EXTRA))

    # stop -> flushed
    c.run(["systemctl", "stop", "netlimitd"], timeout=60)
    assert owned(c.netns) == [], c.journal("netlimitd")
    journal = c.journal("netlimitd", 200)
    assert "netlimitd: start: applied" in journal
    assert re.search(r"on_stop flush: removed [1-9]\d* owned objects .*read back: none remain", journal), journal


def test_netlimitd_starts_after_the_firewalls_and_does_not_restart_on_an_invalid_file():
    """Issue 31: nftables.service / firewalld.service flush the rule set when they
    start, so netlimitd comes after them; exit 1 (invalid file, see `netlimit
    daemon`) is not restarted (a restart cannot fix the file)."""
    unit = (ROOT / "systemd" / "netlimitd.service").read_text()
    lines = [x.strip() for x in unit.splitlines() if x.strip() and not x.startswith("#")]
    after = " ".join(x.split("=", 1)[1] for x in lines if x.startswith("After="))
    assert {"nftables.service", "firewalld.service"} <= set(after.split())
    assert "Restart=on-failure" in lines and "RestartPreventExitStatus=1" in lines
    assert not any(x.startswith("PartOf=") for x in lines)


SECRET = "s3cr3t-Cred:ential/#1"  # URL-special characters: it never goes through a URL
CRED_CONFIG = """\
version: 1
http:
  domain: api
  storage: redis://127.0.0.1:{port}/0
  password_file: ${{CREDENTIALS_DIRECTORY}}/netlimit_redis
  actions:
    - [remote_address]
  descriptors:
    - key: remote_address
      rate_limit: {{unit: minute, requests_per_unit: 1}}
"""
CHECK = (
    "import json,sys,urllib.request,urllib.error,time\n"
    "body=json.dumps({'domain':'api','descriptors':[{'entries':[{'key':'remote_address','value':'10.7.7.7'}]}]})\n"
    "out=[]\n"
    "for i in range(100):\n"
    "    try:\n"
    "        urllib.request.urlopen('http://127.0.0.1:8081/healthz', timeout=2); break\n"
    "    except OSError: time.sleep(0.1)\n"
    "for i in range(2):\n"
    "    req=urllib.request.Request('http://127.0.0.1:8081/v1/check', data=body.encode(),"
    " headers={'Content-Type':'application/json'})\n"
    "    try: out.append(urllib.request.urlopen(req, timeout=5).status)\n"
    "    except urllib.error.HTTPError as e: out.append(e.code)\n"
    "print(out)\n"
)


@pytest.mark.netns
@pytest.mark.systemd
@pytest.mark.redis
@pytest.mark.timeout(1500)
def test_redis_password_reaches_the_sidecar_as_a_systemd_credential(container, tmp_path):
    """Issue 31 item 8 under a real systemd: the shipped unit's
    LoadCredential=netlimit:/etc/netlimit/credentials hands the root-only password
    file to the sidecar's dynamic user; it is never in `systemctl show`, the
    environment, the command line or the journal; without it the sidecar says which
    credential is missing and where to put it."""
    c = container
    redis = _need("redis-server")
    port = 6391
    (tmp_path / "redis").mkdir()
    srv = subprocess.Popen(
        ["ip", "netns", "exec", c.netns, redis, "--port", str(port), "--bind", "127.0.0.1", "--save", ""]
        + ["--appendonly", "no", "--dir", str(tmp_path / "redis"), "--requirepass", SECRET],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )

    def dbsize() -> str:
        res = subprocess.run(
            ["ip", "netns", "exec", c.netns, "redis-cli", "-p", str(port), "dbsize"],
            capture_output=True,
            text=True,
            timeout=30,
            env={**os.environ, "REDISCLI_AUTH": SECRET},
        )
        return res.stdout.strip()

    try:
        wait_for(lambda: dbsize() == "0", 20, "redis-server in the container's namespace")
        creds = c.merged / "etc/netlimit/credentials"
        assert oct(creds.stat().st_mode & 0o777) == "0o700"  # made by install-service
        (creds / "redis").write_text(SECRET + "\n")
        (creds / "redis").chmod(0o600)
        c.write("/etc/netlimit/netlimit.yaml", CRED_CONFIG.format(port=port))
        c.run(["systemctl", "start", "netlimit-sidecar"], timeout=60)

        out = c.run(["/opt/netlimit/bin/python", "-c", CHECK], timeout=60).stdout.strip()
        assert out == "[200, 429]", c.journal("netlimit-sidecar")
        assert int(dbsize()) >= 1  # the count is in the password-protected Redis

        show = c.run(["systemctl", "show", "netlimit-sidecar"]).stdout
        # the shipped unit, unedited, is what loads it (systemd 252's `show` does not list LoadCredential=)
        assert (
            "\nLoadCredential=netlimit:/etc/netlimit/credentials\n"
            in c.run(["systemctl", "cat", "netlimit-sidecar"]).stdout
        )
        pid = re.search(r"^MainPID=(\d+)$", show, re.M)
        assert pid and pid.group(1) != "0", show
        environ = c.run(["cat", f"/proc/{pid.group(1)}/environ"]).stdout.split("\0")
        cmdline = c.run(["cat", f"/proc/{pid.group(1)}/cmdline"]).stdout
        assert "CREDENTIALS_DIRECTORY=/run/credentials/netlimit-sidecar.service" in environ
        journal = c.journal("netlimit-sidecar", 500)
        for where, text in (("systemctl show", show), ("environ", "\n".join(environ)), ("cmdline", cmdline)):
            assert SECRET not in text, where
        assert SECRET not in journal
        # only the service's own (dynamic) user can read the credential
        cred = c.run(["stat", "-c", "%a %U", "/run/credentials/netlimit-sidecar.service/netlimit_redis"]).stdout
        assert cred.split()[0] == "400" and cred.split()[1] != "root", cred

        # the credential taken away: the sidecar does not start, and says what to do
        (creds / "redis").unlink()
        c.run(["systemctl", "restart", "netlimit-sidecar"], check=False, timeout=60)
        hint = "systemd credential 'netlimit_redis' is missing"

        def errors() -> str:
            cmd = ["journalctl", "-u", "netlimit-sidecar", "-p", "err", "--no-pager", "-o", "cat"]
            return c.run(cmd, check=False).stdout

        wait_for(lambda: hint in errors(), 30, "the missing credential's error")
        assert "put the password in /etc/netlimit/credentials/redis (mode 0600, root)" in errors(), errors()
        assert SECRET not in c.journal("netlimit-sidecar", 500)
    finally:
        c.run(["systemctl", "stop", "netlimit-sidecar"], check=False, timeout=60)
        srv.kill()
        srv.wait(timeout=10)
