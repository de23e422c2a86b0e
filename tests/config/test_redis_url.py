"""Storage URLs (netlimit/config/redis_url.py): every form parses to what the
store will use; what can be known wrong without connecting is a FILE:LINE:COL
error from the config and from `netlimit validate`."""

from __future__ import annotations

import textwrap

import pytest
from hypothesis import given
from hypothesis import strategies as st
from typer.testing import CliRunner

from netlimit.cli import app
from netlimit.config.model import redis_url_problem
from netlimit.config.redis_url import RedisURL, parse_redis_url
from netlimit.config.validate import ConfigError, load_string


@pytest.mark.parametrize(
    "url, want",
    [
        ("redis://127.0.0.1:6379/0", RedisURL("single", False, (("127.0.0.1", 6379),))),
        ("rediss://u:p%40ss@h/2", RedisURL("single", True, (("h", 6379),), username="u", password="p@ss", db=2)),
        ("unix:///run/r.sock?db=1", RedisURL("unix", False, path="/run/r.sock", db=1)),
        (
            "redis+cluster://:pw@10.0.0.1:7000,10.0.0.2,[::1]:7002/",
            RedisURL("cluster", False, (("10.0.0.1", 7000), ("10.0.0.2", 6379), ("::1", 7002)), password="pw"),
        ),
        ("rediss+cluster://h:1", RedisURL("cluster", True, (("h", 1),))),
        (
            "redis+sentinel://s1,s2:26380/mymaster/3",
            RedisURL("sentinel", False, (("s1", 26379), ("s2", 26380)), service="mymaster", db=3),
        ),
        ("redis://h/0?protocol=3", RedisURL("single", False, (("h", 6379),), other=("protocol",))),
    ],
)
def test_forms(url, want):
    assert parse_redis_url(url) == want


def test_options_are_kept():
    u = parse_redis_url("redis+sentinel://s/m?sentinel_password=x&sentinel_username=y")
    assert u.options == {"sentinel_password": "x", "sentinel_username": "y"}
    u = parse_redis_url("rediss://h?ssl_cert_reqs=none&ssl_check_hostname=false")
    assert not u.check_hostname and u.options["ssl_cert_reqs"] == "none"


@pytest.mark.parametrize(
    "url, words",
    [
        ("redis+cluster://a:1,b:2/3", "only database 0"),
        ("redis+cluster://a:1/?db=2", "only database 0"),
        ("redis+sentinel://a:26379/", "no service name"),
        ("redis+sentinel://a:26379/svc/x", "'x' must be a number"),
        ("redis+sentinel://a/svc/1/2", "expected /<service>[/db]"),
        ("redis+cluster://a:1,,b:2/", "an empty host"),
        ("redis+cluster://a:0/", "port 0"),
        ("redis+cluster://a:70000/", "out of range"),
        ("redis+cluster://::1:7000/", "needs brackets"),
        ("redis+cluster://a/?timeout=3", "unknown option 'timeout'"),
        ("redis+cluster://a/?ssl_ca_certs=/etc/hosts", "need rediss+cluster://"),
        ("redis://a:1,b:2/0", "redis+cluster://a:1,b:2/"),
        ("redis://a/?sentinel_password=x", "no meaning"),
        ("rediss://a/?ssl_cert_reqs=sometimes", "ssl_cert_reqs 'sometimes'"),
        ("rediss://a/?ssl_cert_reqs=none", "ssl_check_hostname=true needs"),
        ("rediss://a/?ssl_ca_certs=/nonexistent/ca.pem", "no such readable file"),
        ("rediss://a/?ssl_keyfile=/etc/hosts", "without ssl_certfile"),
        ("redis+cluster://a/?ssl_cert_reqs=none&ssl_cert_reqs=required", "given 2 times"),
        ("unix://host/x.sock", "no host"),
        ("memcache://x", "redis+sentinel://10.0.0.1:26379/mymaster"),
    ],
)
def test_problems_known_without_connecting(url, words):
    problem = redis_url_problem(url)
    assert problem is not None and words in problem, problem


def test_files_that_are_not_pem_are_refused_when_validating(tmp_path):
    junk = tmp_path / "junk.pem"
    junk.write_text("not a certificate\n")
    assert "ssl_ca_certs: cannot load them" in redis_url_problem(f"rediss://a/?ssl_ca_certs={junk}")
    assert "ssl_certfile: cannot load them" in redis_url_problem(f"rediss+cluster://a/?ssl_certfile={junk}")


@given(st.text(max_size=80))
def test_any_text_is_a_url_or_a_message_never_a_crash(text):
    try:
        parse_redis_url(text)
    except ValueError as exc:
        assert str(exc)


CFG = """\
version: 1
http:
  domain: d
  storage: {url}
  descriptors: []
"""


def test_a_bad_cluster_url_is_a_file_line_error(tmp_path):
    with pytest.raises(ConfigError) as exc:
        load_string(CFG.format(url="redis+cluster://10.0.0.1:7000/2"), "f.yaml")
    (p,) = exc.value.problems
    assert str(p).startswith("f.yaml:4:12: http: storage 'redis+cluster://10.0.0.1:7000/2': a Redis Cluster has only")
    ok = load_string(CFG.format(url="rediss+sentinel://a,b/mymaster/1"), "g.yaml")
    assert ok.config.http.storage == "rediss+sentinel://a,b/mymaster/1"


def test_validate_flags_a_sentinel_url_without_service(tmp_path):
    f = tmp_path / "s.yaml"
    f.write_text(textwrap.dedent(CFG.format(url="redis+sentinel://10.0.0.1:26379/")))
    res = CliRunner().invoke(app, ["validate", str(f)])
    assert res.exit_code == 1
    assert f"{f}:4:12: http: storage 'redis+sentinel://10.0.0.1:26379/': no service name" in res.output
