"""Fixtures every test directory shares.

The tests mirror the package (tests/limit, tests/sidecar, tests/rls,
tests/kernel, tests/daemon, tests/config, ...); what they need from the
environment is a marker (netns, redis, nginx, envoy, systemd, vagrant).
Helpers that start real programs live in tests/helpers, which is put on
sys.path here: ``from redis_proc import RedisServer``.

No mocks stand in for a program a user runs, and nothing skips: a missing
tool fails with a message that says how to install it.
"""

from __future__ import annotations

import os
import shutil
import sys
import tempfile
from pathlib import Path

import pytest

HELPERS = Path(__file__).resolve().parent / "helpers"
if str(HELPERS) not in sys.path:
    sys.path.insert(0, str(HELPERS))

from netns_topo import REQUIRED, Topo, _seq, _setup, _sh, require  # noqa: E402 - after the sys.path entry
from redis_proc import RedisServer, _free_port, _require_redis_server  # noqa: E402 - after the sys.path entry

# --- the compiled door ------------------------------------------------------------------


def pytest_sessionstart(session):
    """tests/sidecar/test_compiled_door.py runs the door's tests on the release build:
    they must not quietly run on the source tree's Python instead."""
    if os.environ.get("NETLIMIT_EXPECT_COMPILED") != "1":
        return
    import netlimit.sidecar.server  # noqa: F401  (imports every compiled module)
    from netlimit import compiled

    missing = sorted(set(compiled.module_names()) - set(compiled.running()))
    if missing:
        raise pytest.UsageError(f"NETLIMIT_EXPECT_COMPILED=1, but these run in Python: {', '.join(missing)}")


# --- markers from fixtures -----------------------------------------------------------------

# What a fixture needs from the environment is the test's marker too, so `-m "not redis"`
# deselects every test that starts a redis-server, whether it asks for the fixture by
# name or gets it through a parametrised factory (a "redis" parameter).
ENV_FIXTURES = {
    "redis_server": "redis",
    "redis_factory": "redis",
    "redis_cluster": "redis",
    "sentinels": "redis",
    "cluster": "redis",
    "topo": "netns",
}


def pytest_collection_modifyitems(config, items):
    for item in items:
        names = set(getattr(item, "fixturenames", ()))
        for fixture, marker in ENV_FIXTURES.items():
            if fixture in names:
                item.add_marker(marker)
        callspec = getattr(item, "callspec", None)
        if callspec is not None and any(
            isinstance(v, str) and v in ("redis", "cluster") for v in callspec.params.values()
        ):
            item.add_marker("redis")


# --- Redis ---------------------------------------------------------------------------------


@pytest.fixture(scope="session")
def redis_server():
    """One real redis-server for the whole session (tests use distinct keys/prefixes)."""
    _require_redis_server()
    with tempfile.TemporaryDirectory(prefix="netlimit-redis-") as d:
        server = RedisServer(_free_port(), Path(d))
        try:
            server.start()
            yield server
        finally:
            server.stop()


@pytest.fixture(scope="session")
def redis_cluster():
    """A REAL Redis Cluster (3 primaries, 3 replicas) for the whole session, shared by the
    conformance suite, the cluster store and the ban list tests (distinct key prefixes;
    tests that kill a node make clusters of their own, with a short node timeout).
    cluster-node-timeout 15 s: nothing here waits for a failover, and at 2 s a node slow to
    answer its pings on a busy host (the heavy soak beside it, load 10) was marked failed
    and the cluster said CLUSTERDOWN to a test that only counts EVALSHAs."""
    from redis_cluster import RedisCluster

    _require_redis_server()
    with (
        tempfile.TemporaryDirectory(prefix="netlimit-cluster-") as d,
        RedisCluster(Path(d), node_timeout_ms=15_000) as cluster,
    ):
        yield cluster


@pytest.fixture
def redis_factory():
    """Start extra throw-away servers (for tests that pause or kill them)."""
    _require_redis_server()
    servers: list[RedisServer] = []
    dirs: list[tempfile.TemporaryDirectory] = []

    def make() -> RedisServer:
        d = tempfile.TemporaryDirectory(prefix="netlimit-redis-")
        dirs.append(d)
        s = RedisServer(_free_port(), Path(d.name))
        servers.append(s)
        return s.start()

    try:
        yield make
    finally:
        for s in servers:
            s.stop()
        for d in dirs:
            d.cleanup()


# --- network namespaces ---------------------------------------------------------------


LEGACY_BACKENDS = ("restore", "python-iptables")


@pytest.fixture(params=LEGACY_BACKENDS)
def backend(request, monkeypatch):
    """Run the test once per legacy x_tables backend: the in-process reconcile calls and
    the CLI subprocesses both follow $NETLIMIT_BACKEND (tests without a backend fixture
    use auto: nftables on this Debian 12 host)."""
    monkeypatch.setenv("NETLIMIT_BACKEND", request.param)
    return request.param


@pytest.fixture(params=("nftables", "restore"))
def any_backend(request, monkeypatch):
    """Once with nftables and once with the legacy default (restore): what auto picks
    on an nf_tables host and on a legacy one."""
    monkeypatch.setenv("NETLIMIT_BACKEND", request.param)
    return request.param


@pytest.fixture(params=("nftables",) + LEGACY_BACKENDS)
def every_backend(request, monkeypatch):
    monkeypatch.setenv("NETLIMIT_BACKEND", request.param)
    return request.param


@pytest.fixture
def topo():
    if os.geteuid() != 0:
        pytest.fail("netns tests need root (they create network namespaces)", pytrace=False)
    require(*REQUIRED)
    n = next(_seq)
    base = f"nlt-{os.getpid()}-{n}"
    t = Topo(srv=f"{base}-s", cli=f"{base}-c")
    try:
        _setup(t)
        yield t
    finally:
        for ns in (t.srv, t.cli):
            _sh("ip", "netns", "del", ns, check=False)


def _root_snapshot() -> str:
    parts = []
    for cmd in (
        ["iptables-legacy-save"],
        ["ip6tables-legacy-save"],
        ["nft", "list", "tables"],
        ["tc", "qdisc", "show"],
        ["ip", "-br", "link"],
        ["ip", "link", "show"],  # an XDP program shows as "prog/xdp … name netlimit_xdp"
    ):
        if shutil.which(cmd[0]):
            parts.append(_sh(*cmd, check=False).stdout)
    return "\n".join(parts)


@pytest.fixture(scope="session", autouse=True)
def root_namespace_untouched():
    """Fail loudly if anything of netlimit's appears in the machine's own namespace."""
    yield
    if os.geteuid() != 0:
        return
    snap = _root_snapshot()
    for marker in ("netlimit", "NETLIMIT", "nlifb-", "4e4c:"):
        assert marker not in snap, f"{marker!r} found in the ROOT namespace:\n{snap}"
    assert not os.path.exists("/sys/fs/bpf/netlimit/host"), "XDP maps pinned for the ROOT namespace"
    # this session's namespaces (nlt-PID-*, tests/daemon's nlt-dPID-* and nlt-bPID-*) left no XDP pins
    mine = (f"ns-nlt-{os.getpid()}-", f"ns-nlt-d{os.getpid() % 100000}-", f"ns-nlt-b{os.getpid() % 100000}-")
    pins = os.listdir("/sys/fs/bpf/netlimit") if os.path.isdir("/sys/fs/bpf/netlimit") else []
    assert not [p for p in pins if p.startswith(mine)], f"XDP pins left behind: {pins}"
    leftovers = [n for n in _sh("ip", "netns", "list").stdout.split() if n.startswith(f"nlt-{os.getpid()}-")]
    assert not leftovers, f"namespaces left behind: {leftovers}"
