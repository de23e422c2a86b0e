"""netlimit's lean Redis client (netlimit/limit/stores/resp.py) and RedisStore on it,
against real redis-server processes: pipelined concurrent commands get their
own replies, deadlines keep the connection in step, NOSCRIPT after SCRIPT FLUSH
recovers under concurrency, a killed server fails every in-flight command
quickly and the client reconnects after a restart (backing off in between),
AUTH (password and ACL user), SELECT, unix sockets, error replies.  Each test
runs on asyncio's default loop and on uvloop (the sidecar's).

The only non-Redis peer is a few lines of asyncio server that answer what a
real Redis never would (not RESP at all, or a reply of the wrong shape): the
"bad reply" cases cannot be produced otherwise.
"""

from __future__ import annotations

import asyncio
import os
import shutil
import signal
import socket
import ssl
import subprocess
import tempfile
import time
import uuid
from pathlib import Path

import pytest
import redis.asyncio as aioredis

from netlimit.limit.algorithms import Limit
from netlimit.limit.stores import RedisStore, StoreError, limit_lua
from netlimit.limit.stores.resp import (
    Address,
    NoScriptError,
    ReplyError,
    RespClient,
    RespConnectionError,
    RespProtocolError,
    RespTimeoutError,
    parse_url,
)

pytestmark = [pytest.mark.redis, pytest.mark.timeout(60)]

SLACK = 0.03  # event-loop scheduling on a busy box, on top of a timeout
REDIS_SERVER = os.environ.get("NETLIMIT_REDIS_SERVER") or shutil.which("redis-server") or "/usr/bin/redis-server"


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


# DEBUG SLEEP is disabled by default since Redis 7: a script that spins instead
SLEEP = (
    "EVAL",
    "local s = redis.call('TIME') repeat local n = redis.call('TIME') "
    "until (n[1] - s[1]) * 1e6 + (n[2] - s[2]) >= tonumber(ARGV[1]) * 1e6 return 'slept'",
    0,
)


def _require_redis_server() -> None:
    if not os.path.exists(REDIS_SERVER):
        pytest.fail(
            "redis-server is not installed: apt-get install redis-server (or set NETLIMIT_REDIS_SERVER)", pytrace=False
        )


_loop_factory = None


@pytest.fixture(autouse=True, params=["asyncio", "uvloop"])
def event_loop_kind(request):
    """Every test on the default loop and on uvloop (what the sidecar runs on)."""
    global _loop_factory
    if request.param == "uvloop":
        import uvloop

        _loop_factory = uvloop.new_event_loop
    else:
        _loop_factory = None
    yield request.param
    _loop_factory = None


class HostStalls:
    """A thread that notes the time every TICK s: where two notes are far apart, the
    whole process did not run (a busy or paused host), whatever its event loop was
    doing. A call blocking the loop does not stop this thread (the GIL is released in
    a blocking system call, and handed over at least every 5 ms otherwise), so a wait
    the code makes is never taken for the host's."""

    TICK = 0.002

    def __init__(self) -> None:
        import threading

        self.notes: list[float] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        for _ in range(100_000):  # bounded: 200 s at most
            self.notes.append(time.monotonic())
            if self._stop.wait(self.TICK):
                return

    def __enter__(self) -> HostStalls:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(5)

    def within(self, t0: float, t1: float) -> float:
        """The longest time in [t0, t1] the process did not run (s)."""
        import bisect

        n = self.notes
        i = max(1, bisect.bisect_right(n, t0))
        worst = 0.0
        while i < len(n) and n[i - 1] < t1:
            worst = max(worst, min(n[i], t1) - max(n[i - 1], t0) - self.TICK)
            i += 1
        return worst


def arun(coro):
    with asyncio.Runner(loop_factory=_loop_factory) as runner:
        return runner.run(coro)


def prefix() -> str:
    return f"t{uuid.uuid4().hex[:10]}"


class Server:
    """A redis-server with extra arguments (password, unix socket), in a temp dir."""

    def __init__(self, *extra: str, port: int | None = None, unix: bool = False) -> None:
        _require_redis_server()
        self.tmp = tempfile.TemporaryDirectory(prefix="netlimit-resp-")
        self.dir = Path(self.tmp.name)
        self.port = _free_port() if port is None else port
        self.sock = str(self.dir / "redis.sock") if unix else None
        self.extra = extra
        self.proc: subprocess.Popen | None = None

    def start(self) -> Server:
        args = [
            REDIS_SERVER,
            "--port",
            str(self.port),
            "--bind",
            "127.0.0.1",
            "--dir",
            str(self.dir),
            "--save",
            "",
            "--appendonly",
            "no",
            "--protected-mode",
            "no",
            "--logfile",
            str(self.dir / "redis.log"),
            *self.extra,
        ]
        if self.sock:
            args += ["--unixsocket", self.sock, "--unixsocketperm", "700"]
        self.proc = subprocess.Popen(args, stdout=subprocess.DEVNULL, stderr=subprocess.STDOUT)
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            assert self.proc.poll() is None, (self.dir / "redis.log").read_text()[-2000:]
            try:
                with socket.create_connection(("127.0.0.1", self.port), timeout=0.2) as s:
                    s.sendall(b"PING\r\n")
                    if s.recv(64)[:1] in (b"+", b"-"):  # PONG, or NOAUTH with a password
                        if self.sock is None or os.path.exists(self.sock):
                            return self
            except OSError:
                pass
            time.sleep(0.02)
        raise RuntimeError("redis-server did not start")

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            os.kill(self.proc.pid, signal.SIGCONT)
            self.proc.kill()
            self.proc.wait(timeout=10)

    def cleanup(self) -> None:
        self.stop()
        self.tmp.cleanup()


@pytest.fixture
def servers():
    made: list[Server] = []

    def make(*extra: str, **kw) -> Server:
        s = Server(*extra, **kw)
        made.append(s)
        return s.start()

    try:
        yield make
    finally:
        for s in made:
            s.cleanup()


async def admin(url: str):
    return aioredis.Redis.from_url(url, decode_responses=True)


# ------------------------------------------------------------------ URLs


@pytest.mark.parametrize(
    "url, addr",
    [
        ("redis://127.0.0.1:6390/0", Address("127.0.0.1", 6390)),
        ("redis://localhost", Address("localhost", 6379)),
        ("redis://:s%40cret@10.0.0.1:7000/3", Address("10.0.0.1", 7000, password="s@cret", db=3)),
        ("redis://alice:pw@[::1]:6379/1", Address("::1", 6379, username="alice", password="pw", db=1)),
        ("redis://h:1?db=2", Address("h", 1, db=2)),
        ("unix:///run/redis/redis.sock", Address(path="/run/redis/redis.sock")),
        ("unix://:pw@/tmp/r.sock?db=5", Address(path="/tmp/r.sock", password="pw", db=5)),
    ],
)
def test_urls_the_lean_client_takes(url, addr):
    assert parse_url(url) == addr


def test_rediss_is_the_lean_client_with_tls():
    addr = parse_url("rediss://127.0.0.1:6380/0?ssl_cert_reqs=none&ssl_check_hostname=false")
    assert addr == Address("127.0.0.1", 6380) and addr.ssl is not None
    assert addr.ssl.verify_mode == ssl.CERT_NONE and not addr.ssl.check_hostname
    strict = parse_url("rediss://h:6380")
    assert strict.ssl.verify_mode == ssl.CERT_REQUIRED and strict.ssl.check_hostname
    assert isinstance(RedisStore("rediss://h:6380").client, RespClient)


@pytest.mark.parametrize("url", ["redis://h:1/0?protocol=3", "redis://h:1/0?socket_keepalive=true"])
def test_unknown_options_fall_back_to_redis_py(url):
    assert parse_url(url) is None
    store = RedisStore(url)
    assert isinstance(store.client, aioredis.Redis)


@pytest.mark.parametrize(
    "url", ["redis://h:1/x", "http://h:1/", "redis://h:1/0?ssl_cert_reqs=none", "redis+cluster://h:1/2"]
)
def test_bad_urls_are_refused(url):
    with pytest.raises(ValueError):
        parse_url(url)
    with pytest.raises(ValueError):
        RedisStore(url)


def test_cluster_and_sentinel_urls_are_not_one_server():
    assert parse_url("redis+cluster://a:1,b:2/") is None
    assert parse_url("redis+sentinel://a:1/svc") is None


def test_url_stores_use_the_lean_client():
    assert isinstance(RedisStore("redis://127.0.0.1:1/0").client, RespClient)
    assert isinstance(RedisStore("unix:///nonexistent.sock").client, RespClient)


# ------------------------------------------------------------------ pipelining


def test_concurrent_commands_are_pipelined_and_each_gets_its_own_reply(redis_server):
    async def main():
        c = RespClient(redis_server.url, timeout=5)
        key = prefix()
        try:
            assert await c.ping()
            sent, writes = c.commands_sent, c.writes
            n = 2000
            # interleave kinds of replies: bulk, integer, array, nil, error
            futs = []
            for i in range(n):
                m = i % 5
                if m == 0:
                    futs.append(c.execute_command("ECHO", f"v{i}"))
                elif m == 1:
                    futs.append(c.execute_command("INCR", key))
                elif m == 2:
                    futs.append(c.execute_command("LRANGE", key + ":l", 0, -1))
                elif m == 3:
                    futs.append(c.execute_command("GET", key + ":nil"))
                else:
                    futs.append(c.execute_command("HGET", key, "f"))  # WRONGTYPE: key is a string
            res = await asyncio.gather(*futs, return_exceptions=True)
            incr = 0
            for i, r in enumerate(res):
                m = i % 5
                if m == 0:
                    assert r == f"v{i}".encode()
                elif m == 1:
                    incr += 1
                    assert r == incr  # replies in the order the commands were issued
                elif m == 2:
                    assert r == []
                elif m == 3:
                    assert r is None
                else:
                    assert isinstance(r, ReplyError) and str(r).startswith("WRONGTYPE")
            assert c.commands_sent - sent == n
            assert c.writes - writes < n / 10  # issued in one loop iteration: a few writes
            assert await c.execute_command("ECHO", "after") == b"after"  # still in step
        finally:
            await c.aclose()

    arun(main())


def test_concurrent_decisions_one_evalsha_each_and_the_right_answers(redis_server):
    """64 tasks x 50 decisions on 32 keys, each key under its own cost: every
    decision is one EVALSHA (server's commandstats), each task gets its own
    Decision, and the per-key totals are exact."""

    async def main():
        store = RedisStore(redis_server.url, timeout_ms=5000, key_prefix=prefix())
        r = await admin(redis_server.url)
        limit = Limit("fixed_window", 10_000, 3600)
        got: dict[str, list[int]] = {f"k{i}": [] for i in range(32)}
        try:
            await store.load_scripts(limit)
            await r.config_resetstat()
            sent0 = store.client.commands_sent

            async def task(t: int) -> None:
                for j in range(50):
                    k = f"k{(t + j) % 32}"
                    cost = 1 + (t + j) % 32 % 3
                    d = await store.hit(k, limit, cost, now=1000.0)
                    assert d.allowed
                    got[k].append(10_000 - d.remaining)

            await asyncio.gather(*(task(t) for t in range(64)))
            stats = await r.info("commandstats")
            assert stats["cmdstat_evalsha"]["calls"] == 64 * 50
            assert store.client.commands_sent - sent0 == 64 * 50
            for i in range(32):
                used = sorted(got[f"k{i}"])
                cost = 1 + i % 3
                assert used == [cost * (n + 1) for n in range(len(used))], (i, used[:5])
        finally:
            await store.close()
            await r.aclose()

    arun(main())


# ------------------------------------------------------------------ deadlines


def test_a_late_reply_is_dropped_and_the_connection_stays_in_step(redis_server):
    async def main():
        c = RespClient(redis_server.url, timeout=0.05)
        try:
            assert await c.ping()
            t = time.monotonic()
            with pytest.raises(RespTimeoutError):
                await c.execute_command(*SLEEP, "0.3")
            assert time.monotonic() - t <= 0.05 + SLACK
            # queued behind the sleep on the same connection: their own replies, not +OK
            a = c.execute_command("ECHO", "a", timeout=2)
            b = c.execute_command("ECHO", "b", timeout=2)
            assert await asyncio.gather(a, b) == [b"a", b"b"]
            assert c.connects == 1
        finally:
            await c.aclose()

    arun(main())


def test_a_silent_connection_is_dropped_after_dead_after(servers):
    srv = servers()

    async def main():
        c = RespClient(srv.url, timeout=0.05, dead_after=0.3)
        try:
            assert await c.ping()
            os.kill(srv.proc.pid, signal.SIGSTOP)
            try:
                for _ in range(3):
                    with pytest.raises(RespTimeoutError):
                        await c.ping()
                await asyncio.sleep(0.5)  # past dead_after: the client gave up on the connection
                assert not c.connected
            finally:
                os.kill(srv.proc.pid, signal.SIGCONT)
            assert await c.ping(timeout=2)
            assert c.connects == 2
        finally:
            await c.aclose()

    arun(main())


# ------------------------------------------------------------------ NOSCRIPT


def test_noscript_after_script_flush_recovers_under_concurrency(redis_server):
    async def main():
        store = RedisStore(redis_server.url, timeout_ms=2000, key_prefix=prefix())
        r = await admin(redis_server.url)
        limit = Limit("sliding_window_log", 100, 3600)
        try:
            await store.load_scripts(limit)
            await r.script_flush()
            await r.config_resetstat()
            ds = await asyncio.gather(*(store.hit(f"k{i % 4}", limit, now=50.0) for i in range(40)))
            assert all(d.allowed for d in ds)
            assert sorted(d.remaining for d in ds) == sorted([100 - n for n in range(1, 11)] * 4)
            stats = await r.info("commandstats")
            loads = stats.get("cmdstat_script|load", stats.get("cmdstat_script", {})).get("calls", 0)
            # every decision that met NOSCRIPT reloaded (back to back with its retry)
            assert 1 <= loads <= 40
            assert stats["cmdstat_evalsha"]["calls"] == 40 + loads
            await r.config_resetstat()
            await store.hit("again", limit)
            assert (await r.info("commandstats"))["cmdstat_evalsha"]["calls"] == 1
        finally:
            await store.close()
            await r.aclose()

    arun(main())


def test_noscript_is_its_own_error_on_the_client(redis_server):
    async def main():
        c = RespClient(redis_server.url, timeout=1)
        try:
            with pytest.raises(NoScriptError):
                await c.execute_command("EVALSHA", "0" * 40, 0)
            sha = await c.script_load("return 7")
            assert await c.execute_command("EVALSHA", sha, 0) == 7
        finally:
            await c.aclose()

    arun(main())


# ------------------------------------------------------------------ a killed server


def test_killed_server_fails_in_flight_commands_at_once_and_the_client_reconnects(servers):
    srv = servers()

    async def main():
        c = RespClient(srv.url, timeout=0.5)
        store = RedisStore(srv.url, timeout_ms=50, key_prefix=prefix())
        limit = Limit("token_bucket", 10, 60)
        try:
            assert (await store.hit("k", limit)).allowed
            assert await c.ping()
            inflight = [c.execute_command(*SLEEP, "2")] + [c.execute_command("PING") for _ in range(50)]
            await asyncio.sleep(0.05)
            t = time.monotonic()
            srv.stop()
            res = await asyncio.gather(*inflight, return_exceptions=True)
            assert time.monotonic() - t < 0.2  # the loss, not the 0.5 s timeout
            assert all(isinstance(e, RespConnectionError) for e in res), res[:3]

            # down: StoreError within the timeout, connect attempts backing off (a
            # caller that the next attempt would make wait past its deadline fails
            # at once).  Many calls on a shared, busy box: the bound on each gets
            # more slack than above, the typical one must be immediate.
            # Each call's time is counted without the host's stalls (HostStalls: CI once
            # saw 0.41 s for one call on a busy shared host).
            errors, took, windows = [], [], []
            t_down = time.monotonic()
            with HostStalls() as host:
                while time.monotonic() - t_down < 0.6:
                    t = time.monotonic()
                    with pytest.raises(StoreError) as ei:
                        await store.hit("k", limit)
                    took.append(time.monotonic() - t)
                    windows.append((t, t + took[-1]))
                    errors.append(ei.value)
                    await asyncio.sleep(0.001)
            own = [d - host.within(a, b) for d, (a, b) in zip(took, windows)]
            assert max(own) <= 0.05 + 3 * SLACK, (max(own), max(took))
            assert sorted(took)[len(took) // 2] < 0.005
            assert all(isinstance(e.__cause__, (ConnectionError, TimeoutError)) for e in errors)
            assert any("next attempt in" in str(e) for e in errors)  # failed fast, no connect tried
            attempts = store.client._fails
            assert 2 <= attempts <= 10, attempts  # exponential backoff, not one per call

            srv.start()  # same port; empty data set, no scripts
            deadline = time.monotonic() + 3
            timed_out = 0  # calls that gave up at their 50 ms deadline: the server may still have run them
            while True:
                try:
                    d = await store.hit("k", limit)
                    break
                except StoreError as e:
                    timed_out += isinstance(e.__cause__, TimeoutError)
                    assert time.monotonic() < deadline, "no reconnect after the restart"
                    await asyncio.sleep(0.01)
            # a fresh bucket: this hit, and at most the hits that timed out on a busy box
            assert d.allowed and 9 - timed_out <= d.remaining <= 9, (d, timed_out)
            assert await c.ping()
        finally:
            await store.close()
            await c.aclose()

    arun(main())


def test_connect_timeout_is_a_timeout(servers):
    """A listener that never accepts past its backlog: connect times out."""

    async def main():
        ls = socket.socket()
        ls.bind(("127.0.0.1", 0))
        ls.listen(0)
        fillers = []
        try:
            port = ls.getsockname()[1]
            for _ in range(8):  # fill the accept backlog so SYNs go unanswered
                s = socket.socket()
                s.setblocking(False)
                s.connect_ex(("127.0.0.1", port))
                fillers.append(s)
            await asyncio.sleep(0.05)
            store = RedisStore(f"redis://127.0.0.1:{port}/0", timeout_ms=50)
            t = time.monotonic()
            with pytest.raises(StoreError) as ei:
                await store.hit("k", Limit("fixed_window", 1, 1))
            assert time.monotonic() - t <= 0.05 + SLACK
            assert isinstance(ei.value.__cause__, TimeoutError)
            await store.close()
        finally:
            for s in fillers:
                s.close()
            ls.close()

    arun(main())


# ------------------------------------------------------------------ AUTH, SELECT, unix socket


def test_password_protected_server(servers):
    srv = servers("--requirepass", "s3cr3t@pw")

    async def main():
        limit = Limit("fixed_window", 5, 60)
        good = RedisStore(f"redis://:s3cr3t%40pw@127.0.0.1:{srv.port}/0", timeout_ms=1000, key_prefix=prefix())
        wrong = RedisStore(f"redis://:nope@127.0.0.1:{srv.port}/0", timeout_ms=1000)
        none = RedisStore(srv.url, timeout_ms=1000)
        try:
            assert (await good.hit("k", limit)).remaining == 4
            with pytest.raises(StoreError, match=r"refused the handshake: WRONGPASS"):
                await wrong.hit("k", limit)
            # NOAUTH, or (Redis >= 6.2: more than 10 arguments before AUTH) a protocol error
            with pytest.raises(StoreError, match=r"NOAUTH|unauthenticated"):
                await none.hit("k", limit)
            assert (await good.hit("k", limit)).remaining == 3
        finally:
            for s in (good, wrong, none):
                await s.close()

    arun(main())


def test_acl_user_and_select(servers):
    srv = servers("--user", "default", "off", "--user", "alice", "on", ">pw", "~*", "&*", "+@all")

    async def main():
        store = RedisStore(f"redis://alice:pw@127.0.0.1:{srv.port}/3", timeout_ms=1000, key_prefix=prefix())
        r = aioredis.Redis(port=srv.port, db=3, username="alice", password="pw", decode_responses=True)
        try:
            assert (await store.hit("k", Limit("fixed_window", 5, 60))).allowed
            (k,) = store.redis_keys("k", Limit("fixed_window", 5, 60))
            assert await r.exists(k)  # written in db 3
            assert await r.acl_whoami() == "alice"
        finally:
            await store.close()
            await r.aclose()

    arun(main())


def test_unix_socket(servers):
    srv = servers(unix=True)

    async def main():
        store = RedisStore(f"unix://{srv.sock}?db=2", timeout_ms=1000, key_prefix=prefix())
        r = aioredis.Redis(unix_socket_path=srv.sock, db=2, decode_responses=True)
        try:
            limit = Limit("sliding_window_counter", 3, 60)
            ds = [await store.hit("u", limit) for _ in range(4)]
            assert [d.allowed for d in ds] == [True, True, True, False]
            assert await r.exists(store.redis_keys("u", limit)[0])
            assert store.client.address.path == srv.sock
        finally:
            await store.close()
            await r.aclose()

    arun(main())


# ------------------------------------------------------------------ errors and bad replies


def test_error_reply_is_a_store_error_and_the_connection_goes_on(redis_server):
    async def main():
        store = RedisStore(redis_server.url, timeout_ms=1000, key_prefix=prefix())
        r = await admin(redis_server.url)
        try:
            limit = Limit("token_bucket", 5, 60)
            (k,) = store.redis_keys("w", limit)
            await r.lpush(k, "x")
            with pytest.raises(StoreError, match=r"redis token_bucket for 'w': .*WRONGTYPE") as ei:
                await store.hit("w", limit)
            assert isinstance(ei.value.__cause__, ReplyError)
            assert (await store.hit("fine", limit)).allowed
            assert store.client.connects == 1
        finally:
            await store.close()
            await r.aclose()

    arun(main())


async def _fake_server(answer: bytes):
    """A TCP peer that answers every read with ``answer`` (not a Redis)."""

    async def handle(reader, writer):
        while await reader.read(65536):
            writer.write(answer)
        writer.close()

    return await asyncio.start_server(handle, "127.0.0.1", 0)


@pytest.mark.parametrize(
    "answer, cause, match",
    [
        (b"!!! not RESP\r\n", RespProtocolError, "not a RESP reply"),
        (b"+OK\r\n", None, "unexpected reply b'OK'"),
        (b"*2\r\n:1\r\n:2\r\n", None, "unexpected reply"),
    ],
)
def test_bad_reply_is_a_store_error(answer, cause, match):
    async def main():
        srv = await _fake_server(answer)
        port = srv.sockets[0].getsockname()[1]
        store = RedisStore(f"redis://127.0.0.1:{port}/0", timeout_ms=500)
        try:
            for _ in range(2):  # and again, on a fresh connection if the first was dropped
                with pytest.raises(StoreError, match=match) as ei:
                    await store.hit("k", Limit("fixed_window", 1, 60))
                if cause is not None:
                    assert isinstance(ei.value.__cause__, cause)
        finally:
            await store.close()
            srv.close()
            await srv.wait_closed()

    arun(main())


def test_the_same_store_across_event_loops(redis_server):
    store = RedisStore(redis_server.url, timeout_ms=1000, key_prefix=prefix())
    limit = Limit("fixed_window", 5, 3600)
    assert arun(store.hit("k", limit, now=7200.0)).remaining == 4
    assert arun(store.hit("k", limit, now=7200.0)).remaining == 3  # a new loop: reconnects
    arun(store.close())


def test_script_load_returns_the_sha_evalsha_uses(redis_server):
    async def main():
        c = RespClient(redis_server.url, timeout=1)
        try:
            import hashlib

            src = limit_lua(Limit("fixed_window", 5, 60))
            assert await c.script_load(src) == hashlib.sha1(src.encode()).hexdigest()
        finally:
            await c.aclose()

    arun(main())


# ------------------------------------------------------------------ the loop a client is bound to
# send_packed does not call asyncio.get_running_loop() per command (a getpid() on
# Python 3.11): it trusts the loop it is bound to while that loop runs in the
# calling thread and process. These two tests fail if either check goes.


def test_a_loop_running_in_another_thread_is_not_taken_for_the_callers(redis_server):
    import threading

    c = RespClient(redis_server.url, timeout=1)
    other = _loop_factory() if _loop_factory else asyncio.new_event_loop()
    t = threading.Thread(target=other.run_forever, daemon=True)
    t.start()
    try:
        # bound to `other`, which keeps running in its thread
        assert asyncio.run_coroutine_threadsafe(c.ping(), other).result(5)
        assert c._loop is other and other.is_running()
        # this thread's own loop: the client rebinds instead of using `other`
        assert arun(c.ping())
        assert c._loop is not other
    finally:
        other.call_soon_threadsafe(other.stop)
        t.join(5)
        other.close()


def test_a_forked_child_does_not_use_the_parents_connection(redis_server):
    async def main():
        c = RespClient(redis_server.url, timeout=1)
        try:
            assert await c.ping()
            pid = os.fork()
            if pid == 0:  # the child, inside the parent's running loop
                try:
                    c.send_packed(b"*1\r\n$4\r\nPING\r\n")
                    code = 1  # it would have written into the parent's socket
                except RuntimeError:  # asyncio: no running loop in a forked child
                    code = 0
                except BaseException:
                    code = 2
                os._exit(code)
            _, status = os.waitpid(pid, 0)
            assert os.WEXITSTATUS(status) == 0, os.WEXITSTATUS(status)
            assert await c.ping()  # the parent's connection is untouched
        finally:
            await c.aclose()

    arun(main())
