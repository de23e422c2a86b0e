"""netlimitd against the real kernel, in a network namespace each test creates.

The daemon runs as a real process (`netlimit daemon --netns NS`), talks
sd_notify to a datagram socket the test reads, serves its status socket and
Prometheus metrics on loopback, and is killed in every teardown.
"""

from __future__ import annotations

import json
import os
import re
import signal
import socket
import subprocess
import threading
import time
import urllib.request

import pytest
from daemon_proc import (
    EXE,
    EXTRA_RULE,
    config_text,
    owned_rules,
    qdiscs,
    sh,
    wait_for,
)

pytestmark = pytest.mark.netns


@pytest.fixture(autouse=True, params=("nftables", "restore"))
def backend(request, monkeypatch):
    """Every test once with nftables (auto's pick on this host) and once with the legacy
    restore backend; the daemon follows $NETLIMIT_BACKEND."""
    monkeypatch.setenv("NETLIMIT_BACKEND", request.param)
    return request.param


def test_invalid_file_at_start_exits_1_with_every_problem(tmp_path, netns):
    cfg = tmp_path / "bad.yaml"
    cfg.write_text("version: 1\nnetwork:\n  - name: a\n    limt: 1/s\n")
    res = subprocess.run(
        [EXE, "daemon", "--config", str(cfg), "--netns", netns, "--socket", str(tmp_path / "s")],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert res.returncode == 1
    assert f"netlimitd: {cfg}:4:5: a: unknown field 'limt' (did you mean 'limit'?)" in res.stderr
    assert owned_rules(netns) == []


def test_start_reload_reject_and_flush_on_stop(daemon_factory, netns, backend):
    d = daemon_factory(config_text())
    d.start()
    rules = owned_rules(netns)
    assert any('"netlimit:udp-flood' in r for r in rules)
    assert "htb" in qdiscs(netns)
    st = d.status()
    assert st["config_path"] == str(d.config) and len(st["config_sha256"]) == 64
    assert st["last_apply_result"] == "ok" and st["rules"] == ["udp-flood", "shape"]
    assert st["backend"] == backend and st["backend_reason"] == f"NETLIMIT_BACKEND {backend}"
    assert oct(os.stat(d.sock).st_mode & 0o777) == "0o600"

    # an edit goes live (within 2 s on a quiet machine; the deadline allows a loaded one)
    d.edit(config_text(extra=EXTRA_RULE))
    wait_for(lambda: any('"netlimit:ssh-guard' in r for r in owned_rules(netns)), 20.0, "the new rule")
    assert d.status()["reloads_ok"] == 1

    # a bad edit keeps the old rules and says why, with file:line:col
    before = owned_rules(netns)
    d.edit(config_text(extra=EXTRA_RULE).replace("limit: 3/minute", "limit: 3/fortnight"))
    st = wait_for(lambda: (s := d.status())["rejected"] and s, 20.0, "the rejection")
    assert st["rejected"] == (
        f"{d.config}:14:12: ssh-guard: bad rate unit 'fortnight' in '3/fortnight': "
        "expected second, minute, hour or day (s, m, h, d)"
    )
    assert st["summary"].startswith("running old config, new config rejected: ")
    assert owned_rules(netns) == before
    text = subprocess.run([EXE, "status", "--socket", d.sock], capture_output=True, text=True, timeout=30).stdout
    assert "running old config, new config rejected:" in text and ":14:12: ssh-guard: bad rate unit" in text

    # SIGHUP after fixing the file: reloads, rejection cleared
    d.config.write_text(config_text())
    d.proc.send_signal(signal.SIGHUP)
    wait_for(lambda: not any("ssh-guard" in r for r in owned_rules(netns)), 20.0, "the reload")
    st = wait_for(lambda: (s := d.status())["rejected"] is None and s, 20.0, "the cleared rejection")
    assert "SIGHUP" in d.log.read_text()

    assert d.stop() == 0
    assert owned_rules(netns) == []
    assert "htb" not in qdiscs(netns)
    log = d.log.read_text()
    # counted from the kernel read back after the write, not from the plan
    assert re.search(r"on_stop flush: removed \d+ owned objects \(.*\); read back: none remain", log), log


def test_drift_repair_restores_owned_objects_and_spares_foreign_ones(daemon_factory, netns, backend):
    d = daemon_factory(config_text(extra=EXTRA_RULE), resync=1.0)
    d.start()
    before = sorted(owned_rules(netns))
    foreign = ["-A", "INPUT", "-p", "tcp", "--dport", "9999", "-j", "ACCEPT"]
    sh("ip", "netns", "exec", netns, "iptables-legacy", *foreign)
    # someone deletes our rules and our qdisc by hand
    if backend == "nftables":
        sh("ip", "netns", "exec", netns, "nft", "flush", "chain", "inet", "netlimit", "rule-udp-flood")
    else:
        sh("ip", "netns", "exec", netns, "iptables-legacy", "-F", "NETLIMIT")
    sh("ip", "netns", "exec", netns, "tc", "qdisc", "del", "dev", "nlta", "root")
    assert "htb" not in qdiscs(netns)
    wait_for(lambda: sorted(owned_rules(netns)) == before and "htb" in qdiscs(netns), 20.0, "drift repair")
    st = wait_for(lambda: (s := d.status())["drift_repairs"] >= 1 and s, 20.0, "the repair count")
    assert any("udp-flood" in line for line in st["last_drift"])
    saved = sh("ip", "netns", "exec", netns, "iptables-legacy-save").stdout
    assert "-A INPUT -p tcp -m tcp --dport 9999 -j ACCEPT" in saved
    assert "drift repair" in d.log.read_text()
    if backend == "nftables":  # a deleted set (with the rules that use it), then the whole table
        t = json.loads(
            sh(
                "ip", "netns", "exec", netns, "nft", "-j", "-a", "list", "chain", "inet", "netlimit", "rule-ssh-guard"
            ).stdout
        )
        handles = [x["rule"]["handle"] for x in t["nftables"] if "rule" in x and "ban4-ssh-guard" in json.dumps(x)]
        script = "".join(f"delete rule inet netlimit rule-ssh-guard handle {h}\n" for h in handles)
        script += "delete set inet netlimit ban4-ssh-guard\n"
        subprocess.run(
            ["ip", "netns", "exec", netns, "nft", "-f", "-"], input=script, text=True, check=True, timeout=30
        )
        wait_for(lambda: sorted(owned_rules(netns)) == before, 20.0, "the set and its rules repaired")
        sh("ip", "netns", "exec", netns, "nft", "delete", "table", "inet", "netlimit")
        wait_for(lambda: sorted(owned_rules(netns)) == before, 20.0, "the table repaired")
        assert d.status()["drift_repairs"] >= 3
    assert d.stop() == 0
    saved = sh("ip", "netns", "exec", netns, "iptables-legacy-save").stdout
    assert "-A INPUT -p tcp -m tcp --dport 9999 -j ACCEPT" in saved, "flush must spare foreign rules"


def test_keep_on_stop_and_adopt_after_crash(daemon_factory, netns):
    d = daemon_factory(config_text(on_stop="keep"))
    d.start()
    before = sorted(owned_rules(netns))
    assert d.stop() == 0
    assert sorted(owned_rules(netns)) == before, "on_stop: keep leaves the rules"
    d.start()
    assert sorted(owned_rules(netns)) == before
    d.proc.kill()  # a crash: protection stays
    d.proc.wait(timeout=10)
    assert sorted(owned_rules(netns)) == before
    d.start()  # the next start adopts them: no duplicates
    assert sorted(owned_rules(netns)) == before
    assert d.status()["last_apply_changes"] == 0
    assert "start: no changes" in d.log.read_text()


def test_a_restart_marker_keeps_the_rules_once_then_flush_is_back(daemon_factory, netns):
    """debian/netlimit.postinst writes keep-rules-on-next-stop beside the status socket
    before it restarts netlimitd on upgrade: that stop keeps the rules (on_stop: flush
    notwithstanding), the new daemon adopts them without a change, and the stop after
    that flushes again."""
    from netlimit.daemon.service import KEEP_ONCE

    d = daemon_factory(config_text(on_stop="flush"))
    d.start()
    before = sorted(owned_rules(netns))
    assert before
    marker = d.tmp / KEEP_ONCE
    marker.write_text("")
    assert d.stop() == 0
    assert sorted(owned_rules(netns)) == before, "the marked stop keeps the rules"
    assert not marker.exists(), "the marker is used once"
    assert f"({KEEP_ONCE}: a restart): on_stop keep" in d.log.read_text()
    d.start()
    assert sorted(owned_rules(netns)) == before
    assert d.status()["last_apply_changes"] == 0, "the new daemon adopts the rules"
    assert d.stop() == 0
    assert owned_rules(netns) == [], "without the marker on_stop: flush holds again"


def test_metrics_over_http(daemon_factory, netns, backend):
    from prometheus_client.parser import text_string_to_metric_families

    d = daemon_factory(config_text())
    d.start()
    # put some packets through the hashlimit rule
    sh("ip", "-n", netns, "addr", "add", "10.77.0.1/24", "dev", "nlta")
    sh("ip", "-n", netns, "addr", "add", "10.77.0.2/24", "dev", "nltb")
    body = urllib.request.urlopen(f"http://127.0.0.1:{d.metrics_port}/metrics", timeout=10).read().decode()
    fams = {f.name: f for f in text_string_to_metric_families(body)}
    assert {
        "netlimit_rule_packets",
        "netlimit_rule_bytes",
        "netlimit_rule_dropped_packets",
        "netlimit_apply_duration_seconds",
        "netlimit_applies",
        "netlimit_config_reloads",
        "netlimit_drift_repairs",
    } <= set(fams)
    rules = {s.labels["rule"] for s in fams["netlimit_rule_packets"].samples}
    assert {"udp-flood", "shape"} <= rules
    layers = {s.labels["layer"] for s in fams["netlimit_rule_packets"].samples}
    assert layers == ({"nftables", "tc"} if backend == "nftables" else {"iptables", "ip6tables", "tc"})
    applies = {s.labels["result"]: s.value for s in fams["netlimit_applies"].samples if s.name.endswith("_total")}
    assert applies == {"ok": 1.0, "failed": 0.0}
    for s in fams["netlimit_rule_packets"].samples:
        assert set(s.labels) == {"rule", "layer"}, "bounded label set"


@pytest.mark.parametrize("backend", ["restore"], indirect=True)  # the listener is the same on every backend
def test_slow_clients_cannot_pile_up_on_the_metrics_listener(daemon_factory, backend):
    """Clients that connect and never send their request hold at most 16 threads, each
    for at most 5 s; scrapes are served again once they time out."""
    d = daemon_factory(config_text())
    d.start()
    # The status socket answers before the metrics listener starts: the baseline is taken
    # once a scrape has been served, with the listener's own thread in it.
    wait_for(lambda: _scrape(d.metrics_port), 30, "the first scrape")

    def threads() -> int:
        with open(f"/proc/{d.proc.pid}/status") as f:
            return int(next(x.split()[1] for x in f if x.startswith("Threads:")))

    base = threads()
    # The peak is sampled all along, not read once: on a loaded machine the clients'
    # 5 s can pass between two reads of the test, and a single read proves nothing.
    peak = [base]
    stop = threading.Event()

    def sample() -> None:
        while not stop.wait(0.01):
            peak[0] = max(peak[0], threads())

    sampler = threading.Thread(target=sample, daemon=True)
    sampler.start()
    idle: list[socket.socket] = []
    try:
        idle = [socket.create_connection(("127.0.0.1", d.metrics_port), timeout=5) for _ in range(40)]
        wait_for(lambda: peak[0] >= base + 10, 20.0, "threads for the idle clients")
        # 40 silent clients: 16 held for 5 s, the rest dropped; a scrape is served again
        # within about 5 s; the deadline leaves room for a loaded machine
        body = wait_for(
            lambda: _scrape(d.metrics_port), 45, "a scrape served after the idle clients timed out", step=0.5
        )
        assert "netlimit_applies_total" in body
    finally:
        stop.set()
        sampler.join(5)
        for s in idle:
            s.close()
    # 16 handler threads at most; 2 more for the daemon's own short-lived threads (the
    # resync's namespace worker every second). Without the bound 40 clients are 40 threads.
    assert peak[0] - base <= 16 + 2, f"{peak[0] - base} threads above the baseline of {base}"


def _scrape(port: int) -> str | None:
    try:
        return urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=2).read().decode()
    except OSError:
        return None


def test_sd_notify_protocol(tmp_path, daemon_factory):
    """READY=1 after the first apply, RELOADING=1/READY=1 around reloads, STATUS=, WATCHDOG=1, STOPPING=1."""
    path = str(tmp_path / "notify.sock")
    rx = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    rx.bind(path)
    rx.settimeout(10)
    try:
        env = os.environ.copy()
        env.update(NOTIFY_SOCKET=path, WATCHDOG_USEC="400000")
        d = daemon_factory(config_text(), env=env)
        d.start()
        msgs: list[str] = []

        def recv_until(pred, timeout=10.0):
            deadline = time.monotonic() + timeout
            while time.monotonic() < deadline:
                try:
                    m = rx.recv(4096).decode()
                except TimeoutError:
                    break
                msgs.append(m)
                if pred(m):
                    return m
            raise AssertionError(f"no matching notification; got {msgs}")

        ready = recv_until(lambda m: "READY=1" in m)
        assert "STATUS=2 rules from" in ready
        recv_until(lambda m: m == "WATCHDOG=1", timeout=3)
        d.proc.send_signal(signal.SIGHUP)
        recv_until(lambda m: m.startswith("RELOADING=1\nMONOTONIC_USEC="))
        recv_until(lambda m: "READY=1" in m)
        d.stop()
        recv_until(lambda m: m == "STOPPING=1")
    finally:
        rx.close()


def test_status_without_daemon_reads_the_kernel(tmp_path, netns, backend):
    cfg = tmp_path / "c.yaml"
    cfg.write_text(config_text())
    res = subprocess.run([EXE, "apply", str(cfg), "--netns", netns], capture_output=True, text=True, timeout=120)
    assert res.returncode == 0, res.stderr
    try:
        out = subprocess.run(
            [EXE, "status", "--socket", str(tmp_path / "none.sock"), "--netns", netns],
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert out.returncode == 0, out.stderr
        assert out.stdout.startswith(f"no daemon answers on {tmp_path}/none.sock; reading the kernel instead")
        assert "udp-flood" in out.stdout and ("nftables" if backend == "nftables" else "iptables") in out.stdout
    finally:
        subprocess.run([EXE, "flush", "--netns", netns], capture_output=True, timeout=120)


def test_a_half_written_file_is_never_loaded_and_an_empty_one_is_held(daemon_factory, netns):
    """The watch wakes on a closed write, never mid-write; a valid file that would
    remove every running rule (a truncated one) waits until it has stayed the same."""
    d = daemon_factory(config_text(extra=EXTRA_RULE))
    d.start()
    both = owned_rules(netns)
    assert any("ssh-guard" in r for r in both) and any("udp-flood" in r for r in both)
    head = config_text().split("network:")[0] + "network:\n"  # a prefix that parses: no rules at all
    with open(d.config, "w") as fh:  # rewritten in place, slowly
        fh.write(head)
        fh.flush()
        time.sleep(1.5)  # the writer pauses mid-file; nothing may happen meanwhile
        assert owned_rules(netns) == both, d.log.read_text()
        fh.write(config_text(extra=EXTRA_RULE)[len(head) :])
    assert owned_rules(netns) == both  # the complete file is the same rules

    # a complete file that keeps one rule of three (truncated after its first rule):
    # held for a second, then applied, loudly
    # The hold lasts 1 s; on a loaded host one status query can take longer than that,
    # so the test never depends on catching it: what it sees while held must be the
    # old rules, and the log (written in order by the daemon) must show the hold.
    t0 = time.monotonic()
    d.edit(config_text().split("bandwidth:")[0])
    seen: list[dict] = []

    def settled() -> bool:
        st = d.status()
        if st["held"]:
            seen.append(st)
            assert "new config held" in st["summary"] and "remove 2 of 3 rules" in st["held"], st
            assert len(st["rules"]) == 3, st["rules"]  # the running rules stay while it is held
        return st["rules"] == ["udp-flood"]

    wait_for(settled, 30.0, "the truncated file applied after it settled")
    assert time.monotonic() - t0 >= 0.9
    log = d.log.read_text()
    assert "would remove 2 of the 3 running rules; holding it back" in log
    assert "the file still removes most rules after 1 s: applying it" in log

    # a complete file with no rules at all: held the same way
    t0 = time.monotonic()
    d.edit(config_text().split("network:")[0] + "network: []\nbandwidth: []\n")

    def emptied() -> bool:
        st = d.status()
        assert not st["held"] or "remove 1 of 1 rules" in st["held"], st
        return owned_rules(netns) == []

    wait_for(emptied, 30.0, "the empty file applied after it settled")
    assert time.monotonic() - t0 >= 0.9
    assert "would remove 1 of the 1 running rules; holding it back" in d.log.read_text()
    assert d.status()["held"] is None


def test_a_chmod_after_permission_denied_reloads(tmp_path, netns):
    """Under the unit's capabilities (no CAP_DAC_OVERRIDE) an unreadable file is
    rejected; making it readable again is a change the daemon acts on."""
    cfg = tmp_path / "n.yaml"
    cfg.write_text(config_text())
    sock = str(tmp_path / "s")
    log = tmp_path / "d.log"
    proc = subprocess.Popen(
        ["setpriv", "--bounding-set=-dac_override,-dac_read_search", EXE, "daemon", "--config", str(cfg),
         "--netns", netns, "--socket", sock, "--resync", "60"],
        stdout=subprocess.DEVNULL, stderr=open(log, "w"),
    )  # fmt: skip
    try:
        from netlimit.daemon import query_status

        wait_for(lambda: proc.poll() is not None or query_status(sock, timeout=1), 30, "the daemon")
        assert proc.poll() is None, log.read_text()
        new = tmp_path / "n.yaml.new"
        new.write_text(config_text(extra=EXTRA_RULE))
        os.chmod(new, 0o000)
        os.replace(new, cfg)
        st = wait_for(lambda: (s := query_status(sock)) and s["rejected"] and s, 20.0, "the rejection")
        assert "Permission denied" in st["rejected"]
        assert not any("ssh-guard" in r for r in owned_rules(netns))
        os.chmod(cfg, 0o644)  # the operator's fix, and nothing else
        wait_for(lambda: any("ssh-guard" in r for r in owned_rules(netns)), 20.0, "the reload after chmod")
        # the rules are in the kernel a moment before the status says so (load-proof: wait)
        wait_for(lambda: query_status(sock)["rejected"] is None, 10.0, "the rejection cleared")
    finally:
        proc.kill()
        proc.wait(timeout=10)
