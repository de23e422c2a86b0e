"""Fixtures of the engine's tests: a REAL Redis Cluster (3 primaries, 3 replicas,
cluster-node-timeout 2 s) for the whole session, shared by the conformance suite
and the cluster store tests (they use distinct key prefixes; tests that kill or
reshard make clusters of their own)."""

from __future__ import annotations

import tempfile
from pathlib import Path

import pytest
from redis_cluster import RedisCluster
from redis_proc import _require_redis_server


@pytest.fixture(scope="session")
def redis_cluster():
    _require_redis_server()
    with tempfile.TemporaryDirectory(prefix="netlimit-cluster-") as d, RedisCluster(Path(d)) as cluster:
        yield cluster
