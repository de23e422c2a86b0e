"""Recidive escalation (`escalate.repeat`): a prefix banned again within its last ban's
duration (counted from that ban's end) gets the last duration x factor, at most max;
one that stayed away that long starts again at `ban`. The memory list and the Redis
list (its Lua script) give the same answers; `ban del` and `flush` forget."""

from __future__ import annotations

import asyncio
import ipaddress

import pytest
from hypothesis import given
from hypothesis import strategies as st

from netlimit.bans.escalate import Escalator
from netlimit.bans.redis_store import RedisBanList, history_keys, keys
from netlimit.bans.store import MemoryBanList, repeat_ttl
from netlimit.config.validate import ConfigError, load_string
from netlimit.limit.limiter import Limiter
from netlimit.limit.request import CheckRequest
from netlimit.limit.rules import from_loaded
from netlimit.limit.stores import MemoryStore

N = ipaddress.ip_network
NET = N("203.0.113.0/24")
REPEAT = (2.0, 86400.0)


class Clock:
    def __init__(self) -> None:
        self.t = 1000.0

    def __call__(self) -> float:
        return self.t


@given(
    ttl=st.floats(1, 10_000),
    factor=st.floats(1.01, 100),
    most=st.floats(1, 2_000_000),
    last=st.none() | st.tuples(st.floats(1, 2_000_000), st.floats(0, 10_000)),
    now=st.floats(0, 10_000),
)
def test_repeat_ttl_is_between_ban_and_max(ttl, factor, most, last, now):
    got = repeat_ttl(ttl, (factor, most), last, now)
    assert ttl <= got <= max(most, ttl)
    if last is None or now >= last[1]:
        assert got == ttl  # a stranger, or forgotten: the base ban
    else:
        assert got == min(max(ttl, last[0] * factor), max(most, ttl))
    assert repeat_ttl(ttl, None, last, now) == ttl  # no repeat: never longer


def test_memory_list_doubles_a_recidive_up_to_max_and_forgets_who_stays_away():
    clock = Clock()
    lst = MemoryBanList(100, clock=clock)
    got = []
    for _ in range(10):
        r = lst.add(NET, 600, extend=True, repeat=REPEAT)
        got.append(r.left)
        assert not lst.add(NET, 600, extend=True, repeat=REPEAT).added  # banned now: no escalation, no change
        clock.t += r.left + 0.5 * r.left  # it ends; the client is back halfway through the window
    assert got == [600, 1200, 2400, 4800, 9600, 19200, 38400, 76800, 86400, 86400]
    clock.t += 86400 + 1  # away for a whole last duration after the end: forgotten
    assert lst.add(NET, 600, extend=True, repeat=REPEAT).left == 600
    # without repeat (a manual ban, an escalation without it) the time is as asked
    other = N("198.51.100.0/24")
    lst.add(other, 600, repeat=REPEAT)
    clock.t += 601
    assert lst.add(other, 600).left == 600


def test_memory_list_del_and_flush_forget_and_the_memory_is_bounded():
    clock = Clock()
    lst = MemoryBanList(3, clock=clock)
    lst.add(NET, 600, repeat=REPEAT)
    assert lst.delete(NET)
    assert lst.add(NET, 600, repeat=REPEAT).left == 600  # lifted by hand: forgiven
    lst.flush()
    assert lst.add(NET, 600, repeat=REPEAT).left == 600
    for i in range(10):
        lst.add(N(f"192.0.2.{i}/32"), 600 + i, repeat=REPEAT)
    assert len(lst._last) <= 3 and len(lst) <= 3


@pytest.mark.redis
def test_redis_list_escalates_as_the_memory_one(redis_server, prefix):
    lst = RedisBanList(redis_server.url, key_prefix=prefix, max_entries=100)
    zkey = keys(prefix)[0]
    rkey, rtkey = history_keys(prefix)

    def end_ban() -> None:  # the ban's end (its sorted-set member gone), the memory of it kept
        lst.r.zrem(zkey, str(NET))

    try:
        got = []
        for _ in range(9):
            r = lst.add(NET, 600, extend=True, repeat=REPEAT)
            got.append(round(r.left))
            assert round(lst.add(NET, 600, extend=True, repeat=REPEAT).left) == got[-1]  # banned now: no escalation
            end_ban()
        assert got == [600, 1200, 2400, 4800, 9600, 19200, 38400, 76800, 86400]
        assert float(lst.r.hget(rtkey, str(NET))) == 86400_000
        # the memory of the last ban ran out (as if a whole duration passed after its end)
        lst.r.zadd(rkey, {str(NET): 1})
        end_ban()
        assert round(lst.add(NET, 600, extend=True, repeat=REPEAT).left) == 600
        end_ban()
        assert round(lst.add(NET, 600, repeat=REPEAT).left) == 1200
        # del and flush forget
        assert lst.delete(NET)
        assert round(lst.add(NET, 600, repeat=REPEAT).left) == 600
        assert lst.flush() == 1
        assert lst.r.exists(rkey, rtkey) == 0
        assert round(lst.add(NET, 600, repeat=REPEAT).left) == 600
        end_ban()
        assert round(lst.add(NET, 600).left) == 600  # no repeat asked: as given
    finally:
        lst.r.delete(*keys(prefix)[:3], rkey, rtkey)
        lst.close()


FILE = """\
version: 1
http:
  domain: web
  actions: [[remote_address]]
  descriptors:
    - key: remote_address
      rate_limit: {unit: minute, requests_per_unit: 1}
      escalate: {after: 2, within: 1m, ban: 10m, repeat: {factor: 3, max: 1h}}
"""


def test_the_sidecars_escalation_passes_repeat_and_waits_out_the_longer_ban():
    class AsyncList:
        def __init__(self) -> None:
            self.clock = Clock()
            self.list = MemoryBanList(100, clock=self.clock)

        async def add(self, net, ttl, **kw):
            return self.list.add(net, ttl, **kw)

        async def close(self) -> None:
            pass

    async def body():
        loaded = load_string(FILE, "<test>")
        store = MemoryStore()
        lim = Limiter(from_loaded(loaded), store)
        bans = AsyncList()
        now = [0.0]
        esc = Escalator(loaded.config, store, bans, host="h1", clock=lambda: now[0])
        lim.on_over = esc.note
        esc.start()
        try:
            lefts = []
            for _ in range(3):
                for _ in range(3):  # 1 allowed, 2 denied: banned
                    await lim.check(CheckRequest.simple("web", [[("remote_address", "198.51.100.7")]]))
                await esc.wait_idle()
                (b, left), *_ = bans.list.snapshot().bans
                lefts.append(round(left))
                assert esc._recent[b.net] == now[0] + left  # no second write while the longer ban runs
                bans.clock.t += left + 1  # the ban ends; back at once
                now[0] += left + 1
                store = MemoryStore()  # a fresh count of denials
                lim.store = esc.store = store
            assert lefts == [600, 1800, 3600]
        finally:
            await esc.close()

    asyncio.run(body())


@pytest.mark.parametrize(
    "repeat, message",
    [
        ("{factor: 2, max: 5m}", "repeat max 5m must be longer than ban 10m"),
        ("{factor: 2, max: 30d}", "repeat max 30d is longer than the kernel keeps a ban"),
        ("{factor: 1, max: 1d}", "greater than 1"),
        ("{max: 1d, times: 3}", "unknown field 'times'"),
    ],
)
def test_bad_repeat_is_refused_with_its_place(repeat, message):
    text = FILE.replace("{factor: 3, max: 1h}", repeat)
    with pytest.raises(ConfigError) as e:
        load_string(text, "f.yaml")
    assert any(message in str(p) and str(p).startswith("f.yaml:8:") for p in e.value.problems), e.value.problems


def test_the_cli_socket_carries_repeat_to_netlimitds_memory_list(tmp_path):
    """A sidecar's escalation on `store: memory` reaches netlimitd over its socket: the
    request carries repeat, and netlimitd's list escalates (a real unix socket, the
    daemon's own request handler; the kernel is not involved)."""
    import json
    import socket
    import threading

    from netlimit.bans.socket_client import SocketBanList
    from netlimit.daemon.bans import BanFollower

    loaded = load_string("version: 1\nbans: {store: memory}\n", "<t>")
    follower = BanFollower(loaded.config, None, lambda: None)
    clock = Clock()
    follower.memory = MemoryBanList(100, clock=clock)
    path = str(tmp_path / "d.sock")
    srv = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    srv.bind(path)
    srv.listen(8)
    srv.settimeout(30)
    stop = threading.Event()

    def serve() -> None:
        while not stop.is_set():
            try:
                conn, _ = srv.accept()
            except OSError:
                return
            with conn:
                buf = b""
                while not buf.endswith(b"\n"):
                    chunk = conn.recv(65536)
                    if not chunk:
                        break
                    buf += chunk
                conn.sendall(json.dumps(follower.request(json.loads(buf))).encode() + b"\n")

    t = threading.Thread(target=serve, daemon=True)
    t.start()
    try:
        client = SocketBanList(path)
        lefts = []
        for _ in range(3):
            r = client.add(NET, 600, extend=True, repeat=REPEAT, origin="http")
            lefts.append(round(r.left))
            clock.t += r.left + 1
        assert lefts == [600, 1200, 2400]
        bad = follower.request({"ban": "add", "net": str(NET), "ttl": 60, "repeat": [0.5, 10]})
        assert not bad["ok"] and "repeat" in bad["error"]
    finally:
        stop.set()
        srv.close()
        t.join(10)
