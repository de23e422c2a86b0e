"""The documentation stays true: README is a front door under 15 KB that opens
with the two set-up commands, every relative link (and its #anchor) leads
somewhere, every rules/ file named exists, every docs page opens with a
summary paragraph, and every `netlimit …` line of a sh block still parses
(the command exists and accepts the flags shown)."""

from __future__ import annotations

import re
import shlex
from pathlib import Path

import pytest
from typer.testing import CliRunner

from netlimit.cli import app

ROOT = Path(__file__).resolve().parents[2]
README = ROOT / "README.md"
DOCS = sorted((ROOT / "docs").glob("*.md"))
PAGES = [README, ROOT / "CONTRIBUTING.md", ROOT / "CHANGELOG.md", *DOCS]
# Pages README and docs/README.md must link (they are checked as any page).
LINKED = {"docs/security.md", "docs/operations.md", "docs/reliability.md"}
SETUP_COMMANDS = [
    "bash scripts/setup.sh && .venv/bin/netlimit demo",
    "bash scripts/setup.sh && .venv/bin/python -m pytest",
]


def _rel(p: Path) -> str:
    return str(p.relative_to(ROOT))


def _outside_code(text: str) -> str:
    """The text with fenced code blocks and inline code removed."""
    text = re.sub(r"^```.*?^```", "", text, flags=re.M | re.S)
    return re.sub(r"`[^`\n]*`", "", text)


def _slug(heading: str) -> str:
    """GitHub's anchor for a heading."""
    s = re.sub(r"`", "", heading.strip().lower())
    s = re.sub(r"[^\w\- ]", "", s)
    return s.replace(" ", "-")


def _anchors(page: Path) -> set[str]:
    text = re.sub(r"^```.*?^```", "", page.read_text(), flags=re.M | re.S)
    return {_slug(m.group(1)) for m in re.finditer(r"^#{1,6} (.+)$", text, re.M)}


def _sh_blocks(text: str):
    for m in re.finditer(r"^```(sh|bash|console)\n(.*?)^```", text, re.M | re.S):
        yield m.group(2).replace("\\\n", " ")


def test_readme_is_a_front_door():
    text = README.read_text()
    size = len(text.encode())
    assert size <= 15 * 1024, f"README.md is {size} bytes (front door: at most 15 KB; move the rest to docs/)"
    first_block = next(_sh_blocks(text))
    commands = [line.split("#")[0].strip() for line in first_block.splitlines() if line.strip()]
    assert commands == SETUP_COMMANDS, "README's first code block must be the two set-up commands"
    first_screen = text[: text.index("## Install") + 1500]
    for needed in ("fail2ban", "WAF", "apt install", "pipx install", "podman load", "scripts/setup.sh"):
        assert needed in first_screen, f"{needed!r} is not on README's first screen"


@pytest.mark.parametrize("page", DOCS, ids=lambda p: p.name)
def test_each_docs_page_opens_with_a_title_and_a_summary_paragraph(page):
    lines = page.read_text().splitlines()
    assert lines[0].startswith("# "), f"{_rel(page)}: the first line is not a '# Title'"
    assert lines[1] == "", f"{_rel(page)}: a blank line after the title"
    para = []
    for line in lines[2:]:
        if not line.strip():
            break
        para.append(line)
    summary = " ".join(para)
    assert not summary.startswith(("#", "```", "|", "-", "!")), f"{_rel(page)}: no summary paragraph under the title"
    assert len(summary) >= 150, f"{_rel(page)}: the summary paragraph is {len(summary)} characters"


def test_the_table_of_contents_lists_every_page():
    toc = (ROOT / "docs/README.md").read_text()
    linked = set(re.findall(r"\]\(([\w.-]+\.md)\)", toc))
    missing = [p.name for p in DOCS if p.name != "README.md" and p.name not in linked]
    assert not missing, f"docs/README.md does not list {missing}"
    assert {Path(p).name for p in LINKED} <= linked


def test_every_relative_link_and_anchor_resolves():
    bad = []
    for page in PAGES:
        for line in _outside_code(page.read_text()).splitlines():
            for target in re.findall(r"\]\(([^)\s]+)\)", line):
                if re.match(r"^[a-z]+:", target):
                    continue
                path, _, anchor = target.partition("#")
                dest = (page.parent / path).resolve() if path else page
                rel = _rel(dest) if dest.is_relative_to(ROOT) else str(dest)
                if not dest.exists():
                    bad.append(f"{_rel(page)}: {target}: no such file")
                    continue
                if anchor and dest.suffix == ".md" and anchor not in _anchors(dest):
                    bad.append(f"{_rel(page)}: {target}: no heading #{anchor} in {rel}")
    assert not bad, "\n".join(bad)


def test_every_rules_file_named_exists():
    bad = []
    for page in PAGES:
        for name in set(re.findall(r"(?<![\w/.-])rules/([\w.-]+\.(?:ya?ml|conf))", page.read_text())):
            if not (ROOT / "rules" / name).exists():
                bad.append(f"{_rel(page)}: rules/{name}")
    assert not bad, "named in the docs but not in rules/:\n" + "\n".join(bad)


def _netlimit_lines():
    for page in PAGES:
        for block in _sh_blocks(page.read_text()):
            for line in block.splitlines():
                line = line.strip().removeprefix("$ ")
                try:
                    lex = shlex.shlex(line, posix=True, punctuation_chars=True)
                    lex.whitespace_split = True
                    lex.commenters = "#"
                    tokens = list(lex)
                except ValueError:
                    continue
                # every command of the line: split at && || | ; and drop redirections
                cmd: list[str] = []
                for tok in [*tokens, ";"]:
                    if tok in ("&&", "||", "|", ";", "&"):
                        if cmd and re.search(r"(^|/)netlimitd?$", cmd[0]):
                            yield page, line, cmd
                        cmd = []
                    elif tok in (">", ">>", "<", "2>"):
                        cmd.append("\0redirect")
                    else:
                        cmd.append(tok)


def _parse(cmd: list[str]) -> str | None:
    """None when `netlimit ARGS --help` accepts the line's command and flags, else the error.
    (click parses every flag before the eager --help runs, so an unknown flag or
    command fails; values are not checked.)"""
    args = []
    skip = False
    for tok in cmd[1:]:
        if skip:
            skip = False
            continue
        if tok == "\0redirect":
            skip = True
            continue
        args.append(tok.strip("[]"))  # `[--json]` in a usage line: an optional flag
    if cmd[0].endswith("netlimitd"):
        args = ["daemon", *args]
    res = CliRunner().invoke(app, [*args, "--help"], prog_name="netlimit")
    if res.exit_code == 0 and "Usage:" in res.output:
        return None
    said = [line.strip("│╭╮╰╯─ ") for line in res.output.splitlines()]
    return next((line for line in said if line.startswith("No such")), " ".join(said)[-300:])


def test_netlimit_commands_in_the_docs_parse():
    lines = list(_netlimit_lines())
    assert len(lines) >= 15, f"only {len(lines)} netlimit command lines found in sh blocks"
    bad = []
    for page, line, cmd in lines:
        if (why := _parse(cmd)) is not None:
            bad.append(f"{_rel(page)}: {line}\n    {why}")
    assert not bad, "\n".join(bad)


def test_the_parse_check_catches_a_wrong_flag_and_a_wrong_command():
    assert "--listn" in (_parse(["netlimit", "sidecar", "--config", "x.yaml", "--listn", "127.0.0.1:1"]) or "")
    assert "aply" in (_parse(["netlimit", "aply", "x.yaml"]) or "")
    assert _parse(["netlimit", "ban", "list", "--json"]) is None
    assert _parse(["netlimitd", "--config", "x.yaml", "--metrics", "127.0.0.1:9732"]) is None
