#!/usr/bin/env python3
"""The drop path's CPU per packet on a NIC with native XDP: the Vagrant VMs' virtio_net.

    sudo NETLIMIT_VAGRANT_KEEP=1 NETLIMIT_SCENARIO_RUNS=0 vagrant/run.sh     # VMs up, left running
    sudo ip netns exec nlvg-PID /var/cache/netlimit-vagrant/build-venv/bin/python \
        scripts/xdp_vm_bench.py --ssh-config /var/cache/netlimit-vagrant/logs/DATE/ssh-config --json FILE
    cd vagrant && sudo ip netns exec nlvg-PID vagrant destroy -f   # then stop that libvirtd, del the netns

(run.sh prints the namespace and the destroy command; the Python needs PyYAML, as scenario.py.)

On a veth XDP cannot show its advantage (the sender already built the skb; docs/xdp.md).
virtio_net runs native XDP on the receive buffer, before the skb is built, like a physical
NIC's driver. The `flood` VM sends raw UDP frames from 192.168.60.12 as fast as one
Python process can (AF_PACKET, one prebuilt frame) to the `limiter` VM, whose netlimit
file denies that source. The drop path is switched with `netlimit apply` between rounds
(interleaved, so the host's load hits every variant alike):

  xdp-native   xdp: {interfaces: [eth1], mode: native}   (virtio_net's driver hook)
  xdp-generic  xdp: {interfaces: [eth1], mode: generic}  (after the skb is built)
  ingress      ingress: {interfaces: [eth1]}             (nft ingress hook, priority -500)
  input        the input chain (no stage)

Per run the limiter samples /proc/stat and eth1's rx_packets over a window inside the
flood: kernel CPU (system + irq + softirq) and all CPU (user too) less the same
window's idle baseline (no flood, measured each round), per million packets received
(all dropped: the counters of the layer that dropped them are read after each run), and
the receive rate. Under QEMU software emulation (TCG) absolute figures are tens of times
a real CPU's; the ratio between the variants is the information. netlimitd and the
sidecar are stopped on the limiter first (the VMs are thrown away afterwards).
Results: --json FILE, and a table on stdout.
"""

from __future__ import annotations

import argparse
import json
import shutil
import statistics
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "vagrant"))

from scenario import ADDR, ScenarioError, SshHost  # noqa: E402 - after the sys.path entry

NETLIMIT = "/opt/netlimit/bin/netlimit"
BASE = f"""\
version: 1
on_stop: flush
exempt: [127.0.0.0/8]
deny: [{ADDR["flood"]}/32]
"""
VARIANTS = {
    "xdp-native": "xdp:\n  interfaces: [{iface}]\n  mode: native\n",
    "xdp-generic": "xdp:\n  interfaces: [{iface}]\n  mode: generic\n",
    "ingress": "ingress:\n  interfaces: [{iface}]\n",
    "input": "",
}

# the limiter's sampler: /proc/stat's cpu line and rx_packets, `delay` s after its start and
# `window` s later (inside the flood)
SAMPLER = r"""
import json, sys, time
iface, delay, window = sys.argv[1], float(sys.argv[2]), float(sys.argv[3])
def snap():
    cpu = [int(x) for x in open("/proc/stat").readline().split()[1:9]]
    rx = int(open(f"/sys/class/net/{iface}/statistics/rx_packets").read())
    return cpu, rx, time.monotonic()
time.sleep(delay)
a = snap()
time.sleep(window)
b = snap()
print(json.dumps({"cpu": [y - x for x, y in zip(a[0], b[0])], "rx": b[1] - a[1], "seconds": b[2] - a[2]}))
"""

# the flood host's generator: one prebuilt Ethernet/IPv4/UDP frame sent in a loop on AF_PACKET
GENERATOR = r"""
import json, socket, struct, sys, time
iface, dst_mac, src, dst, seconds = sys.argv[1], sys.argv[2], sys.argv[3], sys.argv[4], float(sys.argv[5])
src_mac = open(f"/sys/class/net/{iface}/address").read().strip()
def csum(b):
    s = sum(struct.unpack(f"!{len(b) // 2}H", b))
    s = (s >> 16) + (s & 0xFFFF)
    return ~(s + (s >> 16)) & 0xFFFF
udp = struct.pack("!HHHH", 40000, 9, 8 + 18, 0) + bytes(18)
ip = struct.pack("!BBHHHBBH4s4s", 0x45, 0, 20 + len(udp), 0, 0, 64, 17, 0, socket.inet_aton(src), socket.inet_aton(dst))
ip = ip[:10] + struct.pack("!H", csum(ip)) + ip[12:]
frame = bytes.fromhex(dst_mac.replace(":", "")) + bytes.fromhex(src_mac.replace(":", "")) + b"\x08\x00" + ip + udp
s = socket.socket(socket.AF_PACKET, socket.SOCK_RAW)
s.bind((iface, 0))
s.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, 1 << 22)
n, t0 = 0, time.monotonic()
end = t0 + seconds
send = s.send
while time.monotonic() < end:
    for _ in range(256):
        try:
            send(frame)
            n += 1
        except OSError:  # ENOBUFS: the queue is full, the sender is faster than the wire
            pass
print(json.dumps({"sent": n, "seconds": time.monotonic() - t0}))
"""

CLK_TCK = 100  # USER_HZ of the box's kernel (Debian: 100)


def iface_of(host: SshHost, addr: str) -> str:
    for line in host.run(["ip", "-o", "-4", "addr", "show"]).stdout.splitlines():
        f = line.split()
        if len(f) > 3 and f[3].split("/")[0] == addr:
            return f[1]
    raise ScenarioError(f"{host.name}: no interface has {addr}")


def deny_counters(lim: SshHost) -> dict[str, int]:
    """{layer: packets} of the (deny) rows of `netlimit list`."""
    out = json.loads(lim.run([NETLIMIT, "list", "--json"], timeout=300).stdout)
    got: dict[str, int] = {}
    for r in out.get("objects", []):
        if r.get("rule") == "(deny)":
            got[r["layer"]] = got.get(r["layer"], 0) + int(r.get("packets", 0))
    return got


def apply(lim: SshHost, text: str) -> str | None:
    path = lim.put("xdp-bench.yaml", text)
    res = lim.run([NETLIMIT, "apply", path, "-q"], timeout=600, check=False)
    return None if res.returncode == 0 else (res.stderr or res.stdout).strip()[-400:]


def one_run(lim: SshHost, flood: SshHost, args, liface: str, fiface: str, mac: str, flood_on: bool) -> dict:
    sampler = lim.start(["python3", "-c", SAMPLER, liface, str(args.delay), str(args.window)])
    gen = None
    if flood_on:
        gen = flood.start(
            ["python3", "-c", GENERATOR, fiface, mac, ADDR["flood"], ADDR["limiter"], str(args.delay + args.window + 2)]
        )
    budget = args.delay + args.window + 120
    out, err = sampler.communicate(timeout=budget)
    if sampler.returncode != 0:
        raise ScenarioError(f"sampler: {err.strip()}")
    got = json.loads(out.strip().splitlines()[-1])
    if gen is not None:
        gout, gerr = gen.communicate(timeout=budget)
        if gen.returncode != 0:
            raise ScenarioError(f"generator: {gerr.strip()}")
        got["generator"] = json.loads(gout.strip().splitlines()[-1])
    return got


def busy(cpu: list[int]) -> tuple[float, float]:
    """(kernel, all) CPU seconds of a /proc/stat delta: user nice system idle iowait irq softirq steal."""
    user, nice, system, _idle, _iowait, irq, softirq, steal = cpu
    return (system + irq + softirq) / CLK_TCK, (user + nice + system + irq + softirq + steal) / CLK_TCK


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--ssh-config", type=Path, help="output of `vagrant ssh-config`")
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--delay", type=float, default=2.0, help="seconds of flood before the window")
    ap.add_argument("--window", type=float, default=6.0, help="seconds measured")
    ap.add_argument("--variants", default=",".join(VARIANTS))
    ap.add_argument("--json", type=Path)
    args = ap.parse_args()
    cfg = args.ssh_config
    if cfg is None:
        ap.error("--ssh-config FILE (vagrant ssh-config's output)")
    ctl = Path(tempfile.mkdtemp(prefix="nlxdpb-ssh-"))
    lim, flood = SshHost("limiter", cfg, ctl), SshHost("flood", cfg, ctl)
    variants = [v for v in args.variants.split(",") if v]
    results: dict = {"variants": {v: [] for v in variants}, "idle": [], "errors": {}, "layers": {}}
    try:
        lim.run(["systemctl", "stop", "netlimit-sidecar", "netlimitd"], timeout=300, check=False)
        liface, fiface = iface_of(lim, ADDR["limiter"]), iface_of(flood, ADDR["flood"])
        mac = lim.run(["cat", f"/sys/class/net/{liface}/address"]).stdout.strip()
        kernel = lim.run(["uname", "-r"]).stdout.strip()
        driver = lim.run(["readlink", "-f", f"/sys/class/net/{liface}/device/driver"], check=False).stdout.strip()
        results.update(kernel=kernel, driver=driver.rsplit("/", 1)[-1], iface=liface)
        print(f"limiter {liface} ({results['driver']}), kernel {kernel}; flood from {fiface}", flush=True)
        for rnd in range(args.rounds):
            idle = one_run(lim, flood, args, liface, fiface, mac, flood_on=False)
            results["idle"].append(idle)
            for v in variants:
                if v in results["errors"]:
                    continue
                err = apply(lim, BASE + VARIANTS[v].format(iface=liface))
                if err:
                    results["errors"][v] = err
                    print(f"[{v}] apply failed: {err}", flush=True)
                    continue
                # which layer dropped them, read around every run (outside the measured
                # window): a variant whose drops moved to another layer shows in its round
                before = deny_counters(lim)
                r = one_run(lim, flood, args, liface, fiface, mac, flood_on=True)
                after = deny_counters(lim)
                r["dropped_by"] = {k: after.get(k, 0) - before.get(k, 0) for k in after}
                results["layers"].setdefault(v, r["dropped_by"])  # round 1's, as before
                r["idle_cpu"] = idle["cpu"]
                results["variants"][v].append(r)
                k, a = busy(r["cpu"])
                print(
                    f"[round {rnd + 1}] {v}: {r['rx']} received in {r['seconds']:.1f} s, kernel CPU {k:.2f} s, "
                    f"all {a:.2f} s; generator {r['generator']['sent']} sent; dropped by "
                    f"{r['dropped_by']}",
                    flush=True,
                )
    finally:
        apply(lim, "version: 1\non_stop: flush\n")
        for h in (lim, flood):
            h.close()
        shutil.rmtree(ctl, ignore_errors=True)
    table = summarize(results)
    print(table)
    if args.json:
        args.json.write_text(json.dumps(results, indent=2))
    return 0 if all(results["variants"].values()) else 1


def summarize(results: dict) -> str:
    """Medians per variant: CPU seconds per million received (all dropped), less the idle
    baseline's CPU over the same seconds; and how many times the input chain's cost it is."""
    idle = [(busy(i["cpu"]), i["seconds"]) for i in results["idle"]]
    idle_k = statistics.median(k / sec for (k, _), sec in idle) if idle else 0.0
    idle_a = statistics.median(a / sec for (_, a), sec in idle) if idle else 0.0
    summary: dict = {}
    for v, runs in results["variants"].items():
        runs = [r for r in runs if r["rx"]]
        if runs:
            summary[v] = {
                "kernel": statistics.median(
                    (busy(r["cpu"])[0] - idle_k * r["seconds"]) / (r["rx"] / 1e6) for r in runs
                ),
                "all": statistics.median((busy(r["cpu"])[1] - idle_a * r["seconds"]) / (r["rx"] / 1e6) for r in runs),
                "kpps": statistics.median(r["rx"] / r["seconds"] / 1000 for r in runs),
                "runs": len(runs),
            }
    base = summary.get("input", {}).get("kernel")
    for one in summary.values():
        one["input_over_this"] = base / one["kernel"] if base and one["kernel"] > 0 else None
    results["summary"] = summary
    rows = [("drop path", "kernel CPU s / M", "all CPU s / M", "received kpps", "input chain / this", "runs")]
    for v in results["variants"]:
        if v not in summary:
            rows.append((v, "-", "-", "-", "-", results["errors"].get(v, "no run")[:80]))
            continue
        one = summary[v]
        ratio = f"{one['input_over_this']:.2f}x" if one["input_over_this"] else "-"
        rows.append((v, f"{one['kernel']:.3f}", f"{one['all']:.3f}", f"{one['kpps']:.1f}", ratio, str(one["runs"])))
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    return "\n".join("  ".join(c.ljust(w) for c, w in zip(r, widths)).rstrip() for r in rows)


if __name__ == "__main__":
    sys.exit(main())
