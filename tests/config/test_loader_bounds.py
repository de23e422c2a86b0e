"""The YAML loader's budgets (issue 31, item 2): a 500-byte "billion laughs"
file, a recursive anchor, a file of a million nodes or nesting, a 50 MB file --
each refused with FILE:LINE:COL before it costs time or memory; and every door
that reads a file (validate, netlimitd, the sidecar's lyft_config_dir,
simulate --config) goes through that one loader.

The subprocess cases measure what a user pays: `netlimit validate FILE` run as
a child with an address-space cap and a timeout (a regression must not take
the host down), its peak RSS from wait4() and its CPU time (CPU, not wall
clock: the machine is shared)."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import time
from pathlib import Path

import pytest
from typer.testing import CliRunner

from netlimit.config import loader
from netlimit.config.loader import MAX_ALIAS_NODES, MAX_DEPTH, MAX_NODES
from netlimit.config.validate import MAX_FILE_BYTES, ConfigError, load_file, load_lyft_dir, load_string

ROOT = Path(__file__).resolve().parents[2]


def bomb(levels: int) -> str:
    """The classic: each level a list of nine aliases of the level below."""
    lines = ['a0: &a0 "lol"']
    for i in range(1, levels + 1):
        lines.append(f"a{i}: &a{i} [" + ", ".join([f"*a{i - 1}"] * 9) + "]")
    return "\n".join(lines) + "\n"


def problems(text: str) -> list[str]:
    with pytest.raises(ConfigError) as exc:
        load_string(text, "f.yaml")
    return [str(p) for p in exc.value.problems]


@pytest.mark.parametrize("levels", [7, 9])
def test_billion_laughs_is_refused_naming_the_alias_and_its_place(levels: int):
    text = bomb(levels)
    assert len(text) <= 500
    started = time.process_time()
    out = problems(text)
    assert time.process_time() - started < 1.0
    # a4 expands to 1 + 9 * (1 + 9 * (1 + 9 * 10)) = 7381 nodes: the second
    # the first *a4 on line 6 (column 10) makes 9 + 90 + 819 + 7380 + 7381 = 15679
    assert out == [
        "f.yaml:6:10: yaml: alias *a4 expands to 7381 nodes, which makes 15679 nodes from aliases; "
        f"at most {MAX_ALIAS_NODES} are allowed (aliases of aliases multiply: a 'billion laughs' file?)"
    ]


def test_a_recursive_anchor_is_refused():
    assert problems("version: 1\nexempt: &e [10.0.0.0/8, *e]\n") == [
        "f.yaml:2:25: yaml: alias *e stands inside its own anchor &e (a recursive structure): write the value out"
    ]


def test_aliases_within_the_budget_still_work():
    text = (
        "version: 1\n"
        "network:\n"
        "  - {name: a, protocol: tcp, ports: &ports [22, 2222], limit: 3/minute, per: source}\n"
        "  - {name: b, ports: *ports, limit: 30/second, per: source, protocol: udp}\n"
    )
    loaded = load_string(text, "f.yaml")
    assert [[p.first for p in r.ports] for r in loaded.config.network] == [[22, 2222], [22, 2222]]
    # an expanded alias keeps positions (those of the anchored node)
    assert loaded.position("network", 1, "ports", 1) == (3, 49)


def test_too_many_nodes_is_refused_where_the_count_runs_out():
    text = "version: 1\nnetwork:\n" + "".join(f"- {i}\n" for i in range(MAX_NODES + 10))
    # the root mapping, 'version', 1, 'network' and the list are 5 nodes: the
    # item on line L is node L + 3, so node MAX_NODES + 1 is on line MAX_NODES - 2
    assert problems(text) == [
        f"f.yaml:{MAX_NODES - 2}:3: yaml: more than {MAX_NODES} YAML nodes: this is not a config file"
    ]


def test_a_5000_rule_file_is_within_the_budgets():
    """The largest file the benchmarks apply (docs/benchmarks.md: kernel apply, 5,000
    rules, about 60,000 nodes in 450 KB) loads: a budget of 50,000 nodes refused it."""
    rules = []
    for i in range(5000):
        if i % 2:
            rules.append(f"  - {{name: r{i}, protocol: tcp, ports: [{10000 + i}], max_connections: 20}}")
        else:
            rules.append(
                f"  - {{name: r{i}, protocol: tcp, ports: [{10000 + i}], limit: 100/second, burst: 10, "
                "per: source, htable_size: 256}"
            )
    text = "version: 1\nexempt: [127.0.0.0/8]\nnetwork:\n" + "\n".join(rules) + "\n"
    assert len(text) < MAX_FILE_BYTES
    assert len(load_string(text, "big.yaml").config.network) == 5000


def test_deep_nesting_is_refused_at_the_level_past_the_cap():
    text = "x: " + "[" * 100 + "]" * 100 + "\n"
    # the root mapping is level 1, so the 64th "[" (column 67) is level 65
    assert problems(text) == [f"f.yaml:1:{3 + MAX_DEPTH}: yaml: nesting deeper than {MAX_DEPTH} levels"]


def test_a_file_over_the_cap_is_refused_without_being_read(tmp_path: Path):
    big = tmp_path / "big.yaml"
    with big.open("wb") as f:
        f.truncate(50 * 1000 * 1000)
    with pytest.raises(ConfigError) as exc:
        load_file(big)
    assert [str(p) for p in exc.value.problems] == [
        f"{big}:1:1: file: file is 50000000 bytes; the limit is {MAX_FILE_BYTES}"
    ]


def test_the_lyft_config_dir_goes_through_the_same_loader(tmp_path: Path):
    conf = tmp_path / "conf"
    conf.mkdir()
    (conf / "bomb.yaml").write_text(bomb(9))
    main = tmp_path / "netlimit.yaml"
    main.write_text("version: 1\nhttp:\n  lyft_config_dir: conf\n")
    _, found = load_lyft_dir("conf", str(main))
    assert [f"{p.line}:{p.col}" for p in found] == ["6:10"] and "alias *a4" in found[0].message


def test_the_sidecar_keeps_its_rules_when_the_watched_dir_gets_a_bomb(tmp_path: Path):
    from netlimit.sidecar.app import Sidecar

    conf = tmp_path / "conf"
    conf.mkdir()
    rl = "rate_limit: {unit: second, requests_per_unit: 1}"
    (conf / "a.yaml").write_text(f"domain: a\ndescriptors:\n  - key: k\n    {rl}\n")
    main = tmp_path / "netlimit.yaml"
    main.write_text(
        f"version: 1\nhttp:\n  lyft_config_dir: conf\n  domain: main\n  descriptors:\n    - key: k\n      {rl}\n"
    )
    sc = Sidecar(str(main))
    before = sc.loaded.sha256
    (conf / "b.yaml").write_text(bomb(9))
    started = time.process_time()
    assert sc.reload("test") is False
    assert time.process_time() - started < 1.0
    assert "b.yaml:6:10" in sc.last_reload_error and "alias *a4" in sc.last_reload_error
    assert sc.loaded.sha256 == before


def test_simulate_config_goes_through_the_same_loader(tmp_path: Path):
    from netlimit.cli import app

    cfg = tmp_path / "bomb.yaml"
    cfg.write_text(bomb(9))
    log = tmp_path / "access.log"
    log.write_text('1.2.3.4 - - [27/Nov/2026:10:00:00 +0000] "GET / HTTP/1.1" 200 1 "-" "-"\n')
    res = CliRunner().invoke(app, ["simulate", str(log), "--config", str(cfg)])
    assert res.exit_code == 1
    assert f"{cfg}:6:10: yaml: alias *a4" in res.output


def test_nothing_but_the_loader_parses_yaml():
    """netlimitd, the sidecar, validate and simulate all reach YAML through
    config/loader.py (load_file / load_string / load_lyft_string): no other
    module may parse YAML on its own and skip the budgets."""
    parse = re.compile(
        r"\byaml\.(safe_load|load|full_load|unsafe_load|compose|parse|load_all|safe_load_all)\b|CSafeLoader|yaml\.SafeLoader"
    )
    offenders = []
    for path in (ROOT / "netlimit").rglob("*.py"):
        if path == Path(loader.__file__).resolve():
            continue
        for n, line in enumerate(path.read_text().splitlines(), 1):
            if parse.search(line):
                offenders.append(f"{path.relative_to(ROOT)}:{n}: {line.strip()}")
    assert offenders == []


# --- what a user pays: `netlimit validate FILE` in a bounded child ---------------------


def measure(path: Path) -> tuple[int, str, float, float]:
    """(exit code, stderr, peak RSS in MiB, CPU seconds) of `netlimit validate PATH`,
    run with a 2 GiB address-space cap and a 120 s deadline."""

    # the child reads its own peak (VmHWM): wait4's ru_maxrss would count the
    # pytest process it was forked from
    code = (
        "import resource, sys\n"
        "resource.setrlimit(resource.RLIMIT_AS, (2 << 30, 2 << 30))\n"
        "out = sys.argv.pop()\n"
        "from netlimit.cli import main\n"
        "try:\n"
        "    sys.argv = ['netlimit', 'validate', sys.argv[1]]\n"
        "    main()\n"
        "finally:\n"
        "    hwm = [x for x in open('/proc/self/status') if x.startswith('VmHWM:')][0].split()[1]\n"
        "    open(out, 'w').write(hwm)\n"
    )
    hwm_path = path.with_suffix(".hwm")
    err_path = path.with_suffix(".stderr")
    with err_path.open("wb") as err:
        proc = subprocess.Popen(
            [sys.executable, "-c", code, str(path), str(hwm_path)],
            stdout=err,
            stderr=err,
            env={**os.environ, "PYTHONPATH": str(ROOT)},
        )
        deadline = time.monotonic() + 120
        while True:
            pid, status, usage = os.wait4(proc.pid, os.WNOHANG)
            if pid:
                break
            if time.monotonic() > deadline:
                proc.kill()
                os.wait4(proc.pid, 0)
                raise AssertionError(f"netlimit validate {path} still running after 120 s")
            time.sleep(0.05)
    proc.returncode = os.waitstatus_to_exitcode(status)
    return (proc.returncode, err_path.read_text(), int(hwm_path.read_text()) / 1024, usage.ru_utime + usage.ru_stime)


def hostile_files(tmp: Path) -> dict[str, tuple[Path, str]]:
    """name -> (file, what its refusal says)"""
    out: dict[str, tuple[Path, str]] = {}

    def put(name: str, text: str | None, expect: str) -> None:
        path = tmp / f"{name}.yaml"
        if text is not None:
            path.write_text(text)
        out[name] = (path, expect)

    put("laughs7", bomb(7), ":6:10: yaml: alias *a4 expands to 7381 nodes")
    put("laughs9", bomb(9), ":6:10: yaml: alias *a4 expands to 7381 nodes")
    put("nodes", "version: 1\nx:\n" + "- 1\n" * (MAX_FILE_BYTES // 4 - 10), f"yaml: more than {MAX_NODES} YAML nodes")
    put("nesting", "x:\n" + "".join("  " * i + f"k{i}:\n" for i in range(1, 200)), f"nesting deeper than {MAX_DEPTH}")
    # a valid YAML of one scalar as large as the cap allows: it loads, and the
    # config check refuses it
    put("scalar", "version: 1\nx: " + "a" * (MAX_FILE_BYTES - 100) + "\n", ":2:1: file: unknown field 'x'")
    big = tmp / "big.yaml"
    with big.open("wb") as f:  # 50 MB of real bytes, not a hole
        chunk = b"- " + b"x" * 1021 + b"\n"
        for _ in range(50 * 1000 * 1000 // len(chunk)):
            f.write(chunk)
    put("big", None, f"file: file is {big.stat().st_size} bytes; the limit is {MAX_FILE_BYTES}")
    return out


def test_every_hostile_file_is_refused_in_under_a_second_and_50_mib(tmp_path: Path):
    small = tmp_path / "ok.yaml"
    small.write_text(
        "version: 1\nnetwork:\n  - {name: ssh, protocol: tcp, ports: [22], limit: 3/minute, per: source}\n"
    )
    rc, err, base_rss, base_cpu = measure(small)
    assert rc == 0, err
    figures = {}
    for name, (path, expect) in hostile_files(tmp_path).items():
        rc, err, rss, cpu = measure(path)
        figures[name] = (round(rss, 1), round(cpu - base_cpu, 2))
        assert rc == 1, (name, err)
        assert expect in err, (name, err)
        assert err.startswith(str(path)), (name, err)
        assert rss < 50, (name, rss, err)
        # CPU beyond what the same command spends on a 3-line file (imports, start)
        assert cpu - base_cpu < 1.0, (name, cpu, base_cpu)
    print(f"baseline {base_rss:.1f} MiB {base_cpu:.2f} s; per file (MiB, extra CPU s): {figures}")
