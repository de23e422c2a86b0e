"""The kernel's ban sets with real traffic between two namespaces, under nftables and
the legacy restore backend: a banned source is dropped before any limit, an exempt one
never; a ban ends in the kernel on time by itself; the rule set's applies never touch
the elements; a network rule's escalate bans a flooding source in the kernel."""

from __future__ import annotations

import ipaddress
import time

import pytest

from netlimit.kernel import reconcile
from netlimit.kernel.banset import ban_sets
from netlimit.kernel.netns import run_in_netns
from netlimit.kernel.nft import elements as nfelements

pytestmark = pytest.mark.netns
_WRITE = nfelements.write  # the real writer (steps_seen wraps it)
N = ipaddress.ip_network

CONFIG = """
version: 1
exempt: ["{exempt}/32"]
bans: {{max_entries: 1000}}
network:
  - name: udp-flood
    protocol: udp
    ports: [5000]
    limit: {limit}
    burst: 10
{escalate}
"""


def send(topo, src: str, dst: str, n: int = 20, port: int = 5001) -> None:
    """`n` UDP packets from `src` (an address of the client namespace)."""
    fam = "AF_INET6" if ":" in src else "AF_INET"
    code = (
        f"import socket; s = socket.socket(socket.{fam}, socket.SOCK_DGRAM); s.bind(({src!r}, 0))\n"
        f"for _ in range({n}): s.sendto(b'x' * 16, ({dst!r}, {port}))"
    )
    topo.cx("python3", "-c", code)


def dropped(topo, backend: str) -> int:
    rows = reconcile.list_owned(topo.srv, backend=backend)
    return sum(int(r["dropped"] or 0) for r in rows if r["rule"] == "(bans)")


def wait_for(pred, timeout: float, what: str):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        got = pred()
        if got:
            return got
        time.sleep(0.05)
    raise AssertionError(f"timed out after {timeout} s: {what}")


def sets(topo, backend: str, fn):
    s = ban_sets(backend)
    return run_in_netns(topo.srv, lambda: fn(s))


def test_banned_sources_are_dropped_until_their_ban_ends(topo, any_backend):
    text = CONFIG.format(exempt=topo.cli4b, limit="100/second", escalate="")
    topo.apply(text)
    # the ban drops ICMPv6 too: the topology's neighbours are permanent (netns_topo),
    # or a neighbour probe from the banned cli6 would be one more drop than the packets sent
    base = dropped(topo, any_backend)
    assert base == 0
    # every ban long enough to outlive the sends on a busy host (a 2 s one expired
    # before it was read back once, under the heavy soak); the expiry comes after
    bans = {N(f"{topo.cli4}/32"): 60.0, N(f"{topo.cli4b}/32"): 60.0, N("2001:db8::/120"): 60.0, N("203.0.113.0/24"): 60}
    sets(topo, any_backend, lambda s: s.replace(bans))
    send(topo, topo.cli4, topo.srv4)
    send(topo, topo.cli4b, topo.srv4)  # exempt: never dropped, banned or not
    send(topo, topo.cli6, topo.srv6)
    assert dropped(topo, any_backend) == 40
    held = sets(topo, any_backend, lambda s: s.read())
    assert set(held) == set(bans)
    # the kernel ends a 2 s ban by itself (no daemon here): cli4's, written again short
    sets(topo, any_backend, lambda s: s.replace({**bans, N(f"{topo.cli4}/32"): 2.0}))
    held = sets(topo, any_backend, lambda s: s.read())
    left = held.get(N(f"{topo.cli4}/32"))  # absent already if the read came late
    assert left is None or left <= 2.0, held
    assert set(held) - {N(f"{topo.cli4}/32")} == set(bans) - {N(f"{topo.cli4}/32")}
    wait_for(lambda: N(f"{topo.cli4}/32") not in sets(topo, any_backend, lambda s: s.read()), 30, "the ban to end")
    send(topo, topo.cli4, topo.srv4)
    assert dropped(topo, any_backend) == 40
    # changes: one removed, one added, in one transaction
    sets(topo, any_backend, lambda s: s.change({N(f"{topo.cli4}/32"): 60.0}, [N("2001:db8::/120")]))
    send(topo, topo.cli4, topo.srv4)
    send(topo, topo.cli6, topo.srv6)
    assert dropped(topo, any_backend) == 60
    rows = reconcile.list_owned(topo.srv, backend=any_backend)
    sizes = {r["table"]: r["table_entries"] for r in rows if r["rule"] == "(bans)" and r.get("table")}
    # nftables: the addresses in banhosts4, the /24 in bans4; ipset: all in netlimit-bans4
    v4 = {k: v for k, v in sizes.items() if k.endswith("4")}
    assert sum(v4.values()) == 3 and sum(sizes.values()) == 3, sizes
    want4 = {"set banhosts4": 2, "set bans4": 1} if any_backend == "nftables" else {"ipset netlimit-bans4": 3}
    assert v4 == want4, sizes


def test_applies_leave_the_elements_alone(topo, any_backend):
    text = CONFIG.format(exempt=topo.cli4b, limit="100/second", escalate="")
    topo.apply(text)
    sets(topo, any_backend, lambda s: s.replace({N("198.51.100.0/24"): 300.0, N("2001:db8:5::/64"): 300.0}))
    assert not topo.apply(text).changed  # a no-op apply
    res = topo.apply(text.replace("100/second", "50/second"))  # a changed rule
    assert res.changed
    held = sets(topo, any_backend, lambda s: s.read())
    assert set(held) == {N("198.51.100.0/24"), N("2001:db8:5::/64")} and all(290 < v <= 300 for v in held.values())


def test_a_network_rules_escalate_bans_the_flooding_source_in_the_kernel(topo, any_backend):
    esc = "    escalate: {after: 20, within: 1m, ban: 1h, prefix4: 24, prefix6: 64}"
    topo.apply(CONFIG.format(exempt=topo.cli4b, limit="10/second", escalate=esc))
    send(topo, topo.cli4, topo.srv4, n=200, port=5000)  # 10 pass (burst), ~190 over the limit
    found = sets(topo, any_backend, lambda s: s.kernel_bans([("udp-flood", 24, 64)]))
    assert [(r, str(n)) for r, n, _ in found] == [("udp-flood", "198.18.0.0/24")]
    assert 3500 < found[0][2] <= 3600
    before = dropped(topo, any_backend)
    send(topo, topo.cli4, topo.srv4, n=10, port=6000)  # banned: every packet, any port
    assert dropped(topo, any_backend) == before + 10
    send(topo, topo.cli4b, topo.srv4, n=200, port=5000)  # exempt: never banned
    assert len(sets(topo, any_backend, lambda s: s.kernel_bans([("udp-flood", 24, 64)]))) == 1


def test_netlink_batches_are_all_or_nothing(topo):
    """nftables refuses overlapping intervals and deleting what is not there: the whole
    batch then changes nothing."""
    topo.apply(CONFIG.format(exempt=topo.cli4b, limit="100/second", escalate=""))

    def work():
        nfelements.write([nfelements.Change("netlimit", "bans4", True, add={N("10.0.0.0/24"): 60})])
        for bad in (
            [nfelements.Change("netlimit", "bans4", True, add={N("10.1.0.0/24"): 60, N("10.0.0.7/32"): 60})],
            [
                nfelements.Change("netlimit", "bans4", True, add={N("10.2.0.0/24"): 60}),
                nfelements.Change("netlimit", "bans6", True, delete=[N("2001:db8::/64")]),
            ],
        ):
            with pytest.raises(OSError):
                nfelements.write(bad)
        return nfelements.prefixes(nfelements.read("netlimit", "bans4") or [], interval=True)

    held = run_in_netns(topo.srv, work)
    assert list(held) == [N("10.0.0.0/24")]
    assert run_in_netns(topo.srv, lambda: nfelements.read("netlimit", "no-such-set")) is None


def test_what_the_sets_hold_read_fast_and_written_as_a_difference(topo):
    """held_prefixes() (one dump matched as bytes, a restart's diff, issue 35) reads what
    read() reads, the top of the address space and adjacent prefixes included; a set
    holding what netlimit does not write (a range that is no prefix, an element without
    a timeout) reads as None, and sync_prefixes() then takes that out first (one small
    transaction) and writes the difference."""
    import subprocess

    topo.apply(CONFIG.format(exempt=topo.cli4b, limit="100/second", escalate=""))
    bans = {
        N("10.0.0.0/24"): 600.0,
        N("10.0.1.0/24"): 500.0,  # adjacent: its start is the previous one's end
        N("10.0.2.7/32"): 400.0,
        N("255.255.255.0/24"): 300.0,  # no end element: it reaches the top
        N("2001:db8::/64"): 600.0,
        N("2001:db8:0:1::/64"): 600.0,
        N("ffff::/16"): 600.0,
    }
    s = ban_sets("nftables")
    run_in_netns(topo.srv, lambda: s.replace(bans))

    def held():
        out = {}
        for width, make in ((4, ipaddress.IPv4Network), (16, ipaddress.IPv6Network)):
            v = 4 if width == 4 else 6
            for found in (
                nfelements.held_prefixes("netlimit", f"bans{v}", width),
                nfelements.held_addresses("netlimit", f"banhosts{v}", width),
            ):
                out.update({make((a, p)): ms for (a, p), ms in (found or {}).items()})
        return out

    got = run_in_netns(topo.srv, held)
    assert set(got) == set(bans)
    assert all(bans[n] * 1000 - 5000 < ms <= bans[n] * 1000 for n, ms in got.items()), got
    prefixes = sorted((n.version, int(n.network_address), n.prefixlen, left) for n, left in bans.items())
    # the same list again: nothing written; one lifted, one renewed: two removed, one added
    assert run_in_netns(topo.srv, lambda: s.sync_prefixes(prefixes))["added"] == 0
    less = [p if p[1] != int(ipaddress.ip_address("10.0.2.7")) else (*p[:3], 900.0) for p in prefixes[1:]]
    done = run_in_netns(topo.srv, lambda: s.sync_prefixes(less))
    assert (done["write"], done["added"], done["removed"]) == ("diff", 1, 2), done
    after = run_in_netns(topo.srv, held)
    assert set(after) == set(bans) - {N("10.0.0.0/24")} and after[N("10.0.2.7/32")] > 800_000
    addresses = run_in_netns(topo.srv, lambda: nfelements.held_addresses("netlimit", "banhosts4", 4))
    assert list(addresses or {}) == [(int(ipaddress.ip_address("10.0.2.7")), 32)], (
        addresses
    )  # the hash set: addresses only
    for where, odd in (
        ("bans4", "10.9.0.1-10.9.0.5 timeout 1h"),  # a range
        ("bans4", "10.9.1.0/24"),  # no timeout
        ("banhosts4", "10.9.2.2"),  # no timeout
        ("bans4", "10.9.3.3 timeout 1h"),  # an address in the interval set, as netlimit wrote it before
    ):
        subprocess.run(["ip", "netns", "exec", topo.srv, "nft", "add", "element", "inet", "netlimit", where,
                        f"{{ {odd} }}"], check=True, capture_output=True)  # fmt: skip
        assert run_in_netns(topo.srv, s._read_held) is None, odd
        done = run_in_netns(topo.srv, lambda: s.sync_prefixes(less))
        assert (done["write"], done["added"], done["removed"], done["foreign"]) == ("diff", 0, 1, 1), (odd, done)
        assert set(run_in_netns(topo.srv, held)) == set(after)
        assert set(run_in_netns(topo.srv, s.read)) == set(after)


def _fill_list() -> dict:
    """Bans whose interval elements make the cuts interesting: adjacent prefixes (a start
    that is the previous one's end), prefixes that reach the top (no end element), and
    addresses of both families (the hash sets)."""
    bans = {N(f"10.0.{i}.0/24"): 600.0 for i in range(6)}  # adjacent
    bans.update({N(f"10.1.{i}.7/32"): 500.0 for i in range(7)})
    bans.update({N("255.255.255.0/24"): 400.0, N("ffff::/16"): 400.0})
    bans.update({N(f"2001:db8:0:{i:x}::/64"): 300.0 for i in range(5)})
    bans.update({N(f"2001:db9::{i:x}/128"): 200.0 for i in range(4)})
    return bans


def test_empty_sets_are_filled_in_steps_that_only_add(topo, monkeypatch):
    """Sets that hold nothing (a start after a reboot) are filled in transactions of at
    most FILL_STEP elements (kernel/nft/bansets.fill_in_steps: one transaction of 130,000
    takes about 1 GiB of kernel memory for its change notifications): the sets end
    holding the list exactly, each step cut where a prefix begins (the kernel takes an
    interval's start in one transaction and its end in the next, and between the two
    everything from the start up to the next end is banned); a refused step leaves what
    the steps before it wrote, and the next sync writes the rest."""
    from netlimit.kernel.nft import bansets

    topo.apply(CONFIG.format(exempt=topo.cli4b, limit="100/second", escalate=""))
    bans = _fill_list()
    prefixes = sorted((n.version, int(n.network_address), n.prefixlen, left) for n, left in bans.items())
    s = ban_sets("nftables")
    steps: list[list[int]] = []
    real = nfelements.write

    between: list[set] = []

    def counted(changes, family="inet"):
        steps.append([len(c.elements or []) for c in changes])
        out = real(changes, family)
        between.append(set(s.read() or {}))  # in the namespace: called inside run_in_netns
        return out

    monkeypatch.setattr(bansets, "FILL_STEP", 3)
    monkeypatch.setattr(nfelements, "write", counted)
    run_in_netns(topo.srv, lambda: s.replace({}))
    steps.clear()
    between.clear()
    done = run_in_netns(topo.srv, lambda: s.sync_prefixes(prefixes))
    assert (done["write"], done["why"]) == ("whole", "empty"), done
    held = run_in_netns(topo.srv, s.read)
    assert set(held) == set(bans)
    assert all(bans[n] - 10 < left <= bans[n] for n, left in held.items()), held
    assert steps[0] == [0, 0, 0, 0], steps  # the first transaction flushes the four sets
    # after every step the sets hold part of the list and nothing else: never an
    # interval's start without its end (a range from it up to the next end, banned)
    assert all(held_then <= set(bans) for held_then in between), between
    assert [len(h) for h in between] == sorted(len(h) for h in between)  # they only grow
    # 3 elements a step, more only where a cut moved to the next prefix's start (an
    # interval's start and end: one element more at most)
    assert len(steps) > 8 and all(0 < sum(st) <= 4 for st in steps[1:]), steps
    # every element once: 7 + 4 addresses; per interval set a lower bound, a start and
    # an end per prefix, no end for the one reaching the top
    assert sum(map(sum, steps)) == 7 + 4 + (1 + 6 * 2 + 1) + (1 + 5 * 2 + 1), steps

    # a step refused half way: what the steps before it wrote stays, the next sync mends
    run_in_netns(topo.srv, lambda: s.replace({}))
    calls = []

    def refused(changes, family="inet"):
        calls.append(1)
        if len(calls) == 4:
            raise nfelements.NetlinkError(12, "refused for the test")
        return real(changes, family)

    monkeypatch.setattr(nfelements, "write", refused)
    with pytest.raises(OSError):
        run_in_netns(topo.srv, lambda: s.sync_prefixes(prefixes))
    part = run_in_netns(topo.srv, s.read)
    assert part and set(part) < set(bans), part
    monkeypatch.setattr(nfelements, "write", real)
    run_in_netns(topo.srv, lambda: s.sync_prefixes(prefixes))
    assert set(run_in_netns(topo.srv, s.read)) == set(bans)


def steps_seen(monkeypatch, s, refuse_at: int = 0) -> list[set]:
    """Patch the netlink writer so that each transaction is followed by a read of the
    sets (what they held after each step, in order; called inside run_in_netns, so in
    the namespace); with `refuse_at`, that transaction is refused instead (ENOENT). A
    second call replaces the first's recorder."""
    real = _WRITE
    between: list[set] = []
    calls: list[int] = []

    def write(changes, family="inet"):
        calls.append(1)
        if len(calls) == refuse_at:  # once: the retry's writes go through (and are read)
            raise nfelements.NetlinkError(2, "refused for the test")
        out = real(changes, family)
        between.append(set(s.read() or {}))
        return out

    monkeypatch.setattr(nfelements, "write", write)
    return between


def test_a_large_difference_is_written_in_steps_that_never_drop_a_ban(topo, monkeypatch):
    """Sets holding one list, a start with another that differs in more than FILL_STEP
    prefixes (kernel/nft/bansets.diff_steps): written in steps, and after every step
    the sets hold every ban the two lists share (those written anew too: removed and
    added in one step), the new ones so far and the dropped ones not yet removed, and
    nothing else; a new /16 over dropped /24s and a new /24 inside a dropped /16 go with
    their removals (the kernel refuses overlapping intervals). A step refused once: the
    sets are read again and the rest written in steps; they end holding the list."""
    from netlimit.kernel.nft import bansets

    topo.apply(CONFIG.format(exempt=topo.cli4b, limit="100/second", escalate=""))
    s = ban_sets("nftables")
    old = {N(f"10.0.{i}.0/24"): 600.0 for i in range(6)}  # kept (0-2), written anew (3), dropped (4-5)
    old.update({N(f"10.1.{i}.0/24"): 600.0 for i in range(4)})  # dropped: the new 10.1.0.0/16 holds them
    old.update({N("10.2.0.0/16"): 600.0})  # dropped: the new 10.2.7.0/24 inside it
    old.update({N(f"10.3.0.{i}/32"): 600.0 for i in range(5)})  # kept (0-1), anew (2), dropped (3-4)
    old.update({N(f"2001:db8:0:{i:x}::/64"): 600.0 for i in range(3)})  # kept (0), dropped (1-2)
    new = {n: left for n, left in old.items() if n in (N("10.0.0.0/24"), N("10.0.1.0/24"), N("10.0.2.0/24"))}
    new.update({N("10.3.0.0/32"): 600.0, N("10.3.0.1/32"): 600.0, N("2001:db8::/64"): 600.0})
    new.update({N("10.0.3.0/24"): 3000.0, N("10.3.0.2/32"): 3000.0})  # anew: far longer
    new.update({N("10.1.0.0/16"): 600.0, N("10.2.7.0/24"): 600.0, N("255.255.255.0/24"): 600.0})
    new.update({N(f"10.4.0.{i}/32"): 600.0 for i in range(6)})
    new.update({N(f"2001:db9::{i:x}/128"): 600.0 for i in range(3)})
    shared = set(old) & set(new)

    def as_prefixes(bans):
        return sorted((n.version, int(n.network_address), n.prefixlen, left) for n, left in bans.items())

    run_in_netns(topo.srv, lambda: s.replace({}))
    run_in_netns(topo.srv, lambda: s.sync_prefixes(as_prefixes(old)))
    assert set(run_in_netns(topo.srv, s.read)) == set(old)

    monkeypatch.setattr(bansets, "FILL_STEP", 3)
    between = steps_seen(monkeypatch, s)
    done = run_in_netns(topo.srv, lambda: s.sync_prefixes(as_prefixes(new)))
    assert (done["write"], done["attempts"]) == ("diff", 1), done
    assert done["steps"] == len(between) > 4, (done, between)
    for held in between:
        assert shared <= held <= set(old) | set(new), held
    assert [len(h & set(new)) for h in between] == sorted(len(h & set(new)) for h in between)  # the list only grows
    got = run_in_netns(topo.srv, s.read)
    assert set(got) == set(new)
    assert got[N("10.0.3.0/24")] > 2000 and got[N("10.3.0.2/32")] > 2000, got  # written anew with the new time

    # a step refused once: read again, the rest in steps
    run_in_netns(topo.srv, lambda: s.sync_prefixes(as_prefixes(old)))
    assert set(run_in_netns(topo.srv, s.read)) == set(old)
    between = steps_seen(monkeypatch, s, refuse_at=3)
    done = run_in_netns(topo.srv, lambda: s.sync_prefixes(as_prefixes(new)))
    assert (done["write"], done["attempts"]) == ("diff", 2), done
    assert all(shared <= held for held in between), between
    assert set(run_in_netns(topo.srv, s.read)) == set(new)


def test_a_large_change_is_written_in_steps_that_never_drop_a_ban(topo, monkeypatch):
    """A change() of more than FILL_STEP elements (netlimitd's difference after a long
    outage of the list's store) is written in steps (kernel/nft/bansets.diff_steps):
    after every step the sets hold every ban the change leaves alone, the additions so
    far and the removals not yet made, nothing else; a new /16 goes in the step that
    removes the /24s inside it (the kernel refuses overlapping intervals). A small
    change stays one transaction. A refused step raises and leaves the steps before it
    (netlimitd then reloads: sync_prefixes writes what still differs)."""
    from netlimit.kernel.nft import bansets

    topo.apply(CONFIG.format(exempt=topo.cli4b, limit="100/second", escalate=""))
    s = ban_sets("nftables")
    held = {N(f"10.0.{i}.0/24"): 600.0 for i in range(6)}
    held.update({N(f"10.1.{i}.0/24"): 600.0 for i in range(4)})  # removed: the new 10.1.0.0/16 holds them
    held.update({N(f"10.3.0.{i}/32"): 600.0 for i in range(5)})
    held.update({N(f"2001:db8:0:{i:x}::/64"): 600.0 for i in range(3)})
    add = {N("10.1.0.0/16"): 600.0, N("255.255.255.0/24"): 600.0}
    add.update({N(f"10.4.0.{i}/32"): 600.0 for i in range(6)})
    add.update({N(f"2001:db9::{i:x}/128"): 600.0 for i in range(3)})
    remove = [N("10.0.4.0/24"), N("10.0.5.0/24"), N("10.3.0.3/32"), N("10.3.0.4/32"), N("2001:db8:0:2::/64")]
    remove += [N(f"10.1.{i}.0/24") for i in range(4)]
    untouched = set(held) - set(remove)
    run_in_netns(topo.srv, lambda: s.replace(held))

    monkeypatch.setattr(bansets, "FILL_STEP", 3)
    between = steps_seen(monkeypatch, s)
    run_in_netns(topo.srv, lambda: s.change(add, remove))
    assert len(between) > 4, between
    for now in between:
        assert untouched <= now <= set(held) | set(add), now
    assert [len(h & set(add)) for h in between] == sorted(len(h & set(add)) for h in between)  # additions only grow
    assert set(run_in_netns(topo.srv, s.read)) == untouched | set(add)

    # a small change: one transaction
    monkeypatch.setattr(bansets, "FILL_STEP", 5000)
    between.clear()
    run_in_netns(topo.srv, lambda: s.change({N("10.5.0.0/24"): 60.0}, [N("10.4.0.0/32"), N("10.1.0.0/16")]))
    assert len(between) == 1
    assert N("10.5.0.0/24") in between[0] and not {N("10.4.0.0/32"), N("10.1.0.0/16")} & between[0]

    # a step refused: it raises, the steps before it stay, no ban left alone is missing
    run_in_netns(topo.srv, lambda: s.replace(held))
    monkeypatch.setattr(bansets, "FILL_STEP", 3)
    steps_seen(monkeypatch, s, refuse_at=3)
    with pytest.raises(OSError):
        run_in_netns(topo.srv, lambda: s.change(add, remove))
    part = set(run_in_netns(topo.srv, s.read))
    assert untouched <= part and part & set(add) and not set(add) <= part, part


def test_what_netlimit_does_not_write_is_taken_out_without_dropping_a_ban(topo, monkeypatch):
    """Elements added by hand (no timeout, an address or a range in the interval set)
    made every sync write the list whole in one transaction (over 1 GiB of kernel
    memory for 100,000 bans). Now one small transaction takes them out first
    (bansets.foreign_clearing), adding with them each list prefix they overlap (a
    wider one takes out the held prefixes it overlaps), and the rest is a difference
    in steps. Between any two steps every address the list bans and something banned
    before stays banned; the sets end holding the list, every element with its time."""
    import subprocess

    from netlimit.kernel.nft import bansets

    topo.apply(CONFIG.format(exempt=topo.cli4b, limit="100/second", escalate=""))
    s = ban_sets("nftables")
    old = {N(f"10.0.{i}.0/24"): 600.0 for i in range(4)}
    old.update({N(f"10.1.0.{i}/32"): 600.0 for i in range(4)})
    old.update({N("10.8.2.0/24"): 600.0, N("10.10.0.0/16"): 600.0, N("2001:db8::/64"): 600.0})
    run_in_netns(topo.srv, lambda: s.replace(old))
    for where, odd in (
        ("bans4", "10.9.3.3"),  # an address in the interval set, no timeout: on no list
        ("bans4", "10.5.0.0/24"),  # no timeout: the new list has it
        ("banhosts4", "10.6.0.6"),  # no timeout: the new list holds it in 10.6.0.0/16
        ("bans4", "10.7.0.1-10.7.0.5 timeout 1h"),  # a range: the new list has 10.7.0.4
        ("bans6", "2001:db8:9::1"),  # an address in the interval set: on no list
        ("bans4", "10.8.1.1"),  # inside the new 10.8.0.0/16, beside the held 10.8.2.0/24 it drops
        ("banhosts4", "10.10.0.5"),  # in the new 10.10.0.0/24, inside the held 10.10.0.0/16 it drops
    ):
        subprocess.run(["ip", "netns", "exec", topo.srv, "nft", "add", "element", "inet", "netlimit", where,
                        f"{{ {odd} }}"], check=True, capture_output=True)  # fmt: skip
    new = {n: left for n, left in old.items() if n not in (N("10.8.2.0/24"), N("10.10.0.0/16"))}
    new.update({N("10.10.0.0/24"): 500.0, N("10.10.7.0/24"): 500.0})  # the latter: held only by the /16
    new.update({N("10.5.0.0/24"): 500.0, N("10.6.0.0/16"): 500.0, N("10.7.0.4/32"): 500.0, N("10.8.0.0/16"): 500.0})
    new.update({N(f"10.4.0.{i}/32"): 400.0 for i in range(5)})  # more to write: several steps
    keep = [a for n in new for a in (n.network_address, n.broadcast_address)]
    odd_ones = ("10.5.0.9", "10.6.0.6", "10.7.0.4", "10.8.1.1", "10.8.2.2", "10.10.0.5", "10.10.7.7")
    keep += [ipaddress.ip_address(a) for a in odd_ones]
    banned_before = {a for a in keep if any(a in n for n in run_in_netns(topo.srv, s.read))}
    keep_banned = {a for a in banned_before if any(a in n for n in new)}
    assert {ipaddress.ip_address(a) for a in odd_ones} - {ipaddress.ip_address("10.8.2.2")} <= keep_banned

    monkeypatch.setattr(bansets, "FILL_STEP", 4)
    between = steps_seen(monkeypatch, s)
    prefixes = sorted((n.version, int(n.network_address), n.prefixlen, left) for n, left in new.items())
    done = run_in_netns(topo.srv, lambda: s.sync_prefixes(prefixes))
    assert (done["write"], done["foreign"]) == ("diff", 7), done
    assert len(between) >= 3, between  # the clearing, then the difference in steps
    for now in between:
        missing = {a for a in keep_banned if not any(a in n for n in now)}
        assert not missing, (missing, now)
    got = run_in_netns(topo.srv, s.read)
    assert set(got) == set(new), got
    assert all(left is not None and left > 300 for left in got.values()), got
    assert run_in_netns(topo.srv, s._read_held) is not None

    # more foreign elements than one small transaction takes: written whole, as before
    monkeypatch.setattr(bansets, "FOREIGN_MOST", 3)
    subprocess.run(["ip", "netns", "exec", topo.srv, "nft", "add", "element", "inet", "netlimit", "bans4",
                    "{ 10.9.0.1, 10.9.0.3 }"], check=True, capture_output=True)  # fmt: skip
    done = run_in_netns(topo.srv, lambda: s.sync_prefixes(prefixes))
    assert (done["write"], done["why"]) == ("whole", "unread"), done
    assert set(run_in_netns(topo.srv, s.read)) == set(new)
