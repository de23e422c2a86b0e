"""A real headless Chromium, driven over the DevTools protocol (a websocket).

Only what the report test needs: open a page, collect console errors,
exceptions, failed loads and every request's URL, evaluate JavaScript, and
screenshot a region.  Every wait has a deadline; the browser (and its
children, in the process group it was started in) is stopped in ``close``.
"""

from __future__ import annotations

import asyncio
import base64
import json
import os
import shutil
import signal
import subprocess
import tempfile
import time
from pathlib import Path
from typing import Any

import aiohttp
import pytest

FLAGS = (
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--disable-dev-shm-usage",
    "--hide-scrollbars",
    "--window-size=1280,1600",
)


def chromium_binary() -> str:
    for name in ("/usr/lib/chromium/chromium", shutil.which("chromium"), shutil.which("chromium-browser")):
        if name and os.access(name, os.X_OK):
            return name
    pytest.fail(
        "Chromium is not installed: the report test opens the page in a real headless browser. "
        "Install it with `apt-get install chromium chromium-driver` (scripts/setup.sh does).",
        pytrace=False,
    )


class Browser:
    """``async with Browser() as b: page = await b.page()``."""

    def __init__(self, timeout: float = 60.0):
        self.timeout = timeout
        self.dir = Path(tempfile.mkdtemp(prefix="netlimit-chromium-"))
        self.proc: subprocess.Popen | None = None
        self.port = 0

    async def __aenter__(self) -> Browser:
        exe = chromium_binary()
        self.proc = subprocess.Popen(
            [exe, *FLAGS, f"--user-data-dir={self.dir}", "--remote-debugging-port=0", "about:blank"],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            start_new_session=True,  # its zygote and renderers share our group: stopped together
        )
        active = self.dir / "DevToolsActivePort"
        deadline = time.monotonic() + self.timeout
        while True:
            if active.exists():
                first = active.read_text().split("\n", 1)[0].strip()
                if first.isdigit():
                    self.port = int(first)
                    break
            if self.proc.poll() is not None:
                err = self.proc.stderr.read().decode(errors="replace") if self.proc.stderr else ""
                raise AssertionError(f"chromium exited with {self.proc.returncode} before listening:\n{err[-3000:]}")
            if time.monotonic() > deadline:
                raise AssertionError(f"chromium did not open its DevTools port within {self.timeout} s")
            await asyncio.sleep(0.05)
        return self

    async def __aexit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        p = self.proc
        if p is not None and p.poll() is None:
            try:
                os.killpg(p.pid, signal.SIGTERM)
            except ProcessLookupError:
                pass
            try:
                p.wait(timeout=10)
            except subprocess.TimeoutExpired:
                os.killpg(p.pid, signal.SIGKILL)
                p.wait(timeout=10)
        if p is not None and p.stderr is not None:
            p.stderr.close()
        shutil.rmtree(self.dir, ignore_errors=True)

    async def page(self) -> Page:
        deadline = time.monotonic() + self.timeout
        async with aiohttp.ClientSession() as http:
            while True:
                async with http.get(f"http://127.0.0.1:{self.port}/json/list") as r:
                    targets = await r.json()
                pages = [t for t in targets if t.get("type") == "page"]
                if pages:
                    break
                if time.monotonic() > deadline:
                    raise AssertionError(f"chromium shows no page target: {targets}")
                await asyncio.sleep(0.05)
        return await Page.connect(pages[0]["webSocketDebuggerUrl"], self.timeout)


class Page:
    def __init__(self, session: aiohttp.ClientSession, ws: Any, timeout: float):
        self.session = session
        self.ws = ws
        self.timeout = timeout
        self.next_id = 0
        self.events: list[dict[str, Any]] = []

    @classmethod
    async def connect(cls, url: str, timeout: float) -> Page:
        session = aiohttp.ClientSession()
        ws = await session.ws_connect(url, max_msg_size=0, timeout=aiohttp.ClientWSTimeout(ws_close=5))
        page = cls(session, ws, timeout)
        for domain in ("Page", "Runtime", "Log", "Network"):
            await page.send(f"{domain}.enable")
        return page

    async def close(self) -> None:
        await self.ws.close()
        await self.session.close()

    async def _receive(self, deadline: float) -> dict[str, Any]:
        left = deadline - time.monotonic()
        if left <= 0:
            raise AssertionError("no answer from chromium in time")
        msg = await self.ws.receive(timeout=left)
        if msg.type != aiohttp.WSMsgType.TEXT:
            raise AssertionError(f"the DevTools connection ended: {msg.type} {msg.data!r}")
        return json.loads(msg.data)

    async def send(self, method: str, **params: Any) -> dict[str, Any]:
        self.next_id += 1
        mid = self.next_id
        await self.ws.send_str(json.dumps({"id": mid, "method": method, "params": params}))
        deadline = time.monotonic() + self.timeout
        while True:
            m = await self._receive(deadline)
            if m.get("id") == mid:
                if "error" in m:
                    raise AssertionError(f"{method}: {m['error']}")
                return m.get("result", {})
            if "method" in m:
                self.events.append(m)

    async def wait_event(self, method: str) -> dict[str, Any]:
        for e in self.events:
            if e["method"] == method:
                return e
        deadline = time.monotonic() + self.timeout
        while True:
            m = await self._receive(deadline)
            if "method" in m:
                self.events.append(m)
                if m["method"] == method:
                    return m

    async def evaluate(self, expression: str) -> Any:
        r = await self.send("Runtime.evaluate", expression=expression, returnByValue=True, awaitPromise=True)
        if "exceptionDetails" in r:
            raise AssertionError(f"{expression}: {r['exceptionDetails']}")
        return r["result"].get("value")

    async def screenshot(self, x: float, y: float, w: float, h: float) -> bytes:
        r = await self.send(
            "Page.captureScreenshot",
            format="png",
            clip={"x": x, "y": y, "width": w, "height": h, "scale": 1},
            captureBeyondViewport=True,
        )
        return base64.b64decode(r["data"])

    def problems(self) -> list[str]:
        """Console errors, uncaught exceptions and failed loads seen so far."""
        out = []
        for e in self.events:
            m, p = e["method"], e.get("params", {})
            if m == "Runtime.consoleAPICalled" and p.get("type") in ("error", "assert"):
                out.append(f"console.{p['type']}: {[a.get('value', a.get('description')) for a in p.get('args', [])]}")
            elif m == "Runtime.exceptionThrown":
                out.append(f"exception: {p.get('exceptionDetails', {}).get('text')}")
            elif m == "Log.entryAdded" and p.get("entry", {}).get("level") == "error":
                out.append(f"log: {p['entry'].get('text')} {p['entry'].get('url', '')}")
            elif m == "Network.loadingFailed":
                out.append(f"load failed: {p.get('errorText')}")
        return out

    def requested(self) -> list[str]:
        return [e["params"]["request"]["url"] for e in self.events if e["method"] == "Network.requestWillBeSent"]
