#!/usr/bin/env python3
"""Scale-out drills (issue 18), the long versions of tests/sidecar/test_cluster_sidecars.py:
two `netlimit sidecar` processes on a real Redis Cluster / Sentinel set-up, HTTP
traffic from client threads, figures printed (and written with --json).

    .venv/bin/python scripts/cluster_drills.py exact --rounds 3        # 1,000 keys per algorithm
    .venv/bin/python scripts/cluster_drills.py reshard --rounds 4      # 4096 slots back and forth
    .venv/bin/python scripts/cluster_drills.py failover --rounds 5     # SIGKILL a primary, restart it
    .venv/bin/python scripts/cluster_drills.py sentinel --rounds 5     # the same behind Sentinel
    .venv/bin/python scripts/cluster_drills.py all --json out.json

exact: 2 sidecars x 4 client threads, 1,000 distinct keys per algorithm (5,000),
    limit 5 per day, 8 requests per key: every key must see exactly 5 admissions.
reshard: 3 primaries, 3,000 keys, limit 10 per day, traffic never stops (every key
    at its limit before the first round: a counter lost on the way would admit); each round
    `redis-cli --cluster reshard` moves 4096 slots (a quarter) from one primary to the
    next. Reported: admissions above the limit for keys that moved and for keys that
    did not, MOVED/ASK redirects, store errors, 5xx, request errors.
failover: 3 primaries + 3 replicas (cluster-node-timeout 2000), on_store_failure closed;
    each round SIGKILLs the primary of a probe key's shard, waits for the promotion and
    for decisions from the store, then restarts the killed node (it rejoins as a
    replica). Reported: promotion and resumption times after the kill, admissions
    above the limit (writes the dead primary had not replicated), 5xx.
sentinel: 1 primary, 1 replica, 3 sentinels (down-after 1000 ms); the same per round,
    the killed node restarted and turned into a replica by the sentinels.

Every process is started on free loopback ports and killed at the end (finally).
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "tests" / "helpers"))
sys.path.insert(0, str(REPO))

from cluster_load import Probe, Traffic, config, keys_for, over_limit, store_keys  # noqa: E402 - after sys.path
from redis_cluster import RedisCluster, wait_role  # noqa: E402
from redis_nodes import wait_for  # noqa: E402
from redis_sentinel import SentinelSetup  # noqa: E402
from sidecar_proc import Sidecar, get_metrics, metric, write_config  # noqa: E402

from netlimit.limit.stores.cluster import key_slot  # noqa: E402


def sidecars(cfg: Path, url: str, n: int = 2) -> list[Sidecar]:
    out: list[Sidecar] = []
    try:
        for _ in range(n):
            out.append(Sidecar(cfg, "--redis", url))
    except BaseException:
        for sc in out:
            sc.stop()
        raise
    return out


def store_metrics(scs: list[Sidecar]) -> dict[str, float]:
    out = {"fallbacks": 0.0, "errors": 0.0, "moved": 0.0, "ask": 0.0, "failovers": 0.0}
    for sc in scs:
        s = get_metrics(sc.port)
        out["fallbacks"] += sum(
            metric(s, "netlimit_http_store_fallbacks_total", mode=m) for m in ("local", "open", "closed")
        )
        out["errors"] += sum(
            metric(s, "netlimit_http_store_errors_total", reason=r) for r in ("timeout", "connection", "error")
        )
        out["moved"] += metric(s, "netlimit_http_store_redirects_total", kind="moved")
        out["ask"] += metric(s, "netlimit_http_store_redirects_total", kind="ask")
        out["failovers"] += metric(s, "netlimit_http_store_failovers_total")
    return out


def owners(c: RedisCluster) -> list[int]:
    out = [0] * 16384
    for s in c.shards():
        for a, b in s.ranges:
            out[a : b + 1] = [s.primary.port] * (b - a + 1)
    return out


def log(msg: str) -> None:
    print(msg, flush=True)


# ---------------------------------------------------------------------------- drills


def drill_exact(rounds: int, work: Path) -> dict:
    limit, reps = 5, 8
    results = []
    with RedisCluster(work / "exact") as c:
        for r in range(rounds):
            text = config(limit, on_store_failure="closed", store_timeout_ms=1000, domain=f"exact{r}")
            cfg = write_config(work / f"exact{r}.yaml", text)
            keys = keys_for(5000, tag=f"e{r}-")
            n = len(keys)
            plan = [keys[(i + k) % n] for k in range(reps) for i in range(n)]
            scs = sidecars(cfg, c.url)
            try:
                t0 = time.monotonic()
                tally = Traffic([sc.port for sc in scs], plan, threads=4, max_seconds=600).run()
                secs = time.monotonic() - t0
                wrong = [k for k in keys if tally.statuses[k] != {200: limit, 429: reps - limit}]
                m = store_metrics(scs)
            finally:
                for sc in scs:
                    sc.stop()
            res = {
                "requests": tally.requests,
                "seconds": round(secs, 1),
                "keys_not_exact": len(wrong),
                "errors": len(tally.errors),
                "5xx": tally.five_xx(),
                "store_errors": m["errors"],
            }
            results.append(res)
            log(f"exact round {r + 1}: {res}")
    return {
        "rounds": results,
        "ok": all(x["keys_not_exact"] == 0 and x["errors"] == 0 and x["5xx"] == 0 for x in results),
    }


def drill_reshard(rounds: int, work: Path) -> dict:
    limit = 10
    text = config(limit, on_store_failure="local", store_timeout_ms=500, domain="reshard")
    cfg = write_config(work / "reshard.yaml", text)
    keys = keys_for(3000, tag="r")
    random.Random(3).shuffle(keys)
    slots = {k: key_slot(rk) for k, rk in store_keys(text, keys).items()}
    results = []
    with RedisCluster(work / "reshard", replicas=0) as c:
        scs = sidecars(cfg, c.url)
        traffic = Traffic([sc.port for sc in scs], keys, threads=4, repeat=True, max_seconds=1800).start()
        try:
            # every key at its limit before the first reshard: a counter lost or
            # reset on the way would show as admissions above it
            wait_for(lambda: traffic.tally.requests > 1.5 * limit * len(keys), 120, "traffic to the limits")
            moved_ever: set[str] = set()
            for r in range(rounds):
                shards = c.shards()
                src, dst = shards[r % 3].primary, shards[(r + 1) % 3].primary
                before = owners(c)
                m0 = store_metrics(scs)
                t0 = time.monotonic()
                c.cli("--cluster", "reshard", src.address, "--cluster-from", c.node_id(src), "--cluster-to",
                      c.node_id(dst), "--cluster-slots", "4096", "--cluster-yes", timeout=600)  # fmt: skip
                took = time.monotonic() - t0
                after = owners(c)
                moved = {k for k in keys if before[slots[k]] != after[slots[k]]}
                moved_ever |= moved
                m1 = store_metrics(scs)
                res = {
                    "seconds": round(took, 1),
                    "slots_moved": sum(1 for a, b in zip(before, after) if a != b),
                    "keys_moved": len(moved),
                    "moved_redirects": m1["moved"] - m0["moved"],
                    "ask_redirects": m1["ask"] - m0["ask"],
                    "store_errors": m1["errors"] - m0["errors"],
                }
                results.append(res)
                log(f"reshard round {r + 1}: {res}")
            n0 = traffic.tally.requests
            wait_for(lambda: traffic.tally.requests > n0 + 5000, 60, "traffic after the reshards")
        finally:
            tally = traffic.stop()
            m = store_metrics(scs)
            for sc in scs:
                sc.stop()
    over = over_limit(tally, keys, limit)
    over_moved = {k: v for k, v in over.items() if k in moved_ever}
    summary = {
        "rounds": results,
        "requests": tally.requests,
        "codes": dict(tally.codes()),
        "request_errors": len(tally.errors),
        "keys_moved_at_least_once": len(moved_ever),
        "admissions_over_limit_moved_keys": sum(over_moved.values()),
        "max_over_limit_per_moved_key": max(over_moved.values(), default=0),
        "admissions_over_limit_other_keys": sum(v for k, v in over.items() if k not in moved_ever),
        "keys_below_limit": sum(1 for k in keys if tally.admitted(k) < limit),
        "store": m,
    }
    summary["ok"] = (
        summary["request_errors"] == 0
        and tally.five_xx() == 0
        and summary["max_over_limit_per_moved_key"] <= 1
        and summary["admissions_over_limit_other_keys"] == 0
    )
    log(f"reshard summary: {summary}")
    return summary


def drill_failover(rounds: int, work: Path) -> dict:
    results = []
    with RedisCluster(work / "failover", replicas=1, node_timeout_ms=2000) as c:
        for r in range(rounds):
            results.append(_failover_round(c, r, work))
            log(f"failover round {r + 1}: {results[-1]}")
    return _failover_summary(results)


def _failover_round(c: RedisCluster, r: int, work: Path) -> dict:
    limit = 60
    text = config(limit, on_store_failure="closed", store_timeout_ms=200, domain=f"failover{r}")
    keys = keys_for(600, tag="f")
    cfg = write_config(work / f"failover{r}.yaml", text)
    scs = sidecars(cfg, c.url)
    probe_key = f"probe-{r}"
    slot = key_slot(store_keys(text, [probe_key])[probe_key])
    shard = c.shard_of(slot)
    victim, heir = shard.primary, shard.replicas[0]
    probe = Probe(scs[0].port, probe_key, domain=f"failover{r}").start()
    traffic = Traffic([sc.port for sc in scs], keys, threads=4, repeat=True, max_seconds=300).start()
    try:
        wait_for(lambda: traffic.tally.requests > 3000, 60, "traffic before the kill")
        t_kill = time.monotonic()
        victim.kill()
        t_prom = wait_role(heir, b"master", 30)
        wait_for(lambda: probe.first_store_after(t_kill), 30, "decisions from the store")
        n0 = traffic.tally.requests
        wait_for(lambda: traffic.tally.requests > n0 + 3000, 60, "traffic after")
    finally:
        tally = traffic.stop()
        probe.stop()
        m = store_metrics(scs)
        for sc in scs:
            sc.stop()
    resumed = probe.first_store_after(t_kill)
    over = over_limit(tally, keys, limit)
    victim.start()  # it rejoins as a replica of its heir
    c.wait_healthy(60)
    return {
        "promoted_after_s": round(t_prom - t_kill, 2),
        "store_decisions_again_after_s": round(resumed - t_kill, 2) if resumed else None,
        "after_promotion_s": round(resumed - t_prom, 2) if resumed else None,
        "requests": tally.requests,
        "5xx": tally.five_xx(),
        "request_errors": len(tally.errors),
        "admissions_over_limit": sum(over.values()),
        "keys_over_limit": len(over),
        "fallbacks_closed": m["fallbacks"],
        "failovers_seen": m["failovers"],
    }


def drill_sentinel(rounds: int, work: Path) -> dict:
    results = []
    with SentinelSetup(work / "sentinel") as s:
        for r in range(rounds):
            results.append(_sentinel_round(s, r, work))
            log(f"sentinel round {r + 1}: {results[-1]}")
    return _failover_summary(results)


def _sentinel_round(s: SentinelSetup, r: int, work: Path) -> dict:
    limit = 60
    text = config(limit, on_store_failure="closed", store_timeout_ms=200, domain=f"sentinel{r}")
    keys = keys_for(600, tag="s")
    cfg = write_config(work / f"sentinel{r}.yaml", text)
    scs = sidecars(cfg, s.url)
    victim = s.node(s.named_primary())
    heir = next(n for n in s.data if n is not victim)
    probe = Probe(scs[0].port, f"probe-{r}", domain=f"sentinel{r}").start()
    traffic = Traffic([sc.port for sc in scs], keys, threads=4, repeat=True, max_seconds=300).start()
    try:
        for sc in scs:
            sc.wait_line(r"redis sentinel 'mymaster': primary 127\.0\.0\.1:\d+")
        wait_for(lambda: traffic.tally.requests > 3000, 60, "traffic before the kill")
        t_kill = time.monotonic()
        victim.kill()
        t_prom = wait_role(heir, b"master", 30)
        wait_for(lambda: s.named_primary() == heir.port, 30, "the sentinels to name the replica")
        t_switch = time.monotonic()
        wait_for(lambda: probe.first_store_after(t_kill), 30, "decisions from the store")
        n0 = traffic.tally.requests
        wait_for(lambda: traffic.tally.requests > n0 + 3000, 60, "traffic after")
    finally:
        tally = traffic.stop()
        probe.stop()
        m = store_metrics(scs)
        for sc in scs:
            sc.stop()
    resumed = probe.first_store_after(t_kill)
    over = over_limit(tally, keys, limit)
    victim.start()  # the sentinels turn it into a replica of the new primary
    wait_for(lambda: victim.call("ROLE")[0] == b"slave", 60, "the old primary to rejoin as a replica")
    wait_for(lambda: victim.client().info("replication").get("master_link_status") == "up", 60, "its sync")
    s.wait_settled(60)
    return {
        "promoted_after_s": round(t_prom - t_kill, 2),
        "sentinels_switched_after_s": round(t_switch - t_kill, 2),
        "store_decisions_again_after_s": round(resumed - t_kill, 2) if resumed else None,
        "after_promotion_s": round(resumed - t_prom, 2) if resumed else None,
        "requests": tally.requests,
        "5xx": tally.five_xx(),
        "request_errors": len(tally.errors),
        "admissions_over_limit": sum(over.values()),
        "keys_over_limit": len(over),
        "fallbacks_closed": m["fallbacks"],
        "failovers_seen": m["failovers"],
    }


def _failover_summary(results: list[dict]) -> dict:
    def stat(name: str) -> dict:
        xs = [r[name] for r in results if r.get(name) is not None]
        return {"median": statistics.median(xs), "max": max(xs)} if xs else {}

    summary = {
        "rounds": results,
        "promoted_after_s": stat("promoted_after_s"),
        "store_decisions_again_after_s": stat("store_decisions_again_after_s"),
        "after_promotion_s": stat("after_promotion_s"),
        "admissions_over_limit_total": sum(r["admissions_over_limit"] for r in results),
        "5xx_total": sum(r["5xx"] for r in results),
        "request_errors_total": sum(r["request_errors"] for r in results),
    }
    summary["ok"] = (
        summary["5xx_total"] == 0
        and summary["request_errors_total"] == 0
        and all(r["store_decisions_again_after_s"] is not None for r in results)
    )
    log(f"summary: {json.dumps({k: v for k, v in summary.items() if k != 'rounds'})}")
    return summary


DRILLS = {"exact": drill_exact, "reshard": drill_reshard, "failover": drill_failover, "sentinel": drill_sentinel}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("drill", choices=[*DRILLS, "all"])
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--json", help="write the figures here")
    args = ap.parse_args(argv)
    names = list(DRILLS) if args.drill == "all" else [args.drill]
    out = {}
    with tempfile.TemporaryDirectory(prefix="netlimit-drills-") as d:
        for name in names:
            log(f"== {name} ({args.rounds} rounds)")
            work = Path(d) / name
            work.mkdir()
            out[name] = DRILLS[name](args.rounds, work)
    if args.json:
        Path(args.json).write_text(json.dumps(out, indent=1) + "\n")
    ok = all(v.get("ok") for v in out.values())
    log("ALL OK" if ok else "SOME DRILL FAILED")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
