"""`netlimit list` a person can read (issue 31 item 6), against the real kernel in a
namespace, once per backend (nftables, restore, python-iptables): one line per
rule with what it matches, its limit as the file writes it, packets, drops and
set entries, at most 120 characters; `--verbose` the raw objects, tc ones in the
plan's spelling; a rule's `comment:` in the list and in the kernel's comment."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
from hypothesis import given
from hypothesis import strategies as st

from netlimit.kernel import listing, traffic

NETLIMIT = [sys.executable, "-m", "netlimit.cli"]


def _cli(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([*NETLIMIT, *args], capture_output=True, text=True, timeout=120)


def config(topo) -> str:
    return f"""
version: 1
exempt: [198.18.0.250/32]
network:
  - name: udp-flood
    protocol: udp
    ports: [5000, "6000-6010"]
    limit: 100/second
    burst: 10
    comment: game servers, see OPS-42
  - name: ssh-guard
    protocol: tcp
    ports: [22]
    new_connections: true
    limit: 3/minute
    method: recent
bandwidth:
  - name: bulk
    interface: {topo.srv_if}
    ports: [5201]
    protocol: tcp
    rate: 10mbit
    burst: 64kb
    comment: backups
  - name: in-cap
    interface: {topo.srv_if}
    direction: ingress
    rate: 100mbit
"""


@pytest.mark.netns
def test_list_one_line_per_rule_verbose_in_plan_spelling_and_comments(topo, tmp_path, every_backend):
    f = tmp_path / "r.yaml"
    f.write_text(config(topo))
    a = _cli("apply", str(f), "--netns", topo.srv)
    assert a.returncode == 0, a.stderr
    traffic.udp_flood(topo.cli, topo.cli4, topo.srv4, 5000, 1000, 1.0)

    ls = _cli("list", "--netns", topo.srv)
    assert ls.returncode == 0, ls.stderr
    lines = ls.stdout.splitlines()
    assert lines[0].startswith(f"backend: {every_backend} ")
    table = lines[1:]
    assert table[0].split() == ["RULE", "LAYER", "MATCH", "LIMIT", "PACKETS", "DROPS", "ENTRIES"]
    assert [x.split()[0] for x in table[1:]] == ["(exempt)", "udp-flood", "ssh-guard", "bulk", "in-cap"], ls.stdout
    assert all(len(x) <= 120 for x in lines[1:]), [len(x) for x in lines]
    rows = {x.split()[0]: x for x in table[1:]}
    layer = "nftables" if every_backend == "nftables" else "iptables"
    flood = rows["udp-flood"]
    assert f"udp-flood  {layer}  udp dport 5000,6000-6010" in flood, flood
    assert "100/second burst 10 per source" in flood, flood
    assert "# game serv" in flood, flood
    cols = flood.split("#")[0].split()
    drops = int(cols[-2])
    assert drops > 0 and int(cols[-3]) >= drops, flood  # a flood of 1000 at 100/s: over-limit packets dropped
    assert "3/minute per source (recent)" in rows["ssh-guard"] and "tcp dport 22 new" in rows["ssh-guard"]
    assert f"tc        egress {topo.srv_if} tcp sport 5201" in rows["bulk"] and "10mbit burst 64kb" in rows["bulk"]
    assert "# backups" in rows["bulk"]
    assert f"ingress {topo.srv_if} all traffic" in rows["in-cap"] and "100mbit" in rows["in-cap"]
    assert "198.18.0.250/32" in rows["(exempt)"] and "never limited" in rows["(exempt)"]

    # --json: the same lines, the comment whole, the raw objects as before
    doc = json.loads(_cli("list", "--netns", topo.srv, "--json").stdout)
    by = {x["rule"]: x for x in doc["rules"]}
    assert by["udp-flood"]["comment"] == "game servers, see OPS-42" and by["udp-flood"]["dropped"] == drops
    assert by["udp-flood"]["limit"] == "100/second burst 10 per source"
    assert any(o["rule"] == "udp-flood" for o in doc["objects"])

    # the comment is in the kernel rule's comment too
    if every_backend == "nftables":
        kernel = topo.sx("nft", "list", "table", "inet", "netlimit").stdout
    else:
        kernel = topo.sx("iptables-legacy-save").stdout
    assert "netlimit:udp-flood | game servers, see OPS-42" in kernel, kernel
    assert "no changes" in _cli("plan", str(f), "--live", "--netns", topo.srv).stdout  # read back equal

    # --verbose: every object; tc's as plan writes them (no u32 'at 9', no rounded burst)
    verbose = _cli("list", "--netns", topo.srv, "--verbose").stdout
    plan = _cli("plan", str(f)).stdout
    tc_plan = [x for x in plan.splitlines() if x.startswith(("tc ", "ip link add"))]
    assert len(tc_plan) >= 6
    for cmd in tc_plan:
        assert cmd in verbose, (cmd, verbose)
    assert "netlimit:udp-flood | game servers" in verbose

    # without what the apply remembered: the counters still, the description from --file
    os.unlink(f"/run/netlimit/rules-{topo.srv}.json")
    bare = _cli("list", "--netns", topo.srv).stdout
    assert "run `netlimit list --file FILE`" in bare
    assert any(x.startswith("udp-flood") and " ? " in x for x in bare.splitlines()), bare
    filed = _cli("list", "--netns", topo.srv, "--file", str(f)).stdout
    assert "udp dport 5000,6000-6010" in filed and "--file FILE" not in filed
    filed_verbose = _cli("list", "--netns", topo.srv, "--file", str(f), "-v").stdout  # one read, every command
    for cmd in tc_plan:
        assert cmd in filed_verbose, (cmd, filed_verbose)

    fl = _cli("flush", "--netns", topo.srv)
    assert fl.returncode == 0 and not os.path.exists(f"/run/netlimit/rules-{topo.srv}.json")


# --- the layout, pure -------------------------------------------------------------------

_text = st.text(st.characters(min_codepoint=32, max_codepoint=126), min_size=1, max_size=80)


@given(
    st.lists(
        st.fixed_dictionaries(
            {
                "rule": st.text("abcdefghij-", min_size=1, max_size=48),
                "match": _text,
                "limit": _text,
                "packets": st.none() | st.integers(0, 10**15),
                "dropped": st.none() | st.integers(0, 10**15),
                "entries": st.none() | st.integers(0, 10**7),
                "comment": st.none() | st.text(st.characters(min_codepoint=32, max_codepoint=126), max_size=48),
            }
        ),
        min_size=1,
        max_size=8,
    )
)
def test_every_line_fits_120_and_keeps_the_rule_name_first(entries):
    lines = []
    for e in entries:
        x = {**e, "layer": "nftables", "tables": {"set a": e["entries"]} if e["entries"] is not None else {}}
        if not x["comment"]:
            x.pop("comment")
        lines.append(x)
    out = listing.format_lines(lines).split("\n")
    assert len(out) == len(lines) + 1
    assert all(len(x) <= listing.WIDTH for x in out), max(len(x) for x in out)
    for x, line in zip(lines, out[1:]):
        name = x["rule"]
        assert line.startswith(name if len(name) <= listing.CAPS["rule"] else name[: listing.CAPS["rule"] - 1])


def test_a_short_comment_is_shown_whole():
    line = {
        "rule": "a",
        "layer": "tc",
        "match": "egress eth0 all traffic",
        "limit": "10mbit",
        "packets": 1,
        "dropped": 0,
        "entries": None,
        "tables": {},
        "comment": "the backup window",
    }
    out = listing.format_lines([line]).split("\n")[1]
    assert out.endswith("  # the backup window") and out.startswith("a     tc     egress eth0 all traffic  10mbit")
