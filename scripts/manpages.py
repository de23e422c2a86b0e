"""Write netlimit's man pages (netlimit.1, netlimit-COMMAND.1, ...) generated from the
command line: `python scripts/manpages.py [DIR]` (default: man/). Packaging installs
them under share/man/man1; `man -l DIR/netlimit.1` reads one in place."""

from __future__ import annotations

import sys
from pathlib import Path

from netlimit.manpages import write


def main(argv: list[str]) -> int:
    out = Path(argv[1]) if len(argv) > 1 else Path("man")
    for path in write(out):
        print(path)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
