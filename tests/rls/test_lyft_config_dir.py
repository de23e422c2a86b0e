"""Several domains in one sidecar, as Lyft serves its runtime directory: a real
``netlimit sidecar`` process whose ``http.lyft_config_dir`` holds upstream's
integration config files (tests/rls/upstream/test/integration/runtime),
answering every domain through the gRPC door and the JSON door (POST
/v1/check), and reloading when a file of the directory is added, changed or
removed (integration_test.go's testConfigReload: reload.yaml added, then
removed).  A directory that becomes invalid (two files of one domain) keeps
the running rules, and says why.  On the memory store and on Redis."""

from __future__ import annotations

import json
import os
import shutil
import time
from pathlib import Path

import pytest
from lyft_replay import RUNTIME
from rls_helpers import OK, OVER_LIMIT, grpc_sidecar
from rls_helpers import request as rls_request
from sidecar_proc import request, wait_until

pytestmark = pytest.mark.timeout(120)


def grpc_call(port: int, domain: str, *descs):
    import asyncio

    import grpc

    from netlimit.rls.proto import rls_pb2_grpc

    async def go():
        async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as ch:
            return await rls_pb2_grpc.RateLimitServiceStub(ch).ShouldRateLimit(rls_request(domain, *descs), timeout=10)

    return asyncio.run(go())


def json_call(port: int, domain: str, *descs) -> dict:
    body = {"domain": domain, "descriptors": [{"entries": [{"key": k, "value": v} for k, v in d]} for d in descs]}
    r = request(port, "POST", "/v1/check", {"Content-Type": "application/json"}, json.dumps(body).encode())
    assert r.status in (200, 429), r
    return r.json()


def place(src: Path, dst: Path) -> None:
    """Put a file in place as a deployment does: written beside, renamed in."""
    tmp = dst.with_name("." + dst.name + ".tmp")
    shutil.copyfile(src, tmp)
    os.replace(tmp, dst)


@pytest.fixture(params=["memory", pytest.param("redis", marks=pytest.mark.redis)])
def sidecar(request, tmp_path: Path):
    conf = tmp_path / "config"
    conf.mkdir()
    for p in (RUNTIME / "config").glob("*.yaml"):
        shutil.copyfile(p, conf / p.name)
    main = tmp_path / "netlimit.yaml"
    main.write_text("version: 1\nhttp:\n  lyft_config_dir: config\n")
    extra: list[str] = []
    if request.param == "redis":
        extra = ["--redis", request.getfixturevalue("redis_server").url]
    p = grpc_sidecar(main, *extra)
    try:
        yield p, conf
    finally:
        p.stop()


def test_every_domain_of_the_directory_is_served_and_reloaded(sidecar) -> None:
    p, conf = sidecar
    # testBasicBaseConfig: an unknown domain has no limits; "basic" and "another" do
    r = grpc_call(p.grpc_port, "foo", [("hello", "world")])
    assert r.overall_code == OK and not r.statuses[0].HasField("current_limit")
    unique = str(time.time_ns())
    r = grpc_call(p.grpc_port, "another", [("key3", unique)])
    assert r.overall_code == OK and r.statuses[0].current_limit.requests_per_unit == 10
    assert r.statuses[0].limit_remaining == 9
    assert 1 <= r.statuses[0].duration_until_reset.seconds <= 3600
    doc = json_call(p.port, "another", [("key3", unique)])
    assert doc["overallCode"] == "OK" and doc["statuses"][0]["limitRemaining"] == 8
    assert doc["statuses"][0]["currentLimit"] == {"name": "key3", "requestsPerUnit": 10, "unit": "HOUR"}
    r = grpc_call(p.grpc_port, "share-threshold-test", [("files", f"files/{unique}.pdf")])
    assert r.statuses[0].current_limit.requests_per_unit == 10

    # testConfigReload: reload.yaml added -> its domain is served ("block": a limit of 0)
    r = grpc_call(p.grpc_port, "reload", [("block", "foo")])
    assert r.overall_code == OK and not r.statuses[0].HasField("current_limit")
    place(RUNTIME / "reload.yaml", conf / "reload.yaml")
    wait_until(
        lambda: grpc_call(p.grpc_port, "reload", [("block", "foo")]).overall_code == OVER_LIMIT,
        20,
        what="the reload domain served after reload.yaml was added",
    )
    r = grpc_call(p.grpc_port, "reload", [("key1", unique)])
    assert r.overall_code == OK and r.statuses[0].current_limit.requests_per_unit == 50
    assert json_call(p.port, "reload", [("block", "x")])["overallCode"] == "OVER_LIMIT"
    p.wait_line(r"reloaded \(lyft_config_dir changed\)", timeout=10)
    doc = request(p.port, "GET", "/v1/rules").json()
    assert doc["domains"] == ["another", "basic", "reload", "share-threshold-test"]
    assert {r["domain"] for r in doc["rules"]} == set(doc["domains"])

    # removing it must trigger a reload too
    (conf / "reload.yaml").unlink()
    wait_until(
        lambda: grpc_call(p.grpc_port, "reload", [("block", "foo")]).overall_code == OK,
        20,
        what="the reload domain gone after reload.yaml was removed",
    )

    # a directory with a domain in two files is refused: the running rules stay
    mark = p.mark()
    place(conf / "basic.yaml", conf / "basic-copy.yaml")
    p.wait_line(r"duplicate domain 'basic' in config file", timeout=20, start=mark)
    p.wait_line(r"keeping the previous rules", timeout=10, start=mark)
    r = grpc_call(p.grpc_port, "basic", [("one_per_minute", unique)])
    assert r.overall_code == OK and r.statuses[0].current_limit.requests_per_unit == 1
    assert request(p.port, "GET", "/healthz").json()["last_reload_error"].count("duplicate domain 'basic'") == 1


def test_the_directory_watch_sees_a_configmap_swap(tmp_path: Path) -> None:
    """Kubernetes mounts a ConfigMap as symlinks into a ``..data`` directory that
    it swaps by renaming a new symlink over it: the files' names stay, what they
    point to changes.  Dot files and other names alone are not a change."""
    from netlimit.watch import DirWatch

    d = tmp_path / "cm"
    d.mkdir()
    v1, v2 = d / "..v1", d / "..v2"
    v1.mkdir()
    v2.mkdir()
    (v1 / "a.yaml").write_text("domain: a\n")
    (v2 / "a.yaml").write_text("domain: a2\n")
    os.symlink("..v1", d / "..data")
    os.symlink("..data/a.yaml", d / "a.yaml")
    w = DirWatch(d)
    try:
        assert w.uses_inotify
        (d / ".swp").write_text("x")
        (d / "notes.txt").write_text("x")
        assert not w.changed()  # (inotify queued their events as the writes returned)
        os.symlink("..v2", d / "..data_tmp")
        os.replace(d / "..data_tmp", d / "..data")
        wait_until(w.changed, 5, what="the swap seen")
        assert not w.changed()  # once
    finally:
        w.close()
