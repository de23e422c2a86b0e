"""netlimitd's two listeners under slow clients, with a real daemon in a test
namespace: the metrics listener gives each scraper 5 s for its whole request
(a client trickling a byte a second cannot keep one of the 16 slots), and the
status socket serves at most 8 clients at once, each for at most 5 s."""

from __future__ import annotations

import socket
import threading
import time
import urllib.request

import pytest
from daemon_proc import config_text, wait_for

from netlimit.daemon import query_status

pytestmark = [pytest.mark.netns, pytest.mark.timeout(120)]


def _threads(pid: int) -> int:
    with open(f"/proc/{pid}/status") as f:
        return int(next(x.split()[1] for x in f if x.startswith("Threads:")))


def _trickle(socks: list[socket.socket], stop: threading.Event, data: bytes) -> None:
    """One byte a second on every socket, never a whole request."""
    for i in range(len(data)):
        if stop.wait(1.0):
            return
        for s in socks:
            try:
                s.send(data[i : i + 1])
            except OSError:
                pass


def _scrape(port: int) -> str | None:
    try:
        return urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=2).read().decode()
    except OSError:
        return None


def test_trickling_clients_cannot_keep_the_metrics_slots(daemon_factory):
    d = daemon_factory(config_text())
    d.start()
    stop = threading.Event()
    socks = [socket.create_connection(("127.0.0.1", d.metrics_port), timeout=5) for _ in range(16)]
    try:
        for s in socks:
            s.send(b"G")
        t0 = time.monotonic()
        threading.Thread(
            target=_trickle, args=(socks, stop, b"ET /metrics HTTP/1.1\r\nX-Pad: " + b"a" * 60), daemon=True
        ).start()
        body = wait_for(lambda: _scrape(d.metrics_port), 15, "a scrape while 16 clients trickle", step=0.5)
        assert "netlimit_applies_total" in body
        assert time.monotonic() - t0 < 10  # the slots came free at the 5 s deadline, not at the end of the trickle
    finally:
        stop.set()
        for s in socks:
            s.close()


def test_the_status_socket_serves_a_bounded_number_of_clients(daemon_factory):
    # No resync during the count: its namespace worker is a thread of its own.
    d = daemon_factory(config_text(), resync=3600.0)
    d.start()
    # The status socket answers before the metrics listener starts: the baseline is
    # taken once a scrape has been served, with every long-lived thread running.
    wait_for(lambda: _scrape(d.metrics_port), 30, "the first scrape")
    base = _threads(d.proc.pid)
    peak = [base]
    stop = threading.Event()

    def sample() -> None:  # all along: one read at one moment proves little on a loaded machine
        while not stop.wait(0.01):
            peak[0] = max(peak[0], _threads(d.proc.pid))

    sampler = threading.Thread(target=sample, daemon=True)
    sampler.start()
    socks = []
    try:
        for _ in range(20):
            s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            socks.append(s)
            wait_for(lambda s=s: _connect(s, d.sock), 5, "a connection to the status socket")  # its backlog is short
            try:
                s.send(b"s")
            except OSError:
                pass  # closed at once: more than the daemon serves at a time
        threading.Thread(target=_trickle, args=(socks, stop, b"tatus-and-more-without-a-newline"), daemon=True).start()
        wait_for(lambda: peak[0] >= base + 4, 10, "threads for the trickling clients")
        t0 = time.monotonic()
        st = wait_for(lambda: _query(d.sock), 15, "netlimit status while 20 clients trickle", step=0.5)
        assert st["pid"] == d.proc.pid and time.monotonic() - t0 < 10
    finally:
        stop.set()
        sampler.join(5)
        for s in socks:
            s.close()
    assert peak[0] <= base + 8, f"{peak[0] - base} threads above the baseline of {base}"


def _query(path: str) -> dict | None:
    try:
        return query_status(path, timeout=2)
    except (OSError, ValueError):
        return None


def _connect(s: socket.socket, path: str) -> bool:
    try:
        s.connect(path)
    except BlockingIOError:
        return False
    return True
