"""Boot a real systemd (systemd-nspawn) in a network namespace the test owns.

The cached root file system (rootfs.py) is the lower layer of an overlay, so
every container starts clean and the cache is never modified. netlimit is
installed the way a user installs it: a wheel of this checkout into the
container's /opt/netlimit venv, then `netlimit install-service`.
"""

from __future__ import annotations

import atexit
import functools
import importlib.metadata
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import tomllib
from pathlib import Path

from rootfs import ROOT, ensure_rootfs


def _find_init(root_pid: int) -> int | None:
    """The container's PID 1 (a descendant of systemd-nspawn whose command is systemd)."""
    parents: dict[int, int] = {}
    comms: dict[int, str] = {}
    for d in Path("/proc").iterdir():
        if not d.name.isdigit():
            continue
        try:
            stat = (d / "stat").read_text()
        except OSError:
            continue
        rparen = stat.rindex(")")
        comms[int(d.name)] = stat[stat.index("(") + 1 : rparen]
        parents[int(d.name)] = int(stat[rparen + 2 :].split()[1])
    for pid, comm in comms.items():
        if comm != "systemd":
            continue
        p = pid
        while p > 1:
            p = parents.get(p, 0)
            if p == root_pid:
                return pid
    return None


def _build_backend_installed() -> bool:
    """pyproject.toml's build requirement on setuptools (its bdist_wheel is built in) is
    met by this venv: the wheel can be built without an isolated build environment."""
    requires = tomllib.loads((ROOT / "pyproject.toml").read_text())["build-system"]["requires"]
    wanted = next((r.split(">=", 1)[1] for r in requires if r.replace(" ", "").startswith("setuptools>=")), None)
    try:
        have = int(importlib.metadata.version("setuptools").split(".")[0])
        need = int(wanted.split(".")[0]) if wanted else None
    except (importlib.metadata.PackageNotFoundError, ValueError):  # absent or odd: build isolated
        return False
    return need is not None and have >= need


@functools.cache
def netlimit_wheel() -> Path:
    """The wheel of this checkout, built once per test process: every container of the
    run installs the same source tree. Built with the venv's setuptools when it meets
    the build requirement (~1 s of CPU; the isolated build pip does otherwise first
    installs setuptools into a fresh environment: ~4 s of CPU, 10 s on a busy host;
    the two wheels hold the same files, byte for byte)."""
    wheels = Path(tempfile.mkdtemp(prefix="nlt-wheel-"))
    atexit.register(shutil.rmtree, wheels, ignore_errors=True)
    isolation = ["--no-build-isolation"] if _build_backend_installed() else []
    subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", *isolation, "-w", str(wheels), str(ROOT)],
        check=True,
        capture_output=True,
        timeout=300,
    )
    (whl,) = wheels.glob("netlimit-*.whl")
    return whl


class Container:
    def __init__(self, name: str, netns: str):
        self.name = name
        self.netns = netns
        self.tmp = Path(tempfile.mkdtemp(prefix=f"{name}-"))
        self.merged = self.tmp / "merged"
        self.proc: subprocess.Popen | None = None
        self.leader: int | None = None
        self.log = self.tmp / "console.log"
        self._mounted = False

    # --- lifecycle -----------------------------------------------------------------

    def prepare(self) -> None:
        lower = ensure_rootfs(progress=lambda m: print(m, file=sys.stderr))
        for d in ("upper", "work", "merged"):
            (self.tmp / d).mkdir()
        subprocess.run(
            [
                "mount",
                "-t",
                "overlay",
                "overlay",
                "-o",
                f"lowerdir={lower},upperdir={self.tmp / 'upper'},workdir={self.tmp / 'work'}",
                str(self.merged),
            ],
            check=True,
            capture_output=True,
            timeout=30,
        )
        self._mounted = True
        whl = netlimit_wheel()
        shutil.copy(whl, self.merged / "tmp" / whl.name)
        self.chroot(["/opt/netlimit/bin/pip", "install", "-q", "--no-deps", "--no-index", f"/tmp/{whl.name}"])
        self.install_output = self.chroot(["/opt/netlimit/bin/netlimit", "install-service"]).stdout

    def chroot(self, cmd: list[str], timeout: float = 120) -> subprocess.CompletedProcess:
        res = subprocess.run(["chroot", str(self.merged), *cmd], capture_output=True, text=True, timeout=timeout)
        if res.returncode != 0:
            raise AssertionError(f"chroot {' '.join(cmd)} failed ({res.returncode}):\n{res.stdout}\n{res.stderr}")
        return res

    def boot(self, timeout: float = 60) -> None:
        with open(self.log, "w") as log:
            self.proc = subprocess.Popen(
                [
                    "systemd-nspawn",
                    "-b",
                    "-D",
                    str(self.merged),
                    "-M",
                    self.name,
                    "--register=no",
                    "--keep-unit",
                    f"--network-namespace-path=/run/netns/{self.netns}",
                    "--console=passive",
                    # the namespace is the test's own: let the container administer it
                    "--capability=CAP_NET_ADMIN",
                ],
                stdout=log,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                start_new_session=True,
            )
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise AssertionError(f"systemd-nspawn exited ({self.proc.returncode}):\n{self.log.read_text()}")
            self.leader = _find_init(self.proc.pid)
            if self.leader:
                break
            time.sleep(0.05)
        else:
            raise AssertionError(f"the container's systemd did not appear\n{self.log.read_text()[-3000:]}")
        state = "offline"
        while time.monotonic() < deadline:
            res = self.run(
                ["systemctl", "is-system-running", "--wait"], check=False, timeout=max(5.0, deadline - time.monotonic())
            )
            state = res.stdout.strip()
            if state in ("running", "degraded"):
                return
            time.sleep(0.1)  # 'offline': the manager's socket is not up yet
        raise AssertionError(f"container did not boot: {state!r}\n{self.log.read_text()[-3000:]}")

    def run(self, cmd: list[str], check: bool = True, timeout: float = 60) -> subprocess.CompletedProcess:
        assert self.leader is not None
        res = subprocess.run(
            ["nsenter", "-t", str(self.leader), "-m", "-u", "-i", "-n", "-p", *cmd],
            capture_output=True,
            text=True,
            timeout=timeout,
        )
        if check and res.returncode != 0:
            raise AssertionError(
                f"in container: {' '.join(cmd)} failed ({res.returncode}):\n{res.stdout}\n{res.stderr}"
            )
        return res

    def journal(self, unit: str, lines: int = 50) -> str:
        return self.run(["journalctl", "-u", unit, "--no-pager", "-n", str(lines)], check=False).stdout

    def write(self, path: str, text: str) -> None:
        """Write a file inside the container (as an editor would: new file, then rename)."""
        dest = self.merged / path.lstrip("/")
        tmp = dest.with_name(dest.name + ".new")
        tmp.write_text(text)
        tmp.chmod(0o644)
        os.replace(tmp, dest)

    def close(self) -> None:
        try:
            if self.proc is not None and self.proc.poll() is None:
                try:
                    self.proc.send_signal(signal.SIGTERM)  # nspawn -b: a clean poweroff
                    self.proc.wait(timeout=15)
                except subprocess.TimeoutExpired:
                    os.killpg(self.proc.pid, signal.SIGKILL)
                    self.proc.wait(timeout=10)
        finally:
            if self._mounted:
                for _ in range(20):
                    if subprocess.run(["umount", str(self.merged)], capture_output=True).returncode == 0:
                        break
                    time.sleep(0.25)
                else:
                    subprocess.run(["umount", "-l", str(self.merged)], capture_output=True)
            shutil.rmtree(self.tmp, ignore_errors=True)
