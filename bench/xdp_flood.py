"""A flood from one banned source, dropped by XDP (native, generic), netlimit's nft
ingress hook chain (`ingress:`), netlimit's input chain with its ban set (the nftables
backend without `ingress:`) and legacy iptables: CPU time per million dropped packets
and the drop rate (issue 34 item 5).

    python -m bench.xdp_flood [--packets 1000000] [--runs 3] [--out bench/results/xdp_flood.json]

Generator: Debian's trafgen (netsniff-ng), one CPU, in a client namespace, over a veth
into a limiter namespace (both created here, deleted in finally). On a veth the
receive path runs in softirq on the sending CPU, in the sender's context or in
ksoftirqd; the figure is the generator's CPU (user+sys, which includes the softirq
work done in its context) plus ksoftirqd's, per million packets. It therefore
includes the generator's own cost: it is an upper bound for each drop path, and the
differences between rows are the drop paths' differences. Other processes' softirq
work in ksoftirqd adds noise on a shared machine: medians of interleaved runs.
"""

from __future__ import annotations

import argparse
import glob
import json
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from netlimit.kernel.xdp import XdpPath

SRC, DST = "198.18.0.2", "198.18.0.1"
# netlimit's own table (the nftables backend): the ban list's set matched in the ingress
# hook chain on s0 (`ingress:`), or in the input chain as without it
NETLIMIT_BANS = "version: 1\nbans: {max_entries: 1000}\n"
NETLIMIT_INGRESS = NETLIMIT_BANS + "ingress: {interfaces: [s0]}\n"
VARIANTS = ("generator-only", "xdp-native", "xdp-generic", "nft-ingress", "nft-input-set", "iptables-legacy")


def sh(*cmd: str, check: bool = True, inp: str | None = None) -> str:
    return subprocess.run(list(cmd), check=check, capture_output=True, text=True, timeout=120, input=inp).stdout


def ksoftirqd_ticks() -> int:
    total = 0
    for stat in glob.glob("/proc/[0-9]*/stat"):
        try:
            with open(stat) as fh:
                data = fh.read()
        except OSError:
            continue
        if "(ksoftirqd/" in data:
            fields = data.rsplit(")", 1)[1].split()
            total += int(fields[11]) + int(fields[12])  # utime, stime
    return total


def netlimit_bans(srv: str, text: str) -> None:
    """netlimit's nftables table for `text` in `srv`, SRC in its ban list's set."""
    import ipaddress

    from netlimit.config.validate import load_string
    from netlimit.kernel import reconcile
    from netlimit.kernel.banset import ban_sets
    from netlimit.kernel.compile import compile_config
    from netlimit.kernel.netns import run_in_netns

    desired = compile_config(load_string(text, "<bench>").config)
    reconcile.apply(desired, srv, backend="nftables")
    bans = ban_sets("nftables")
    run_in_netns(srv, lambda: bans.replace({ipaddress.ip_network(f"{SRC}/32"): 3600.0}))


def install(variant: str, srv: str, xdp: XdpPath) -> None:
    if variant == "generator-only":  # the peer down: veth drops at transmit, no receive path at all
        sh("ip", "-n", srv, "link", "set", "s0", "down")
    elif variant.startswith("xdp-"):
        xdp.sync(["s0"], "native" if variant == "xdp-native" else "generic")
        xdp.add_bans([f"{SRC}/32"])
    elif variant in ("nft-ingress", "nft-input-set"):
        netlimit_bans(srv, NETLIMIT_INGRESS if variant == "nft-ingress" else NETLIMIT_BANS)
    elif variant == "iptables-legacy":
        sh("ip", "netns", "exec", srv, "iptables-legacy", "-A", "INPUT", "-s", SRC, "-j", "DROP")


def remove(variant: str, srv: str, xdp: XdpPath) -> None:
    if variant == "generator-only":
        sh("ip", "-n", srv, "link", "set", "s0", "up")
    elif variant.startswith("xdp-"):
        xdp.flush()
    elif variant in ("nft-ingress", "nft-input-set"):
        from netlimit.kernel import reconcile

        reconcile.flush(srv, backend="nftables")
    elif variant == "iptables-legacy":
        sh("ip", "netns", "exec", srv, "iptables-legacy", "-F", "INPUT", check=False)


def dropped(variant: str, srv: str, xdp: XdpPath) -> int:
    if variant == "generator-only":
        return 0
    if variant.startswith("xdp-"):
        return xdp.counters().banned
    if variant == "iptables-legacy":
        out = sh("ip", "netns", "exec", srv, "iptables-legacy", "-L", "INPUT", "-v", "-x", "-n")
        return sum(int(line.split()[0]) for line in out.splitlines() if "DROP" in line)
    out = sh("ip", "netns", "exec", srv, "nft", "list", "ruleset")
    return sum(int(m) for m in re.findall(r"counter packets (\d+)", out))


def flood(cli: str, conf: str, packets: int) -> tuple[float, float, float]:
    """(generator cpu s, ksoftirqd cpu s, wall s) of one trafgen run."""
    hz = os.sysconf("SC_CLK_TCK")
    k0 = ksoftirqd_ticks()
    t0 = time.monotonic()
    proc = subprocess.Popen(
        ["ip", "netns", "exec", cli, "trafgen", "--dev", "c0", "--conf", conf, "-n", str(packets), "--cpus", "1", "-q"],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    _pid, status, ru = os.wait4(proc.pid, 0)
    wall = time.monotonic() - t0
    proc.returncode = os.waitstatus_to_exitcode(status)
    if proc.returncode != 0:
        raise RuntimeError(f"trafgen exited {proc.returncode}")
    return ru.ru_utime + ru.ru_stime, (ksoftirqd_ticks() - k0) / hz, wall


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m bench.xdp_flood", description=__doc__.splitlines()[0])
    ap.add_argument("--packets", type=int, default=1_000_000)
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--out", default=str(Path(__file__).parent / "results" / "xdp_flood.json"))
    args = ap.parse_args(argv)
    if os.geteuid() != 0:
        print("xdp_flood: needs root", file=sys.stderr)
        return 64
    for tool in ("trafgen", "nft", "iptables-legacy"):
        if not sh("sh", "-c", f"command -v {tool} || true").strip():
            print(f"xdp_flood: {tool} missing (scripts/setup.sh installs it)", file=sys.stderr)
            return 64
    srv, cli = f"nlb-fl-{os.getpid()}-s", f"nlb-fl-{os.getpid()}-c"
    res: dict = {"packets_per_run": args.packets, "loadavg_at_start": os.getloadavg(), "variants": {}}
    conf_fd, conf = tempfile.mkstemp(suffix=".cfg")
    os.close(conf_fd)
    xdp = None
    try:
        sh("ip", "netns", "add", srv)
        sh("ip", "netns", "add", cli)
        sh("ip", "link", "add", "s0", "netns", srv, "type", "veth", "peer", "name", "c0", "netns", cli)
        for ns, dev, addr in ((srv, "s0", DST), (cli, "c0", SRC)):
            sh("ip", "-n", ns, "addr", "add", f"{addr}/24", "dev", dev)
            sh("ip", "-n", ns, "link", "set", dev, "up")
        mac = re.search(r"link/ether (\S+)", sh("ip", "-n", srv, "-o", "link", "show", "s0"))
        assert mac
        with open(conf, "w") as fh:
            fh.write(
                f"{{ eth(da={mac.group(1)}), ipv4(saddr={SRC}, daddr={DST}), udp(sp=40000, dp=5000), fill(0, 18) }}\n"
            )
        xdp = XdpPath(srv)
        runs: dict[str, list[tuple[float, float, float, int]]] = {v: [] for v in VARIANTS}
        for _ in range(args.runs):
            for v in VARIANTS:  # interleaved: load changes hit every variant alike
                install(v, srv, xdp)
                try:
                    gen, soft, wall = flood(cli, conf, args.packets)
                    runs[v].append((gen, soft, wall, dropped(v, srv, xdp)))
                finally:
                    remove(v, srv, xdp)
        for v, rs in runs.items():
            cpu = [(g + s) / (args.packets / 1e6) for g, s, _w, _d in rs]
            res["variants"][v] = {
                "cpu_s_per_million": round(statistics.median(cpu), 3),
                "drop_rate_kpps": round(statistics.median(d / w for _g, _s, w, d in rs) / 1e3, 1),
                "dropped_of_sent": [f"{d}/{args.packets}" for *_x, d in rs],
                "runs": [
                    {"gen_cpu_s": round(g, 3), "ksoftirqd_s": round(s, 3), "wall_s": round(w, 3)} for g, s, w, _d in rs
                ],
            }
    finally:
        if xdp is not None:
            xdp.flush()
            xdp.close()
        for ns in (srv, cli):
            subprocess.run(["ip", "netns", "del", ns], capture_output=True, timeout=30)
        os.unlink(conf)
    base = res["variants"]["nft-input-set"]["cpu_s_per_million"]
    gen = res["variants"]["generator-only"]["cpu_s_per_million"]
    for d in res["variants"].values():
        d["minus_generator_cpu_s_per_million"] = round(d["cpu_s_per_million"] - gen, 3)
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(res, indent=2) + "\n")
    print(f"{args.packets} packets per run, {args.runs} runs, load at start {res['loadavg_at_start']}")
    print("| drop path | CPU s per million | minus the generator's | vs nft input chain | rate kpps | dropped |")
    print("|---|---:|---:|---:|---:|---|")
    for v, d in res["variants"].items():
        ratio = base / d["cpu_s_per_million"] if d["cpu_s_per_million"] else float("inf")
        print(
            f"| {v} | {d['cpu_s_per_million']} | {d['minus_generator_cpu_s_per_million']} | {ratio:.2f}x "
            f"| {d['drop_rate_kpps']} | {d['dropped_of_sent'][0]} |"
        )
    print(f"written to {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
