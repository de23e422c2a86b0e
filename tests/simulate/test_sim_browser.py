"""The HTML report in a real headless Chromium: every plot renders (its
screenshot is a picture, not a blank box, and matches the image the page
embeds), no console error, nothing fetched from anywhere but the file itself."""

from __future__ import annotations

import asyncio
import base64
import io
import re
import subprocess
import sys
from pathlib import Path

import pytest
from cdp import Browser, chromium_binary
from PIL import Image, ImageChops, ImageStat
from simlog import T0, combined, config, write

pytestmark = [pytest.mark.browser, pytest.mark.timeout(240)]

EXE = str(Path(sys.executable).with_name("netlimit"))

RULES = """\
  actions:
    - [remote_address]
    - [path, remote_address]
  descriptors:
    - key: remote_address
      rate_limit: {unit: second, requests_per_unit: 10}
      algorithm: token_bucket
      burst: 20
    - key: path
      value: /login
      descriptors:
        - key: remote_address
          rate_limit: {unit: minute, requests_per_unit: 5}
          algorithm: sliding_window_log
"""


def _log(path: Path) -> Path:
    lines = []
    for s in range(0, 1800, 3):  # half an hour of 300 ordinary clients
        for c in range(0, 300, 7):
            lines.append(combined(f"10.0.{c // 200}.{c % 200}", T0 + s + c % 3, "/api/items" if c % 2 else "/"))
    for s in range(300, 900):  # a scraper at 30/s for ten minutes
        lines += [combined("203.0.113.5", T0 + s, f"/api/items/{s}")] * 30
    for s in range(600, 1200, 2):  # a password guesser on /login
        lines.append(combined("198.51.100.9", T0 + s, "/login", "POST"))
    lines.sort(key=lambda ln: ln[ln.index("[") :])
    return write(path, lines)


def _blank(img: Image.Image) -> str | None:
    """Why a screenshot looks blank (None when it is a picture)."""
    rgb = img.convert("RGB")
    colours = rgb.getcolors(maxcolors=1 << 20) or []
    if len(colours) < 16:
        return f"only {len(colours)} colours"
    top = max(n for n, _ in colours)
    if top > 0.97 * rgb.width * rgb.height:
        return f"one colour covers {100 * top / (rgb.width * rgb.height):.1f}% of it"
    return None


def test_the_report_renders_in_chromium(tmp_path):
    chromium_binary()  # fails with how to install it when missing
    cfg = config(tmp_path / "rules.yaml", RULES)
    log = _log(tmp_path / "access.log")
    report = tmp_path / "report.html"
    p = subprocess.run(
        [EXE, "simulate", "-c", str(cfg), "--report", str(report), str(log)],
        capture_output=True,
        text=True,
        timeout=180,
    )
    assert p.returncode == 0, p.stderr
    page_html = report.read_text()
    embedded = re.findall(r'<img src="data:image/png;base64,([^"]+)" alt="([^"]*)"', page_html)
    # per rule: CDF, timeline, algorithms, offenders
    assert len(embedded) == 8, [alt for _, alt in embedded]
    asyncio.run(_check(report, embedded))


async def _check(report: Path, embedded: list[tuple[str, str]]) -> None:
    async with Browser() as browser:
        page = await browser.page()
        try:
            await page.send("Page.navigate", url=report.as_uri())
            await page.wait_event("Page.loadEventFired")
            images = await page.evaluate(
                "[...document.images].map(i => { const r = i.getBoundingClientRect();"
                " return {alt: i.alt, complete: i.complete, w: i.naturalWidth, h: i.naturalHeight,"
                " x: r.left + i.clientLeft + window.scrollX, y: r.top + i.clientTop + window.scrollY,"
                " cw: i.clientWidth, ch: i.clientHeight}; })"
            )
            assert [i["alt"] for i in images] == [alt for _, alt in embedded]
            for img, (data, alt) in zip(images, embedded):
                original = Image.open(io.BytesIO(base64.b64decode(data)))
                assert img["complete"] and (img["w"], img["h"]) == original.size, (alt, img)
                assert (round(img["cw"]), round(img["ch"])) == original.size, f"{alt}: scaled on the page: {img}"
                shot = Image.open(io.BytesIO(await page.screenshot(img["x"], img["y"], img["cw"], img["ch"])))
                assert shot.size == original.size, (alt, shot.size, original.size)
                why = _blank(shot)
                assert why is None, f"{alt}: the screenshot looks blank: {why}"
                diff = ImageStat.Stat(ImageChops.difference(shot.convert("RGB"), original.convert("RGB"))).mean
                assert max(diff) < 8, f"{alt}: the rendered plot differs from the embedded one (mean diff {diff})"
            # the page's own words: no raw mathtext anywhere (the plots' words: test_report_labels.py)
            text = await page.evaluate("document.body.innerText")
            assert text and "mathdefault" not in text and "$" not in text, text[:500]
            assert page.problems() == []
            urls = page.requested()
            assert urls and all(u.startswith(("file:", "data:")) for u in urls), urls
        finally:
            await page.close()
