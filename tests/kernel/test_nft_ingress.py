"""The `ingress:` stage of the nftables backend with real traffic between two
namespaces: deny and the bans are matched in an inet ingress hook chain on the listed
interface, before conntrack; a banned or denied source is dropped there (its counter
moves, the input chain's does not), exempt passes, IPv4 and IPv6; where the hook is
unavailable they stay in the input chain; plan/apply/flush own the chain like the rest."""

from __future__ import annotations

import ipaddress
import subprocess
import sys

import pytest
from test_bans_kernel import send

from netlimit.config.validate import load_string
from netlimit.errors import ConfigError
from netlimit.kernel import reconcile
from netlimit.kernel.banset import ban_sets
from netlimit.kernel.compile import compile_config
from netlimit.kernel.netns import run_in_netns

N = ipaddress.ip_network
NETLIMIT = [sys.executable, "-m", "netlimit.cli"]
CLI4C = "198.18.0.4"  # a third client address (denied)

CONFIG = """
version: 1
exempt: ["{exempt}/32"]
deny: ["{deny4}/32", "{deny6}/128"]
bans: {{max_entries: 1000}}
{ingress}
network:
  - name: udp-cap
    protocol: udp
    ports: [5000]
    limit: 1000/second
"""


def _config(topo, ingress: str = "") -> str:
    return CONFIG.format(exempt=topo.cli4b, deny4=CLI4C, deny6=topo.cli6, ingress=ingress)


def _dropped(topo, chain: str) -> dict[str, int]:
    """(bans) and (deny) packets dropped in one base chain, and (exempt) packets passed."""
    out = {"(bans)": 0, "(deny)": 0, "(exempt)": 0}
    for r in reconcile.list_owned(topo.srv, backend="nftables"):
        if r.get("chain") == chain and r["rule"] in out:
            out[r["rule"]] += int(r["packets"] or 0)
    return out


def _prime(topo) -> None:
    """Every client address talks once before deny and the bans exist (neighbour
    discovery learned: a banned IPv6 source's own solicitations are dropped too)."""
    topo.cx("ip", "addr", "add", f"{CLI4C}/24", "dev", topo.cli_if)
    for src, dst in ((topo.cli4, topo.srv4), (topo.cli4b, topo.srv4), (CLI4C, topo.srv4)):
        send(topo, src, dst, n=1, port=6000)
    for src in (topo.cli6, topo.cli6b):
        send(topo, src, topo.srv6, n=1, port=6000)


def _nft(topo, *args: str) -> str:
    return topo.sx("nft", *args).stdout


@pytest.mark.netns
def test_ingress_chain_drops_bans_and_deny_before_input(topo, monkeypatch):
    monkeypatch.setenv("NETLIMIT_BACKEND", "nftables")
    _prime(topo)
    text = _config(topo, f"ingress: {{interfaces: [{topo.srv_if}]}}")
    desired = topo.desired(text)
    assert "ingress hook on s0" in desired.nft.stage
    topo.apply(text)
    listed = _nft(topo, "list", "chain", "inet", "netlimit", "ingress")
    assert 'devices = { "s0" }' in listed or 'device "s0"' in listed, listed
    assert "priority -500" in listed
    bans = ban_sets("nftables")
    run_in_netns(topo.srv, lambda: bans.replace({N(f"{topo.cli4}/32"): 60.0, N(f"{topo.cli6b}/128"): 60.0}))
    send(topo, topo.cli4, topo.srv4, n=20, port=5000)  # banned, IPv4
    send(topo, topo.cli6b, topo.srv6, n=20, port=5000)  # banned, IPv6
    send(topo, CLI4C, topo.srv4, n=20, port=5000)  # denied, IPv4
    send(topo, topo.cli6, topo.srv6, n=20, port=5000)  # denied, IPv6
    send(topo, topo.cli4b, topo.srv4, n=20, port=5000)  # exempt: passes both chains
    ingress, inp = _dropped(topo, "ingress"), _dropped(topo, "input")
    assert ingress["(bans)"] == 40 and ingress["(deny)"] == 40, ingress
    assert inp["(bans)"] == 0 and inp["(deny)"] == 0, inp  # never reached the input chain
    assert ingress["(exempt)"] == 20 and inp["(exempt)"] == 20, (ingress, inp)
    # `list` names the stage
    out = subprocess.run([*NETLIMIT, "list", "--netns", topo.srv], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    deny = [ln for ln in out.stdout.splitlines() if ln.startswith("(deny)")]
    assert deny and deny[0].split()[1].startswith("ingress"), out.stdout
    out = subprocess.run(
        [*NETLIMIT, "list", "--verbose", "--netns", topo.srv], capture_output=True, text=True, timeout=120
    )
    assert out.returncode == 0, out.stderr
    assert any(ln.startswith("(deny)") and "ingress: " in ln for ln in out.stdout.splitlines()), out.stdout
    # the same file again: nothing to do
    assert not topo.apply(text).changed
    # the chain removed behind netlimit's back: plan sees it, apply puts it back (drift repair
    # is this reconcile)
    topo.sx("nft", "delete", "chain", "inet", "netlimit", "ingress")
    assert topo.apply(text).changed
    assert "priority -500" in _nft(topo, "list", "chain", "inet", "netlimit", "ingress")
    # another interface list: the chain is made again with it
    two = _config(topo, f"ingress: {{interfaces: [eth9, {topo.srv_if}]}}")
    assert topo.apply(two).changed
    listed = _nft(topo, "list", "chain", "inet", "netlimit", "ingress")
    assert "eth9" in listed and "s0" in listed, listed
    assert not topo.apply(two).changed  # the devices read back over netlink, in any order
    # without `ingress:` the chain goes and the input chain drops again
    topo.apply(_config(topo))
    assert "chain ingress" not in _nft(topo, "list", "table", "inet", "netlimit")
    send(topo, topo.cli4, topo.srv4, n=5, port=5000)
    assert _dropped(topo, "input")["(bans)"] == 5
    # flush leaves nothing
    p = subprocess.run([*NETLIMIT, "flush", "--netns", topo.srv, "-q"], capture_output=True, text=True, timeout=120)
    assert p.returncode == 0, p.stderr
    assert _nft(topo, "list", "ruleset").strip() == ""


@pytest.mark.netns
def test_without_the_hook_deny_and_bans_stay_in_input(topo, monkeypatch, tmp_path):
    """An old kernel or nft: the same file compiles to today's input chain, and plan says why."""
    monkeypatch.setenv("NETLIMIT_BACKEND", "nftables")
    _prime(topo)
    text = _config(topo, f"ingress: {{interfaces: [{topo.srv_if}]}}")
    desired = compile_config(load_string(text, "<test>").config, ingress_problem="nft 0.9.8 (test)")
    assert [c.name for c in desired.nft.chains if c.hook] == ["input"]
    assert "unavailable: nft 0.9.8 (test)" in desired.nft.stage
    # the same table as a file without `ingress:`
    plain = compile_config(load_string(_config(topo), "<test>").config)
    assert desired.nft == plain.nft and plain.nft.stage == ""
    reconcile.apply(desired, topo.srv)
    bans = ban_sets("nftables")
    run_in_netns(topo.srv, lambda: bans.replace({N(f"{topo.cli6b}/128"): 60.0}))
    send(topo, topo.cli6b, topo.srv6, n=20, port=5000)
    send(topo, CLI4C, topo.srv4, n=20, port=5000)
    inp = _dropped(topo, "input")
    assert inp["(bans)"] == 20 and inp["(deny)"] == 20, inp
    f = tmp_path / "ingress.yaml"
    f.write_text(text)
    out = subprocess.run(
        [*NETLIMIT, "plan", str(f), "--netns", topo.srv, "--backend", "nftables"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    # on this host the hook exists: plan (which asks the host) adds the ingress chain
    assert out.returncode == 0, out.stderr
    assert "chain ingress" in out.stdout, out.stdout
    reconcile.flush(topo.srv)
    assert _nft(topo, "list", "ruleset").strip() == ""


def test_ingress_interfaces_are_checked():
    base = "version: 1\ndeny: [203.0.113.0/24]\ningress: {interfaces: %s}\n"
    for bad, why in (("[lo]", "loopback"), ("[eth0, eth0]", "twice"), ("[]", "at least 1"), ("[a/b]", "not a valid")):
        with pytest.raises(ConfigError) as exc:
            load_string(base % bad, "f.yaml")
        assert why in str(exc.value) and "f.yaml:3" in str(exc.value), str(exc.value)
    cfg = load_string(base % "[eth0, eth1]", "f.yaml").config
    assert cfg.ingress is not None and cfg.ingress.interfaces == ["eth0", "eth1"]
    # the legacy backends have no ingress hook: plan warns, naming the line
    from netlimit.kernel.registry import backend

    warned = backend("restore").warnings(load_string(base % "[eth0]", "f.yaml"))
    assert len(warned) == 1 and warned[0].line == 3 and "nftables backend" in warned[0].message, warned
    assert backend("nftables").warnings(load_string(base % "[eth0]", "f.yaml")) == []
    # nothing to match (no deny, no bans): no ingress chain
    empty = compile_config(load_string("version: 1\ningress: {interfaces: [eth0]}\n", "f").config, 250, None)
    assert empty.nft.empty
