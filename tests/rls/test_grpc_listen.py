"""``--grpc 0.0.0.0:PORT`` listens on IPv4 only, as the HTTP listeners do (gRPC
core binds ``[::]`` dual-stack for ``0.0.0.0``: it answered on ``::1`` too), and
a gRPC door beyond loopback is named in a warning at start.  In a namespace of
its own: nothing is bound on the machine's interfaces."""

from __future__ import annotations

import sys
import textwrap

import pytest
from lone_netns import LoneNetns
from sidecar_proc import LogProc, netlimit_cmd, write_config

pytestmark = [pytest.mark.netns, pytest.mark.timeout(120)]

CONFIG = """\
version: 1
http:
  domain: web
  descriptors:
    - key: remote_address
      rate_limit: {unit: second, requests_per_unit: 100}
"""

HEALTH = textwrap.dedent(
    """
    import sys, grpc
    from grpc_health.v1 import health_pb2, health_pb2_grpc
    with grpc.insecure_channel(sys.argv[1]) as ch:
        r = health_pb2_grpc.HealthStub(ch).Check(health_pb2.HealthCheckRequest(service=""), timeout=10)
    print(health_pb2.HealthCheckResponse.ServingStatus.Name(r.status))
    """
)


@pytest.mark.parametrize("port", [0, 50051], ids=["any-port", "fixed-port"])
def test_grpc_on_0_0_0_0_answers_on_ipv4_only(tmp_path, port):
    cfg = write_config(tmp_path / "n.yaml", CONFIG)
    with LoneNetns("grpc4") as ns:
        argv = [*netlimit_cmd(), "sidecar", "--config", str(cfg), "--listen", "127.0.0.1:0"]
        sc = LogProc(ns.argv(*argv, "--grpc", f"0.0.0.0:{port}"))
        try:
            p = int(sc.wait_line(r"gRPC listening on 0\.0\.0\.0:(\d+)", timeout=60).group(1))
            assert port in (0, p)
            sc.wait_line(rf"the gRPC door listens on 0\.0\.0\.0:{p}, which is not a loopback address")
            got = ns.connect(("127.0.0.1", p), ("::1", p))
            assert got == {f"127.0.0.1 {p}": "answers", f"::1 {p}": "ConnectionRefusedError"}
            assert f"0.0.0.0:{p}" in ns.listening()
            assert not any(a.endswith(f":{p}") and a.startswith("[") for a in ns.listening())
            assert ns.run(sys.executable, "-c", HEALTH, f"127.0.0.1:{p}").strip() == "SERVING"
        finally:
            sc.stop()


def test_grpc_on_loopback_is_not_warned_about(tmp_path):
    cfg = write_config(tmp_path / "n.yaml", CONFIG)
    with LoneNetns("grpclo") as ns:
        argv = [*netlimit_cmd(), "sidecar", "--config", str(cfg), "--listen", "127.0.0.1:0", "--grpc", "127.0.0.1:0"]
        sc = LogProc(ns.argv(*argv))
        try:
            sc.wait_line(r"gRPC listening on 127\.0\.0\.1:\d+", timeout=60)
        finally:
            sc.stop()
        assert "not a loopback address" not in sc.log()
