"""The sidecar's container image run for real with podman (run by scripts/release-test.sh,
not by the default suite: it needs the built image archive).

The container joins a network namespace this test owns (nothing in the host's), where
a small upstream answers on 127.0.0.1:9080: the sidecar proxies to it, a burst over
the mounted file's limit gets 429 with Retry-After and X-RateLimit-* headers, the
HEALTHCHECK reports healthy, it runs as uid 10001 on a read-only root file system, and
`podman stop` ends it within 2 s.

    NETLIMIT_IMAGE=dist/netlimit-sidecar-0.2.0.image.tar .venv/bin/python -m pytest -s tests/release/release_image.py
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import time
from pathlib import Path

import pytest
from release_common import sh, wait_for

pytestmark = pytest.mark.netns

# This sandbox's host has hybrid cgroups (v1 controllers), which crun refuses ("cgroups in
# hybrid mode not supported"), and forbids raising RLIMIT_NPROC/NOFILE to podman's default
# ("setrlimit `RLIMIT_NOFILE`: Operation not permitted"): runc and explicit limits work.
# On a cgroup v2 host NETLIMIT_PODMAN_RUN_ARGS="" runs podman's defaults.
RUN_ARGS = os.environ.get("NETLIMIT_PODMAN_RUN_ARGS", "--ulimit nofile=16384:16384 --ulimit nproc=4096:4096").split()
RUNTIME = os.environ.get("NETLIMIT_PODMAN_RUNTIME", "runc")

RULES = """\
version: 1
http:
  domain: edge
  actions: [[remote_address]]
  descriptors:
    - key: remote_address
      rate_limit: {unit: minute, requests_per_unit: 5}
"""

UPSTREAM = """
import http.server
class H(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        body = b"upstream says hi\\n"
        self.send_response(200)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)
    def log_message(self, *a):
        pass
http.server.ThreadingHTTPServer(("127.0.0.1", 9080), H).serve_forever()
"""

CLIENT = """
import http.client, json, sys
out = []
for i in range(int(sys.argv[1])):
    c = http.client.HTTPConnection("127.0.0.1", 8080, timeout=5)
    c.request("GET", "/x")
    r = c.getresponse()
    body = r.read().decode(errors="replace")
    out.append({"status": r.status, "headers": {k.lower(): v for k, v in r.getheaders()}, "body": body[:200]})
    c.close()
print(json.dumps(out))
"""


def podman(*args: str, check: bool = True, timeout: float = 120) -> subprocess.CompletedProcess:
    res = subprocess.run(["podman", "--runtime", RUNTIME, *args], capture_output=True, text=True, timeout=timeout)
    if check and res.returncode != 0:
        raise AssertionError(f"podman {' '.join(args)} failed ({res.returncode}):\n{res.stdout}\n{res.stderr}")
    return res


@pytest.fixture
def image() -> str:
    path = os.environ.get("NETLIMIT_IMAGE")
    assert path, "set NETLIMIT_IMAGE to the image archive to test (scripts/release-test.sh does)"
    p = Path(path).resolve()
    assert p.is_file(), f"{p}: no such file"
    out = podman("load", "-i", str(p), timeout=600).stdout
    m = re.search(r"Loaded image(?:\(s\))?: (\S+)", out)
    assert m, out
    return m.group(1)


@pytest.fixture
def netns():
    name = f"nl-img{os.getpid() % 100000}"
    sh("ip", "netns", "add", name)
    up = None
    try:
        sh("ip", "-n", name, "link", "set", "lo", "up")
        up = subprocess.Popen(["ip", "netns", "exec", name, "python3", "-c", UPSTREAM])
        yield name
    finally:
        if up is not None:
            up.kill()
            up.wait(timeout=10)
        sh("ip", "netns", "del", name, check=False)


def test_image_limits_a_burst_reports_healthy_and_stops_fast(image, netns, tmp_path):
    rules = tmp_path / "netlimit.yaml"
    rules.write_text(RULES)
    rules.chmod(0o644)
    tmp_path.chmod(0o755)
    name = f"nl-img{os.getpid() % 100000}"
    size = int(podman("image", "inspect", "--format", "{{.Size}}", image).stdout.strip())
    print(f"image {image}: {size / 1e6:.0f} MB")
    assert size <= 150e6, f"the image is {size / 1e6:.0f} MB (goal: at most 150 MB)"
    cfg = json.loads(podman("image", "inspect", "--format", "{{json .Config}}", image).stdout)
    assert cfg["User"] == "10001:10001", cfg
    hc = json.loads(podman("image", "inspect", "--format", "{{json .HealthCheck}}", image).stdout)
    assert hc and hc["Test"][0] in ("CMD", "CMD-SHELL") and "healthcheck" in " ".join(hc["Test"]), hc
    try:
        podman("run", "-d", "--name", name, "--read-only", f"--network=ns:/run/netns/{netns}", *RUN_ARGS,
               "-v", f"{rules}:/etc/netlimit/netlimit.yaml:ro", "-e", "NETLIMIT_UPSTREAM=http://127.0.0.1:9080",
               image)  # fmt: skip

        def up():
            r = sh("ip", "netns", "exec", netns, "python3", "-c", CLIENT, "0", check=False)
            logs = podman("logs", name, check=False).stdout + podman("logs", name, check=False).stderr
            return "listening on" in logs and r.returncode == 0

        wait_for(up, 60, "the sidecar listening")
        health = podman("healthcheck", "run", name, check=False)
        assert health.returncode == 0, f"HEALTHCHECK: {health.stdout} {health.stderr}"
        assert podman("exec", name, "id", "-u").stdout.strip() == "10001"
        ro = podman("exec", name, "sh", "-c", "touch /opt/netlimit/x", check=False)
        assert ro.returncode != 0 and "Read-only" in ro.stderr, ro.stderr

        answers = json.loads(sh("ip", "netns", "exec", netns, "python3", "-c", CLIENT, "8").stdout)
        statuses = [a["status"] for a in answers]
        print("burst of 8 against 5/minute:", statuses)
        assert statuses == [200] * 5 + [429] * 3, statuses
        assert answers[0]["body"] == "upstream says hi\n"
        denied = answers[-1]["headers"]
        assert int(denied["retry-after"]) >= 1
        assert denied["x-ratelimit-limit"] == "5" and denied["x-ratelimit-remaining"] == "0"

        t = time.monotonic()
        podman("stop", "-t", "10", name, timeout=30)
        took = time.monotonic() - t
        print(f"podman stop: {took:.2f} s")
        assert took <= 2.0, f"podman stop took {took:.2f} s"
        state = podman("inspect", "--format", "{{.State.Status}} {{.State.ExitCode}}", name).stdout.strip()
        assert state == "exited 0", state
    finally:
        podman("rm", "-f", "-t", "0", name, check=False)
