"""netlimitd with `xdp:`: it attaches the program on apply, writes the ban list into the
program's bans map beside the nftables sets (a ban added and lifted reaches both), a
map cleared by hand and a detached program are repaired at the next resync, and stop
(on_stop: flush) detaches and unpins everything."""

from __future__ import annotations

import ipaddress
import os
import subprocess
import sys
import urllib.request
from pathlib import Path

import pytest
from daemon_proc import sh, wait_for

from netlimit.kernel.xdp import XdpPath
from netlimit.kernel.xdp.path import pin_dir_for

pytestmark = pytest.mark.netns
N = ipaddress.ip_network
EXE = str(Path(sys.executable).with_name("netlimit"))

FILE = """\
version: 1
on_stop: flush
exempt: [127.0.0.0/8]
deny: [203.0.113.0/24]
bans:
  store: memory
  socket: {socket}
xdp:
  interfaces: [nlta]
  mode: generic
network:
  - name: udp-early
    protocol: udp
    ports: [5000]
    limit: 100/second
    early: true
"""


def ban(config: Path, *args: str) -> None:
    r = subprocess.run([EXE, "ban", *args, "--config", str(config)], capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr


def xdp_bans(ns: str) -> set:
    if not os.path.exists(os.path.join(pin_dir_for(ns), "prog")):
        return set()
    with XdpPath(ns) as p:
        return set(p.prefixes("bans"))


def dropped_metrics(d) -> dict:
    """{(rule, layer): value} of netlimit_rule_dropped_packets."""
    from prometheus_client.parser import text_string_to_metric_families

    text = urllib.request.urlopen(f"http://127.0.0.1:{d.metrics_port}/metrics", timeout=10).read().decode()
    return {
        (s.labels["rule"], s.labels["layer"]): s.value
        for fam in text_string_to_metric_families(text)
        for s in fam.samples
        if s.name == "netlimit_rule_dropped_packets_total"
    }


def attached(ns: str) -> bool:
    return "netlimit_xdp" in sh("ip", "-n", ns, "link", "show", "nlta").stdout


def test_bans_reach_the_xdp_map_drift_is_repaired_and_stop_unpins(daemon_factory, netns, tmp_path):
    d = daemon_factory(FILE.format(socket=tmp_path / "netlimitd.sock"), resync=1.0)
    d.start()
    try:
        wait_for(lambda: attached(netns), 20.0, "the XDP program attached")
        m = wait_for(lambda: ("udp-early", "xdp") in dropped_metrics(d) and dropped_metrics(d), 20.0, "the xdp series")
        assert m[("udp-early", "xdp")] == 0  # no traffic yet: the series exists, from the per-CPU counters
        ban(d.config, "add", "198.51.100.0/24", "--ttl", "10m")
        ban(d.config, "add", "2001:db8:7::/64", "--ttl", "10m")
        want = {N("198.51.100.0/24"), N("2001:db8:7::/64")}
        wait_for(lambda: xdp_bans(netns) == want, 10.0, "the bans in the XDP map")
        with XdpPath(netns) as p:
            expiry = p.prefixes("bans")[N("198.51.100.0/24")]
            assert expiry > 0  # each ban carries its end: netlimitd expires the map
            assert set(p.prefixes("deny")) == {N("203.0.113.0/24")}
        ban(d.config, "del", "2001:db8:7::/64", "--yes")
        wait_for(lambda: xdp_bans(netns) == {N("198.51.100.0/24")}, 10.0, "the lifted ban gone from the map")
        # drift: the map cleared by hand, the program detached
        with XdpPath(netns) as p:
            p.remove_prefixes("bans", [N("198.51.100.0/24")])
        wait_for(lambda: xdp_bans(netns) == {N("198.51.100.0/24")}, 20.0, "the map refilled")
        sh("ip", "-n", netns, "link", "set", "dev", "nlta", "xdpgeneric", "off")
        wait_for(lambda: attached(netns), 20.0, "the program re-attached")
        st = wait_for(lambda: (s := d.status())["drift_repairs"] >= 2 and s, 20.0, "the repair count")
        assert any("xdp" in line.lower() for line in st["last_drift"]), st["last_drift"]
    finally:
        assert d.stop() == 0
    assert not attached(netns)
    assert not os.path.exists(pin_dir_for(netns))


def test_on_stop_keep_leaves_program_and_bans_and_a_restart_adopts_them(daemon_factory, netns, tmp_path):
    text = FILE.format(socket=tmp_path / "netlimitd.sock").replace("on_stop: flush", "on_stop: keep")
    d = daemon_factory(text, resync=1.0)
    d.start()
    try:
        wait_for(lambda: attached(netns), 20.0, "the XDP program attached")
        ban(d.config, "add", "198.51.100.0/24", "--ttl", "10m")
        wait_for(lambda: xdp_bans(netns) == {N("198.51.100.0/24")}, 10.0, "the ban in the XDP map")
        with XdpPath(netns) as p:
            prog = p.prog_id()
        assert d.stop() == 0
        assert attached(netns) and xdp_bans(netns) == {N("198.51.100.0/24")}  # kept while it is down
        d.start()
        wait_for(lambda: d.status()["bans"]["in_kernel"] == 1, 20.0, "the kept ban read back after the restart")
        ban(d.config, "add", "192.0.2.0/24", "--ttl", "10m")  # the writer works after the restart
        want = {N("198.51.100.0/24"), N("192.0.2.0/24")}
        wait_for(lambda: xdp_bans(netns) == want, 10.0, "the new ban in the XDP map")
        with XdpPath(netns) as p:
            assert p.prog_id() == prog  # the same file again: the program was not reloaded
        assert attached(netns)
    finally:
        d.stop()
        subprocess.run([EXE, "flush", "--netns", netns, "-q"], capture_output=True, timeout=120)
    assert not attached(netns) and not os.path.exists(pin_dir_for(netns))


@pytest.mark.redis
def test_a_ban_from_another_host_reaches_the_xdp_map_within_a_second(daemon_factory, netns, redis_server):
    """Issue 34 item 4's fan-out: a ban written to the shared list (as another host's
    netlimitd or sidecar does) is in this host's XDP bans map within 1 s, every time."""
    import time

    from netlimit.bans.redis_store import RedisBanList, keys

    prefix = f"nltx{os.getpid()}"
    text = FILE.format(socket="/nonexistent").replace("  store: memory\n", f"  store: {redis_server.url}\n")
    text = text.replace("  socket: /nonexistent\n", f"  socket: /nonexistent\n  key_prefix: {prefix}\n")
    lst = RedisBanList(redis_server.url, key_prefix=prefix)
    d = daemon_factory(text, resync=1.0)
    d.start()
    try:
        wait_for(lambda: attached(netns) and d.status()["bans"]["connected"], 20.0, "XDP attached, the list followed")
        lags = []
        with XdpPath(netns) as p:
            for i in range(20):
                net = N(f"198.18.{i}.0/24")
                lst.add(net, 600)
                t0 = time.monotonic()
                while net not in p.prefixes("bans") and time.monotonic() - t0 < 5.0:
                    time.sleep(0.005)
                lags.append(time.monotonic() - t0)
        print(f"fan-out into XDP: max {max(lags) * 1000:.0f} ms, median {sorted(lags)[10] * 1000:.0f} ms")
        assert max(lags) <= 1.0, lags
    finally:
        lst.r.delete(*keys(prefix)[:3])
        lst.close()
        d.stop()
