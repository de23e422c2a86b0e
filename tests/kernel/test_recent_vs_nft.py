"""README's table of what `method: recent` admits under the legacy backend and under
nftables, checked at a quarter of its time scale (scripts/recent_vs_nft.py --scale
0.25: a 15 s period, about 35 s for every scenario at once, real TCP connections
between namespaces). The 'burst, pause, burst' row is left to the full-scale script:
its pause is scaled but a dropped attempt's connect timeout is not."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.netns

SCRIPT = Path(__file__).resolve().parents[2] / "scripts" / "recent_vs_nft.py"


@pytest.mark.timeout(400)
def test_recent_and_its_nftables_form_admit_what_readme_says(tmp_path):
    out = tmp_path / "r.json"
    p = subprocess.run(
        [sys.executable, str(SCRIPT), "--scale", "0.25", "--json", str(out)],
        capture_output=True,
        text=True,
        timeout=380,
    )
    assert p.returncode == 0, p.stdout + p.stderr
    rows = {r["scenario"]: r for r in json.loads(out.read_text())["rows"]}
    first_three = [True, True, True]
    # a burst, then persistent knocking: both admit the first three, then nothing
    burst = rows["burst-then-every-5s"]
    assert burst["recent"] == first_three + [False] * 14, burst
    assert burst["nftables"] == first_three + [False] * 14, burst
    # a little faster than the limit: recent blocks at hit 4 (every hit stays in its log),
    # nftables admits until its bucket runs dry
    fast = rows["every-15s"]
    assert fast["recent"] == first_three + [False] * 6, fast
    assert fast["nftables"][:6] == [True] * 6 and sum(fast["nftables"]) >= 6, fast
    # under the limit: everything through on both
    slow = rows["every-25s"]
    assert slow["recent"] == [True] * 5 and slow["nftables"] == [True] * 5, slow
