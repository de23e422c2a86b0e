"""netlimitd honours the file's `backend:` (with no --backend and no $NETLIMIT_BACKEND),
and `netlimit status` shows how many sources each rule's kernel table tracks, for
the nftables sets and the legacy hashlimit tables alike, under real traffic."""

from __future__ import annotations

import re
import subprocess

import pytest
from daemon_proc import EXE, Daemon, wait_for

from netlimit.kernel import traffic

pytestmark = pytest.mark.netns

CONFIG = """\
version: 1
backend: {backend}
exempt: [127.0.0.0/8]
network:
  - name: udp-flood
    protocol: udp
    ports: [5000]
    limit: 50/second
    burst: 5
"""


@pytest.mark.parametrize("backend", ["nftables", "restore"])
def test_the_files_backend_is_honoured_and_status_counts_table_entries(topo, tmp_path, monkeypatch, backend):
    monkeypatch.delenv("NETLIMIT_BACKEND", raising=False)
    d = Daemon(tmp_path, topo.srv, CONFIG.format(backend=backend))
    d.start()
    try:
        st = d.status()
        assert st["backend"] == backend and st["backend_reason"] == f"the file's backend: {backend}"
        flood = traffic.udp_flood_start(topo.cli, topo.cli4, topo.srv4, 5000, 300, 2)
        table = "limit4-udp-flood" if backend == "nftables" else "udp-flood"

        def entries() -> str | None:
            text = subprocess.run(
                [EXE, "status", "--socket", d.sock], capture_output=True, text=True, timeout=30
            ).stdout
            m = re.search(rf"udp-flood\s+\S+\s+\d+\s+\d+\s+\d+\s+.*{re.escape(table)}[^:]*: (\d+)", text)
            return text if m and int(m.group(1)) >= 1 else None

        text = wait_for(entries, 30, "a tracked source in `netlimit status`")
        assert "per-source entries" in text
        res = traffic.flood_result(flood)
        assert res.sent > 0
        assert d.stop(timeout=60) == 0
    finally:
        d.kill()
