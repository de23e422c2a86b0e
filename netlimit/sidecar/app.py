"""The HTTP sidecar's state: the config, the limiter, reloads, and what a
decision request becomes (the endpoints themselves are in endpoints.py, the
reverse proxy in proxy.py, the connections in http11/, the listeners in
server.py).

Listeners::

    decision mode (no --upstream): one listener for the decision endpoints and
        the operator endpoints (loopback by default: nginx and Envoy call it);
    proxy mode (--upstream URL): the client-facing listener proxies EVERY path
        to the upstream; the decision and operator endpoints live only on the
        admin listener (--admin-listen, loopback by default), so no client can
        charge another's counters or read the rules through the proxy.

Endpoints (decision listener / admin listener)::

    GET  /v1/check        decision endpoint for nginx auth_request (and similar):
                          the original request comes from X-Original-URI and
                          X-Original-Method (or X-Forwarded-Uri / -Method);
                          200 = allow, else ``deny_status`` (query, default 429).
                          Denials also carry X-Netlimit-Problem (the 429 problem
                          JSON) for nginx, which cannot read the body.
    ANY  /v1/authz/<path> Envoy ext_authz (HTTP service, path_prefix /v1/authz):
                          the original path is what follows the prefix, the
                          original method is the request's; 200 or 429.
    POST /v1/check        JSON API, Lyft's /json shape (json_api.py).
    GET  /v1/rules        the loaded rules.
    GET  /v1/top          counters per rule and the most denied descriptors (netlimit top).
    GET  /healthz         liveness + state (JSON).
    GET  /metrics         Prometheus text format.

Errors are problem+json (RFC 9457).  The sidecar never answers 5xx because of
its store: see ``on_store_failure`` in netlimit/limit/limiter.py.  (502/504 in
proxy mode mean the upstream application failed.)
"""

from __future__ import annotations

import asyncio
import logging
import time
from typing import TYPE_CHECKING, Any

from ..bans.escalate import escalator_for
from ..buildinfo import InfoCollector
from ..config.model import redis_url_problem
from ..config.validate import load_file, lyft_dir_path
from ..errors import BadRequest, ConfigError, StoreError
from ..limit.actions import ActionPlan, BadAddress
from ..limit.limiter import Limiter
from ..limit.metrics import FrontStats, Metrics
from ..limit.rules import from_loaded
from ..limit.stores import LeasedRedisStore, MemoryStore, RedisStore
from ..logs import problem_fields
from ..reload import DropGuard
from ..watch import DirWatch, FileWatch
from .http11.limits import ClientError
from .http11.state import ServerState

if TYPE_CHECKING:
    from .peers import Peers

log = logging.getLogger("netlimit.sidecar")


class Sidecar:
    """Config, limiter and decision logic of one sidecar process."""

    def __init__(
        self,
        config_path: str,
        *,
        upstream: str | None = None,
        redis_url: str | None = None,
        reload_interval: float = 1.0,
        retry_interval: float = 0.25,
        log_interval: float = 10.0,
        max_connections: int = 10_000,
        admin_max_connections: int = 1024,
        admin_token: bytes | None = None,
        show_values: bool = False,
        shared_state: str | None = None,
        shared_leases: bool = True,
    ):
        self.config_path = str(config_path)
        loaded = load_file(self.config_path)  # ConfigError goes to the caller
        rules = from_loaded(loaded)
        http = loaded.config.http
        assert http is not None
        self.loaded = loaded
        self.plan = ActionPlan.of(http)
        self.front = FrontStats()
        self.redis_override = redis_url
        self.storage = redis_url or http.storage
        self._store_settings = (http.storage, http.store_timeout_ms, http.max_keys, http.max_key_length)
        if self.storage == "memory" and shared_state is not None:  # a worker of --workers N (workers.py)
            from ..limit.stores.shared import SharedMemoryStore

            store: Any = SharedMemoryStore(
                shared_state, leases=shared_leases, max_keys=http.max_keys, max_key_length=http.max_key_length
            )
        elif self.storage == "memory":
            store = MemoryStore(max_keys=http.max_keys, max_key_length=http.max_key_length)
        else:
            problem = redis_url_problem(self.storage, secrets=True)  # ${VAR} and password files: now
            if problem is not None:
                from ..config.loader import Problem

                line, col = loaded.position("http", "storage") if redis_url is None else (0, 0)
                where = self.config_path if redis_url is None else "--redis"
                raise ConfigError([Problem(where, line, col, "http", f"storage {self.storage!r}: {problem}")])
            kind = LeasedRedisStore if http.leases else RedisStore
            store = kind(self.storage, timeout_ms=http.store_timeout_ms, max_key_length=http.max_key_length)
        self.limiter = Limiter(
            rules,
            store,
            on_store_failure=http.on_store_failure,
            retry_interval=retry_interval,
            log_interval=log_interval,
        )
        # header: descriptor values (API keys...) are hashed in /v1/top and the logs unless shown
        self.limiter.show_values = show_values
        # --admin-token-file: the decision and operator endpoints need `Authorization: Bearer <token>`
        self.admin_token = admin_token
        self.metrics = Metrics(self.limiter, self.front)
        self.metrics.registry.register(InfoCollector(lambda: self.loaded.sha256))
        # escalation: repeat offenders banned at L3 (netlimit/bans/escalate.py)
        self.escalator = escalator_for(loaded.config, store, redis_url)
        self.limiter.on_over = self.escalator.note
        self.metrics.registry.register(self.escalator)
        self.upstream = upstream
        self.reload_interval = reload_interval
        self.last_reload_error: str | None = None
        self._watch_task: asyncio.Task | None = None
        self._watch: FileWatch | None = None
        self._dir_watch: DirWatch | None = None  # http.lyft_config_dir, while watched
        self.guard = DropGuard()  # holds back a file that would remove most rules (netlimit/reload.py)
        self._recheck: asyncio.TimerHandle | None = None
        self._xff_warned = False
        #: `--workers N`: (this worker's index, N) -- /healthz says which worker answered
        self.worker: tuple[int, int] | None = None
        #: `--workers N`: the other workers' /metrics and /v1/top (peers.py), merged into this one's
        self.peers: Peers | None = None
        # each listener's connections and batched answers: a flood on the client-facing
        # listener cannot take the admin listener's connections (nor the reverse)
        self.state = ServerState(max_connections)
        self.admin_state = ServerState(admin_max_connections)
        self.metrics.registry.register(_ListenerCollector({"main": self.state, "admin": self.admin_state}))

    # -- reload --------------------------------------------------------------------

    def reload(self, why: str) -> bool:
        """Load the file again; on any problem keep the running rules and log why."""
        path = self.config_path
        try:
            loaded = load_file(path)
            rules = from_loaded(loaded)
            http = loaded.config.http
            assert http is not None
            plan = ActionPlan.of(http)
        except ConfigError as exc:
            for p in exc.problems:
                log.error("%s", p, extra=problem_fields(p))
            n = len(exc.problems)
            self.last_reload_error = "; ".join(str(p) for p in exc.problems[:5])
            log.error(
                "%s: reload (%s) failed with %d problem%s; keeping the previous rules (sha256 %s)",
                path,
                why,
                n,
                "" if n == 1 else "s",
                self.loaded.sha256[:12],
            )
            self.front.reload(False)
            return False
        except Exception as exc:  # a reload must never take the sidecar down
            self.last_reload_error = repr(exc)
            log.exception("%s: reload (%s) failed: %r; keeping the previous rules", path, why, exc)
            self.front.reload(False)
            return False
        new_names = [f"{r.domain}/{r.path}" for r in rules.all_rules]
        running = [f"{r.domain}/{r.path}" for r in self.limiter.rules.all_rules]
        wait = self.guard.check(loaded.sha256, new_names, running)
        if wait:
            log.warning(
                "%s: (%s) the new file would remove %d of the %d running rules; holding it back until it "
                "has stayed the same for %g s (a file caught half-written or truncated by mistake must not switch "
                "limits off)",
                path,
                why,
                self.guard.removed(new_names, running),
                len(running),
                self.guard.settle,
            )
            self._schedule_recheck(wait)
            return False
        if why == "held file":
            log.warning("%s: the file still removes most rules after %g s: applying it", path, self.guard.settle)
        settings = (http.storage, http.store_timeout_ms, http.max_keys, http.max_key_length)
        if self.redis_override:  # --redis wins over http.storage anyway
            settings = (self._store_settings[0],) + settings[1:]
        if settings != self._store_settings:
            log.warning(
                "%s: storage, store_timeout_ms, max_keys and max_key_length take effect at restart; "
                "the running store is kept",
                path,
            )
        self.plan = plan
        self.state.plans += 1  # the connections ask their handler again which fields it reads
        self.admin_state.plans += 1
        self.limiter.set_rules(rules, http.on_store_failure)
        self.escalator.configure(loaded.config)
        self.loaded = loaded
        self.last_reload_error = None
        self.front.reload(True)
        self._sync_dir_watch()
        log.info(
            "%s: reloaded (%s): domain%s %s, %d rules, on_store_failure %s, sha256 %s",
            path,
            why,
            "s" if len(rules.domains) > 1 else "",
            ", ".join(repr(d) for d in rules.domains),
            len(rules.all_rules),
            http.on_store_failure,
            loaded.sha256[:12],
        )
        return True

    def _sync_dir_watch(self) -> None:
        """Watch the lyft_config_dir the running file names (none, or another one
        after a reload), while the file watch runs."""
        if self._watch is None:
            return
        http = self.loaded.config.http
        want = lyft_dir_path(self.config_path, http.lyft_config_dir) if http and http.lyft_config_dir else None
        have = self._dir_watch
        if have is not None and want is not None and have.path == want.absolute():
            return
        loop = asyncio.get_running_loop()
        if have is not None:
            if have.uses_inotify:
                loop.remove_reader(have.fileno())
            have.close()
            self._dir_watch = None
        if want is not None:
            self._dir_watch = dw = DirWatch(want)
            if dw.uses_inotify:
                loop.add_reader(dw.fileno(), self._on_dir_event)

    def _on_dir_event(self) -> None:
        if self._dir_watch is not None and self._dir_watch.changed():
            self.reload("lyft_config_dir changed")

    def _schedule_recheck(self, wait: float) -> None:
        try:
            loop = asyncio.get_running_loop()
        except RuntimeError:  # driven without a loop (tests): the next event or SIGHUP decides
            return
        if self._recheck is not None:
            self._recheck.cancel()
        self._recheck = loop.call_later(wait, self._on_recheck)

    def _on_recheck(self) -> None:
        self._recheck = None
        if self._watch is not None:
            self._watch.changed()
        self.reload("held file")

    def _on_file_event(self) -> None:
        if self._watch is not None and self._watch.changed():
            self.reload("file changed")

    async def watch(self) -> None:
        """Reload when the file changes (netlimit/watch.py: on a closed write or a
        rename into place, never mid-write); every reload_interval where inotify is
        unavailable."""
        self._watch = w = FileWatch(self.config_path)
        loop = asyncio.get_running_loop()
        if w.uses_inotify:
            loop.add_reader(w.fileno(), self._on_file_event)
        else:
            log.warning("%s: inotify unavailable: polling the file every %g s", self.config_path, self.reload_interval)
        self._sync_dir_watch()
        try:
            while True:
                await asyncio.sleep(self.reload_interval if not w.uses_inotify else 3600)
                if not w.uses_inotify:
                    self._on_file_event()
                    self._on_dir_event()
        finally:
            if w.uses_inotify:
                loop.remove_reader(w.fileno())
            w.close()
            self._watch = None
            dw, self._dir_watch = self._dir_watch, None
            if dw is not None:
                if dw.uses_inotify:
                    loop.remove_reader(dw.fileno())
                dw.close()

    def on_sighup(self) -> None:
        if self._watch is not None:
            self._watch.changed()  # this reload reads the file anyway
        if self._dir_watch is not None:
            self._dir_watch.changed()
        self.reload("SIGHUP")

    # -- lifecycle -----------------------------------------------------------------------

    async def start(self) -> None:
        store = self.limiter.store
        if isinstance(store, RedisStore):  # the cluster map, the sentinels' primary, a cluster behind redis://
            try:
                await store.start()
            except StoreError as exc:
                raise SystemExit(str(exc)) from None
        self._watch_task = asyncio.create_task(self.watch())
        self.escalator.start()

    async def stop(self) -> None:
        if self._recheck is not None:
            self._recheck.cancel()
        if self._watch_task is not None:
            self._watch_task.cancel()
            try:
                await self._watch_task
            except asyncio.CancelledError:
                pass
        await self.escalator.close()
        await self.limiter.close()

    # -- what a decision request becomes -----------------------------------------------

    def descriptors(self, peer: str, h: Any, method: str, path: Any, xff: str | None = None) -> list:
        """``h.get`` takes lower-case names and gives a field's first line;
        ``xff``: every X-Forwarded-For line, joined (default: ``h``'s)."""
        plan = self.plan
        if (
            not self._xff_warned
            and plan.needs_remote
            and (xff is not None or h.get("x-forwarded-for") is not None)
            and peer not in plan.trusted
        ):
            self._xff_warned = True
            log.warning(
                "request from %s carries X-Forwarded-For but %s is not in http.trusted_proxies: "
                "the header is ignored and remote_address is the peer (add the proxy's address "
                "to trusted_proxies if it is yours)",
                peer,
                peer,
            )
        try:
            return plan.build(peer, method, path, h, xff)
        except BadAddress as exc:  # never a key of its own: refused
            raise ClientError(400, str(exc)) from None

    def check_request(self, peer: str, h: Any, query: str, xff: str | None = None) -> tuple[list, int]:
        """GET /v1/check[?deny_status=403]: (descriptors, deny status); BadRequest
        (400, the connection kept) for a bad deny_status or a missing
        X-Original-URI.  A repeated ``deny_status`` counts once, the first (as a
        header)."""
        deny_status = 0
        if query:
            for part in query.split("&"):
                k, _, ds = part.partition("=")
                if k == "deny_status" and not deny_status:
                    if not (ds.isascii() and ds.isdigit() and len(ds) == 3) or not 400 <= int(ds) <= 499:
                        raise BadRequest(f"deny_status must be a 4xx status code, got {ds[:20]!r}")
                    deny_status = int(ds)
        deny_status = deny_status or 429
        plan = self.plan
        path = "/"  # the path and the method only when an action uses them
        if plan.needs_path:
            uri = h.get("x-original-uri") or h.get("x-forwarded-uri")
            if uri is None:
                raise BadRequest(
                    "the actions use 'path' but the request has no X-Original-URI header "
                    "(nginx: proxy_set_header X-Original-URI $request_uri;)"
                )
            path = plan.path_of(uri)
        method = (h.get("x-original-method") or h.get("x-forwarded-method") or "GET") if plan.needs_method else "GET"
        return self.descriptors(peer, h, method, path, xff), deny_status

    def authz_request(self, peer: str, h: Any, method: str, path: str, query: str, xff: str | None = None) -> list:
        """Envoy ext_authz (path_prefix /v1/authz): the original path follows the prefix."""
        tail = path[len("/v1/authz") :] or "/"
        path_of = self.plan.path_of
        return self.descriptors(peer, h, method, lambda: path_of(tail), xff)

    # -- operator endpoints --------------------------------------------------------------

    def health(self) -> dict[str, Any]:
        lim = self.limiter
        doc: dict[str, Any] = {
            "status": "ok",
            "mode": "proxy" if self.upstream is not None else "decision",
            "domain": lim.rules.domain,
            "rules": len(lim.rules.all_rules),
            "store": "memory" if self.storage == "memory" else "redis",
            "store_available": lim.store_available,
            "on_store_failure": lim.on_store_failure,
            "config": self.config_path,
            "config_sha256": self.loaded.sha256,
            "last_reload_error": self.last_reload_error,
            "connections": len(self.state.conns),
            "connections_shed": self.state.shed,
            "admin_connections": len(self.admin_state.conns),
        }
        if isinstance(lim.store, RedisStore):  # nodes, their role, whether they answer
            doc["store_topology"] = lim.store.topology()
        if self.worker is not None:  # the worker the connection landed on (its counters only)
            doc["worker"], doc["workers"] = self.worker
        return doc

    def rules_doc(self) -> dict[str, Any]:
        rs = self.limiter.rules
        return {"domain": rs.domain, "domains": sorted(rs.domains), "rules": rs.describe()}

    def top_doc(self) -> dict[str, Any]:
        """What `netlimit top` shows of this sidecar: counters per rule (it takes the
        rates) and the most denied descriptors (bounded, approximate counts)."""
        lim = self.limiter
        per_rule: dict[tuple[str, str], Any] = {}
        for r in lim.rules.all_rules:
            per_rule.setdefault((r.domain, r.name), r.stats)  # rules sharing a name share their stats
        return {
            "time": time.time(),
            "rules": [
                {"domain": d, "rule": n, "hits": st.hits, "over": st.over, "shadow": st.shadow}
                for (d, n), st in per_rule.items()
            ],
            "denied": lim.stats.denied.top(10),
        }


class _ListenerCollector:
    """/metrics families of the listeners' connections (``listener``: main, the
    client-facing one; admin): what the bounds of http11/ did."""

    def __init__(self, states: dict[str, ServerState]):
        self.states = states

    def describe(self) -> list:
        return []

    def collect(self) -> Any:
        from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

        conns = GaugeMetricFamily("netlimit_http_connections", "Open client connections", labels=["listener"])
        shed = CounterMetricFamily(
            "netlimit_http_connections_shed",
            "Connections closed at the connection cap to make room (the oldest idle, else the slowest head)",
            labels=["listener"],
        )
        refused = CounterMetricFamily(
            "netlimit_http_connections_refused", "New connections refused: every one was busy", labels=["listener"]
        )
        timeouts = CounterMetricFamily(
            "netlimit_http_connection_timeouts",
            "Connections closed by a timeout (kind: header, body, keepalive, send)",
            labels=["listener", "kind"],
        )
        queued = GaugeMetricFamily(
            "netlimit_http_pipeline_queued_max",
            "The most requests one connection had queued at once since the start (bounded by the pipeline limit)",
            labels=["listener"],
        )
        errors = CounterMetricFamily(
            "netlimit_http_internal_errors", "Requests answered 500 because the sidecar failed", labels=["listener"]
        )
        for name, st in self.states.items():
            conns.add_metric([name], len(st.conns))
            shed.add_metric([name], st.shed)
            refused.add_metric([name], st.refused)
            for kind, n in st.timeouts.items():
                timeouts.add_metric([name, kind], n)
            queued.add_metric([name], st.queued_max)
            errors.add_metric([name], st.errors)
        return iter((conns, shed, refused, timeouts, queued, errors))
