"""The wheel as an operator installs it: `pip install netlimit-VERSION-py3-none-any.whl`
into a fresh venv with no extras.

It carries the daemon's and the sidecar's dependencies only (the venv stays
under README's 100 MB), ships the dashboard, the alert rules, the units and the
examples as data files, and each optional part it lacks is named in one line
with its `pip install 'netlimit[EXTRA]'` when a command needs it, before
anything is changed.
"""

from __future__ import annotations

import os
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

import netlimit

ROOT = Path(__file__).resolve().parents[2]
CORE_VENV_LIMIT_MB = 100  # README, Install: the core venv's size


def _run(cmd, timeout=600, **kw):
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}
    return subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, env=env, **kw)


def _du_mb(path: Path) -> float:
    total = 0
    for dirpath, _, files in os.walk(path):
        for f in files:
            p = os.path.join(dirpath, f)
            if not os.path.islink(p):
                total += os.lstat(p).st_blocks * 512
    return total / 1e6


@pytest.fixture(scope="module")
def wheel(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("dist")
    r = _run([sys.executable, "-m", "pip", "wheel", "--no-deps", "-q", "-w", str(out), str(ROOT)])
    assert r.returncode == 0, r.stderr[-3000:]
    (whl,) = out.glob("netlimit-*.whl")
    return whl


@pytest.fixture(scope="module")
def core(wheel, tmp_path_factory) -> Path:
    venv = tmp_path_factory.mktemp("core") / "venv"
    r = _run([sys.executable, "-m", "venv", str(venv)])
    assert r.returncode == 0, r.stderr
    r = _run([str(venv / "bin/python"), "-m", "pip", "install", "-q", str(wheel)])
    assert r.returncode == 0, r.stderr[-3000:]
    return venv


def test_wheel_is_named_after_the_version_and_carries_the_shipped_files(wheel):
    assert wheel.name == f"netlimit-{netlimit.__version__}-py3-none-any.whl"
    names = set(zipfile.ZipFile(wheel).namelist())
    data = f"netlimit-{netlimit.__version__}.data/data/share/netlimit/"
    for f in (
        "dashboards/netlimit.json",
        "alerts/netlimit-rules.yaml",
        "alerts/netlimit-rules.test.yaml",
        "systemd/netlimitd.service",
        "systemd/netlimit-sidecar.service",
        "systemd/netlimitd-xdp.conf",
        "rules/starter.yaml",
        "rules/demo.yaml",
        "rules/demo-escalation.yaml",
    ):
        assert data + f in names, f"{f} is not in the wheel"
    meta = zipfile.ZipFile(wheel).read(f"netlimit-{netlimit.__version__}.dist-info/METADATA").decode()
    requires = [line for line in meta.splitlines() if line.startswith("Requires-Dist:")]
    core = [r for r in requires if "extra ==" not in r]
    for heavy in ("matplotlib", "python-iptables", "grpcio", "protobuf"):
        assert not any(r.split()[1].startswith(heavy) for r in core), f"{heavy} is a core dependency"
    for extra in ("report", "iptables", "grpc", "test"):
        assert f"Provides-Extra: {extra}" in meta


def test_core_venv_is_lean_and_has_no_optional_part(core):
    mb = _du_mb(core)
    print(f"core venv: {mb:.0f} MB")
    assert mb <= CORE_VENV_LIMIT_MB, f"core venv {mb:.0f} MB > {CORE_VENV_LIMIT_MB} MB"
    r = _run([str(core / "bin/python"), "-c", "import matplotlib"])
    assert r.returncode != 0
    r = _run([str(core / "bin/netlimit"), "--version"])
    assert r.stdout.strip() == f"netlimit {netlimit.__version__}", r.stderr


def test_missing_extras_are_named_in_one_line(core, tmp_path):
    log = tmp_path / "access.log"
    log.write_text('192.0.2.1 - - [27/Nov/2026:10:00:00 +0000] "GET / HTTP/1.1" 200 1 "-" "x"\n')
    report = tmp_path / "r.html"
    r = _run(
        [
            str(core / "bin/netlimit"),
            "simulate",
            "-c",
            str(ROOT / "rules/api-per-ip.yaml"),
            str(log),
            "--report",
            str(report),
        ]
    )
    assert r.returncode == 64, r.stdout + r.stderr
    assert r.stderr.strip().splitlines()[-1].endswith("pip install 'netlimit[report]'"), r.stderr
    assert not report.exists()

    r = _run(
        [str(core / "bin/netlimit"), "sidecar", "--config", str(ROOT / "rules/api-per-ip.yaml"),
         "--listen", "127.0.0.1:0", "--grpc", "127.0.0.1:0"],
        timeout=60,
    )  # fmt: skip
    assert r.returncode == 64, r.stdout + r.stderr
    # one line: the sidecar's log line (its time and level, then the message)
    assert len(r.stderr.strip().splitlines()) == 1, r.stderr
    assert r.stderr.strip().endswith(
        "netlimit sidecar --grpc (Envoy's rate limit service) needs grpc, which is not installed: "
        "pip install 'netlimit[grpc]'"
    ), r.stderr

    code = "from netlimit.kernel.registry import backend; print(backend('python-iptables').available())"
    r = _run([str(core / "bin/python"), "-c", code])
    assert r.returncode == 0, r.stderr
    assert "pip install 'netlimit[iptables]'" in r.stdout


def test_assets_command_writes_the_dashboard_and_alert_rules(core, tmp_path):
    dest = tmp_path / "assets"
    r = _run([str(core / "bin/netlimit"), "assets", "--dest", str(dest)])
    assert r.returncode == 0, r.stdout + r.stderr
    for f in ("dashboards/netlimit.json", "alerts/netlimit-rules.yaml"):
        assert (dest / f).read_bytes() == (ROOT / f).read_bytes()
    # an operator's edit is kept unless --force
    (dest / "alerts/netlimit-rules.yaml").write_text("groups: []\n")
    r = _run([str(core / "bin/netlimit"), "assets", "--dest", str(dest)])
    assert r.returncode == 1 and "kept" in r.stdout
    assert (dest / "alerts/netlimit-rules.yaml").read_text() == "groups: []\n"
    r = _run([str(core / "bin/netlimit"), "assets", "--dest", str(dest), "--force"])
    assert r.returncode == 0
    assert (dest / "alerts/netlimit-rules.yaml").read_bytes() == (ROOT / "alerts/netlimit-rules.yaml").read_bytes()
