"""The `xdp:` section and `early: true` (docs/xdp.md): refused with FILE:LINE and the
reason when XDP cannot run the rule, or when there is no `xdp:` section."""

from __future__ import annotations

import textwrap

import pytest

from netlimit.config.early import refusal
from netlimit.config.validate import ConfigError, load_string

HEAD = "version: 1\nxdp:\n  interfaces: [veth0]\nnetwork:\n"


def load(text: str):
    return load_string(textwrap.dedent(text), "f.yaml")


def errors(text: str) -> list[str]:
    with pytest.raises(ConfigError) as exc:
        load(text)
    return str(exc.value).splitlines()


def test_an_early_per_source_rule_with_xdp_is_valid():
    cfg = load(
        HEAD
        + "  - {name: web, protocol: tcp, ports: [80], limit: 100/second, burst: 10, early: true, source_prefix: 24}\n"
    ).config
    assert cfg.xdp is not None and cfg.xdp.interfaces == ["veth0"] and cfg.xdp.mode == "auto"
    assert cfg.network[0].early and refusal(cfg.network[0]) is None


@pytest.mark.parametrize(
    ("rule", "why"),
    [
        ("{name: r, limit: 10/minute, method: recent, early: true}", "method: recent"),
        ("{name: r, protocol: tcp, max_connections: 5, early: true}", "connlimit"),
        ("{name: r, protocol: tcp, limit: 10/second, new_connections: true, early: true}", "new_connections"),
        ("{name: r, limit: 10/second, per: destination, early: true}", "per: destination"),
        ("{name: r, limit: 10/second, action: reject, early: true}", "action: reject"),
        ("{name: r, limit: 10/second, chain: forward, early: true}", "chain: forward"),
        ("{name: r, protocol: tcp, ports: [80, 443], limit: 10/second, early: true}", "contiguous"),
    ],
)
def test_early_is_refused_where_xdp_cannot_run_the_rule(rule, why):
    (line,) = errors(HEAD + f"  - {rule}\n")
    assert line.startswith("f.yaml:5:") and ": r: early: true cannot run in XDP" in line and why in line


def test_early_without_xdp_is_an_error_with_its_line():
    out = errors("version: 1\nnetwork:\n  - name: a\n    limit: 5/second\n    early: true\n")
    assert out == ["f.yaml:5:12: a: early: true needs a top-level `xdp:` section (its interfaces)"]


@pytest.mark.parametrize(
    ("xdp", "msg"),
    [
        ("{interfaces: [lo]}", "loopback"),
        ("{interfaces: [a, a]}", "listed twice"),
        ("{interfaces: []}", "at least 1"),
        ("{interfaces: [eth0], mode: fast}", "auto"),
        ("{interfaces: ['a/b']}", "not a valid Linux interface name"),
    ],
)
def test_the_xdp_section_is_checked(xdp, msg):
    out = errors(f"version: 1\nxdp: {xdp}\n")
    assert out and out[0].startswith("f.yaml:2:") and msg in "\n".join(out)


def test_early_false_is_the_default_and_needs_no_xdp():
    cfg = load("version: 1\nnetwork:\n  - {name: a, limit: 5/second}\n").config
    assert cfg.network[0].early is False and cfg.xdp is None


def test_netlimit_validate_names_file_line_and_reason(tmp_path):
    import subprocess
    import sys
    from pathlib import Path

    f = tmp_path / "n.yaml"
    f.write_text(HEAD + "  - name: r\n    protocol: tcp\n    max_connections: 5\n    early: true\n")
    exe = str(Path(sys.executable).with_name("netlimit"))
    p = subprocess.run([exe, "validate", str(f)], capture_output=True, text=True, timeout=60)
    assert p.returncode == 1, p
    assert f"{f}:8:12: r: early: true cannot run in XDP: max_connections (connlimit)" in p.stdout + p.stderr


@pytest.mark.parametrize(
    ("section", "reason"),
    [("ingress", "never hooked at ingress"), ("xdp", "never passes a driver's XDP hook")],
)
def test_each_stage_refuses_loopback_with_its_own_reason(section, reason):
    """ingress: and xdp: share one interface check; each names why lo is refused."""
    out = "\n".join(errors(f"version: 1\n{section}: {{interfaces: [eth0, lo]}}\n"))
    assert "f.yaml:2:" in out and "interface 'lo': " in out and reason in out, out
    assert "listed twice" in "\n".join(errors(f"version: 1\n{section}: {{interfaces: [eth0, eth0]}}\n"))
