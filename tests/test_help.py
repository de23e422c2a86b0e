"""--help as a person reads it: words for values (FILE, PATH, N, TEXT), never Python
types (`<list[Path]>`, `<bool>`), and nftables named where it is the default."""

from __future__ import annotations

import re

import pytest
import typer.main
from typer.testing import CliRunner

from netlimit.cli import app

runner = CliRunner()
PY_TYPE = re.compile(r"<(?:list\[|bool>|str>|int>|float>|path>|Path>)")


def command_paths() -> list[list[str]]:
    out: list[list[str]] = [[]]

    def walk(group, prefix: list[str]) -> None:
        for name, cmd in sorted(group.commands.items()):
            out.append([*prefix, name])
            if hasattr(cmd, "commands"):
                walk(cmd, [*prefix, name])

    walk(typer.main.get_command(app), [])
    return out


@pytest.mark.parametrize("words", command_paths(), ids=lambda w: " ".join(w) or "netlimit")
def test_help_shows_no_python_types(words):
    res = runner.invoke(app, [*words, "--help"], env={"COLUMNS": "200"})
    assert res.exit_code == 0, res.output
    assert not PY_TYPE.search(res.output), res.output


def test_help_words():
    out = runner.invoke(app, ["validate", "--help"], env={"COLUMNS": "200"}).output
    assert "{FILE}..." in out and "--quiet" in out
    out = runner.invoke(app, ["top", "--help"], env={"COLUMNS": "200"}).output
    assert re.search(r"--interval\s+NUMBER", out) and re.search(r"--count\s+N\b", out)
    assert re.search(r"--socket\s+TEXT", out) and re.search(r"--sidecar\s+TEXT", out)
    out = runner.invoke(app, ["ban", "add", "--help"], env={"COLUMNS": "200"}).output
    assert re.search(r"--config\s+-c\s+PATH", out)


def test_help_names_nftables_first():
    out = runner.invoke(app, ["--help"], env={"COLUMNS": "200"}).output
    assert "(nftables, or legacy iptables; tc)" in out
    assert "(iptables, tc)" not in out
