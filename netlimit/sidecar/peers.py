"""`netlimit sidecar --workers N`: /metrics and /v1/top of every worker.

A connection reaches one worker; its counters alone would be a random 1/N of
the truth.  So each worker also answers on a Unix socket of its own,
``worker-<i>.sock`` in the supervisor's 0700 directory (the one the shared
store's owner socket lives in): one request line (``metrics`` or ``top``), the
answer, the connection closed.  The worker a scrape lands on asks the others
(PEER_TIMEOUT each, concurrently; at most PEER_MAX_BYTES of answer) and answers

* /metrics: one exposition, every worker's samples with a ``worker="i"`` label
  (HELP / TYPE once per family; nothing summed -- a ratio cannot be), plus
  ``netlimit_sidecar_workers`` and ``netlimit_sidecar_workers_unreachable``;
* /v1/top: the counters per rule summed, the denied descriptors' counts summed
  per (rule, key), sorted and cut to TOP_N.

A worker that does not answer in time (stopped, restarting, overloaded) is
left out and counted as unreachable.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
from typing import Any

from ..logevery import LogEvery

log = logging.getLogger("netlimit.sidecar")

#: how long the answering worker waits for each other worker
PEER_TIMEOUT = 0.5
#: the largest answer taken from one worker (bigger: that worker counts as unreachable)
PEER_MAX_BYTES = 8 * 1024 * 1024
#: /v1/top: the most denied descriptors shown
TOP_N = 10
_log_every = LogEvery(30.0)


def socket_path(directory: str, i: int) -> str:
    return os.path.join(directory, f"worker-{i}.sock")


def label_exposition(text: str, worker: int, families: dict[str, dict[str, Any]]) -> None:
    """Add ``worker="<worker>"`` to every sample of a Prometheus text exposition and
    file its lines into ``families`` (name -> its HELP, TYPE and samples; the first
    HELP / TYPE of a family kept).  The label goes first, so the escapes in the
    label values that follow need no parsing."""
    label = f'worker="{worker}"'
    current: str | None = None
    for line in text.splitlines():
        if not line:
            continue
        if line.startswith("#"):
            parts = line.split(" ", 3)
            if len(parts) >= 3 and parts[1] in ("HELP", "TYPE"):
                current = parts[2]
                fam = families.setdefault(current, {"HELP": None, "TYPE": None, "samples": []})
                if fam[parts[1]] is None:
                    fam[parts[1]] = line
            continue
        brace = line.find("{")
        space = line.find(" ")
        if brace != -1 and (space == -1 or brace < space):
            sep = "" if line[brace + 1 : brace + 2] == "}" else ","
            sample = f"{line[: brace + 1]}{label}{sep}{line[brace + 1 :]}"
            name = line[:brace]
        elif space != -1:
            sample = f"{line[:space]}{{{label}}}{line[space:]}"
            name = line[:space]
        else:
            continue  # not a sample line
        if current is None or not name.startswith(current):  # a sample without its family's HELP / TYPE
            current = name
        families.setdefault(current, {"HELP": None, "TYPE": None, "samples": []})["samples"].append(sample)


def merged_exposition(texts: list[tuple[int, str]], n: int, unreachable: int) -> bytes:
    """One exposition of the workers' ``(index, text)``."""
    families: dict[str, dict[str, Any]] = {}  # insertion order: the first worker's order
    for i, text in texts:
        label_exposition(text, i, families)
    out: list[str] = []
    for fam in families.values():
        out += [h for h in (fam["HELP"], fam["TYPE"]) if h is not None]
        out += fam["samples"]
    out += [
        "# HELP netlimit_sidecar_workers The sidecar's worker processes (--workers).",
        "# TYPE netlimit_sidecar_workers gauge",
        f"netlimit_sidecar_workers {float(n)}",
        "# HELP netlimit_sidecar_workers_unreachable Workers that did not answer this scrape in time "
        "(their samples are missing from it).",
        "# TYPE netlimit_sidecar_workers_unreachable gauge",
        f"netlimit_sidecar_workers_unreachable {float(unreachable)}",
    ]
    return ("\n".join(out) + "\n").encode()


def merged_top(docs: list[dict[str, Any]], n: int, unreachable: int) -> dict[str, Any]:
    """One /v1/top of the workers' documents: counts summed per rule and per
    (rule, key) of the denied descriptors, the TOP_N largest kept.  A descriptor
    one worker had in its top but another had not is summed from those that had
    it (each worker's list is itself approximate: ``error`` is summed as well)."""
    rules: dict[tuple[str, str], dict[str, Any]] = {}
    denied: dict[tuple[str, str], dict[str, Any]] = {}
    for doc in docs:
        for r in doc.get("rules", ()):
            k = (r["domain"], r["rule"])
            acc = rules.setdefault(k, {"domain": k[0], "rule": k[1], "hits": 0, "over": 0, "shadow": 0})
            for f in ("hits", "over", "shadow"):
                acc[f] += r.get(f, 0)
        for d in doc.get("denied", ()):
            k = (d["rule"], d["key"])
            acc = denied.setdefault(k, {"rule": k[0], "key": k[1], "count": 0, "error": 0})
            acc["count"] += d.get("count", 0)
            acc["error"] += d.get("error", 0)
    best = sorted(denied.values(), key=lambda d: -d["count"])[:TOP_N]
    return {
        "time": max((d.get("time", 0.0) for d in docs), default=0.0),
        "rules": list(rules.values()),
        "denied": best,
        "workers": n,
        "workers_unreachable": unreachable,
    }


class Peers:
    """This worker's door for the others, and its questions to them."""

    def __init__(self, directory: str, index: int, n: int) -> None:
        self.directory = directory
        self.index = index
        self.n = n
        self.path = socket_path(directory, index)
        self._server: asyncio.AbstractServer | None = None

    async def start(self, sc: Any) -> None:
        """Serve this worker's metrics text and top document to the other workers."""

        async def answer(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            try:
                what = (await asyncio.wait_for(reader.readline(), PEER_TIMEOUT * 4))[:16].strip()
                if what == b"metrics":
                    writer.write(sc.metrics.render())
                elif what == b"top":
                    writer.write(json.dumps(sc.top_doc()).encode())
                await writer.drain()
            except (OSError, TimeoutError, asyncio.IncompleteReadError):  # the asker gave up: nothing to do
                pass
            finally:
                writer.close()

        with contextlib.suppress(FileNotFoundError):  # a previous run of this worker's (restarted)
            os.unlink(self.path)
        old = os.umask(0o077)
        try:
            self._server = await asyncio.start_unix_server(answer, self.path)
        finally:
            os.umask(old)

    def close(self) -> None:
        if self._server is not None:
            self._server.close()
            self._server = None
        with contextlib.suppress(OSError):
            os.unlink(self.path)
        with contextlib.suppress(OSError):  # the last one out (a SIGKILLed supervisor cannot)
            os.rmdir(self.directory)

    async def _ask(self, i: int, what: bytes) -> bytes | None:
        path = socket_path(self.directory, i)
        writer: asyncio.StreamWriter | None = None
        try:
            async with asyncio.timeout(PEER_TIMEOUT):
                reader, writer = await asyncio.open_unix_connection(path, limit=64 * 1024)
                writer.write(what + b"\n")
                await writer.drain()
                data = await reader.read(PEER_MAX_BYTES + 1)
                chunks = [data]
                size = len(data)
                while data and size <= PEER_MAX_BYTES:
                    data = await reader.read(PEER_MAX_BYTES + 1 - size)
                    chunks.append(data)
                    size += len(data)
            if size > PEER_MAX_BYTES:
                raise ValueError(f"more than {PEER_MAX_BYTES} bytes")
            return b"".join(chunks)
        except (OSError, TimeoutError, ValueError) as exc:  # that worker is left out, counted unreachable
            held = _log_every.due(f"peer {i}")
            if held >= 0:
                log.warning("worker %d: worker %d did not answer %s within %g s (%s); left out",
                            self.index, i, what.decode(), PEER_TIMEOUT, exc or type(exc).__name__)  # fmt: skip
            return None
        finally:
            if writer is not None:
                writer.close()

    async def _gather(self, what: bytes) -> list[tuple[int, bytes | None]]:
        others = [i for i in range(self.n) if i != self.index]
        got = await asyncio.gather(*(self._ask(i, what) for i in others))
        return list(zip(others, got, strict=True))

    async def metrics(self, own: bytes) -> bytes:
        answers = await self._gather(b"metrics")
        texts = [(self.index, own.decode())]
        texts += [(i, a.decode("utf-8", "replace")) for i, a in answers if a is not None]
        texts.sort()
        return merged_exposition(texts, self.n, sum(1 for _, a in answers if a is None))

    async def top(self, own: dict[str, Any]) -> dict[str, Any]:
        answers = await self._gather(b"top")
        docs = [own]
        for _, a in answers:
            if a is None:
                continue
            try:
                docs.append(json.loads(a))
            except ValueError:  # a garbled answer: that worker counts as unreachable
                pass
        return merged_top(docs, self.n, self.n - len(docs))
