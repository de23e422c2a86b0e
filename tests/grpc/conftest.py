"""Fixtures for the gRPC front door tests: the real redis-server fixtures of
tests/http (shared, not copied), and tests/http on sys.path for its process
helpers (``fixtures_sidecar``).  No mocks: gRPC clients talk to real servers
over loopback; Envoy is a real binary (tests/grpc/test_envoy.py)."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
HTTP_TESTS = HERE.parent / "http"
if str(HTTP_TESTS) not in sys.path:
    sys.path.insert(0, str(HTTP_TESTS))
if str(HERE) not in sys.path:
    sys.path.insert(0, str(HERE))

_spec = importlib.util.spec_from_file_location("netlimit_tests_http_conftest", HTTP_TESTS / "conftest.py")
_http = importlib.util.module_from_spec(_spec)
assert _spec.loader is not None
sys.modules[_spec.name] = _http   # dataclasses look their module up while the class is built
_spec.loader.exec_module(_http)

redis_server = _http.redis_server
redis_factory = _http.redis_factory
RedisServer = _http.RedisServer
