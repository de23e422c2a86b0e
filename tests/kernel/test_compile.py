"""The pure compiler and the plan renderers (no root, no kernel)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from netlimit.config.validate import load_file, load_string
from netlimit.kernel.compile import compile_config, ifb_name, log_chain_name
from netlimit.kernel.objects import COMMENT_EXEMPT, COMMENT_JUMP, TcClass, TcFilter, TcLink, TcQdisc
from netlimit.kernel.render import plan_dict, plan_json, plan_text, rule_line

ROOT = Path(__file__).resolve().parents[2]
RULES = sorted((ROOT / "rules").glob("*.yaml"))
GOLDEN = ROOT / "tests" / "kernel" / "golden"
HZ = 250  # the golden files are rendered with a fixed HZ so they do not depend on the host


def compiled(text: str, hz: int = HZ):
    return compile_config(load_string(text, "<t>").config, hz=hz)


def lines(d, family=None):
    return [rule_line(r) for r in d.rules if family is None or r.family == family]


# --- network rules -----------------------------------------------------------------------


def test_hashlimit_rule_all_parameters_explicit():
    d = compiled("""
version: 1
network:
  - name: dns
    protocol: udp
    ports: [53]
    limit: 100/second
    burst: 10
    source_prefix: 24
    sources: [10.0.0.0/8]
""")
    assert lines(d) == [
        '-A NETLIMIT -s 10.0.0.0/8 -p udp -m comment --comment "netlimit:dns" -m multiport --dports 53 '
        "-m hashlimit --hashlimit-above 100/sec --hashlimit-burst 10 --hashlimit-mode srcip --hashlimit-name dns "
        "--hashlimit-htable-size 4096 --hashlimit-htable-max 65536 --hashlimit-htable-expire 10000 "
        "--hashlimit-srcmask 24 -j DROP",
        '-I INPUT 1 -m comment --comment "netlimit: jump" -j NETLIMIT',
    ]


def test_hashlimit_expire_outlives_refill_and_modes():
    d = compiled("""
version: 1
network:
  - name: slow
    protocol: tcp
    ports: [25]
    limit: 2/minute
    burst: 4
    per: source+port
    htable_size: 128
  - name: one-bucket
    protocol: udp
    ports: [123]
    limit: 10/second
    per: all
    htable_expire: 5000
""")
    txt = "\n".join(lines(d, 4))
    # 4 tokens at 2/minute refill in 120 s: the entry must live that long
    assert "--hashlimit-above 2/min --hashlimit-burst 4 --hashlimit-mode srcip,dstport" in txt
    assert "--hashlimit-htable-size 128 --hashlimit-htable-max 65536 --hashlimit-htable-expire 120000" in txt
    one = [l for l in lines(d, 4) if "one-bucket" in l][0]
    assert "--hashlimit-mode" not in one and "--hashlimit-burst 5 " in one and "expire 5000" in one


def test_long_rule_name_uses_config_hashlimit_name():
    from netlimit.config.validate import hashlimit_name

    name = "a-very-long-rule-name-for-tests"
    d = compiled(f"version: 1\nnetwork:\n  - name: {name}\n    protocol: udp\n    ports: [9]\n    limit: 5/second\n")
    assert f"--hashlimit-name {hashlimit_name(name)} " in lines(d)[0]
    assert len(hashlimit_name(name)) <= 15


def test_recent_rule_checks_then_sets():
    d = compiled("""
version: 1
network:
  - name: ssh
    protocol: tcp
    ports: [22]
    new_connections: true
    limit: 3/minute
    method: recent
""")
    v4 = lines(d, 4)
    assert v4[0].endswith(
        "-m conntrack --ctstate NEW -m recent --update --seconds 60 --hitcount 3 --name ssh "
        "--mask 255.255.255.255 --rsource -j DROP"
    )
    assert v4[1].endswith("-m recent --set --name ssh --mask 255.255.255.255 --rsource")
    v6 = lines(d, 6)
    assert "--mask ffff:ffff:ffff:ffff:ffff:ffff:ffff:ffff --rsource -j DROP" in v6[0]


def test_connlimit_rule():
    d = compiled("""
version: 1
network:
  - name: api
    protocol: tcp
    ports: [443]
    max_connections: 20
    action: reject
  - name: per-dst
    protocol: tcp
    ports: [80]
    max_connections: 5
    per: destination
    source_prefix6: 64
""")
    v4, v6 = lines(d, 4), lines(d, 6)
    assert v4[0].endswith(
        "-m conntrack --ctstate NEW -m connlimit --connlimit-above 20 --connlimit-mask 32 "
        "--connlimit-saddr -j REJECT --reject-with tcp-reset"
    )
    assert "--connlimit-mask 128 --connlimit-saddr" in v6[0]
    assert "--connlimit-above 5 --connlimit-mask 64 --connlimit-daddr -j DROP" in v6[1]


def test_log_action_counts_and_logs_never_drops():
    d = compiled(
        """
version: 1
network:
  - name: shadow
    protocol: tcp
    ports: [8080]
    limit: 10/second
""".replace("limit: 10/second", "limit: 10/second\n    action: log")
    )
    v4 = lines(d, 4)
    chain = log_chain_name("shadow")
    assert v4[0].endswith(f"-j {chain}")
    assert v4[1] == (
        f'-A {chain} -m comment --comment "netlimit:shadow" -m limit --limit 10/min --limit-burst 5 '
        '-j LOG --log-prefix "netlimit:shadow "'
    )
    assert not any("DROP" in l or "REJECT" in l for l in v4)
    assert [c.name for c in d.chains if c.family == 4] == ["NETLIMIT", chain]


def test_family_split_by_addresses():
    d = compiled("""
version: 1
exempt: [127.0.0.0/8, "::1/128"]
network:
  - name: v4only
    protocol: udp
    ports: [1]
    limit: 1/second
    sources: [10.0.0.0/8]
  - name: v6only
    protocol: udp
    ports: [2]
    limit: 1/second
    destinations: ["2001:db8::/32"]
  - name: both
    protocol: icmp
    limit: 1/second
  - name: mixed
    protocol: udp
    ports: [3]
    limit: 1/second
    sources: [192.0.2.0/24, "2001:db8:1::/48"]
""")
    v4, v6 = "\n".join(lines(d, 4)), "\n".join(lines(d, 6))
    assert "v4only" in v4 and "v4only" not in v6
    assert "v6only" in v6 and "v6only" not in v4
    assert "-p icmp " in v4 and "-p ipv6-icmp " in v6
    assert "-s 192.0.2.0/24" in v4 and "-s 2001:db8:1::/48" in v6
    assert "2001:db8:1::" not in v4 and "192.0.2.0" not in v6


def test_exempt_first_and_jump_at_top():
    d = compiled("""
version: 1
exempt: [127.0.0.0/8, 192.0.2.0/24, "::1/128"]
network:
  - name: a
    protocol: udp
    ports: [1]
    limit: 1/second
  - name: fwd
    chain: forward
    interface: eth1
    protocol: udp
    ports: [2]
    limit: 1/second
""")
    for fam in (4, 6):
        rules = [r for r in d.rules if r.family == fam]
        for chain in ("NETLIMIT", "NETLIMIT-FWD"):
            in_chain = [r for r in rules if r.chain == chain]
            n_exempt = 2 if fam == 4 else 1
            assert all(r.comment == COMMENT_EXEMPT and r.target == "RETURN" for r in in_chain[:n_exempt])
            assert all(r.comment != COMMENT_EXEMPT for r in in_chain[n_exempt:])
        jumps = [r for r in rules if r.comment == COMMENT_JUMP]
        assert [(j.chain, j.target, j.position) for j in jumps] == [
            ("INPUT", "NETLIMIT", 0),
            ("FORWARD", "NETLIMIT-FWD", 0),
        ]
    assert any("-i eth1 " in l for l in lines(d, 4))


def test_many_ports_split_into_multiport_groups():
    ports = ", ".join(str(p) for p in range(1000, 1020))
    d = compiled(f"version: 1\nnetwork:\n  - name: m\n    protocol: tcp\n    ports: [{ports}]\n    limit: 1/second\n")
    v4 = [l for l in lines(d, 4) if "multiport" in l]
    assert len(v4) == 2
    assert "--dports 1000,1001,1002,1003,1004,1005,1006,1007,1008,1009,1010,1011,1012,1013,1014 " in v4[0]


def test_no_network_rules_no_chains():
    d = compiled("version: 1\nexempt: [10.0.0.0/8]\n")
    assert d.rules == () and d.chains == () and d.devices == ()
    assert "nothing to install" in plan_text(d)


# --- bandwidth rules ---------------------------------------------------------------------


def test_bandwidth_classes_filters_and_default():
    d = compiled("""
version: 1
bandwidth:
  - name: web
    interface: eth0
    ports: [8080, "9000-9003"]
    protocol: tcp
    rate: 10mbit
  - name: peer
    interface: eth0
    sources: [10.1.0.0/16]
    rate: 50mbit
    burst: 64kb
""")
    (dev,) = d.devices
    q = [o for o in dev.objects if isinstance(o, TcQdisc)]
    c = [o for o in dev.objects if isinstance(o, TcClass)]
    f = [o for o in dev.objects if isinstance(o, TcFilter)]
    assert [(o.handle, o.default_minor) for o in q] == [(0x4E4C0000, 2)]
    assert [(hex(o.classid), o.rule, o.rate) for o in c] == [
        ("0x4e4c0002", "", 100 * 10**9),
        ("0x4e4c0010", "web", 10**7),
        ("0x4e4c0011", "peer", 5 * 10**7),
    ]
    assert all(o.quantum <= 60000 for o in c)
    assert c[2].burst == 65536 and c[1].burst == 10240
    web4 = [o for o in f if o.rule == "web" and o.protocol == "ip"]
    # port 8080 + range 9000-9003 (one aligned block) for tcp
    assert len(web4) == 2 and all(o.prio == 10 and o.flowid == 0x4E4C0010 for o in web4)
    assert any(k.offset == 20 and k.mask == 0xFFFC0000 and k.value == 9000 << 16 for o in web4 for k in o.keys)
    peer = [o for o in f if o.rule == "peer"]
    assert [o.protocol for o in peer] == ["ip"] and peer[0].prio == 20
    assert [(k.value, k.mask, k.offset) for k in peer[0].keys] == [(0x0A010000, 0xFFFF0000, 16)]


def test_ingress_uses_ifb_and_redirect():
    d = compiled("""
version: 1
bandwidth:
  - name: in
    interface: eth0
    direction: ingress
    rate: 100mbit
""")
    (dev,) = d.devices
    assert dev.dev == ifb_name("eth0") == "nlifb-eth0"
    kinds = [type(o).__name__ for o in dev.objects]
    assert kinds == ["TcLink", "TcQdisc", "TcClass", "TcQdisc", "TcFilter"]
    link, htb, cls, ing, red = dev.objects
    assert isinstance(link, TcLink) and htb.dev == "nlifb-eth0" and htb.default_minor == 1
    assert ing.kind == "ingress" and ing.dev == "eth0"
    assert red.redirect_to == "nlifb-eth0" and red.dev == "eth0"
    txt = plan_text(d)
    assert (
        "tc filter add dev eth0 parent ffff: protocol all prio 20044 u32 match u32 0x00000000 0x00000000 at 0 "
        "action mirred egress redirect dev nlifb-eth0" in txt
    )


def test_ifb_names_are_short_and_deterministic():
    assert ifb_name("a-very-long-if0") == ifb_name("a-very-long-if0")
    assert len(ifb_name("a-very-long-if0")) <= 15
    assert ifb_name("a-very-long-if0") != ifb_name("a-very-long-if1")


def test_default_burst_from_kernel_limits():
    from netlimit.config.kernel_limits import default_tc_burst

    d = compiled("version: 1\nbandwidth:\n  - name: c\n    interface: eth0\n    rate: 200mbit\n", hz=100)
    cls = [o for o in d.devices[0].objects if isinstance(o, TcClass)][0]
    assert cls.burst == default_tc_burst(200 * 10**6, 100)


def test_whole_interface_cap_is_parent_of_rule_classes():
    d = compiled("""
version: 1
bandwidth:
  - name: cap
    interface: eth0
    rate: 100mbit
  - name: part
    interface: eth0
    ports: [80]
    protocol: tcp
    rate: 10mbit
""")
    cls = {o.classid & 0xFFFF: o for o in d.devices[0].objects if isinstance(o, TcClass)}
    assert cls[1].rule == "cap" and cls[1].parent == 0x4E4C0000
    assert cls[2].parent == cls[0x10].parent == 0x4E4C0001
    assert cls[2].ceil == 100 * 10**6


# --- determinism and output formats --------------------------------------------------------


def test_deterministic():
    p = ROOT / "rules" / "example-all.yaml"
    a = compile_config(load_file(p).config, hz=HZ)
    b = compile_config(load_file(p).config, hz=HZ)
    assert a == b and plan_text(a) == plan_text(b)


def test_plan_json_shape():
    d = compile_config(load_file(ROOT / "rules" / "example-all.yaml").config, hz=HZ)
    data = json.loads(plan_json(d, source="x.yaml"))
    assert data["file"] == "x.yaml"
    assert {r["layer"] for r in data["iptables"]["rules"]} == {"iptables", "ip6tables"}
    assert all(r["line"].startswith(("-A ", "-I ")) for r in data["iptables"]["rules"])
    assert data["iptables"]["restore"]["iptables"].startswith("*filter\n")
    objs = [o for dev in data["tc"]["devices"] for o in dev["objects"]]
    assert {o["object"] for o in objs} == {"link", "qdisc", "class", "filter"}
    assert plan_dict(d) == json.loads(plan_json(d))


def test_plan_text_is_restore_input():
    """Every non-comment iptables line of the plan is valid iptables-restore syntax in shape."""
    d = compile_config(load_file(ROOT / "rules" / "example-all.yaml").config, hz=HZ)
    text = plan_text(d)
    section = None
    for line in text.splitlines():
        if line.startswith("# --- "):
            section = line
            continue
        if not line or line.startswith("#"):
            continue
        if "tc" in (section or "").split()[2:3]:
            assert line.startswith(("tc ", "ip link add"))
        else:
            assert line.startswith(("*filter", ":", "-A ", "-I ", "COMMIT")), line


def _run_cli(*args):
    env = dict(os.environ)
    return subprocess.run(
        [sys.executable, "-m", "netlimit.cli", *args], capture_output=True, text=True, timeout=60, cwd=ROOT, env=env
    )


def test_cli_plan_without_root_and_fast_imports():
    p = _run_cli("plan", "rules/example-all.yaml", "--backend", "restore")
    assert p.returncode == 0, p.stderr
    assert "-A NETLIMIT" in p.stdout and "tc qdisc add" in p.stdout
    assert "# backend: restore (--backend restore)" in p.stdout
    n = _run_cli("plan", "rules/example-all.yaml", "--backend", "nftables")
    assert "table inet netlimit {" in n.stdout and "-A NETLIMIT" not in n.stdout and "tc qdisc add" in n.stdout
    assert "method: recent is a bucket" in n.stderr  # the recent warning, under nftables only
    assert "method: recent" not in p.stderr
    auto = _run_cli("plan", "rules/example-all.yaml")
    assert "# backend: " in auto.stdout and "auto: " in auto.stdout, auto.stdout[:400]
    pj = _run_cli("plan", "rules/example-all.yaml", "--json")
    doc = json.loads(pj.stdout)
    assert doc["rules"] and doc["backend"] in ("nftables", "restore", "python-iptables") and doc["backend_reason"]
    # plan must not load python-iptables or pyroute2
    code = (
        "import sys; from typer.testing import CliRunner; from netlimit.cli import app; "
        "r = CliRunner().invoke(app, ['plan', 'rules/example-all.yaml']); assert r.exit_code == 0, r.output; "
        "bad = [m for m in ('iptc', 'pyroute2') if m in sys.modules]; assert not bad, bad"
    )
    c = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, timeout=60)
    assert c.returncode == 0, c.stderr


def test_cli_plan_invalid_file_exit_1(tmp_path):
    f = tmp_path / "bad.yaml"
    f.write_text("version: 1\nnetwork:\n  - name: x\n    limit: nope\n")
    p = _run_cli("plan", str(f))
    assert p.returncode == 1 and "bad rate" in p.stderr


# --- golden files: the plan of every file in rules/ -------------------------------------------


@pytest.mark.parametrize("path", RULES, ids=[p.name for p in RULES])
def test_golden_plan(path: Path):
    """The plan under both backends (legacy: .plan.*, nftables: .nft.plan.*).
    Regenerate with: NETLIMIT_UPDATE_GOLDEN=1 pytest tests/kernel/test_compile.py -k golden"""
    loaded = load_file(path)
    d = compile_config(loaded.config, hz=HZ)
    rel = f"rules/{path.name}"
    got = {
        ".plan.txt": plan_text(d, source=rel),
        ".plan.json": plan_json(d, source=rel),
        ".nft.plan.txt": plan_text(d, source=rel, backend="nftables"),
        ".nft.plan.json": plan_json(d, source=rel, backend="nftables"),
    }
    for suffix, text in got.items():
        golden = GOLDEN / (path.stem + suffix)
        if os.environ.get("NETLIMIT_UPDATE_GOLDEN") == "1":
            golden.parent.mkdir(parents=True, exist_ok=True)
            golden.write_text(text)
            continue
        assert golden.exists(), (
            f"no golden file {golden.relative_to(ROOT)}: run NETLIMIT_UPDATE_GOLDEN=1 pytest -k golden"
        )
        assert text == golden.read_text(), (
            f"plan of {rel} changed; if intended, regenerate with NETLIMIT_UPDATE_GOLDEN=1 pytest -k golden"
        )
