"""RedisStore on a REAL Redis Cluster (tests/limit/conftest.py: 3 primaries + 3
replicas): slot routing as Redis computes it, one EVALSHA per decision on the
key's primary, the ASK path of a slot in migration (CLUSTER SETSLOT by the test)
and the MOVED after it, NOSCRIPT per node, a plain redis:// URL at a cluster
node followed as a cluster, a paused primary bounded by the call's timeout,
CLUSTERDOWN as a StoreError, TLS and an ACL user on a cluster of their own,
and the topology /healthz and /metrics show."""

from __future__ import annotations

import asyncio
import logging
import signal
import time
import uuid

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from redis.crc import key_slot as redispy_key_slot
from redis_cluster import RedisCluster, cluster_info, wait_role
from redis_nodes import Auth, RedisNode, free_ports, wait_for
from tls_certs import make_certs

from netlimit.limit.algorithms import ALGORITHMS, Limit
from netlimit.limit.limiter import Limiter
from netlimit.limit.metrics import Metrics
from netlimit.limit.stores import RedisStore, StoreError
from netlimit.limit.stores.cluster import ClusterClient, key_slot, parse_shards
from netlimit.limit.stores.resp import Address
from netlimit.limit.stores.topology import parse_redirect

pytestmark = [pytest.mark.redis, pytest.mark.timeout(120)]

SLACK = 0.05


def arun(coro):
    return asyncio.run(coro)


def prefix() -> str:
    return f"t{uuid.uuid4().hex[:10]}"


# ------------------------------------------------------------------ pure parts


@settings(max_examples=300, deadline=None)
@given(st.binary(max_size=60) | st.text(max_size=30).map(lambda s: s.encode("utf-8", "surrogatepass")))
def test_key_slot_is_redis_crc16_of_the_hash_tag(key):
    assert key_slot(key) == redispy_key_slot(key)


def test_key_slot_agrees_with_the_server(redis_cluster):
    node = redis_cluster.nodes[0]
    keys = [b"foo", b"{user1000}.following", b"foo{}{bar}", b"foo{{bar}}zap", b"foo{bar}{zap}", b"netlimit:{ab:}}",
            "ключ{}".encode(), b"{", b"}{x}"]  # fmt: skip
    for k in keys:
        assert key_slot(k) == node.call("CLUSTER", "KEYSLOT", k), k


@pytest.mark.parametrize(
    "msg, want",
    [
        ("MOVED 3999 127.0.0.1:6381", ("moved", 3999, "127.0.0.1", 6381)),
        ("ASK 1 10.0.0.2:7000", ("ask", 1, "10.0.0.2", 7000)),
        ("MOVED 12 ::1:7000", ("moved", 12, "::1", 7000)),
        ("MOVED 12 :7000", ("moved", 12, "", 7000)),
        ("MOVED 16384 h:1", None),
        ("MOVED x h:1", None),
        ("ERR MOVED 1 h:1", None),
        ("ASK 1 h:0", None),
    ],
)
def test_redirect_replies(msg, want):
    r = parse_redirect(msg)
    assert (None if r is None else (r.kind, r.slot, r.host, r.port)) == want


def test_shards_reply_with_a_failed_primary_prefers_the_live_one():
    def node(port, role, health):
        return [b"id", b"x", b"port", port, b"ip", b"127.0.0.1", b"endpoint", b"127.0.0.1", b"role", role,
                b"replication-offset", 1, b"health", health]  # fmt: skip

    reply = [
        [b"slots", [0, 100, 200, 300], b"nodes", [node(7001, b"master", b"fail"), node(7004, b"master", b"online")]]
    ]
    (shard,) = parse_shards(reply, False, "h")
    assert shard.primary.port == 7004 and [r.port for r in shard.replicas] == [7001]
    assert shard.ranges == [(0, 100), (200, 300)] and shard.n_slots == 202


# ------------------------------------------------------------------ routing


def _primary_by_port(cluster):
    return {s.primary.port: s for s in cluster.shards()}


def _calls(node, cmd: str) -> int:
    c = node.client()
    try:
        return c.info("commandstats").get(f"cmdstat_{cmd}", {}).get("calls", 0)
    finally:
        c.close()


def test_decisions_go_to_each_key_s_primary_in_one_evalsha(redis_cluster):
    limit = Limit("token_bucket", 100, 60)
    pre = prefix()
    keys = [f"10.0.{i // 256}.{i % 256}" for i in range(300)]

    async def main():
        store = RedisStore(redis_cluster.url, timeout_ms=2000, key_prefix=pre)
        try:
            await store.start()
            await store.load_scripts(limit)
            primaries = redis_cluster.primaries
            before = {
                n.port: (_calls(n, "evalsha"), sum(_calls(n, c) for c in ("cluster|shards", "asking")))
                for n in primaries
            }
            for k in keys:
                assert (await store.hit(k, limit)).remaining == 99
            after = {
                n.port: (_calls(n, "evalsha"), sum(_calls(n, c) for c in ("cluster|shards", "asking")))
                for n in primaries
            }
            per_node = {p: after[p][0] - before[p][0] for p in after}
            # every primary took its share, and nothing but the EVALSHA was sent
            assert sum(per_node.values()) == len(keys) and min(per_node.values()) > 50, per_node
            assert all(after[p][1] == before[p][1] for p in after)
            assert store.stats.redirects == {"moved": 0, "ask": 0}
            # each key is on the primary of its slot
            by_port = _primary_by_port(redis_cluster)
            for k in keys[:20]:
                (rk,) = store.redis_keys(k, limit)
                owner = next(s for s in by_port.values() if s.owns(key_slot(rk.encode())))
                assert owner.primary.call("EXISTS", rk) == 1
        finally:
            await store.close()

    arun(main())


def _same_slot_key(store: RedisStore, limit: Limit, slot: int, stem: str) -> str:
    for i in range(200_000):
        k = f"{stem}-{i}"
        if key_slot(store.redis_keys(k, limit)[0].encode()) == slot:
            return k
    raise AssertionError("no key found for the slot")


def test_ask_during_a_migration_then_moved_after_it_counts_stay_exact(redis_cluster):
    """A slot in MIGRATING (source) / IMPORTING (target), set up with CLUSTER
    SETSLOT as redis-cli --cluster reshard does: a new key is created on the
    target through ASK; a key still on the source is served there; once MIGRATEd
    it is served by the target through ASK with its count; after SETSLOT NODE
    the source answers MOVED and the map follows."""
    limit = Limit("fixed_window", 10, 3600)
    pre = prefix()

    async def main():
        store = RedisStore(redis_cluster.url, timeout_ms=2000, key_prefix=pre)
        await store.start()
        new_key = "ask-new"
        slot = key_slot(store.redis_keys(new_key, limit)[0].encode())
        old_key = _same_slot_key(store, limit, slot, "ask-old")
        shards = redis_cluster.shards()
        src = next(s for s in shards if s.owns(slot)).primary
        dst = next(s for s in shards if not s.owns(slot)).primary
        src_id, dst_id = redis_cluster.node_id(src), redis_cluster.node_id(dst)
        old_rk = store.redis_keys(old_key, limit)[0]
        try:
            assert (await store.hit(old_key, limit)).remaining == 9  # on the source
            dst.call("CLUSTER", "SETSLOT", slot, "IMPORTING", src_id)
            src.call("CLUSTER", "SETSLOT", slot, "MIGRATING", dst_id)

            d = await store.hit(new_key, limit)  # not on the source: ASK
            assert (d.allowed, d.remaining) == (True, 9)
            assert store.stats.redirects == {"moved": 0, "ask": 1}
            assert (await store.hit(new_key, limit)).remaining == 8  # ASK again: the map is unchanged
            assert store.stats.redirects["ask"] == 2
            assert (await store.hit(old_key, limit)).remaining == 8  # still on the source: no redirect
            assert store.stats.redirects["ask"] == 2

            src.call("MIGRATE", "127.0.0.1", dst.port, "", 0, 5000, "KEYS", old_rk)
            assert (await store.hit(old_key, limit)).remaining == 7  # moved with its count
            assert store.stats.redirects["ask"] == 3

            for n in (dst, src, *[s.primary for s in shards if s.primary not in (src, dst)]):
                n.call("CLUSTER", "SETSLOT", slot, "NODE", dst_id)
            assert (await store.hit(new_key, limit)).remaining == 7  # MOVED, then the target
            assert store.stats.redirects["moved"] == 1
            assert store.client.slots[slot] is store.client.node_at("127.0.0.1", dst.port)
            assert (await store.hit(new_key, limit)).remaining == 6
            assert (await store.hit(old_key, limit)).remaining == 6
            assert store.stats.redirects == {"moved": 1, "ask": 3}
            assert dst.call("EXISTS", old_rk) == 1 and dst.call("EXISTS", store.redis_keys(new_key, limit)[0]) == 1
        finally:
            await store.close()

    arun(main())


def test_noscript_on_one_node_reloads_there(redis_cluster):
    limit = Limit("sliding_window_log", 5, 60)
    pre = prefix()

    async def main():
        store = RedisStore(redis_cluster.url, timeout_ms=2000, key_prefix=pre)
        try:
            keys = [f"n{i}" for i in range(30)]
            for k in keys:
                await store.hit(k, limit)
            victim = redis_cluster.primaries[0]
            victim.call("SCRIPT", "FLUSH")
            for k in keys:
                assert (await store.hit(k, limit)).remaining == 3
        finally:
            await store.close()

    arun(main())


def test_plain_redis_url_at_a_cluster_node_is_followed_as_a_cluster(redis_cluster, caplog):
    limit = Limit("fixed_window", 4, 3600)
    pre = prefix()
    url = f"redis://{redis_cluster.nodes[0].address}/0"

    async def main():
        # at start: INFO cluster
        s1 = RedisStore(url, timeout_ms=2000, key_prefix=pre)
        # without start: the first MOVED
        s2 = RedisStore(url, timeout_ms=2000, key_prefix=pre)
        try:
            with caplog.at_level(logging.WARNING, logger="netlimit.limit"):
                await s1.start()
                assert s1.kind == "cluster"
                assert (
                    "is a Redis Cluster node (INFO cluster says cluster_enabled:1): following it as a cluster"
                    in caplog.text
                )
                got = []
                for i in range(40):
                    got.append((await s2.hit(f"k{i}", limit)).remaining)
                    got.append((await s1.hit(f"k{i}", limit)).remaining)
                assert got == [3, 2] * 40  # the two stores share every counter
                assert s2.kind == "cluster" and s2.stats.redirects["moved"] >= 1
                assert "following it as a cluster" in caplog.text and "answered 'MOVED" in caplog.text
        finally:
            await s1.close()
            await s2.close()

    arun(main())


def test_a_paused_primary_fails_within_the_timeout_others_answer(redis_cluster):
    limit = Limit("token_bucket", 100, 60)
    pre = prefix()

    async def main():
        store = RedisStore(redis_cluster.url, timeout_ms=100, key_prefix=pre)
        await store.start()
        shards = redis_cluster.shards()
        victim = shards[0]
        keys = [f"p{i}" for i in range(60)]
        mine = [k for k in keys if victim.owns(key_slot(store.redis_keys(k, limit)[0].encode()))]
        others = [k for k in keys if k not in mine]
        for k in keys:
            await store.hit(k, limit)
        victim.primary.proc.send_signal(signal.SIGSTOP)
        try:
            t0 = time.monotonic()
            with pytest.raises(StoreError, match=r"100 ms|timed out|not answered"):
                await store.hit(mine[0], limit)
            assert time.monotonic() - t0 < 0.1 + SLACK
            for k in others[:5]:
                assert (await store.hit(k, limit)).allowed
            assert store.stats.node_errors.get(victim.primary.address, 0) >= 1
        finally:
            victim.primary.proc.send_signal(signal.SIGCONT)
            await store.close()

    arun(main())


def test_topology_and_metrics(redis_cluster):
    limit = Limit("fixed_window", 5, 60)

    async def main():
        store = RedisStore(redis_cluster.url, timeout_ms=2000, key_prefix=prefix())
        try:
            await store.start()
            for i in range(20):
                await store.hit(f"m{i}", limit)
            t = store.topology()
            assert t["kind"] == "cluster" and t["slots_served"] == 16384 and t["last_refresh_error"] is None
            prim = [n for n in t["nodes"] if n["role"] == "primary"]
            reps = [n for n in t["nodes"] if n["role"] == "replica"]
            assert len(prim) == 3 and len(reps) == 3
            assert sum(n["slots"] for n in prim) == 16384 and all(n["reachable"] for n in prim)
            assert {r["of"] for r in reps} == {p["address"] for p in prim}
            text = Metrics(Limiter(_rules(), store)).render().decode()
            assert 'netlimit_http_store_redirects_total{kind="moved"}' in text
            assert "netlimit_http_store_failovers_total 0.0" in text
            for p in prim:
                assert f'netlimit_http_store_node_up{{node="{p["address"]}",role="primary"}} 1.0' in text
        finally:
            await store.close()

    arun(main())


def _rules():
    from netlimit.config.validate import load_string
    from netlimit.limit.rules import from_loaded

    return from_loaded(load_string("version: 1\nhttp:\n  domain: d\n  descriptors: []\n"))


# ------------------------------------------------------------------ clusters of their own


def test_clusterdown_is_a_store_error_and_the_map_is_looked_at_again(tmp_path):
    """3 primaries, no replicas: a killed primary takes the cluster down
    (cluster-require-full-coverage): live nodes answer CLUSTERDOWN."""
    limit = Limit("fixed_window", 5, 60)
    with RedisCluster(tmp_path, replicas=0, node_timeout_ms=1000) as c:

        async def main():
            store = RedisStore(c.url, timeout_ms=500, key_prefix=prefix())
            try:
                await store.start()
                shards = c.shards()
                dead, alive = shards[0], shards[1]
                key = next(
                    f"d{i}" for i in range(1000) if alive.owns(key_slot(store.redis_keys(f"d{i}", limit)[0].encode()))
                )
                assert (await store.hit(key, limit)).allowed
                dead.primary.kill()
                wait_for(lambda: cluster_info(alive.primary).get("cluster_state") == "fail", 15, "cluster_state:fail")
                with pytest.raises(StoreError, match="CLUSTERDOWN"):
                    await store.hit(key, limit)
                assert store.stats.node_errors.get(alive.primary.address, 0) >= 1
                refreshes = store.stats.refreshes
                await asyncio.sleep(0.3)
                assert store.stats.refreshes > refreshes  # the map was asked for again
            finally:
                await store.close()

        arun(main())


def test_tls_cluster_with_an_acl_user(tmp_path):
    """rediss+cluster:// with the CA, a client certificate (the nodes require one)
    and an ACL user limited to what netlimit needs; wrong credentials or an
    untrusted certificate are store errors, not decisions."""
    tls = make_certs(tmp_path / "tls")
    auth = Auth()
    limit = Limit("sliding_window_counter", 3, 3600)
    with RedisCluster(tmp_path / "c", replicas=0, tls=tls, auth=auth, tls_auth_clients="yes") as c:
        url = c.make_url("rediss+cluster", userinfo=f"{auth.user}:{auth.password}@", query=tls.query())

        async def main():
            store = RedisStore(url, timeout_ms=2000)  # key prefix netlimit: (the ACL allows ~netlimit:*)
            try:
                await store.start()
                assert store.kind == "cluster" and store.topology()["slots_served"] == 16384
                got = [(await store.hit(f"tls{i % 10}", limit)).allowed for i in range(40)]
                assert got.count(True) == 30
                nodes = {n["address"] for n in store.topology()["nodes"] if n["reachable"]}
                assert len(nodes) == 3
            finally:
                await store.close()
            for bad in (
                c.make_url("rediss+cluster", userinfo=f"{auth.user}:wrong@", query=tls.query()),
                c.make_url(
                    "rediss+cluster", userinfo=f"{auth.user}:{auth.password}@", query=tls.query(client_cert=False)
                ),
                c.make_url("rediss+cluster", userinfo=f"{auth.user}:{auth.password}@"),  # the system CAs: untrusted
            ):
                s = RedisStore(bad, timeout_ms=500)
                try:
                    await s.start()
                    with pytest.raises(StoreError):
                        await s.hit("x", limit)
                finally:
                    await s.close()

        arun(main())


def test_tls_single_server(tmp_path):
    tls = make_certs(tmp_path / "tls")
    node = RedisNode(tmp_path / "n", tls=tls).start()
    try:
        limit = Limit("token_bucket", 5, 3600)

        async def main():
            for q in (tls.query(), tls.query(client_cert=False)):
                store = RedisStore(f"rediss://127.0.0.1:{node.port}/0?{q}", timeout_ms=2000, key_prefix=prefix())
                try:
                    await store.start()
                    assert [(await store.hit("a", limit)).remaining for _ in range(6)][-2:] == [0, 0]
                    assert store.kind == "single" and store.topology()["nodes"][0]["reachable"] is True
                finally:
                    await store.close()
            # plain TCP to a TLS port, and TLS with the host name unchecked against a wrong name
            for url in (f"redis://127.0.0.1:{node.port}/0", f"rediss://localhost:{node.port}/0?{tls.query()}"):
                store = RedisStore(url, timeout_ms=500, key_prefix=prefix())
                try:
                    if url.startswith("redis:"):
                        with pytest.raises(StoreError):
                            await store.hit("a", limit)
                    else:  # localhost is in the certificate too: it works
                        assert (await store.hit("a", limit)).allowed
                finally:
                    await store.close()

        arun(main())
    finally:
        node.stop()


def test_cluster_url_with_only_dead_seeds_is_a_store_error_quickly():
    a, b = free_ports(2)

    async def main():
        store = RedisStore(f"redis+cluster://127.0.0.1:{a},127.0.0.1:{b}/", timeout_ms=100)
        try:
            await store.start(budget=0.5)
            t0 = time.monotonic()
            with pytest.raises(StoreError, match=r"no node serves slot|Connection refused|unreachable"):
                await store.hit("k", Limit("fixed_window", 1, 1))
            assert time.monotonic() - t0 < 0.1 + SLACK
            assert store.topology()["last_refresh_error"]
        finally:
            await store.close()

    arun(main())


def test_cluster_client_refresh_prefers_reachable_nodes(redis_cluster):
    """A dead seed listed first costs nothing once the map is known: the map is
    asked of the primaries first."""
    (dead,) = free_ports(1)

    async def main():
        cc = ClusterClient([Address("127.0.0.1", dead), Address("127.0.0.1", redis_cluster.nodes[0].port)], timeout=0.5)
        try:
            assert await cc.refresh(2.0)
            assert await cc.refresh(2.0)
            assert cc.last_refresh_error is None and len(cc.primaries()) == 3
        finally:
            await cc.close()

    arun(main())


@pytest.mark.parametrize("alg", ALGORITHMS)
def test_every_algorithm_exact_under_concurrency_on_the_cluster(redis_cluster, alg):
    """64 concurrent hits on each of 30 keys from two stores (two connections per
    primary) admit exactly the limit per key."""
    limit = Limit(alg, 7, 3600)
    pre = prefix()

    async def main():
        a = RedisStore(redis_cluster.url, timeout_ms=5000, key_prefix=pre)
        b = RedisStore(redis_cluster.url, timeout_ms=5000, key_prefix=pre)
        try:
            keys = [f"c{i}" for i in range(30)]
            res = await asyncio.gather(*((a if i % 2 else b).hit(k, limit) for k in keys for i in range(16)))
            per = {}
            for (k, _), d in zip(((k, i) for k in keys for i in range(16)), res):
                per[k] = per.get(k, 0) + d.allowed
            assert set(per.values()) == {limit.capacity}, per
        finally:
            await a.close()
            await b.close()

    arun(main())


def test_wait_role_helper_and_replicas_follow(redis_cluster):
    """The fixture's replicas replicate: a decision's key shows up on its primary's replica."""
    limit = Limit("fixed_window", 3, 3600)
    pre = prefix()

    async def main():
        store = RedisStore(redis_cluster.url, timeout_ms=2000, key_prefix=pre)
        try:
            await store.hit("rep", limit)
            (rk,) = store.redis_keys("rep", limit)
            shard = redis_cluster.shard_of(key_slot(rk.encode()))
            replica = shard.replicas[0]
            wait_role(replica, b"slave", 5)
            c = replica.client()
            try:
                c.execute_command("READONLY")
                wait_for(lambda: c.execute_command("GET", rk) is not None, 5, "the key on the replica")
            finally:
                c.close()
        finally:
            await store.close()

    arun(main())


BRACES = st.text(alphabet="ab{}:|é", max_size=6)


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(prefix=BRACES, name=BRACES, keys=st.lists(BRACES, min_size=1, max_size=4))
def test_the_hot_path_routes_every_key_to_its_slot_braces_anywhere(redis_cluster, prefix, name, keys):
    """The store continues the CRC16 of the hash tag from the key head (or, when a
    brace in the prefix or the rule's name moves the tag, computes it whole): a
    wrong slot would show as a MOVED redirect."""
    limit = Limit("fixed_window", 100, 60, name=name)

    async def main():
        store = RedisStore(redis_cluster.url, timeout_ms=2000, key_prefix="p" + prefix)
        try:
            await store.start()
            for k in keys:
                assert (await store.hit(k, limit)).allowed
                (rk,) = store.redis_keys(k, limit)
                assert store.client.slots[key_slot(rk.encode())] is not None
            assert store.stats.redirects == {"moved": 0, "ask": 0}
        finally:
            await store.close()

    arun(main())
