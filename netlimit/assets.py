"""`netlimit assets --dest DIR`: the Grafana dashboard and the Prometheus alert
rules that ship inside the package, put on disk for Grafana and Prometheus.

They come from the checkout's dashboards/ and alerts/ or, in an installed
package, from <prefix>/share/netlimit (the wheel's data files; the Debian
package puts them under /usr/share/netlimit too). A file already at the
destination with other contents is kept unless --force says to replace it.
"""

from __future__ import annotations

import filecmp
import shutil
from pathlib import Path

import typer

KINDS = ("dashboards", "alerts")


def copy_assets(dest: Path, force: bool = False, echo=print) -> int:
    """Copy every asset under dest/<kind>/; 0 when all are in place, 1 when one was kept."""
    from .install import find_share

    kept = 0
    for kind in KINDS:
        src = find_share(kind)
        if src is None:
            echo(f"assets: {kind}/ is not installed with this package (looked in the checkout and <prefix>/share)")
            return 64
        out = dest / kind
        out.mkdir(parents=True, exist_ok=True)
        for f in sorted(p for p in src.iterdir() if p.is_file()):
            target = out / f.name
            if not force and target.exists() and not filecmp.cmp(f, target, shallow=False):
                echo(f"kept {target} (it differs from the shipped file; --force replaces it)")
                kept += 1
                continue
            shutil.copyfile(f, target)
            target.chmod(0o644)
            echo(f"wrote {target}")
    return 1 if kept else 0


def register(app: typer.Typer) -> None:
    @app.command()
    def assets(
        dest: Path = typer.Option(..., "--dest", help="Directory to write dashboards/ and alerts/ into."),
        force: bool = typer.Option(False, "--force", help="Replace files that differ from the shipped ones."),
    ) -> None:
        """Write the Grafana dashboard and the Prometheus alert rules shipped with netlimit.

        DEST/dashboards/netlimit.json imports into Grafana (a Prometheus data source);
        DEST/alerts/netlimit-rules.yaml goes into Prometheus's rule_files (its
        promtool unit test beside it). Exit 0 when every file is in place, 1 when a
        changed file was kept, 64 when the files are not installed.
        """
        rc = copy_assets(dest, force=force, echo=typer.echo)
        raise typer.Exit(rc)
