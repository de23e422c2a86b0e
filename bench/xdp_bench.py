"""The XDP drop path's figures (issue 34): program cost per packet with
BPF_PROG_TEST_RUN, map write speed (100k bans: batch vs one syscall each vs bpftool),
and load/attach/replace latency.

    python -m bench.xdp_bench [--repeat 1000000] [--runs 3] [--out bench/results/xdp.json]

Needs root, clang, libbpf (scripts/setup.sh). Everything happens in a network
namespace it creates (a veth pair inside it, native XDP on one end) and deletes;
/sys/fs/bpf/netlimit/ns-<it> is flushed in finally. Not part of the test suite.
"""

from __future__ import annotations

import argparse
import ipaddress
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

from netlimit.kernel.xdp import XdpPath, XdpRule, frame

XDP_ACTIONS = {1: "DROP", 2: "PASS"}


def sh(*cmd: str) -> str:
    return subprocess.run(list(cmd), check=True, capture_output=True, text=True, timeout=60).stdout


def cost(path: XdpPath, pkt: bytes, repeat: int, runs: int) -> dict:
    ns = []
    action = 0
    for _ in range(runs):
        action, d = path.test_run(pkt, repeat)
        ns.append(d)
    return {"ns_per_packet": round(statistics.median(ns), 1), "runs": ns, "action": XDP_ACTIONS.get(action, action)}


def bans(n: int, base: int) -> list[str]:
    return [f"{ipaddress.IPv4Address(base + i)}/32" for i in range(n)]


def bans6(n: int) -> list[str]:
    return [f"{ipaddress.IPv6Address((0x20010DB8AAAA << 80) + i)}/128" for i in range(n)]


def timed(fn) -> float:
    t0 = time.perf_counter()
    fn()
    return time.perf_counter() - t0


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m bench.xdp_bench", description=__doc__.splitlines()[0])
    ap.add_argument("--repeat", type=int, default=1_000_000, help="BPF_PROG_TEST_RUN repeat per run")
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--bans", type=int, default=100_000)
    ap.add_argument("--no-bpftool", action="store_true", help="skip the bpftool-per-element comparison")
    ap.add_argument("--out", default=str(Path(__file__).parent / "results" / "xdp.json"))
    args = ap.parse_args(argv)
    if os.geteuid() != 0:
        print("xdp_bench: needs root (bpf, network namespaces)", file=sys.stderr)
        return 64

    ns = f"nlb-xdp-{os.getpid()}"
    sh("ip", "netns", "add", ns)
    res: dict = {"kernel": os.uname().release, "cpus": os.cpu_count(), "loadavg_at_start": os.getloadavg()}
    path = XdpPath(ns)
    try:
        sh("ip", "-n", ns, "link", "add", "x0", "type", "veth", "peer", "name", "x1")
        sh("ip", "-n", ns, "link", "set", "x0", "up")
        sh("ip", "-n", ns, "link", "set", "x1", "up")

        # -- load / attach / replace latency ------------------------------------------
        t_load = timed(path.load)
        t_attach = timed(lambda: path.attach("x0", "native"))
        replace = []
        for _ in range(10):
            t0 = time.perf_counter()
            path.load()
            path.attach("x0")
            replace.append(time.perf_counter() - t0)
        res["lifecycle_ms"] = {
            "first_load": round(t_load * 1e3, 1),
            "first_attach_native": round(t_attach * 1e3, 1),
            "reload_and_replace_median": round(statistics.median(replace) * 1e3, 1),
        }

        # -- program cost per packet (BPF_PROG_TEST_RUN) -------------------------------
        r, k = args.repeat, args.runs
        dst4, dst6 = "10.0.0.1", "2001:db8:ffff::1"
        c: dict = {}
        c["pass_empty_maps_no_rules"] = cost(path, frame("10.9.9.9", dst4), r, k)
        path.add_bans(["10.200.0.0/16", "2001:db8:bad::/48"])
        c["ban_hit_v4_1_ban"] = cost(path, frame("10.200.1.1", dst4), r, k)
        c["ban_hit_v6_1_ban"] = cost(path, frame("2001:db8:bad::1", dst6), r, k)
        b4, b6, b4b = bans(args.bans, 0x0B000000), bans6(args.bans), bans(args.bans, 0x0C000000)
        t_batch = timed(lambda: path.add_bans(b4))
        t_batch6 = timed(lambda: path.add_bans(b6))
        c[f"ban_hit_v4_{args.bans // 1000}k_bans"] = cost(path, frame("11.0.100.7", dst4), r, k)
        c[f"ban_miss_v4_{args.bans // 1000}k_bans"] = cost(path, frame("12.0.0.1", dst4), r, k)
        # a miss that walks as deep as a hit: next to the banned range
        c[f"ban_miss_v4_near_{args.bans // 1000}k_bans"] = cost(path, frame("11.1.200.1", dst4), r, k)
        c[f"ban_hit_v6_{args.bans // 1000}k_bans"] = cost(path, frame("2001:db8:aaaa::7", dst6), r, k)
        c[f"ban_miss_v6_{args.bans // 1000}k_bans"] = cost(path, frame("2001:db8:cccc::1", dst6), r, k)
        path.set_rules([XdpRule("admit", limit=1_000_000_000, burst=1_000_000_000, protocol="udp")])
        c["bucket_admit_1_rule"] = cost(path, frame("12.0.0.2", dst4), r, k)
        path.set_rules([XdpRule("drop", limit=1, period_s=3600, burst=1, protocol="udp")])
        path.test_run(frame("12.0.0.3", dst4), 1)
        c["bucket_drop_1_rule"] = cost(path, frame("12.0.0.3", dst4), r, k)
        many = [XdpRule(f"r{i}", limit=10**9, burst=10**9, protocol="udp", dports=(i + 1, i + 1)) for i in range(31)]
        path.set_rules([*many, XdpRule("last", limit=10**9, burst=10**9, protocol="udp")])
        c["bucket_admit_32nd_of_32_rules"] = cost(path, frame("12.0.0.4", dst4), r, k)
        res["cost_per_packet"] = c

        # -- map writes --------------------------------------------------------------
        m = path.map("bans4")
        m._batch_ok = False
        t_single = timed(lambda: path.add_bans(b4b))
        n_tool = 200
        ids = json.loads(sh("bpftool", "-j", "map", "show", "pinned", os.path.join(path.pin_dir, "bans4")))
        t0 = time.perf_counter()
        for i in range(n_tool):
            key = [str(b) for b in (32, 0, 0, 0, 13, 0, i // 256, i % 256)]
            sh("bpftool", "map", "update", "id", str(ids["id"]), "key", *key, "value", *["0"] * 8)
        t_tool = (time.perf_counter() - t0) / n_tool * args.bans
        res["map_writes_s"] = {
            f"{args.bans}_v4_bans_batch": round(t_batch, 3),
            f"{args.bans}_v6_bans_batch": round(t_batch6, 3),
            f"{args.bans}_v4_bans_one_syscall_each": round(t_single, 3),
            f"{args.bans}_v4_bans_bpftool_per_element_extrapolated": round(t_tool, 1),
        }
        res["bans_in_map"] = sum(1 for _ in path.map("bans4").iter_keys())
    finally:
        try:
            path.flush()
        finally:
            path.close()
            subprocess.run(["ip", "netns", "del", ns], capture_output=True, timeout=30)

    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(res, indent=2) + "\n")
    print(f"kernel {res['kernel']}, {res['cpus']} CPUs, load at start {res['loadavg_at_start']}")
    print("| case | ns per packet | action |\n|---|---:|---|")
    for name, v in res["cost_per_packet"].items():
        print(f"| {name} | {v['ns_per_packet']} | {v['action']} |")
    for name, v in {**res["map_writes_s"], **res["lifecycle_ms"]}.items():
        print(f"{name}: {v}")
    print(f"written to {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
