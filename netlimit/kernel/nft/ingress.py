"""Whether this host can run the `ingress:` stage: a chain on the inet family's ingress
hook needs kernel 5.10 and nft 1.0.1 (docs/xdp.md, "Stages"). Asked once per process,
and only when the file has an `ingress:` section."""

from __future__ import annotations

import functools
import os
import re
import subprocess

KERNEL_MIN = (5, 10)
NFT_MIN = (1, 0, 1)
#: compile_config's default: ask the host (tests and goldens pass a fixed answer)
PROBE = "probe"


def _version(text: str, parts: int) -> tuple[int, ...] | None:
    m = re.search(r"(\d+)\.(\d+)(?:\.(\d+))?", text)
    if m is None:
        return None
    return tuple(int(x or 0) for x in m.groups())[:parts]


@functools.lru_cache(maxsize=1)
def hook_problem() -> str | None:
    """Why the ingress hook cannot be used here, or None when it can."""
    kernel = _version(os.uname().release, 2)
    if kernel is None or kernel < KERNEL_MIN:
        return f"kernel {os.uname().release} has no inet ingress hook (needs {KERNEL_MIN[0]}.{KERNEL_MIN[1]})"
    try:
        p = subprocess.run(["nft", "--version"], capture_output=True, text=True, timeout=10)
    except (OSError, subprocess.SubprocessError):
        return "nft is not installed"
    nft = _version(p.stdout, 3)
    if p.returncode != 0 or nft is None:
        return "nft --version gave no version"
    if nft < NFT_MIN:
        return f"nft {'.'.join(map(str, nft))} cannot write an inet ingress chain (needs 1.0.1)"
    return None
