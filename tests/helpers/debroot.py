"""A clean Debian 12 root file system for the package test: debootstrap (minbase) with
systemd and nothing of netlimit's, cached in the same place as rootfs.py's. The test
boots it with systemd-nspawn on an overlay (nspawn.Container), so every run starts
from the same clean system and `apt install ./netlimit_*.deb` brings what it needs.
"""

from __future__ import annotations

import fcntl
import hashlib
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

from nspawn import Container
from rootfs import CACHE, SUITE, RootfsError, apt_mirror

PACKAGES = ["systemd", "systemd-sysv", "dbus", "procps"]
QUIET_UNITS = (
    "systemd-networkd-wait-online.service",
    "apt-daily.timer",
    "apt-daily-upgrade.timer",
    "e2scrub_all.timer",
    "fstrim.timer",
)


def ensure_debroot(progress=print) -> Path:
    """The path of a ready clean root file system, built once (about 3 minutes)."""
    for tool in ("debootstrap", "systemd-nspawn"):
        if not shutil.which(tool):
            raise RootfsError(f"{tool} is not installed: apt-get install debootstrap systemd-container")
    key = hashlib.sha256(repr((SUITE, PACKAGES, QUIET_UNITS)).encode()).hexdigest()[:12]
    CACHE.mkdir(parents=True, exist_ok=True)
    target = CACHE / f"debroot-{SUITE}-{key}"
    with open(CACHE / "debroot.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if (target / ".netlimit-ready").exists():
            return target
        tmp = CACHE / "debroot.partial"
        if not (tmp / ".debootstrap-done").exists():
            shutil.rmtree(tmp, ignore_errors=True)
            progress(f"building a clean Debian {SUITE} root in {target} (once; about 3 minutes)")
            with open(CACHE / "debroot.log", "w") as log:
                res = subprocess.run(
                    ["debootstrap", "--variant=minbase", f"--include={','.join(PACKAGES)}", SUITE, str(tmp),
                     apt_mirror()],
                    stdout=log, stderr=subprocess.STDOUT, timeout=1800,
                )  # fmt: skip
            if res.returncode != 0:
                raise RootfsError(f"debootstrap failed (exit {res.returncode}); see {CACHE / 'debroot.log'}")
            (tmp / ".debootstrap-done").write_text("ok\n")
        for unit in QUIET_UNITS:
            link = tmp / "etc/systemd/system" / unit
            link.unlink(missing_ok=True)
            os.symlink("/dev/null", link)
        (tmp / "etc/machine-id").write_text("")
        (tmp / "etc/hostname").write_text("netlimit-deb-test\n")
        for old in CACHE.glob(f"debroot-{SUITE}-*"):
            shutil.rmtree(old, ignore_errors=True)
        tmp.rename(target)
        (target / ".netlimit-ready").write_text("ok\n")
        return target


class DebContainer(Container):
    """nspawn.Container on the clean root: nothing of netlimit inside until the test installs it."""

    def __init__(self, name: str, netns: str):
        super().__init__(name, netns)

    def prepare(self) -> None:
        lower = ensure_debroot(progress=lambda m: print(m, file=sys.stderr))
        for d in ("upper", "work", "merged"):
            (self.tmp / d).mkdir()
        subprocess.run(
            ["mount", "-t", "overlay", "overlay", "-o",
             f"lowerdir={lower},upperdir={self.tmp / 'upper'},workdir={self.tmp / 'work'}", str(self.merged)],
            check=True, capture_output=True, timeout=30,
        )  # fmt: skip
        self._mounted = True
        # the container's namespace has no route out: apt's lists and the packages the
        # .deb depends on are fetched now through the host's network (chroot), then
        # `apt install` inside the booted system works from the cache
        shutil.copy("/etc/resolv.conf", self.merged / "etc/resolv.conf")
        self.chroot(["apt-get", "-q", "update"], timeout=600)

    def stage(self, deb: Path) -> str:
        """Copy a .deb into the container and download what it depends on; its path inside."""
        # /root, not /tmp: the booted system mounts a fresh tmpfs on /tmp
        shutil.copy(deb, self.merged / "root" / deb.name)
        self.chroot(["apt-get", "-q", "install", "-y", "--download-only", f"/root/{deb.name}"], timeout=600)
        return f"/root/{deb.name}"


def bump_version(deb: Path, version: str, out_dir: Path) -> Path:
    """The same package with another version: what an upgrade from a previous build replaces."""
    with tempfile.TemporaryDirectory(prefix="nl-deb-") as tmp:
        tree = Path(tmp) / "tree"
        subprocess.run(["dpkg-deb", "-R", str(deb), str(tree)], check=True, capture_output=True, timeout=300)
        control = tree / "DEBIAN/control"
        lines = [
            f"Version: {version}" if line.startswith("Version:") else line for line in control.read_text().splitlines()
        ]
        control.write_text("\n".join(lines) + "\n")
        out = out_dir / f"netlimit_{version}_amd64.deb"
        res = subprocess.run(
            ["dpkg-deb", "-Zgzip", "-b", str(tree), str(out)], capture_output=True, text=True, timeout=600
        )
        if res.returncode != 0:
            raise AssertionError(f"dpkg-deb -b failed ({res.returncode}): {res.stderr}")
        return out
