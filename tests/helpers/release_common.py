"""What the release tests (tests/release/release_deb.py, release_image.py) share: a
command that must succeed, and a bounded wait for a condition."""

from __future__ import annotations

import subprocess
import time


def sh(*cmd: str, check: bool = True, timeout: float = 60) -> subprocess.CompletedProcess:
    """Run `cmd` (bounded by `timeout`); with `check`, a non-zero exit fails the test with its output."""
    res = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)
    if check and res.returncode != 0:
        raise AssertionError(f"{' '.join(cmd)} failed ({res.returncode}):\n{res.stdout}\n{res.stderr}")
    return res


def wait_for(pred, timeout: float, what: str, step: float = 0.2):
    """pred()'s first true value within `timeout` seconds; else the test fails naming `what`."""
    deadline = time.monotonic() + timeout
    last = None
    while time.monotonic() < deadline:
        last = pred()
        if last:
            return last
        time.sleep(step)
    raise AssertionError(f"timed out after {timeout} s waiting for {what} (last: {last!r})")
