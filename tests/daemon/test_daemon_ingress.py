"""netlimitd owns the nftables `ingress:` stage like every other object: it writes the
ingress chain, repairs it when it is deleted by hand, and removes it on stop."""

from __future__ import annotations

import pytest
from daemon_proc import config_text, sh, wait_for

pytestmark = pytest.mark.netns


def _chain(netns: str) -> str:
    return sh("ip", "netns", "exec", netns, "nft", "list", "chain", "inet", "netlimit", "ingress", check=False).stdout


def test_drift_repair_covers_the_ingress_chain(daemon_factory, netns, monkeypatch):
    monkeypatch.setenv("NETLIMIT_BACKEND", "nftables")
    text = config_text().replace(
        "exempt: [127.0.0.0/8]\n", "exempt: [127.0.0.0/8]\ndeny: [203.0.113.0/24]\ningress: {interfaces: [nlta]}\n"
    )
    d = daemon_factory(text, resync=1.0)
    d.start()
    wait_for(lambda: "hook ingress" in _chain(netns), 20.0, "the ingress chain")
    assert "@deny4" in _chain(netns) and "priority -500" in _chain(netns)
    sh("ip", "netns", "exec", netns, "nft", "delete", "chain", "inet", "netlimit", "ingress")
    assert "hook ingress" not in _chain(netns)
    wait_for(lambda: "@deny4" in _chain(netns), 20.0, "the ingress chain repaired")
    st = wait_for(lambda: (s := d.status())["drift_repairs"] >= 1 and s, 20.0, "the repair count")
    assert any("ingress" in line for line in st["last_drift"]), st["last_drift"]
    assert d.stop() == 0  # on_stop: flush
    assert sh("ip", "netns", "exec", netns, "nft", "list", "ruleset").stdout.strip() == ""
