"""RedisStore against a real redis-server: TTLs, key layout, one EVALSHA round
trip per decision, NOSCRIPT recovery, server time, atomicity under concurrency,
and StoreError within the timeout when Redis is slow (SIGSTOP) or down (killed)."""

from __future__ import annotations

import asyncio
import hashlib
import math
import random
import re
import time
import uuid
from array import array

import pytest
import redis.asyncio as aioredis
from hypothesis import given, settings
from hypothesis import strategies as st
from redis.crc import key_slot

from netlimit.limit.algorithms import ALGORITHMS, Limit, decide
from netlimit.limit.stores import RedisStore, StoreError, hash_key, limit_lua
from netlimit.limit.stores.redis import _pack

# Slack for event-loop scheduling on a busy CI box on top of timeout_ms.
SLACK = 0.03


def arun(coro):
    return asyncio.run(coro)


def prefix() -> str:
    return f"t{uuid.uuid4().hex[:10]}"


async def admin(server):
    return aioredis.Redis.from_url(server.url, decode_responses=True)


LIMITS = {
    "token_bucket": Limit("token_bucket", 10, 1, burst=20),
    "leaky_bucket": Limit("leaky_bucket", 5, 2, burst=3, delay=True),
    "fixed_window": Limit("fixed_window", 7, 30),
    "fixed_window_admitted": Limit("fixed_window_admitted", 7, 30),
    "sliding_window_counter": Limit("sliding_window_counter", 9, 20),
    "sliding_window_log": Limit("sliding_window_log", 6, 10),
}


# ------------------------------------------------------------------ keys and TTLs


@pytest.mark.parametrize("alg", ALGORITHMS)
def test_written_keys_carry_ttls_just_past_the_state_lifetime(redis_server, alg):
    limit = LIMITS[alg]

    async def main():
        pre = prefix()
        store = RedisStore(redis_server.url, timeout_ms=1000, key_prefix=pre)
        r = await admin(redis_server)
        try:
            d = await store.hit("ip:1.2.3.4", limit, 2)  # server time
            assert d.allowed
            (k,) = store.redis_keys("ip:1.2.3.4", limit)
            assert await r.keys(pre + "*") == [k]  # one key per decision, the sliding log's too
            # the state matters for at most `reset` (window end for fixed, the full
            # window for the log) -- the TTL is that plus a one second margin
            lifetime = limit.period if alg == "sliding_window_log" else d.reset
            ttl = await r.pttl(k)
            assert 0 < ttl <= math.ceil(lifetime * 1000) + 1000, (k, ttl, lifetime)
            assert ttl >= lifetime * 1000 + 1000 - 200, (k, ttl)  # less only by elapsed time
        finally:
            await store.close()
            await r.aclose()

    arun(main())


def test_idle_keys_vanish(redis_server):
    async def main():
        store = RedisStore(redis_server.url, timeout_ms=1000, key_prefix=prefix())
        r = await admin(redis_server)
        try:
            limit = Limit("token_bucket", 100, 1)  # refills 1 token in 10 ms
            await store.hit("gone", limit)
            (k,) = store.redis_keys("gone", limit)
            assert await r.exists(k)
            deadline = time.monotonic() + 3
            while await r.exists(k) and time.monotonic() < deadline:
                await asyncio.sleep(0.05)
            assert not await r.exists(k)
        finally:
            await store.close()
            await r.aclose()

    arun(main())


@pytest.mark.parametrize("key", ["1.2.3.4", "user:{42}", "}{", "{}", "x" * 1000])
def test_one_key_per_decision_under_a_cluster_hash_tag(key):
    store = RedisStore("redis://127.0.0.1:1/0", key_prefix="netlimit")
    limit = Limit("sliding_window_log", 5, 60, name="login")
    (k,) = store.redis_keys(key, limit)
    assert k.startswith("netlimit:{login|swl|5/60.0|")
    # the hash tag is the rule signature and the key (up to a '}' in the key)
    tag = k[len("netlimit:{") :].split("}", 1)[0]
    assert key_slot(k.encode()) == key_slot(tag.encode())
    assert len(k) < 120  # long keys are hashed
    if len(key) > 256:
        assert hash_key(key) in k


def test_peek_writes_nothing(redis_server):
    async def main():
        store = RedisStore(redis_server.url, timeout_ms=1000, key_prefix=prefix())
        r = await admin(redis_server)
        try:
            for alg, limit in LIMITS.items():
                d = await store.peek("p", limit, 1)
                assert d.allowed, alg
                assert not any([await r.exists(k) for k in store.redis_keys("p", limit)]), alg
                await store.hit("p", limit, 1)
                assert await r.exists(store.redis_keys("p", limit)[0]), alg
        finally:
            await store.close()
            await r.aclose()

    arun(main())


# ------------------------------------------------------------------ sliding log members


def test_sliding_log_keeps_one_member_per_unit_when_the_clock_steps_back(redis_server):
    """Members are '<now>:<count + j>'; a now that steps back can meet members of
    that earlier now numbered above today's count (ZADD NX adds fewer than
    cost), and the rest must still get members of their own.  After every
    event (probes included: they change nothing) the stored scores must be
    exactly the reference's log, and the clash path must have been taken."""
    limit = Limit("sliding_window_log", 6, 10)
    rng = random.Random(7)

    async def main():
        store = RedisStore(redis_server.url, timeout_ms=1000, key_prefix=prefix())
        r = await admin(redis_server)
        (k,) = store.redis_keys("k", limit)
        state = None
        clashes = 0
        try:
            # The clash: 1:1 and 5:2, a cost 0 hit at 11.5 expires 1:1, then at 5
            # again count is 1 and 5:2 is taken.  Then that pattern with random
            # costs, probes (which must not expire anything) and a random walk.
            events = [("hit", 1.0, 1), ("hit", 5.0, 1), ("hit", 11.5, 0), ("hit", 5.0, 2)]
            for b in range(30, 3000, 30):
                for dt in (0, 5, rng.choice([5, 11.5, 20]), 11.5, 5, 5, rng.choice([-1, 0, 5, 9])):
                    op = "peek" if rng.random() < 0.2 else "hit"
                    events.append((op, b + dt, rng.choice([0, 1, 1, 2, 3])))
            t = 3000.0
            for _ in range(300):
                t += rng.choice([0, 0, 1, 1, 2, 3, 6, 11, -2, -5, -9])
                events.append((rng.choice(["hit", "hit", "hit", "peek"]), t, rng.choice([0, 1, 1, 1, 2, 3, 6])))
            for i, (op, now, cost) in enumerate(events):
                if op == "peek":  # changes nothing, in the reference nor in Redis
                    want, _ = decide(limit, None if state is None else array("d", state), now, cost)
                else:
                    want, state = decide(limit, state, now, cost)
                got = await getattr(store, op)("k", limit, cost, now=now)
                assert got == want, (i, op, now, cost)
                stored = await r.zrange(k, 0, -1, withscores=True)
                assert [sc for _, sc in stored] == list(state or []), (i, op, now, cost)
                assert all(float(m.rsplit(":", 1)[0]) == sc for m, sc in stored)
                clashes += any(int(m.rsplit(":", 1)[1]) > limit.limit for m, _ in stored)

            assert clashes > 20, clashes
        finally:
            await store.close()
            await r.aclose()

    arun(main())


def test_sliding_log_stamps_entries_with_the_server_time(redis_server):
    """With the server's clock the stamp is TIME's '<seconds>.<microseconds>'
    (zero-padded to 6 digits), and the score is exactly that decimal."""
    limit = Limit("sliding_window_log", 1000, 60)

    async def main():
        store = RedisStore(redis_server.url, timeout_ms=1000, key_prefix=prefix())
        r = await admin(redis_server)
        (k,) = store.redis_keys("t", limit)
        try:
            sec, usec = await r.time()
            before = float(f"{sec}.{usec:06d}")
            for i in range(30):
                d = await store.hit("t", limit)
                assert d.allowed and d.remaining == 1000 - i - 1
            sec, usec = await r.time()
            after = float(f"{sec}.{usec:06d}")
            stored = await r.zrange(k, 0, -1, withscores=True)
            assert len(stored) == 30
            for m, sc in stored:
                stamp, n = m.split(":")
                assert re.fullmatch(r"\d+\.\d{6}", stamp) and 1 <= int(n) <= 30, m
                assert float(stamp) == sc and before <= sc <= after, (m, sc)
        finally:
            await store.close()
            await r.aclose()

    arun(main())


def test_sliding_log_counts_members_left_by_earlier_versions(redis_server):
    """Before the members were named '<timestamp>:<n>' they were bare numbers from
    a '...:seq' counter; such a log (and its counter) left behind by an upgrade
    is read as it stands, and the counter is never touched again."""
    limit = Limit("sliding_window_log", 3, 10)

    async def main():
        store = RedisStore(redis_server.url, timeout_ms=1000, key_prefix=prefix())
        r = await admin(redis_server)
        (k,) = store.redis_keys("old", limit)
        try:
            await r.zadd(k, {"1": 100.0, "2": 101.0})
            await r.set(k + ":seq", 2, px=11_000)
            state = array("d", [100.0, 101.0])
            for now, cost in [(102.0, 1), (103.0, 1), (110.5, 2), (111.0, 1), (111.0, 1)]:
                want, state = decide(limit, state, now, cost)
                assert await store.hit("old", limit, cost, now=now) == want, (now, cost)
            assert [sc for _, sc in await r.zrange(k, 0, -1, withscores=True)] == list(state)
            assert await r.get(k + ":seq") == "2"
        finally:
            await store.close()
            await r.aclose()

    arun(main())


# ------------------------------------------------------------------ scripts and round trips


def test_scripts_are_loaded_under_their_sha1(redis_server):
    async def main():
        store = RedisStore(redis_server.url, timeout_ms=1000)
        try:
            shas = [hashlib.sha1(limit_lua(limit).encode()).hexdigest() for limit in LIMITS.values()]
            await store.client.execute_command(b"SCRIPT", b"FLUSH")
            assert not any(await store.client.execute_command(b"SCRIPT", b"EXISTS", *shas))
            await store.load_scripts(*LIMITS.values())
            assert all(await store.client.execute_command(b"SCRIPT", b"EXISTS", *shas))
        finally:
            await store.close()

    arun(main())


def test_exactly_one_evalsha_round_trip_per_decision(redis_server):
    async def main():
        store = RedisStore(redis_server.url, timeout_ms=1000, key_prefix=prefix())
        r = await admin(redis_server)
        sent: list[str] = []
        client = store.client
        orig = client.send_packed  # every command goes through it (execute_command too)

        def counting(data, *args, **kw):
            sent.append(data.split(b"\r\n")[2].decode().upper())  # *N, $len, NAME
            return orig(data, *args, **kw)

        try:
            await store.load_scripts(*LIMITS.values())
            client.send_packed = counting
            await r.config_resetstat()
            n = 0
            for i in range(30):
                for limit in LIMITS.values():
                    await (store.hit if i % 3 else store.peek)(f"k{i % 4}", limit, 1 + i % 2)
                    n += 1
            stats = await r.info("commandstats")
            assert stats["cmdstat_evalsha"]["calls"] == n
            assert "cmdstat_eval" not in stats and "cmdstat_script" not in stats
            assert sent == ["EVALSHA"] * n  # one command, one round trip, per decision
        finally:
            client.send_packed = orig
            await store.close()
            await r.aclose()

    arun(main())


def test_noscript_after_script_flush_recovers_and_keeps_state(redis_server):
    async def main():
        store = RedisStore(redis_server.url, timeout_ms=1000, key_prefix=prefix())
        r = await admin(redis_server)
        try:
            limit = Limit("fixed_window", 3, 3600)
            assert (await store.hit("f", limit, 2, now=10.0)).remaining == 1
            await r.script_flush()
            await r.config_resetstat()
            d = await store.hit("f", limit, 1, now=11.0)  # NOSCRIPT -> SCRIPT LOAD -> EVALSHA
            assert d.allowed and d.remaining == 0
            stats = await r.info("commandstats")
            assert (
                stats["cmdstat_script|load"]["calls"] == 1
                if "cmdstat_script|load" in stats
                else stats["cmdstat_script"]["calls"] == 1
            )
            assert stats["cmdstat_evalsha"]["calls"] == 2
            assert not (await store.hit("f", limit, 1, now=12.0)).allowed
        finally:
            await store.close()
            await r.aclose()

    arun(main())


# ------------------------------------------------------------------ per-limit scripts, packed admissions


def test_the_usual_call_sends_no_argv_and_others_send_cost_now_and_dry(redis_server):
    """The limit's constants are in its script: cost 1 on the server's clock is
    EVALSHA sha 1 key and nothing more; anything else adds cost, now, dry run."""

    async def main():
        store = RedisStore(redis_server.url, timeout_ms=1000, key_prefix=prefix())
        limit = LIMITS["fixed_window"]
        sent: list[bytes] = []
        client = store.client
        orig = client.send_packed

        def counting(data, *args, **kw):
            sent.append(data)
            return orig(data, *args, **kw)

        try:
            await store.load_scripts(limit)
            client.send_packed = counting
            await store.hit("a", limit)
            await store.hit("a", limit, 2)
            await store.peek("a", limit)
            await store.hit("a", limit, now=100.0)
            argvs = [d.split(b"\r\n")[10:-1:2] for d in sent]  # *N $7 EVALSHA $40 sha $1 1 $n key, then ARGV
            assert argvs == [[], [b"2", b"", b"0"], [b"1", b"", b"1"], [b"1", b"100.0", b"0"]]
            assert all(
                d.split(b"\r\n")[4] == hashlib.sha1(limit_lua(limit).encode()).hexdigest().encode() for d in sent
            )
        finally:
            client.send_packed = orig
            await store.close()

    arun(main())


def test_packed_admissions_decode_to_the_same_decision_as_the_full_reply(redis_server):
    """An admission is one integer (remaining * pack + reset in µs) where the
    limit allows it, else the full table.  Both sides of one limit, on the
    server's clock: same remaining, resets within a microsecond of what the
    window arithmetic says."""

    async def main():
        store = RedisStore(redis_server.url, timeout_ms=1000, key_prefix=prefix())
        r = await admin(redis_server)
        try:
            for limit in (Limit("fixed_window", 100, 60), Limit("fixed_window", 4_000_000_000, 3600)):
                src = limit_lua(limit)
                packs = _pack(limit) is not None
                assert packs == (limit.limit < 2**20)  # (cap + 1) * pack <= 2**53
                (k,) = store.redis_keys("p", limit)
                raw = await r.eval(src, 1, k)  # the script as EVALSHA runs it, reply undecoded
                assert isinstance(raw, int) if packs else raw[:3] == [1, limit.limit, limit.limit - 1]
                sec, usec = await r.time()
                d = await store.hit("p", limit)
                assert d.allowed and d.remaining == limit.limit - 2 and d.limit == limit.limit
                now = sec + usec / 1e6
                want = (math.floor(now / limit.period) + 1) * limit.period - now
                assert want - 0.5 <= d.reset <= want + 1e-6, (limit, d.reset, want)
                assert d.retry_after == 0 and d.delay == 0
        finally:
            await store.close()
            await r.aclose()

    arun(main())


def test_a_reset_beyond_the_packed_range_answers_the_full_table(redis_server):
    """A clock that steps far back keeps the later window: the reset is then
    longer than any packed one, and the script answers the full table, the
    same decision as the reference."""

    async def main():
        store = RedisStore(redis_server.url, timeout_ms=1000, key_prefix=prefix())
        limit = Limit("fixed_window", 5, 1)
        state = None
        try:
            for i, (now, cost) in enumerate(((1_000_000.5, 1), (10.25, 1), (10.25, 2), (10.5, 3))):
                want, state = decide(limit, state, now, cost)
                got = await store.hit("b", limit, cost, now=now)
                assert (got.allowed, got.remaining) == (want.allowed, want.remaining)
                assert abs(got.reset - want.reset) <= 1e-6
                assert got.reset > 999_990 if i else got.reset == 0.5
        finally:
            await store.close()

    arun(main())


@settings(max_examples=300, deadline=None)
@given(
    alg=st.sampled_from(ALGORITHMS),
    limit=st.integers(1, 0xFFFFFFFF),
    period=st.floats(1e-3, 1e7, allow_nan=False),
    burst=st.none() | st.integers(1, 0xFFFFFFFF),
)
def test_pack_leaves_room_for_every_remaining_and_a_steady_reset(alg, limit, period, burst):
    bucket = alg in ("token_bucket", "leaky_bucket")
    lim = Limit(alg, limit, period, burst=burst if bucket else None)
    pack = _pack(lim)
    steady_us = 2e6 * max(lim.period, lim.capacity / lim.rate)  # the longest steady reset, in µs
    if pack is None:  # the full table instead: only when no power of two fits
        assert (lim.capacity + 1) * (steady_us + 2) > 2**52
        return
    assert pack & (pack - 1) == 0
    assert (lim.capacity + 1) * pack <= 2**53  # exact in Lua's doubles
    assert pack > steady_us


@pytest.mark.parametrize("alg", ["fixed_window", "sliding_window_counter"])
def test_window_ttls_are_set_once_per_window(redis_server, alg):
    """The first write in a window sets the TTL (the state's end + 1 s); later
    writes in that window keep whatever TTL the key has (KEEPTTL), and the first
    write of the next window sets a new one.  The TTL is moved by hand in
    between, so a script that set it on every write would show."""

    async def main():
        store = RedisStore(redis_server.url, timeout_ms=1000, key_prefix=prefix())
        r = await admin(redis_server)
        limit = Limit(alg, 1000, 3600)
        lifetime = 3599.5 + (3600 if alg == "sliding_window_counter" else 0)  # at now = 7200.5
        try:
            (k,) = store.redis_keys("w", limit)
            await store.hit("w", limit, now=7200.5)
            ttl = await r.pttl(k)
            assert lifetime * 1000 + 1000 - 200 <= ttl <= lifetime * 1000 + 1000, ttl
            moved = await r.pexpiretime(k) + 5_000_000
            await r.pexpireat(k, moved)
            for now in (7300.0, 9000.0, 10_799.0):  # the same window
                await store.hit("w", limit, now=now)
                assert await r.pexpiretime(k) == moved, now
            await store.hit("w", limit, now=10_800.25)  # the next one
            ttl = await r.pttl(k)
            want = 3599.75 + (3600 if alg == "sliding_window_counter" else 0)
            assert want * 1000 + 1000 - 200 <= ttl <= want * 1000 + 1001, ttl
        finally:
            await store.close()
            await r.aclose()

    arun(main())


# ------------------------------------------------------------------ time and atomicity


def test_time_comes_from_the_redis_server(redis_server):
    async def main():
        store = RedisStore(redis_server.url, timeout_ms=1000, key_prefix=prefix())
        r = await admin(redis_server)
        try:
            limit = Limit("token_bucket", 1, 3600, burst=1)
            sec, usec = await r.time()
            before = sec + usec / 1e6
            assert (await store.hit("t", limit)).allowed
            sec, usec = await r.time()
            after = sec + usec / 1e6
            tokens, last = map(float, (await r.get(store.redis_keys("t", limit)[0])).split())
            assert tokens == 0 and before <= last <= after
            d = await store.hit("t", limit)
            assert not d.allowed and 3600 - (after - before) - 0.5 <= d.retry_after <= 3600
            fw = Limit("fixed_window", 1, 60)
            d = await store.hit("t", fw)
            assert 0 < d.reset <= 60
            frac = (before + d.reset) % 60  # windows end on whole minutes of the epoch
            assert min(frac, 60 - frac) < 1.0, frac
        finally:
            await store.close()
            await r.aclose()

    arun(main())


@pytest.mark.parametrize("alg", ALGORITHMS)
def test_concurrent_hits_admit_exactly_the_limit(redis_server, alg):
    """200 concurrent decisions on one key over 4 connections: Lua makes each atomic."""
    limit = Limit(alg, 50, 3600) if alg != "leaky_bucket" else Limit(alg, 50, 3600, burst=50)

    async def main():
        stores = [RedisStore(redis_server.url, timeout_ms=5000, key_prefix="") for _ in range(4)]
        key = prefix()
        try:
            ds = await asyncio.gather(*(stores[i % 4].hit(key, limit) for i in range(200)))
            assert sum(d.allowed for d in ds) == 50
            assert sorted(d.remaining for d in ds if d.allowed) == list(range(50))
        finally:
            for s in stores:
                await s.close()

    arun(main())


# ------------------------------------------------------------------ failures: StoreError within the timeout


async def timed(coro):
    t = time.monotonic()
    try:
        await coro
    except StoreError as e:
        return time.monotonic() - t, e
    raise AssertionError("expected StoreError")


def test_paused_redis_raises_store_error_within_the_timeout(redis_factory):
    server = redis_factory()
    limit = Limit("token_bucket", 100, 1)

    async def main():
        store = RedisStore(server.url, timeout_ms=50, key_prefix=prefix())
        fresh = RedisStore(server.url, timeout_ms=50, key_prefix=prefix())
        try:
            assert (await store.hit("k", limit)).allowed  # pooled connection established
            server.pause()
            try:
                for s in (store, store, fresh):  # pooled connection, again, and a brand-new one
                    elapsed, err = await timed(s.hit("k", limit))
                    assert elapsed <= 0.05 + SLACK, elapsed
                    assert "Timeout" in repr(err) or "timeout" in str(err).lower()
            finally:
                server.resume()
            d = await store.hit("k", limit)  # back to normal once Redis answers again
            assert d.allowed
        finally:
            await store.close()
            await fresh.close()

    arun(main())


def test_killed_redis_raises_store_error_quickly_and_recovers_on_restart(redis_factory):
    server = redis_factory()
    limit = Limit("sliding_window_log", 10, 60)

    async def main():
        store = RedisStore(server.url, timeout_ms=50, key_prefix=prefix())
        try:
            assert (await store.hit("k", limit)).allowed
            server.stop()
            for _ in range(3):
                elapsed, err = await timed(store.hit("k", limit))
                assert elapsed <= 0.05 + SLACK, elapsed
                assert isinstance(err.__cause__, Exception)
            server.start()  # same port, empty data set, no scripts loaded
            d = await store.hit("k", limit)  # reconnects, NOSCRIPT -> reload
            assert d.allowed and d.remaining == 9
        finally:
            await store.close()

    arun(main())


def test_nothing_listening_raises_store_error(redis_factory):
    server = redis_factory()
    url = server.url
    server.stop()

    async def main():
        store = RedisStore(url, timeout_ms=50)
        try:
            elapsed, _ = await timed(store.hit("k", Limit("fixed_window", 1, 1)))
            assert elapsed <= 0.05 + SLACK
            elapsed, _ = await timed(store.load_scripts(*LIMITS.values()))
            assert elapsed <= 1.0 + SLACK
        finally:
            await store.close()

    arun(main())


def test_corrupt_state_is_a_store_error_not_a_crash(redis_server):
    async def main():
        store = RedisStore(redis_server.url, timeout_ms=1000, key_prefix=prefix())
        r = await admin(redis_server)
        try:
            limit = Limit("fixed_window", 1, 60)
            (k,) = store.redis_keys("c", limit)
            await r.hset(k, "x", "y")  # WRONGTYPE for GET
            with pytest.raises(StoreError):
                await store.hit("c", limit)
        finally:
            await store.close()
            await r.aclose()

    arun(main())


def test_a_client_passed_in_is_left_open(redis_server):
    """Through redis-py too: a script Redis does not have (first use, or flushed)
    is loaded on NOSCRIPT and the decision goes through."""

    async def main():
        client = aioredis.Redis.from_url(redis_server.url)
        store = RedisStore(client, key_prefix=prefix(), timeout_ms=1000)
        limit = Limit("fixed_window", 1, 60)
        await client.script_flush()
        assert (await store.hit("k", limit)).allowed
        assert await client.script_exists(hashlib.sha1(limit_lua(limit).encode()).hexdigest()) == [True]
        assert not (await store.hit("k", limit)).allowed
        await store.close()
        assert await client.ping()
        await client.aclose()

    arun(main())


def test_limit_zero_needs_no_round_trip():
    async def main():
        store = RedisStore("redis://127.0.0.1:1/0", timeout_ms=50)  # nothing listens there
        d = await store.hit("k", Limit("fixed_window_admitted", 0, 60))
        assert not d.allowed and d.retry_after == math.inf
        # Lyft's fixed window counts the hits of a limit of 0 as well: it asks the store
        with pytest.raises(StoreError):
            await store.hit("k", Limit("fixed_window", 0, 60))
        await store.close()

    arun(main())
