"""Build the XDP object: `python -m netlimit.kernel.xdp.build [--force]`.

clang -O2 -g -target bpf -mcpu=v3 compiles netlimit_xdp.c into netlimit_xdp.o next to
it (package data: the wheel ships the .o, a host running it needs no compiler).
-mcpu=v3 for the atomic compare-and-swap of the token buckets (kernel >= 5.12).
scripts/setup.sh runs this; load() rebuilds a stale object when clang is present.
"""

from __future__ import annotations

import argparse
import os
import platform
import shutil
import subprocess
import sys

from ...errors import NetlimitError

HERE = os.path.dirname(os.path.abspath(__file__))
SOURCE = os.path.join(HERE, "netlimit_xdp.c")
OBJECT = os.path.join(HERE, "netlimit_xdp.o")


class BuildError(NetlimitError, RuntimeError):
    pass


def _arch_include() -> list[str]:
    """asm/types.h lives in the multiarch directory on Debian (linux-libc-dev)."""
    triplet = {"x86_64": "x86_64-linux-gnu", "aarch64": "aarch64-linux-gnu"}.get(platform.machine())
    path = f"/usr/include/{triplet}" if triplet else ""
    return [f"-I{path}"] if path and os.path.isdir(path) else []


def command(source: str = SOURCE, output: str = OBJECT) -> list[str]:
    clang = shutil.which("clang")
    if clang is None:
        raise BuildError("clang is not installed: apt-get install clang llvm libbpf-dev (scripts/setup.sh does)")
    return [
        clang,
        "-O2",
        "-g",
        "-target",
        "bpf",
        "-mcpu=v3",
        "-Wall",
        "-Werror",
        *_arch_include(),
        "-c",
        source,
        "-o",
        output,
    ]


def stale(source: str = SOURCE, output: str = OBJECT) -> bool:
    return not os.path.exists(output) or os.path.getmtime(output) < os.path.getmtime(source)


def build(source: str = SOURCE, output: str = OBJECT, force: bool = False) -> str:
    """Compile when the object is missing or older than the source; returns its path."""
    if not force and not stale(source, output):
        return output
    tmp = f"{output}.tmp{os.getpid()}"
    try:
        proc = subprocess.run(command(source, tmp), capture_output=True, text=True, timeout=300)
        if proc.returncode != 0:
            raise BuildError(f"clang failed on {source}:\n{proc.stderr.strip()}")
        os.replace(tmp, output)
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)
    return output


def object_path() -> str:
    """The object to load: rebuilt if stale and clang exists; else the shipped one."""
    if os.path.exists(SOURCE) and stale() and shutil.which("clang"):
        return build()
    if not os.path.exists(OBJECT):
        raise BuildError(f"{OBJECT} is missing: run 'python -m netlimit.kernel.xdp.build' (needs clang)")
    return OBJECT


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m netlimit.kernel.xdp.build", description=__doc__.splitlines()[0])
    ap.add_argument("--force", action="store_true", help="rebuild even when the object is up to date")
    ap.add_argument("-o", "--output", default=OBJECT)
    args = ap.parse_args(argv)
    try:
        out = build(output=args.output, force=args.force)
    except BuildError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    print(out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
