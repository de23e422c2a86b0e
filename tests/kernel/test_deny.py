"""The static deny list (`deny:`) with real traffic between two namespaces, on every
backend: its sources are dropped right after exempt and before the bans and every
limit, forever; `list` shows it; an apply of the same file changes nothing; an
entry overlapping exempt is refused by validate before anything is written."""

from __future__ import annotations

import subprocess
import sys

import pytest
from test_bans_kernel import send

from netlimit.kernel import reconcile

pytestmark = pytest.mark.netns
NETLIMIT = [sys.executable, "-m", "netlimit.cli"]

CONFIG = """
version: 1
exempt: ["{exempt}/32"]
deny: ["{deny4}", "{deny6}/128", 203.0.113.0/24, 203.0.113.7]
network:
  - name: udp-cap
    protocol: udp
    ports: [5000]
    limit: 1000/second
"""


def denied(topo, backend: str) -> int:
    rows = reconcile.list_owned(topo.srv, backend=backend)
    return sum(int(r["dropped"] or 0) for r in rows if r["rule"] == "(deny)")


def test_denied_sources_are_dropped_before_any_rule(topo, every_backend, tmp_path):
    text = CONFIG.format(exempt=topo.cli4b, deny4=topo.cli4, deny6=topo.cli6)
    f = tmp_path / "deny.yaml"
    f.write_text(text)
    p = subprocess.run(
        [*NETLIMIT, "apply", str(f), "--netns", topo.srv, "-q"], capture_output=True, text=True, timeout=120
    )
    assert p.returncode == 0, p.stderr
    assert denied(topo, every_backend) == 0
    send(topo, topo.cli4, topo.srv4, n=20, port=5000)  # denied, also on the rule's own port
    send(topo, topo.cli4b, topo.srv4, n=20, port=5000)  # exempt
    send(topo, topo.cli6b, topo.srv6, n=5, port=5000)  # neither: the rule's 1000/s lets it pass
    assert denied(topo, every_backend) == 20
    rows = reconcile.list_owned(topo.srv, backend=every_backend)
    rule_rows = [r for r in rows if r["rule"] == "udp-cap"]
    # only the undenied source reached the rule: one source in its per-source tables
    assert sum(int(r.get("table_entries") or 0) for r in rule_rows) == 1, rule_rows
    send(topo, topo.cli6, topo.srv6, n=7, port=6000)
    assert denied(topo, every_backend) == 27
    # `list` names the deny list on one line: what it matches, and the 27 packets it dropped
    out = subprocess.run([*NETLIMIT, "list", "--netns", topo.srv], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    deny_lines = [line for line in out.stdout.splitlines() if line.startswith("(deny)")]
    assert len(deny_lines) == 1 and "always dropped" in deny_lines[0] and "from " in deny_lines[0], out.stdout
    packets, drops = deny_lines[0].split()[-3:-1]
    assert (packets, drops) == ("27", "27"), out.stdout
    # --verbose keeps the kernel objects: the sets (nftables) or one rule per prefix
    # (203.0.113.7 lies inside 203.0.113.0/24: merged)
    out = subprocess.run(
        [*NETLIMIT, "list", "--verbose", "--netns", topo.srv], capture_output=True, text=True, timeout=120
    )
    assert out.returncode == 0, out.stderr
    raw = [line for line in out.stdout.splitlines() if line.startswith("(deny)")]
    if every_backend == "nftables":
        assert any("[set deny4: 2 entries]" in line for line in raw), out.stdout
    else:
        assert len(raw) == 3, out.stdout
        assert any(f"{topo.cli4}" in line for line in raw) and any("203.0.113.0/24" in line for line in raw)
    # the same file again: nothing to do; a deny entry removed: it passes again
    assert not topo.apply(text).changed
    topo.apply(text.replace(f'"{topo.cli4}", ', ""))
    before = denied(topo, every_backend)
    send(topo, topo.cli4, topo.srv4, n=10, port=5000)
    assert denied(topo, every_backend) == before
    send(topo, topo.cli6, topo.srv6, n=3, port=6000)
    assert denied(topo, every_backend) == before + 3


def test_deny_alone_makes_the_input_chain(topo, every_backend):
    topo.apply(f'version: 1\ndeny: ["{topo.cli4}"]\n')
    send(topo, topo.cli4, topo.srv4, n=4)
    send(topo, topo.cli4b, topo.srv4, n=4)
    assert denied(topo, every_backend) == 4
    res = topo.apply("version: 1\n")
    assert res.changed and reconcile.list_owned(topo.srv, backend=every_backend) == []


def test_a_deny_entry_overlapping_exempt_is_refused(topo, tmp_path):
    f = tmp_path / "overlap.yaml"
    f.write_text("version: 1\nexempt: [198.18.0.0/24]\ndeny:\n  - 203.0.113.0/24\n  - 198.18.0.2\n")
    p = subprocess.run([*NETLIMIT, "apply", str(f), "--netns", topo.srv], capture_output=True, text=True, timeout=120)
    assert p.returncode == 1
    assert f"{f}:5:5: deny: 198.18.0.2/32 overlaps exempt 198.18.0.0/24 (line 2)" in p.stderr, p.stderr
    assert reconcile.list_owned(topo.srv) == []  # nothing was written
