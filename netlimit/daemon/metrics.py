"""The daemon's Prometheus metrics; per-rule counters are read from the kernel
at scrape time."""

from __future__ import annotations

import io
import logging
import socket
import time
from typing import Any

from ..buildinfo import InfoCollector
from .kernel_ops import KernelOps
from .status import DeadlineReader, Status

log = logging.getLogger("netlimit.daemon")

#: scrapers served at once, and the seconds each has to send its whole request
MAX_CLIENTS = 16
CLIENT_TIMEOUT = 5.0


class Metrics:
    """Prometheus metrics; rule counters are read from the kernel at scrape time."""

    def __init__(self, kernel: KernelOps, status: Status):
        from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

        self.registry = CollectorRegistry(auto_describe=True)
        self.kernel = kernel
        self.status = status
        self.apply_seconds = Histogram(
            "netlimit_apply_duration_seconds",
            "Duration of kernel applies",
            registry=self.registry,
            buckets=(0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10),
        )
        self.applies = Counter("netlimit_applies_total", "Kernel applies by result", ["result"], registry=self.registry)
        self.reloads = Counter(
            "netlimit_config_reloads_total", "Config reloads by result", ["result"], registry=self.registry
        )
        self.repairs = Counter(
            "netlimit_drift_repairs_total", "Drift repairs (kernel changed behind our back)", registry=self.registry
        )
        self.last_apply = Gauge(
            "netlimit_last_apply_timestamp_seconds", "Time of the last successful apply", registry=self.registry
        )
        self.rejected = Gauge(
            "netlimit_config_rejected",
            "1 when the file on disk was rejected and an older config is running",
            registry=self.registry,
        )
        for r in ("ok", "failed"):
            self.applies.labels(r)
        for r in ("ok", "rejected"):
            self.reloads.labels(r)
        self._bans = _BanCollector()
        self.registry.register(InfoCollector(lambda: status.config_sha256))
        self.registry.register(_RuleCollector(kernel, self._bans))
        self.registry.register(self._bans)
        self._server: Any = None

    def follow_bans(self, follower: Any) -> None:
        """The ban follower whose counters the scrape reads (None: the file uses no bans)."""
        self._bans.follower = follower

    def serve(self, hostport: str) -> None:
        """Serve /metrics on HOST:PORT in a thread: at most ``MAX_CLIENTS`` at once,
        each with ``CLIENT_TIMEOUT`` seconds to send its whole request (a slow or
        idle client cannot hold a thread for ever, nor many of them pile up)."""
        import threading
        from http.server import ThreadingHTTPServer

        from prometheus_client.exposition import MetricsHandler

        from ..listen import parse_listen

        host, port = parse_listen(hostport, "--metrics")

        base: Any = MetricsHandler.factory(self.registry)  # a class made at run time

        class Handler(base):
            timeout = CLIENT_TIMEOUT  # each write of the answer
            rfile: io.BufferedIOBase

            def setup(self) -> None:
                super().setup()
                self.rfile.close()  # the socket stays open: read it through the deadline instead
                raw = DeadlineReader(self.connection, time.monotonic() + CLIENT_TIMEOUT)
                self.rfile = io.BufferedReader(raw)

            def parse_request(self) -> bool:
                ok = super().parse_request()
                self.connection.settimeout(CLIENT_TIMEOUT)  # the request is in: the answer's own timeout
                return ok

        handler = Handler
        slots = threading.BoundedSemaphore(MAX_CLIENTS)

        class Server(ThreadingHTTPServer):
            daemon_threads = True
            address_family = socket.AF_INET6 if ":" in host else socket.AF_INET
            # socketserver's default backlog is 5: a burst of scrapers (or of idle clients)
            # beyond it has its SYNs dropped and retried a second later. The slots above
            # bound the threads; the backlog only has to hold a burst until they drop it.
            request_queue_size = 128

            def process_request(self, request, client_address):
                if not slots.acquire(blocking=False):
                    self.shutdown_request(request)  # too many at once: this one is dropped
                    return
                super().process_request(request, client_address)

            def process_request_thread(self, request, client_address):
                try:
                    super().process_request_thread(request, client_address)
                finally:
                    slots.release()

        srv = Server((host, port), handler)
        threading.Thread(target=srv.serve_forever, name="metrics", daemon=True).start()
        self._server = srv

    def close(self) -> None:
        if self._server is not None:
            self._server.shutdown()


class _RuleCollector:
    def __init__(self, kernel: KernelOps, bans: _BanCollector):
        self.kernel = kernel
        self.bans = bans

    def describe(self):
        return []

    def collect(self):
        from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

        packets = CounterMetricFamily(
            "netlimit_rule_packets", "Packets matched per rule and layer", labels=["rule", "layer"]
        )
        bytes_ = CounterMetricFamily(
            "netlimit_rule_bytes", "Bytes matched per rule and layer", labels=["rule", "layer"]
        )
        dropped = CounterMetricFamily(
            "netlimit_rule_dropped_packets", "Packets dropped per rule and layer", labels=["rule", "layer"]
        )
        up = GaugeMetricFamily("netlimit_kernel_read_ok", "1 if the kernel counters could be read")
        limit = GaugeMetricFamily(
            "netlimit_bandwidth_limit_bytes_per_second",
            "Configured rate of each bandwidth rule (to draw tc bytes against)",
            labels=["rule"],
        )
        config = self.kernel.config
        for b in config.bandwidth if config is not None else ():
            limit.add_metric([b.name], b.rate / 8)
        try:  # never wait long behind an apply: a scrape has its own timeout
            f = self.bans.follower
            rows = self.kernel.counters(wait=2.0, ban_sizes=f.kernel_sizes() if f is not None else None)
            ok = 1
        except Exception as exc:  # a scrape never crashes the daemon
            log.warning("metrics: cannot read kernel counters: %s", exc)
            rows, ok = [], 0
        agg: dict[tuple[str, str], list[int]] = {}
        for row in rows:
            k = (row["rule"], row["layer"])
            a = agg.setdefault(k, [0, 0, 0])
            a[0] += int(row.get("packets") or 0)
            a[1] += int(row.get("bytes") or 0)
            a[2] += int(row.get("dropped") or 0)
        for (rule, layer), (p, b, d) in sorted(agg.items()):
            packets.add_metric([rule, layer], p)
            bytes_.add_metric([rule, layer], b)
            dropped.add_metric([rule, layer], d)
        up.add_metric([], ok)
        banned = CounterMetricFamily(
            "netlimit_bans_dropped_packets", "Packets dropped because their source is banned (all ban sets)"
        )
        banned.add_metric([], sum(d for (rule, _layer), (_p, _b, d) in agg.items() if rule == "(bans)"))
        yield banned
        yield packets
        yield bytes_
        yield dropped
        yield limit
        yield up


class _BanCollector:
    """The ban follower's counters (netlimit/daemon/bans.py), read at scrape time."""

    def __init__(self) -> None:
        self.follower: Any = None

    def describe(self):
        return []

    def collect(self):
        from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

        f = self.follower
        if f is None:
            return
        st = f.status()
        active = GaugeMetricFamily("netlimit_bans_active", "Bans in the list this host follows")
        active.add_metric([], st["active"])
        kernel = GaugeMetricFamily(
            "netlimit_bans_in_kernel", "Prefixes in the kernel's ban sets (the outermost ones on nftables)"
        )
        kernel.add_metric([], st["in_kernel"])
        up = GaugeMetricFamily("netlimit_bans_store_up", "1 while the ban list's store is reachable")
        up.add_metric([], 1 if st["connected"] else 0)
        added = CounterMetricFamily(
            "netlimit_bans_added",
            "Bans this host loaded, by rule and origin (http, network, manual)",
            labels=["rule", "origin"],
        )
        for (rule, origin), n in sorted(f.added.items()):
            added.add_metric([rule, origin], n)
        expired = CounterMetricFamily(
            "netlimit_bans_expired", "Bans that ran out, by rule and origin", labels=["rule", "origin"]
        )
        for (rule, origin), n in sorted(f.expired.items()):
            expired.add_metric([rule, origin], n)
        simple = [
            ("netlimit_bans_removed", "Bans removed before their time (ban del, flush, max_entries)", f.removed),
            ("netlimit_bans_skipped", "Bans not written: exempt addresses and trusted proxies", st["skipped"]),
            ("netlimit_bans_loads", "Whole reloads of the kernel's ban sets", st["loads"]),
            ("netlimit_bans_write_errors", "Refused writes to the ban sets (a reload follows)", st["write_errors"]),
            ("netlimit_bans_kernel_published", "Bans of network escalate handed to the list", st["kernel_published"]),
        ]  # fmt: skip
        yield active
        yield kernel
        yield up
        yield added
        yield expired
        for name, doc, value in simple:
            c = CounterMetricFamily(name, doc)
            c.add_metric([], value)
            yield c
