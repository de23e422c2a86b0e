"""Man pages generated from the command line itself (scripts/manpages.py writes them;
packaging installs them under share/man/man1): netlimit(1) with every command, and
netlimit-COMMAND(1) per command (netlimit-ban-add(1) for `ban add`), each with its
synopsis, description, options as --help states them, exit status and files. Pure:
nothing here touches the kernel."""

from __future__ import annotations

import inspect
from pathlib import Path
from typing import Any

from . import __version__

SECTION = "1"
EXIT_STATUS = (
    ("0", "Done."),
    ("1", "Invalid input (a file with a problem, a bad address or duration); nothing was changed."),
    ("2", "The operation failed (the kernel refused, a store could not be reached); the previous state is restored."),
    ("64", "Usage: an unknown command or flag, a missing argument, not root, a missing tool or namespace."),
)
FILES = (
    ("/etc/netlimit/netlimit.yaml", "the configuration netlimitd and the sidecar read (`netlimit validate` checks it)"),
    ("/etc/netlimit/netlimit.schema.json", "its JSON Schema, for editors (`netlimit schema` prints it)"),
    ("/run/netlimit/", "netlimitd's status socket, the apply lock and per-namespace notes"),
)


def roff(text: str) -> str:
    """Text as roff reads it: backslashes escaped, no line starting a request."""
    out = []
    for line in text.replace("\\", "\\e").replace("-", "\\-").splitlines():
        out.append("\\&" + line if line.startswith((".", "'")) else line)
    return "\n".join(out)


def _help(cmd: Any) -> str:
    return inspect.cleandoc(cmd.help or "") if getattr(cmd, "help", None) else ""


def _short(cmd: Any) -> str:
    h = _help(cmd).split("\n\n")[0].replace("\n", " ")
    return h.split(". ")[0].rstrip(".") if h else ""


def _walk(cmd: Any, words: list[str], parent_ctx: Any) -> list[tuple[list[str], Any, Any]]:
    """(words, command, context) of every command below `cmd` (groups too)."""
    out = []
    for name, sub in sorted(getattr(cmd, "commands", {}).items()):
        if getattr(sub, "hidden", False):
            continue
        ctx = sub.context_class(sub, info_name=name, parent=parent_ctx)
        out.append(([*words, name], sub, ctx))
        out.extend(_walk(sub, [*words, name], ctx))
    return out


def _options(cmd: Any, ctx: Any) -> list[str]:
    lines: list[str] = []
    for p in cmd.get_params(ctx):
        if getattr(p, "hidden", False):
            continue
        if getattr(p, "param_type_name", "") == "argument":
            head = f"\\fI{roff(p.metavar or (p.name or '').upper())}\\fR"
        else:
            names = ", ".join(f"\\fB{roff(o)}\\fR" for o in [*p.opts, *p.secondary_opts])
            mv = p.metavar or ""
            head = names + (f" \\fI{roff(mv)}\\fR" if mv and not getattr(p, "is_flag", False) else "")
        text = getattr(p, "help", None) or ""
        default = getattr(p, "default", None)
        if (
            getattr(p, "show_default", True) is not False
            and default not in (None, False, (), [], "")
            and not callable(default)
            and getattr(p, "param_type_name", "") != "argument"
        ):
            text += f" (default: {default})"
        lines += [".TP", head, roff(text)]
    return lines


def page(words: list[str], cmd: Any, ctx: Any, children: list[tuple[list[str], Any, Any]]) -> str:
    """One man page: `words` is the command (["netlimit"] for the root)."""
    name = "-".join(words)
    title = name.upper()
    usage = " ".join(cmd.collect_usage_pieces(ctx))
    lines = [
        f'.TH {roff(title)} {SECTION} "" "netlimit {__version__}" "netlimit manual"',
        ".SH NAME",
        f"{roff(name)} \\- {roff(_short(cmd) or 'netlimit')}",
        ".SH SYNOPSIS",
        f"\\fB{roff(' '.join(words))}\\fR {roff(usage)}",
        ".SH DESCRIPTION",
    ]
    for para in _help(cmd).split("\n\n"):
        lines += [roff(" ".join(para.split())), ".PP"]
    if children:
        lines.append(".SH COMMANDS")
        for w, sub, _ctx in children:
            lines += [
                ".TP",
                f"\\fB{roff(' '.join(w))}\\fR",
                roff(_short(sub)) + f". See \\fB{roff('-'.join(w))}\\fR(1).",
            ]
    opts = _options(cmd, ctx)
    if opts:
        lines += [".SH OPTIONS", *opts]
    lines.append(".SH EXIT STATUS")
    for code, what in EXIT_STATUS:
        lines += [".TP", f"\\fB{code}\\fR", roff(what)]
    lines.append(".SH FILES")
    for path, what in FILES:
        lines += [".TP", f"\\fI{roff(path)}\\fR", roff(what)]
    see = sorted({"netlimit"} | {"-".join(w) for w, _s, _c in children}) if len(words) == 1 else ["netlimit"]
    lines += [".SH SEE ALSO", ", ".join(f"\\fB{roff(s)}\\fR({SECTION})" for s in see if s != name) + "."]
    return "\n".join(line for line in lines if line is not None) + "\n"


def pages() -> dict[str, str]:
    """File name -> roff text of every page (netlimit.1, netlimit-validate.1, ...)."""
    import typer.main

    from .cli import app

    root = typer.main.get_command(app)
    ctx = root.context_class(root, info_name="netlimit")
    below = _walk(root, ["netlimit"], ctx)
    out = {f"netlimit.{SECTION}": page(["netlimit"], root, ctx, [b for b in below if len(b[0]) == 2])}
    for words, cmd, cctx in below:
        kids = [b for b in below if len(b[0]) == len(words) + 1 and b[0][: len(words)] == words]
        out[f"{'-'.join(words)}.{SECTION}"] = page(words, cmd, cctx, kids)
    return out


def write(directory: Path) -> list[Path]:
    """Write every page into `directory` (made if missing); the paths written."""
    directory.mkdir(parents=True, exist_ok=True)
    written = []
    for name, text in pages().items():
        path = directory / name
        path.write_text(text)
        written.append(path)
    return written


__all__ = ["pages", "roff", "write"]
