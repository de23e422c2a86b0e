"""HTTP traffic for the scale-out drills (tests/sidecar/test_cluster_sidecars.py,
scripts/cluster_drills.py): client threads, each with a keep-alive connection to
every sidecar, sending ``GET /v1/check`` with an ``X-Api-Key`` per request and
recording every status per key, every transport error and every 5xx.

Also the config the drills share (one rule per algorithm, matched by the key's
prefix) and where a key's counter lives (its cluster slot), computed with the
engine itself.
"""

from __future__ import annotations

import http.client
import itertools
import textwrap
import threading
import time
from collections import Counter, defaultdict
from dataclasses import dataclass, field

ALG_PREFIX = {
    "token_bucket": "tb",
    "leaky_bucket": "lb",
    "fixed_window": "fw",
    "sliding_window_log": "swl",
    "sliding_window_counter": "swc",
}


def config(limit: int, *, on_store_failure: str = "closed", store_timeout_ms: int = 500, domain: str = "drill") -> str:
    """One rule per algorithm, ``limit`` per day each (nothing refills or rolls over
    during a drill, unless it spans midnight UTC), keyed by the X-Api-Key value;
    ``probe-*`` keys are never denied (:class:`Probe` uses them)."""
    rules = "".join(
        f"""
    - key: "header:X-Api-Key"
      value: {p}-*
      rate_limit: {{unit: day, requests_per_unit: {limit}, name: {p}}}
      algorithm: {alg}"""
        for alg, p in ALG_PREFIX.items()
    )
    rules += """
    - key: "header:X-Api-Key"
      value: probe-*
      rate_limit: {unit: day, requests_per_unit: 100000000, name: probe}
      algorithm: token_bucket"""
    return (
        textwrap.dedent(f"""\
        version: 1
        http:
          domain: {domain}
          store_timeout_ms: {store_timeout_ms}
          on_store_failure: {on_store_failure}
          actions:
            - [header:X-Api-Key]
          descriptors:""")
        + rules
        + "\n"
    )


def keys_for(n: int, algorithms=tuple(ALG_PREFIX), tag: str = "k") -> list[str]:
    """``n`` distinct API keys, spread evenly over ``algorithms``."""
    algs = list(algorithms)
    return [f"{ALG_PREFIX[algs[i % len(algs)]]}-{tag}{i}" for i in range(n)]


def store_keys(cfg_text: str, api_keys: list[str]) -> dict[str, bytes]:
    """The Redis key (bytes) holding each API key's counter, as the sidecar names it."""
    from netlimit.config.validate import load_string
    from netlimit.limit.rules import from_loaded
    from netlimit.limit.stores import RedisStore

    rs = from_loaded(load_string(cfg_text, "drill.yaml"))
    naming = RedisStore("redis://127.0.0.1:1/0")  # names keys; never connects
    out = {}
    for k in api_keys:
        d = [("header:X-Api-Key", k)]
        rule = rs.match(d)
        assert rule is not None and rule.limit is not None, k
        out[k] = naming.redis_keys(rs.store_key(rule, d), rule.limit)[0].encode()
    return out


@dataclass
class Tally:
    statuses: dict[str, Counter] = field(default_factory=lambda: defaultdict(Counter))
    errors: list[str] = field(default_factory=list)
    requests: int = 0
    # (monotonic time, status) of every answer, for timelines
    times: list[tuple[float, int]] = field(default_factory=list)

    def admitted(self, key: str) -> int:
        return self.statuses[key][200]

    def codes(self) -> Counter:
        c: Counter = Counter()
        for v in self.statuses.values():
            c.update(v)
        return c

    def five_xx(self) -> int:
        return sum(n for code, n in self.codes().items() if code >= 500)


class Traffic:
    """``threads`` client threads over the sidecars at ``ports``.

    ``plan``: the API keys each request uses, in order; thread ``t`` sends items
    ``t, t + threads, ...`` and alternates sidecars request by request, so every
    key is asked of both processes by several threads at about the same time.
    With ``repeat`` the plan starts over until :meth:`stop`, ``max_seconds`` or
    ``max_requests``."""

    def __init__(
        self,
        ports: list[int],
        plan: list[str],
        *,
        threads: int = 4,
        repeat: bool = False,
        max_seconds: float = 60.0,
        max_requests: int = 2_000_000,
        timeout: float = 10.0,
    ) -> None:
        self.ports = ports
        self.plan = plan
        self.threads = threads
        self.repeat = repeat
        self.max_seconds = max_seconds
        self.max_requests = max_requests
        self.timeout = timeout
        self.tally = Tally()
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._threads: list[threading.Thread] = []

    def start(self) -> Traffic:
        for t in range(self.threads):
            th = threading.Thread(target=self._run, args=(t,), daemon=True)
            self._threads.append(th)
            th.start()
        return self

    def stop(self) -> Tally:
        self._stop.set()
        return self.join()

    def join(self, timeout: float | None = None) -> Tally:
        deadline = time.monotonic() + (timeout if timeout is not None else self.max_seconds + 30)
        for th in self._threads:
            th.join(max(0.0, deadline - time.monotonic()))
        assert not any(th.is_alive() for th in self._threads), "client threads did not finish"
        return self.tally

    def run(self) -> Tally:
        return self.start().join()

    def _run(self, t: int) -> None:
        conns = [http.client.HTTPConnection("127.0.0.1", p, timeout=self.timeout) for p in self.ports]
        end = time.monotonic() + self.max_seconds
        mine = self.plan[t :: self.threads]
        items = itertools.cycle(mine) if self.repeat else iter(mine)
        local: list[tuple[str, int, float]] = []
        n = 0
        try:
            for key in items:
                if self._stop.is_set() or time.monotonic() > end or self.tally.requests >= self.max_requests:
                    break
                i = n % len(conns)
                n += 1
                try:
                    conns[i].request("GET", "/v1/check", headers={"X-Original-URI": "/", "X-Api-Key": key})
                    r = conns[i].getresponse()
                    r.read()
                    local.append((key, r.status, time.monotonic()))
                except (OSError, http.client.HTTPException) as e:
                    with self._lock:
                        self.tally.errors.append(f"{key}: {e!r}")
                    conns[i].close()
                    conns[i] = http.client.HTTPConnection("127.0.0.1", self.ports[i], timeout=self.timeout)
                if len(local) >= 256:
                    self._flush(local)
            self._flush(local)
        finally:
            for c in conns:
                c.close()

    def _flush(self, local: list[tuple[str, int, float]]) -> None:
        with self._lock:
            for key, status, at in local:
                self.tally.statuses[key][status] += 1
                self.tally.times.append((at, status))
            self.tally.requests += len(local)
        local.clear()


def over_limit(tally: Tally, keys: list[str], limit: int) -> dict[str, int]:
    """Admissions above ``limit`` per key (only keys that have some)."""
    return {k: tally.admitted(k) - limit for k in keys if tally.admitted(k) > limit}


class Probe:
    """One thread asking a sidecar's JSON API every ``interval`` s for a
    ``probe-*`` key, recording (monotonic time, HTTP status, decision source:
    store | local | open | closed)."""

    def __init__(self, port: int, key: str, domain: str = "drill", interval: float = 0.05, max_seconds: float = 120):
        import json

        self.port = port
        self.body = json.dumps(
            {"domain": domain, "descriptors": [{"entries": [{"key": "header:X-Api-Key", "value": key}]}]}
        ).encode()
        self.interval = interval
        self.max_seconds = max_seconds
        self.samples: list[tuple[float, int, str]] = []
        self.errors: list[str] = []
        self._stop = threading.Event()
        self._t = threading.Thread(target=self._run, daemon=True)

    def start(self) -> Probe:
        self._t.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        self._t.join(10)

    def _run(self) -> None:
        import json

        end = time.monotonic() + self.max_seconds
        conn = http.client.HTTPConnection("127.0.0.1", self.port, timeout=10)
        try:
            while not self._stop.is_set() and time.monotonic() < end:
                try:
                    conn.request("POST", "/v1/check", body=self.body, headers={"Content-Type": "application/json"})
                    r = conn.getresponse()
                    doc = json.loads(r.read())
                    self.samples.append((time.monotonic(), r.status, doc["statuses"][0].get("source", "")))
                except (OSError, http.client.HTTPException, ValueError, KeyError) as e:
                    self.errors.append(repr(e))
                    conn.close()
                    conn = http.client.HTTPConnection("127.0.0.1", self.port, timeout=10)
                self._stop.wait(self.interval)
        finally:
            conn.close()

    def first_store_after(self, t: float) -> float | None:
        """When the first decision from the store came after ``t`` following one that was not."""
        seen_other = False
        for at, _, src in self.samples:
            if at < t:
                continue
            if src != "store":
                seen_other = True
            elif seen_other:
                return at
        return None

    def sources_after(self, t: float) -> Counter:
        return Counter(src for at, _, src in self.samples if at >= t)
