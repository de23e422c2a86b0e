"""`netlimit install-service`: put the systemd units and a starter config in place.

Units come from the repository's systemd/ (a checkout or an editable install)
or from <prefix>/share/netlimit/systemd (a wheel install); @BINDIR@ in them is
replaced by the directory of the running `netlimit`, so the units start the
very installation that installed them. An existing config is never replaced.
"""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

UNITS = ("netlimitd.service", "netlimit-sidecar.service")
PKG_ROOT = Path(__file__).resolve().parent.parent


def find_share(kind: str) -> Path | None:
    for cand in (PKG_ROOT / kind, Path(sys.prefix) / "share/netlimit" / kind, Path("/usr/share/netlimit") / kind):
        if cand.is_dir():
            return cand
    return None


def bindir() -> Path:
    """Where the `netlimit` / `netlimitd` scripts of this installation live."""
    for cand in (Path(sys.argv[0]).resolve().parent, Path(sys.executable).parent):
        if (cand / "netlimit").exists() and (cand / "netlimitd").exists():
            return cand
    raise FileNotFoundError(
        "cannot find the netlimit and netlimitd scripts next to this Python "
        f"({sys.executable}); install the package with pip first"
    )


def render_unit(text: str, bin_dir: Path) -> str:
    return text.replace("@BINDIR@", str(bin_dir))


def install(root: Path = Path("/"), enable: bool = False, reload: bool = True, echo=print) -> int:
    units_dir = find_share("systemd")
    rules_dir = find_share("rules")
    if units_dir is None or rules_dir is None:
        echo(
            "install-service: the unit files are not installed with this package "
            "(looked in the checkout's systemd/ and <prefix>/share/netlimit)"
        )
        return 64
    bin_dir = bindir()
    unit_dest = root / "etc/systemd/system"
    unit_dest.mkdir(parents=True, exist_ok=True)
    for unit in UNITS:
        dest = unit_dest / unit
        text = render_unit((units_dir / unit).read_text(), bin_dir)
        dest.write_text(text)
        dest.chmod(0o644)
        echo(f"installed {dest} (ExecStart from {bin_dir})")
    etc = root / "etc/netlimit"
    etc.mkdir(parents=True, exist_ok=True)
    etc.chmod(0o755)
    # the units' LoadCredential=netlimit:/etc/netlimit/credentials: each file a secret
    # (a Redis password) only root and the service can read; the unit fails without it
    creds = etc / "credentials"
    creds.mkdir(mode=0o700, exist_ok=True)
    creds.chmod(0o700)
    conf = etc / "netlimit.yaml"
    if conf.exists():
        echo(f"kept {conf} (an existing config is never replaced)")
    else:
        shutil.copyfile(rules_dir / "starter.yaml", conf)
        conf.chmod(0o644)  # the sidecar runs as a dynamic user and must read it
        echo(f"installed {conf} (starter: shadow-mode SSH rule; edit it, then reload)")
    from .config.schema import schema_text

    schema = etc / "netlimit.schema.json"  # for the file's `# yaml-language-server: $schema=` line
    schema.write_text(schema_text())
    schema.chmod(0o644)
    echo(f"installed {schema} (editors complete and check netlimit.yaml with it)")
    default = root / "etc/default/netlimit-sidecar"
    if not default.exists():
        default.parent.mkdir(parents=True, exist_ok=True)
        default.write_text(
            "# Arguments of `netlimit sidecar` (see netlimit sidecar --help), e.g.\n"
            "# NETLIMIT_SIDECAR_ARGS=--listen 127.0.0.1:8081 --upstream http://127.0.0.1:8080\n"
            "NETLIMIT_SIDECAR_ARGS=--listen 127.0.0.1:8081\n"
        )
        echo(f"installed {default}")
    from .config.validate import ConfigError, load_file

    try:
        load_file(conf)
    except ConfigError as exc:
        echo(f"warning: {conf} is not valid; netlimitd will refuse to start until it is:")
        for p in exc.problems:
            echo(f"  {p}")
    systemd_running = (root == Path("/")) and Path("/run/systemd/system").is_dir() and shutil.which("systemctl")
    if reload and systemd_running:
        subprocess.run(["systemctl", "daemon-reload"], check=True)
        echo("ran systemctl daemon-reload")
        if enable:
            subprocess.run(["systemctl", "enable", "--now", "netlimitd.service"], check=True)
            echo("enabled and started netlimitd.service")
    elif reload:
        echo("systemd is not running here: run `systemctl daemon-reload` on the target host")
    if not enable:
        echo(
            "next: edit /etc/netlimit/netlimit.yaml, then `systemctl enable --now netlimitd` "
            "(and netlimit-sidecar for HTTP limits)"
        )
    return 0
