"""A Debian root file system for booting a real systemd with systemd-nspawn.

Built once with debootstrap from the apt sources this machine already uses
(no mirror is hard-coded) and cached outside the repository; rebuilt when
missing or when the recipe changes. netlimit's dependencies are installed
into /opt/netlimit (a venv) from wheels built on the host, because the
container's network namespace has no route anywhere.
"""

from __future__ import annotations

import fcntl
import hashlib
import os
import re
import shutil
import subprocess
import sys
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
CACHE = Path(os.environ.get("NETLIMIT_TEST_CACHE", "/var/cache/netlimit-test"))
SUITE = "bookworm"
PACKAGES = ["systemd", "systemd-sysv", "dbus", "iproute2", "iptables", "python3", "python3-venv", "libc-bin", "procps"]


class RootfsError(RuntimeError):
    pass


def apt_mirror() -> str:
    """The first Debian archive URI in this machine's apt sources (deb822 or one-line)."""
    candidates: list[str] = []
    for f in sorted(Path("/etc/apt/sources.list.d").glob("*.sources")):
        for block in f.read_text().split("\n\n"):
            uris = re.search(r"^URIs:\s*(\S+)", block, re.M)
            suites = re.search(r"^Suites:\s*(.+)$", block, re.M)
            if uris and suites and SUITE in suites.group(1).split():
                candidates.append(uris.group(1))
    for f in [Path("/etc/apt/sources.list"), *sorted(Path("/etc/apt/sources.list.d").glob("*.list"))]:
        if f.exists():
            for line in f.read_text().splitlines():
                m = re.match(r"^deb\s+(?:\[[^\]]*\]\s+)?(\S+)\s+(\S+)", line.strip())
                if m and m.group(2) == SUITE:
                    candidates.append(m.group(1))
    if not candidates:
        raise RootfsError(f"no apt source for {SUITE} found in /etc/apt: cannot debootstrap")
    return candidates[0]


def _dependencies() -> list[str]:
    meta = tomllib.loads((ROOT / "pyproject.toml").read_text())
    # Debian 12's Python is 3.11.2: redis-py needs async-timeout below 3.11.3,
    # which a newer host Python would not fetch for it.
    return list(meta["project"]["dependencies"]) + ["async-timeout>=4.0.3"]


def recipe_hash() -> str:
    h = hashlib.sha256()
    h.update(repr((SUITE, PACKAGES, _dependencies(), sys.version_info[:2])).encode())
    h.update(Path(__file__).read_bytes())
    return h.hexdigest()[:12]


def _run(cmd: list[str], log, timeout: int = 900) -> None:
    log.write(f"$ {' '.join(cmd)}\n")
    log.flush()
    res = subprocess.run(cmd, stdout=log, stderr=subprocess.STDOUT, timeout=timeout)
    if res.returncode != 0:
        raise RootfsError(f"{' '.join(cmd[:3])} … failed (exit {res.returncode}); see {log.name}")


def ensure_rootfs(progress=print) -> Path:
    """Return the path of a ready root file system, building it if needed."""
    for tool in ("debootstrap", "systemd-nspawn"):
        if not shutil.which(tool):
            raise RootfsError(f"{tool} is not installed: apt-get install debootstrap systemd-container")
    CACHE.mkdir(parents=True, exist_ok=True)
    target = CACHE / f"rootfs-{SUITE}-{recipe_hash()}"
    ready = target / ".netlimit-ready"
    with open(CACHE / "build.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if ready.exists():
            return target
        for old in CACHE.glob(f"rootfs-{SUITE}-*"):
            shutil.rmtree(old, ignore_errors=True)
        tmp = CACHE / "rootfs.partial"
        base_done = tmp / ".debootstrap-done"
        base_key = repr((SUITE, PACKAGES))
        if not (base_done.exists() and base_done.read_text() == base_key):
            shutil.rmtree(tmp, ignore_errors=True)
        wheels = CACHE / "wheels"
        with open(CACHE / "build.log", "w") as log:
            progress(f"building the systemd test root file system in {target} (once; a few minutes)")
            if not base_done.exists():
                _run(
                    [
                        "debootstrap",
                        "--variant=minbase",
                        f"--include={','.join(PACKAGES)}",
                        SUITE,
                        str(tmp),
                        apt_mirror(),
                    ],
                    log,
                    timeout=1500,
                )
                base_done.write_text(base_key)
            progress("building dependency wheels for the container")
            shutil.rmtree(wheels, ignore_errors=True)
            _run([sys.executable, "-m", "pip", "wheel", "-q", "-w", str(wheels), *_dependencies()], log)
            shutil.rmtree(tmp / "opt/wheels", ignore_errors=True)
            shutil.rmtree(tmp / "opt/netlimit", ignore_errors=True)
            shutil.copytree(wheels, tmp / "opt/wheels")
            _run(["chroot", str(tmp), "python3", "-m", "venv", "/opt/netlimit"], log)
            _run(
                [
                    "chroot",
                    str(tmp),
                    "/opt/netlimit/bin/pip",
                    "install",
                    "-q",
                    "--no-index",
                    "--find-links",
                    "/opt/wheels",
                    *_dependencies(),
                ],
                log,
            )
            # A container boots faster and quieter without these.
            base_done.unlink()
            for unit in (
                "systemd-networkd-wait-online.service",
                "apt-daily.timer",
                "apt-daily-upgrade.timer",
                "e2scrub_all.timer",
                "fstrim.timer",
            ):
                (tmp / "etc/systemd/system" / unit).unlink(missing_ok=True)
                os.symlink("/dev/null", tmp / "etc/systemd/system" / unit)
            (tmp / "etc/machine-id").write_text("")
            (tmp / "etc/hostname").write_text("netlimit-test\n")
        tmp.rename(target)
        ready.write_text("ok\n")
        progress(f"root file system ready: {target}")
        return target


if __name__ == "__main__":
    print(ensure_rootfs())
