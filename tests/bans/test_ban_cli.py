"""`netlimit ban add|del|list|flush` as a user runs it, against a real Redis."""

from __future__ import annotations

import json
import re
import shlex
import subprocess
import sys
import time
from pathlib import Path

import pytest

from netlimit.bans.redis_store import RedisBanList, keys

pytestmark = pytest.mark.redis
EXE = str(Path(sys.executable).with_name("netlimit"))


def run(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([EXE, "ban", *args], capture_output=True, text=True, timeout=60)


@pytest.fixture
def config(tmp_path, redis_server, prefix):
    p = tmp_path / "netlimit.yaml"
    p.write_text(
        f"""\
version: 1
exempt: [10.0.0.0/8, "fd00::/8"]
bans:
  store: {redis_server.url}
  key_prefix: {prefix}
http:
  domain: web
  trusted_proxies: [192.0.2.10/32]
  actions: [[remote_address]]
"""
    )
    try:
        yield str(p)
    finally:
        lst = RedisBanList(redis_server.url, key_prefix=prefix)
        lst.r.delete(*keys(prefix)[:3])
        lst.close()


def test_add_list_del_flush(config):
    t0 = time.monotonic()
    r = run("add", "203.0.113.0/24", "--ttl", "1h", "--reason", "credential stuffing", "--config", config)
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip() == "banned 203.0.113.0/24 for 1h: credential stuffing"
    assert run("add", "2001:db8::/64", "--ttl", "90s", "--config", config).returncode == 0
    r = run("list", "--config", config)
    assert r.returncode == 0 and r.stdout.startswith("2 bans (redis://")
    lines = r.stdout.splitlines()
    prefix, left, origin = lines[2].split()[:3]
    assert (prefix, origin) == ("2001:db8::/64", "manual") and re.fullmatch(r"1m[0-3]\ds", left), lines[2]
    assert "203.0.113.0/24" in lines[3] and "(cli)" in lines[3] and lines[3].endswith("credential stuffing")
    doc = json.loads(run("list", "--json", "--config", config).stdout)
    assert [b["net"] for b in doc["bans"]] == ["2001:db8::/64", "203.0.113.0/24"]
    # what the ban has left is its hour less the time these commands took (however loaded the host)
    assert 3600 - (time.monotonic() - t0) - 1 < doc["bans"][1]["left"] <= 3600 and doc["bans"][1]["origin"] == "manual"
    assert doc["bans"][1]["by"].endswith("(cli)") and doc["bans"][1]["reason"] == "credential stuffing"
    r = run("del", "203.0.113.0/24", "--yes", "--config", config)
    assert r.returncode == 0 and r.stdout.strip() == "lifted the ban of 203.0.113.0/24"
    r = run("del", "203.0.113.0/24", "--yes", "--config", config)
    assert r.returncode == 1 and "is not banned" in r.stderr
    r = run("flush", "-y", "--config", config)
    assert r.returncode == 0 and r.stdout.strip() == "lifted 1 bans"
    assert run("list", "--config", config).stdout.startswith("no bans")


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (("10.1.2.3", "--ttl", "1h"), "refused: 10.1.2.3/32 is exempt (10.0.0.0/8); exempt addresses and trusted"),
        (("fd00:1::/64", "--ttl", "1h"), "is exempt (fd00::/8)"),
        (("192.0.2.0/24", "--ttl", "1h"), "refused: 192.0.2.0/24 holds the trusted proxy 192.0.2.10/32"),
        (("203.0.113.7/24", "--ttl", "1h"), "has host bits set: did you mean 203.0.113.0/24?"),
        (("example.com", "--ttl", "1h"), "is not an IP address or CIDR prefix"),
        (("203.0.113.7", "--ttl", "1 week"), "--ttl: bad duration unit"),
        (("203.0.113.7", "--ttl", "30d"), "longer than the kernel keeps a ban"),
        (("203.0.113.7", "--ttl", "1h", "--reason", "x" * 300), "--reason is 300 characters"),
    ],
)
def test_bad_or_forbidden_bans_are_refused_and_change_nothing(config, args, message):
    r = run("add", *args, "--config", config)
    assert r.returncode == 1 and message in r.stderr and "Traceback" not in r.stderr, r.stderr
    assert run("list", "--config", config).stdout.startswith("no bans")


def test_a_file_without_bans_or_a_store_that_is_down(tmp_path):
    plain = tmp_path / "plain.yaml"
    plain.write_text("version: 1\nnetwork:\n  - name: a\n    limit: 5/second\n")
    r = run("list", "--config", str(plain))
    assert r.returncode == 1 and "uses no bans: add a `bans:` section" in r.stderr
    down = tmp_path / "down.yaml"
    down.write_text("version: 1\nbans: {store: 'redis://127.0.0.1:1/0'}\n")
    r = run("add", "203.0.113.7", "--ttl", "1m", "--config", str(down))
    assert (
        r.returncode == 2 and "the ban list at redis://127.0.0.1:1/0 failed" in r.stderr and "Traceback" not in r.stderr
    )
    bad = tmp_path / "bad.yaml"
    bad.write_text("version: 1\nbans: {store: nope}\n")
    r = run("list", "--config", str(bad))
    assert r.returncode == 1 and f"{bad}:2:" in r.stderr


def on_tty(args: list[str], answer: str) -> subprocess.CompletedProcess:
    """`netlimit ban ARGS` on a pseudo-terminal (script(1)), `answer` typed at its prompt."""
    cmd = " ".join(shlex.quote(a) for a in [EXE, "ban", *args])
    return subprocess.run(
        ["script", "-qec", cmd, "/dev/null"], input=answer, capture_output=True, text=True, timeout=60
    )


def test_del_and_flush_ask_on_a_terminal_and_want_yes_elsewhere(config):
    for net in ("203.0.113.0/24", "198.51.100.7"):
        assert run("add", net, "--ttl", "1h", "--config", config).returncode == 0

    def listed() -> list[str]:
        return [b["net"] for b in json.loads(run("list", "--json", "--config", config).stdout)["bans"]]

    # no terminal, no --yes: refused as a usage error, nothing lifted
    for args in (["flush"], ["del", "198.51.100.7"]):
        r = run(*args, "--config", config)
        assert r.returncode == 64, r.stderr
        assert "lifts bans on every host: no terminal to confirm on, pass --yes" in r.stderr
    assert sorted(listed()) == ["198.51.100.7/32", "203.0.113.0/24"]
    # a terminal: the question, then what was typed decides
    r = on_tty(["flush", "--config", config], "n\n")
    assert r.returncode == 1, r.stdout
    assert "lift 2 bans on every host (redis://" in r.stdout and "not confirmed; nothing was changed" in r.stdout
    assert len(listed()) == 2
    r = on_tty(["del", "198.51.100.7", "--config", config], "y\n")
    assert r.returncode == 0 and "lift the ban of 198.51.100.7/32 on every host" in r.stdout, r.stdout
    assert "lifted the ban of 198.51.100.7/32" in r.stdout
    assert listed() == ["203.0.113.0/24"]
    r = on_tty(["flush", "--config", config], "\n")  # Enter: the default is no
    assert r.returncode == 1 and listed() == ["203.0.113.0/24"]
    r = on_tty(["flush", "--config", config], "yes\n")
    assert r.returncode == 0 and "lifted 1 bans" in r.stdout, r.stdout
    assert listed() == []
