"""L7 escalation: the engine's denials, counted per client prefix with the engine's own
algorithm and store, ban the repeat offender; exempt addresses and trusted proxies never."""

from __future__ import annotations

import asyncio
import ipaddress

import pytest

from netlimit.bans.escalate import Escalator, rule_paths
from netlimit.bans.store import MemoryBanList
from netlimit.config.validate import load_string
from netlimit.limit.limiter import Limiter
from netlimit.limit.request import CheckRequest
from netlimit.limit.rules import from_loaded
from netlimit.limit.stores import MemoryStore

N = ipaddress.ip_network

FILE = """\
version: 1
exempt: [10.0.0.0/8]
http:
  domain: web
  trusted_proxies: [192.0.2.10/32]
  actions: [[remote_address], [path, remote_address]]
  descriptors:
    - key: remote_address
      rate_limit: {unit: minute, requests_per_unit: 2}
      escalate: {after: 3, within: 1m, ban: 15m, prefix4: 24, prefix6: 64, reason: hammering}
    - key: path
      value: /login
      descriptors:
        - key: remote_address
          rate_limit: {unit: minute, requests_per_unit: 1}
          escalate: {after: 2, within: 10s, ban: 1h}
    - key: path
      value: /quiet
      descriptors:
        - key: remote_address
          rate_limit: {unit: minute, requests_per_unit: 1}
"""


class AsyncList:
    """A MemoryBanList behind the async `add` the escalator calls."""

    def __init__(self) -> None:
        self.list = MemoryBanList(100)
        self.fail = False

    async def add(self, net, ttl, **kw):
        if self.fail:
            raise ConnectionError("the ban store is down")
        return self.list.add(net, ttl, **kw)

    async def close(self) -> None:
        pass


def make(text: str = FILE):
    loaded = load_string(text, "<test>")
    store = MemoryStore()
    lim = Limiter(from_loaded(loaded), store)
    bans = AsyncList()
    esc = Escalator(loaded.config, store, bans, host="h1")
    lim.on_over = esc.note
    return lim, esc, bans


async def hits(lim, esc, n: int, addr: str, path: str | None = None):
    descs = [[("remote_address", addr)]] if path is None else [[("path", path), ("remote_address", addr)]]
    for _ in range(n):
        await lim.check(CheckRequest.simple("web", descs))
    await esc.wait_idle()


def test_rule_paths_name_the_engines_rules():
    loaded = load_string(FILE, "<test>")
    paths = rule_paths(loaded.config)
    assert set(paths) == {"remote_address", "path_/login.remote_address"}
    built = {r.path for r in from_loaded(loaded).rules}
    assert set(paths) <= built  # the escalator finds its rules by the engine's own names


def test_the_after_th_denial_bans_the_clients_prefix():
    async def body():
        lim, esc, bans = make()
        esc.start()
        try:
            await hits(lim, esc, 2 + 2, "198.51.100.7")  # 2 allowed, 2 denied: not yet
            assert bans.list.snapshot().bans == []
            await hits(lim, esc, 1, "198.51.100.7")  # the 3rd denial
            (b, left), *_ = bans.list.snapshot().bans
            assert b.net == N("198.51.100.0/24") and left == pytest.approx(900, abs=5)
            assert (b.rule, b.reason, b.by, b.origin) == ("remote_address", "hammering", "sidecar@h1", "http")
            assert esc.banned["remote_address"] == 1
            # IPv6 by its /64; another rule counts on its own
            await hits(lim, esc, 2 + 3, "2001:db8:1:2::99")
            await hits(lim, esc, 1 + 2, "203.0.113.5", path="/login")
            nets = {str(b.net): round(left, -1) for b, left in bans.list.snapshot().bans}
            assert nets == {"198.51.100.0/24": 900, "2001:db8:1:2::/64": 900, "203.0.113.5/32": 3600}
        finally:
            await esc.close()

    asyncio.run(body())


def test_exempt_trusted_proxies_and_rules_without_escalate_never_ban():
    async def body():
        lim, esc, bans = make()
        esc.start()
        try:
            await hits(lim, esc, 10, "10.1.2.3")
            await hits(lim, esc, 10, "192.0.2.11")  # its /24 holds the proxy 192.0.2.10
            await hits(lim, esc, 10, "198.51.100.1", path="/quiet")
            assert bans.list.snapshot().bans == []
            assert esc.skipped["exempt"] == 8 and esc.skipped["trusted_proxy"] == 8
            assert esc.denials == 16  # /quiet has no escalate: not even counted
        finally:
            await esc.close()

    asyncio.run(body())


def test_what_is_not_an_address_and_a_full_queue_are_counted():
    async def body():
        lim, esc, bans = make()
        esc.max_queue = 3
        await hits(lim, esc, 12, "not-an-ip")  # no task yet: the queue fills
        assert esc.skipped["queue_full"] == 10 - 3
        esc.start()
        try:
            await esc.wait_idle()
            assert esc.skipped["invalid_address"] == 3
            assert bans.list.snapshot().bans == []
        finally:
            await esc.close()

    asyncio.run(body())


def test_a_failing_ban_store_is_counted_and_escalation_goes_on():
    async def body():
        lim, esc, bans = make()
        bans.fail = True
        esc.start()
        try:
            await hits(lim, esc, 2 + 3, "198.51.100.7")
            assert esc.errors["ban_store"] == 1 and bans.list.snapshot().bans == []
            bans.fail = False
            await hits(lim, esc, 1, "198.51.100.7")  # the next denial over the count bans
            assert [str(b.net) for b, _ in bans.list.snapshot().bans] == ["198.51.100.0/24"]
        finally:
            await esc.close()

    asyncio.run(body())


def test_a_reload_changes_what_escalates():
    async def body():
        lim, esc, bans = make()
        text = FILE.replace(
            "      escalate: {after: 3, within: 1m, ban: 15m, prefix4: 24, prefix6: 64, reason: hammering}\n", ""
        )
        esc.configure(load_string(text, "<test>").config)
        assert set(esc.specs) == {"path_/login.remote_address"}
        esc.start()
        try:
            await hits(lim, esc, 10, "198.51.100.7")
            assert bans.list.snapshot().bans == []
        finally:
            await esc.close()

    asyncio.run(body())


def test_the_engine_calls_the_hook_only_for_enforced_denials():
    text = FILE.replace(
        "      rate_limit: {unit: minute, requests_per_unit: 2}\n",
        "      rate_limit: {unit: minute, requests_per_unit: 2}\n      shadow_mode: true\n",
        1,
    )
    loaded = load_string(
        text.replace(
            "      escalate: {after: 3, within: 1m, ban: 15m, prefix4: 24, prefix6: 64, reason: hammering}\n", ""
        ),
        "<t>",
    )
    lim = Limiter(from_loaded(loaded), MemoryStore())
    seen = []
    lim.on_over = lambda rule, d: seen.append((rule.path, tuple(d)))
    for _ in range(5):
        lim.check_fast([[("remote_address", "198.51.100.1")]])  # shadow: never enforced
        lim.check_fast([[("path", "/login"), ("remote_address", "198.51.100.1")]])
    assert seen == [("path_/login.remote_address", (("path", "/login"), ("remote_address", "198.51.100.1")))] * 4
