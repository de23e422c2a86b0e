"""The processes `netlimit sidecar --workers N` starts (workers.py):
``python -m netlimit.sidecar.worker_main JSON`` runs a worker (a whole sidecar,
its listeners on SO_REUSEPORT) or, with ``{"owner": path, ...}``, the state
owner of the shared memory store (limit/stores/shared.py)."""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
import signal
import sys
from typing import Any

log = logging.getLogger("netlimit.sidecar")


def _loop_factory() -> Any:
    try:
        import uvloop

        return uvloop.new_event_loop
    except ImportError:  # pragma: no cover - uvloop is a dependency on Linux
        return None


def owner_main(path: str, max_keys: int, max_key_length: int) -> None:
    """The owner process: serve the shared store until SIGTERM (SIGHUP: nothing to reload)."""
    from ..limit.stores import MemoryStore
    from ..limit.stores.shared import serve_owner

    async def main() -> None:
        loop = asyncio.get_running_loop()
        task = asyncio.current_task()
        assert task is not None
        loop.add_signal_handler(signal.SIGTERM, task.cancel)
        loop.add_signal_handler(signal.SIGINT, task.cancel)
        loop.add_signal_handler(signal.SIGHUP, lambda: None)
        try:
            await serve_owner(path, MemoryStore(max_keys=max_keys, max_key_length=max_key_length))
        except asyncio.CancelledError:
            pass

    try:
        with asyncio.Runner(loop_factory=_loop_factory()) as runner:
            runner.run(main())
    finally:  # the supervisor removes the directory; a SIGKILLed one cannot: the owner does
        with contextlib.suppress(OSError):
            os.unlink(path)
        with contextlib.suppress(OSError):
            os.rmdir(os.path.dirname(path))


def worker_main(doc: dict[str, Any]) -> int:
    from ..config.validate import ConfigError
    from ..logs import problem_fields, setup
    from .server import Options, run

    setup(doc["log_level"], fmt=doc["log_format"])
    o = Options(**doc["options"])
    try:
        run(o)
    except ConfigError as exc:
        for p in exc.problems:
            log.error(str(p), extra=problem_fields(p))
        log.error("worker %s: %s: the worker did not start", o.worker, o.config)
        return 1
    except SystemExit as exc:
        if isinstance(exc.code, str):
            log.error("worker %s: %s", o.worker, exc.code)
            return 1
        raise
    return 0


def main(argv: list[str]) -> int:
    doc = json.loads(argv[0])
    if "owner" in doc:
        from ..logs import setup

        setup(doc.get("log_level", "info"), fmt=doc.get("log_format", "text"))
        owner_main(doc["owner"], doc["max_keys"], doc["max_key_length"])
        return 0
    return worker_main(doc)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
