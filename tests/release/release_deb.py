"""The Debian package installed for real (run by scripts/release-test.sh, not by the
default suite: it needs the built .deb). A clean Debian 12 (debootstrap, booted with
systemd-nspawn in a network namespace this test owns):

apt install ./netlimit_VERSION_amd64.deb -> netlimitd enabled and running -> an edit of
/etc/netlimit/netlimit.yaml is picked up -> a UDP flood from a second namespace is cut to
the configured rate -> upgrade to a later build: the operator's file kept, the daemon
restarted, the rules never gone (sampled all along) -> apt remove: no unit running, no
kernel object -> apt purge: no configuration left. Also: man pages and completions
installed, and netlimitd reaching a password-protected Redis through the packaged
unit's LoadCredential= (the password never in its environment or journal).

    NETLIMIT_DEB=dist/netlimit_0.2.0_amd64.deb .venv/bin/python -m pytest -s tests/release/release_deb.py
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import threading
import time
from pathlib import Path

import pytest
from debroot import DebContainer, bump_version
from release_common import sh, wait_for

pytestmark = [pytest.mark.systemd, pytest.mark.netns]

PORT = 5000
REDIS_PORT = 6393
SECRET = "s3cr3t-Cred:ential/#1"
CONF = """\
version: 1
on_stop: flush
exempt: [127.0.0.0/8, "::1/128"]
network:
  - name: udp-flood
    protocol: udp
    ports: [{port}]
    limit: {rate}/second
    burst: 10
    per: source
bandwidth:
  - name: shape
    interface: nlda
    rate: 10mbit
"""


MAN_PAGES = (
    "usr/share/man/man1/netlimit.1.gz",
    "usr/share/man/man1/netlimit-apply.1.gz",
    "usr/share/man/man1/netlimit-ban-add.1.gz",
    "usr/share/man/man1/netlimit-daemon.1.gz",
    "usr/share/man/man1/netlimitd.1.gz",
)
COMPLETIONS = (
    "usr/share/bash-completion/completions/netlimit",
    "usr/share/zsh/vendor-completions/_netlimit",
    "usr/share/fish/vendor_completions.d/netlimit.fish",
)


@pytest.fixture
def deb() -> Path:
    path = os.environ.get("NETLIMIT_DEB")
    assert path, "set NETLIMIT_DEB to the .deb to test (scripts/release-test.sh does)"
    p = Path(path).resolve()
    assert p.is_file(), f"{p}: no such file"
    return p


@pytest.fixture
def net():
    """The container's namespace (nlda, 10.98.0.1) and a client namespace (nldb, 10.98.0.2)."""
    tag = os.getpid() % 100000
    ns, cl = f"nl-deb{tag}", f"nl-debc{tag}"
    try:
        sh("ip", "netns", "add", ns)
        sh("ip", "netns", "add", cl)
        sh("ip", "-n", ns, "link", "set", "lo", "up")
        sh("ip", "-n", cl, "link", "set", "lo", "up")
        sh("ip", "-n", ns, "link", "add", "nlda", "type", "veth", "peer", "name", "nldb", "netns", cl)
        sh("ip", "-n", ns, "addr", "add", "10.98.0.1/24", "dev", "nlda")
        sh("ip", "-n", cl, "addr", "add", "10.98.0.2/24", "dev", "nldb")
        sh("ip", "-n", ns, "link", "set", "nlda", "up")
        sh("ip", "-n", cl, "link", "set", "nldb", "up")
        yield ns, cl
    finally:
        sh("ip", "netns", "del", cl, check=False)
        sh("ip", "netns", "del", ns, check=False)


RECEIVER = """
import socket, sys, time
s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
s.bind(("10.98.0.1", int(sys.argv[1])))
s.settimeout(float(sys.argv[2]))
print("ready", flush=True)
n = 0
try:
    while True:
        s.recv(2048)
        n += 1
except socket.timeout:
    pass
print(n, flush=True)
"""

SENDER = """
import socket, sys, time
s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
n, secs = int(sys.argv[2]), float(sys.argv[3])
start = time.monotonic()
for i in range(n):
    target = start + i * secs / n
    while time.monotonic() < target:
        pass
    s.sendto(b"x" * 64, ("10.98.0.1", int(sys.argv[1])))
print(time.monotonic() - start, flush=True)
"""


def flood(ns: str, cl: str, packets: int = 3000, secs: float = 3.0) -> tuple[int, float]:
    """Packets delivered of a paced flood, and how long it took to send."""
    rx = subprocess.Popen(
        ["ip", "netns", "exec", ns, "python3", "-c", RECEIVER, str(PORT), "1.5"],
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert rx.stdout is not None and rx.stdout.readline().strip() == "ready"
        sent = sh("ip", "netns", "exec", cl, "python3", "-c", SENDER, str(PORT), str(packets), str(secs), timeout=60)
        out, _ = rx.communicate(timeout=60)
        return int(out.strip()), float(sent.stdout.strip())
    finally:
        if rx.poll() is None:
            rx.kill()
            rx.wait(timeout=10)


def nft_table(ns: str) -> str:
    return sh("ip", "netns", "exec", ns, "nft", "-a", "list", "table", "inet", "netlimit", check=False).stdout


def test_the_package_carries_man_pages_and_completions(deb):
    """`dpkg-deb -c`: a man page per command (gzipped, netlimitd(1) a link to
    netlimit-daemon(1)) and the bash, zsh and fish completions where those shells look."""
    listing = sh("dpkg-deb", "-c", str(deb)).stdout
    entries = {line.split()[5].removeprefix("./"): line for line in listing.splitlines() if len(line.split()) >= 6}
    for path in (*MAN_PAGES, *COMPLETIONS):
        assert path in entries, f"{path} not in {deb.name}"
    assert entries["usr/share/man/man1/netlimitd.1.gz"].startswith("l"), "netlimitd.1.gz is a link"
    assert "-> netlimit-daemon.1.gz" in entries["usr/share/man/man1/netlimitd.1.gz"]
    pages = [p for p in entries if p.startswith("usr/share/man/man1/netlimit")]
    assert len(pages) >= 20, pages  # one per command and sub-command
    with_bytecode = [p for p in entries if p.endswith(".pyc")]
    assert not with_bytecode, with_bytecode[:5]
    zsh = subprocess.run(
        ["sh", "-c", f"dpkg-deb --fsys-tarfile {deb} | tar -xOf - ./usr/share/zsh/vendor-completions/_netlimit"],
        capture_output=True,
        text=True,
        timeout=120,
    ).stdout
    assert zsh.startswith("#compdef netlimit") and "_NETLIMIT_COMPLETE=complete_zsh" in zsh, zsh[:200]


def test_install_enforce_reload_upgrade_remove_purge(deb, net, tmp_path):
    ns, cl = net
    t0 = time.monotonic()
    timings: dict[str, float] = {}
    c = DebContainer(f"nl-deb{os.getpid() % 100000}", ns)
    try:
        c.prepare()
        m = re.fullmatch(r"netlimit_(.+)_amd64\.deb", deb.name)
        assert m, deb.name
        later = bump_version(deb, m.group(1) + "+upgrade1", tmp_path)
        inside = c.stage(deb)
        inside_later = c.stage(later)
        timings["prepare"] = time.monotonic() - t0
        c.boot()

        # --- install: netlimitd enabled and started (Debian policy), the starter file in place
        t = time.monotonic()
        res = c.run(["env", "DEBIAN_FRONTEND=noninteractive", "apt-get", "-q", "install", "-y", inside], timeout=600)
        timings["apt install"] = time.monotonic() - t
        assert c.run(["systemctl", "is-enabled", "netlimitd"], check=False).stdout.strip() == "enabled"
        wait_for(lambda: c.run(["systemctl", "is-active", "netlimitd"], check=False).stdout.strip() == "active",
                 60, "netlimitd active after apt install\n" + res.stdout[-2000:])  # fmt: skip
        assert c.run(["systemctl", "is-enabled", "netlimit-sidecar"], check=False).stdout.strip() == "disabled"
        assert "ssh-guard" in c.run(["cat", "/etc/netlimit/netlimit.yaml"]).stdout
        assert c.run(["netlimit", "--version"]).stdout.strip().startswith("netlimit ")
        assert c.run(["readlink", "-f", "/usr/bin/netlimitd"]).stdout.strip() == "/usr/lib/netlimit/bin/netlimitd"
        conffiles = c.run(["cat", "/var/lib/dpkg/info/netlimit.conffiles"]).stdout.split()
        assert "/etc/netlimit/netlimit.yaml" in conffiles
        # the units' LoadCredential= directory, root-only (made by postinst)
        assert c.run(["stat", "-c", "%a %U", "/etc/netlimit/credentials"]).stdout.split() == ["700", "root"]
        # man pages and completions: bash completes from the installed script
        for path in (*MAN_PAGES, *COMPLETIONS):
            assert c.run(["test", "-s", "/" + path], check=False).returncode == 0, f"/{path} not installed"
        script = (
            "source /usr/share/bash-completion/completions/netlimit\n"
            "COMP_WORDS=(netlimit va); COMP_CWORD=1; _netlimit_completion netlimit\n"
            'printf "%s\\n" "${COMPREPLY[@]}"\n'
        )
        assert c.run(["bash", "-c", script]).stdout.split() == ["validate"]

        # --- edit the file: the daemon reloads it (inotify), the kernel follows
        c.write("/etc/netlimit/netlimit.yaml", CONF.format(port=PORT, rate=100))
        wait_for(lambda: "udp-flood" in nft_table(ns) and "100/second" in nft_table(ns), 30, "the udp-flood rule")
        wait_for(lambda: "htb" in sh("ip", "netns", "exec", ns, "tc", "qdisc", "show", "dev", "nlda").stdout,
                 30, "the shaping qdisc")  # fmt: skip

        # --- a flood measured: 3000 packets in 3 s from one source against 100/s + burst 10
        delivered, took = flood(ns, cl)
        expected = 100 * took + 10
        print(f"flood: {delivered} of 3000 delivered in {took:.2f} s (100/s + 10 = {expected:.0f})")
        assert 0.8 * expected <= delivered <= 1.2 * expected + 10, (delivered, expected)

        c.write("/etc/netlimit/netlimit.yaml", CONF.format(port=PORT, rate=200))
        wait_for(lambda: "200/second" in nft_table(ns), 30, "the edit reloaded (200/second)")
        st = json.loads(c.run(["netlimit", "status", "--json"]).stdout)
        assert st["config_path"] == "/etc/netlimit/netlimit.yaml", st
        assert "file changed: applied" in c.journal("netlimitd", 80)

        # --- upgrade to a later build: the file kept, the daemon restarted, the rules never gone
        pid_before = c.run(["systemctl", "show", "-p", "MainPID", "--value", "netlimitd"]).stdout.strip()
        handle = re.search(r"table inet netlimit \{ # handle (\d+)", nft_table(ns))
        assert handle, nft_table(ns)
        samples: list[tuple[float, bool, str | None]] = []
        stop = threading.Event()

        def sample():
            while not stop.is_set():
                text = nft_table(ns)
                h = re.search(r"table inet netlimit \{ # handle (\d+)", text)
                samples.append((time.monotonic(), "udp-flood" in text and "200/second" in text, h and h.group(1)))
                time.sleep(0.02)

        th = threading.Thread(target=sample, daemon=True)
        th.start()
        t = time.monotonic()
        try:
            c.run(
                ["env", "DEBIAN_FRONTEND=noninteractive", "apt-get", "-q", "install", "-y", inside_later], timeout=600
            )
            wait_for(
                lambda: (
                    c.run(["systemctl", "show", "-p", "MainPID", "--value", "netlimitd"]).stdout.strip()
                    not in ("", "0", pid_before)
                ),
                60,
                "a new netlimitd after the upgrade",
            )
            wait_for(lambda: c.run(["systemctl", "is-active", "netlimitd"], check=False).stdout.strip() == "active",
                     60, "netlimitd active after the upgrade")  # fmt: skip
            time.sleep(0.5)  # a few more samples with the new daemon in charge
        finally:
            stop.set()
            th.join(timeout=10)
        timings["upgrade"] = time.monotonic() - t
        assert len(samples) > 20, len(samples)
        missing = [s for s in samples if not s[1]]
        handles = {s[2] for s in samples}
        print(f"upgrade: {len(samples)} samples of the table, {len(missing)} without the rule, handles {handles}")
        assert not missing, "the rules were gone during the upgrade"
        assert handles == {handle.group(1)}, "the table was re-created (flushed) during the upgrade"
        assert "200/second" in c.run(["cat", "/etc/netlimit/netlimit.yaml"]).stdout, "the conffile kept the edit"
        version = c.run(["dpkg-query", "-W", "-f", "${Version}", "netlimit"]).stdout
        assert version.endswith("+upgrade1"), version
        delivered, took = flood(ns, cl, packets=2000, secs=2.0)
        assert delivered <= 1.2 * (200 * took + 10) + 10, "limits still enforced after the upgrade"

        # --- a Redis password as a systemd credential (docs/operations.md, Secrets): the
        # packaged unit hands /etc/netlimit/credentials/redis to netlimitd for bans.store
        t = time.monotonic()
        redis = subprocess.Popen(
            ["ip", "netns", "exec", ns, "redis-server", "--port", str(REDIS_PORT), "--bind", "127.0.0.1"]
            + ["--save", "", "--appendonly", "no", "--dir", str(tmp_path), "--requirepass", SECRET],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        try:
            cred = c.merged / "etc/netlimit/credentials/redis"
            cred.write_text(SECRET + "\n")
            cred.chmod(0o600)
            bans = f"bans:\n  store: redis://127.0.0.1:{REDIS_PORT}/0\n"
            bans += "  password_file: ${CREDENTIALS_DIRECTORY}/netlimit_redis\n"
            c.write("/etc/netlimit/netlimit.yaml", CONF.format(port=PORT, rate=200) + bans)
            c.run(["systemctl", "restart", "netlimitd"], timeout=120)

            def store() -> dict:
                res = c.run(["netlimit", "status", "--json"], check=False)
                return (json.loads(res.stdout).get("bans") or {}) if res.returncode == 0 else {}

            wait_for(lambda: store().get("connected") is True, 60, "netlimitd connected with the credential")
            # the Redis follower (connected only after AUTH, SUBSCRIBE and a snapshot), not a memory list
            assert store()["store"].startswith(f"redis://127.0.0.1:{REDIS_PORT}/0"), store()
            pid = c.run(["systemctl", "show", "-p", "MainPID", "--value", "netlimitd"]).stdout.strip()
            seen = c.run(["cat", f"/proc/{pid}/environ", f"/proc/{pid}/cmdline"]).stdout
            seen += c.run(["systemctl", "show", "netlimitd"]).stdout + c.journal("netlimitd", 500)
            assert SECRET not in seen, "the password leaked into the environment, command line, show or journal"
        finally:
            redis.kill()
            redis.wait(timeout=10)
        timings["credential"] = time.monotonic() - t

        # --- apt remove: no unit running, no kernel object left
        c.run(["env", "DEBIAN_FRONTEND=noninteractive", "apt-get", "-q", "remove", "-y", "netlimit"], timeout=300)
        assert c.run(["systemctl", "is-active", "netlimitd"], check=False).stdout.strip() != "active"
        assert c.run(["pgrep", "-f", "netlimit"], check=False).stdout.strip() == ""
        tables = sh("ip", "netns", "exec", ns, "nft", "list", "tables").stdout
        assert "netlimit" not in tables, tables
        qd = sh("ip", "netns", "exec", ns, "tc", "qdisc", "show", "dev", "nlda").stdout
        assert "htb" not in qd, qd
        assert c.run(["test", "-e", "/etc/netlimit/netlimit.yaml"], check=False).returncode == 0, "remove keeps config"
        assert c.run(["test", "-e", "/usr/lib/netlimit"], check=False).returncode != 0

        # --- apt purge: the configuration goes too
        c.run(["env", "DEBIAN_FRONTEND=noninteractive", "apt-get", "-q", "purge", "-y", "netlimit"], timeout=300)
        for path in ("/etc/netlimit", "/etc/default/netlimit-sidecar", "/run/netlimit", "/var/lib/netlimit"):
            assert c.run(["test", "-e", path], check=False).returncode != 0, f"{path} left after purge"
        assert c.run(["dpkg-query", "-W", "netlimit"], check=False).returncode != 0
        timings["total"] = time.monotonic() - t0
        print("timings (s):", {k: round(v, 1) for k, v in timings.items()})
    finally:
        c.close()
