"""Secrets out of the world-readable file (issue 31 item 8): ``${VAR}`` in storage
URLs, ``password_file`` (a URL option or a section key, e.g. under systemd's
LoadCredential= ``${CREDENTIALS_DIRECTORY}/netlimit_redis``), and `validate` warning about
a password written in a file every user can read. The end-to-end test runs a real
sidecar against a real password-protected redis-server."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import textwrap
import time

import pytest
from redis_proc import REDIS_SERVER
from sidecar_proc import Sidecar, free_port, netlimit_cmd, write_config

from netlimit.config.redis_url import inline_password, parse_redis_url
from netlimit.config.validate import ConfigError, load_file, secret_warnings

PW = "p@ss:w/rd#1"  # every character a URL would need escaped


def test_env_variables_expand_in_each_part(monkeypatch):
    monkeypatch.setenv("NL_PW", PW)
    monkeypatch.setenv("NL_HOSTS", "10.0.0.1:7000,10.0.0.2:7001")
    u = parse_redis_url("redis://app:${NL_PW}@127.0.0.1:6379/2")
    assert (u.username, u.password, u.db, u.hosts) == ("app", PW, 2, (("127.0.0.1", 6379),))
    c = parse_redis_url("redis+cluster://:${NL_PW}@${NL_HOSTS}/")
    assert c.hosts == (("10.0.0.1", 7000), ("10.0.0.2", 7001)) and c.password == PW
    monkeypatch.delenv("NL_PW")
    with pytest.raises(ValueError, match=r"\$\{NL_PW\} is not set in the environment"):
        parse_redis_url("redis://:${NL_PW}@127.0.0.1:6379/0")
    # validate (no secrets): the shape only
    assert parse_redis_url("redis://:${NL_PW}@127.0.0.1:6379/0", secrets=False).hosts == (("127.0.0.1", 6379),)


def test_password_files(tmp_path, monkeypatch):
    f = tmp_path / "redis"
    f.write_text(PW + "\nsecond line ignored\n")
    assert parse_redis_url(f"redis://127.0.0.1:6379/0?password_file={f}").password == PW
    monkeypatch.setenv("CREDENTIALS_DIRECTORY", str(tmp_path))
    u = parse_redis_url("redis+sentinel://s1:26379/mymaster?sentinel_password_file=${CREDENTIALS_DIRECTORY}/redis")
    assert u.options["sentinel_password"] == PW and "sentinel_password_file" not in u.options
    for url, msg in (
        ("redis://:x@h:6379/0?password_file=/p", "a password in the URL and password_file"),
        ("redis://h:6379/0?password_file=rel/p", "must be an absolute path"),
        (f"redis://h:6379/0?password_file={tmp_path}/none", "cannot read it: No such file"),
        ("redis://h:6379/0?sentinel_password_file=/p", "no meaning in a redis:// URL"),
    ):
        with pytest.raises(ValueError, match=msg):
            parse_redis_url(url)
    (tmp_path / "empty").write_text("\n")
    with pytest.raises(ValueError, match="first line is empty"):
        parse_redis_url(f"redis://h:6379/0?password_file={tmp_path}/empty")
    assert parse_redis_url(f"redis://h:6379/0?password_file={tmp_path}/none", secrets=False).password


def _file(tmp_path, body: str, mode: int = 0o644):
    p = tmp_path / "n.yaml"
    p.write_text(textwrap.dedent(body))
    p.chmod(mode)
    return p


HTTP = """\
version: 1
http:
  domain: api
  storage: {storage}
{extra}  actions:
    - [remote_address]
  descriptors:
    - key: remote_address
      rate_limit: {{unit: minute, requests_per_unit: 1}}
"""


def test_password_file_key_and_its_errors(tmp_path):
    p = _file(tmp_path, HTTP.format(storage="redis://127.0.0.1:6379/0", extra="  password_file: /etc/netlimit/redis\n"))
    assert load_file(p).config.http.storage == "redis://127.0.0.1:6379/0?password_file=/etc/netlimit/redis"
    p = _file(tmp_path, HTTP.format(storage="memory", extra="  password_file: /etc/netlimit/redis\n"))
    with pytest.raises(ConfigError) as ei:
        load_file(p)
    assert "password_file needs a Redis URL in storage (it is 'memory')" in str(ei.value.problems[0])
    bans = "version: 1\nbans:\n  store: redis://127.0.0.1:6379/0\n  password_file: ${CREDENTIALS_DIRECTORY}/r\n"
    assert load_file(_file(tmp_path, bans)).config.ban_store.endswith("?password_file=${CREDENTIALS_DIRECTORY}/r")


def test_validate_warns_about_a_password_others_can_read(tmp_path):
    inline = HTTP.format(storage="redis://:s3cret@127.0.0.1:6379/0", extra="")
    w = secret_warnings(load_file(_file(tmp_path, inline)))
    assert len(w) == 1 and w[0].line == 4 and w[0].col == 12 and "every user can read (mode 0644)" in w[0].message
    assert secret_warnings(load_file(_file(tmp_path, inline, 0o640))) == []
    env = HTTP.format(storage='"redis://:${REDIS_PW}@127.0.0.1:6379/0"', extra="")
    assert secret_warnings(load_file(_file(tmp_path, env))) == []
    assert inline_password("redis+sentinel://s:26379/m?sentinel_password=x")
    assert not inline_password("redis+sentinel://s:26379/m?sentinel_password=${SP}")
    p = _file(tmp_path, inline)
    out = subprocess.run([*netlimit_cmd(), "validate", str(p)], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0 and f"{p}:4:12: http: warning: a Redis password" in out.stdout, out


# --- a real sidecar and a real password-protected Redis ------------------------------


@pytest.fixture
def locked_redis(tmp_path):
    if REDIS_SERVER is None:
        pytest.fail("redis-server is not installed: apt-get install redis-server")
    port = free_port()
    proc = subprocess.Popen(
        [REDIS_SERVER, "--port", str(port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no"]
        + ["--dir", str(tmp_path), "--requirepass", PW],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        deadline = time.monotonic() + 10
        while True:
            try:
                socket.create_connection(("127.0.0.1", port), timeout=0.2).close()
                break
            except OSError:
                assert time.monotonic() < deadline and proc.poll() is None, "redis-server did not start"
                time.sleep(0.05)
        yield port
    finally:
        proc.kill()
        proc.wait(timeout=10)


def _keys(port: int) -> int:
    with socket.create_connection(("127.0.0.1", port), timeout=5) as s:
        pw = PW.encode()
        s.sendall(b"*2\r\n$4\r\nAUTH\r\n$%d\r\n%s\r\n*1\r\n$6\r\nDBSIZE\r\n" % (len(pw), pw))
        data = b""
        while data.count(b"\r\n") < 2:
            data += s.recv(100)
    assert data.startswith(b"+OK\r\n:"), data
    return int(data.split(b"\r\n")[1][1:])


@pytest.mark.redis
def test_sidecar_takes_its_redis_password_from_env_and_from_a_credential(tmp_path, locked_redis, monkeypatch):
    body = {"domain": "api", "descriptors": [{"entries": [{"key": "remote_address", "value": "10.9.9.9"}]}]}
    cfg = write_config(
        tmp_path / "env.yaml", HTTP.format(storage=f'"redis://:${{NL_PW}}@127.0.0.1:{locked_redis}/0"', extra="")
    )
    monkeypatch.setenv("NL_PW", PW)
    sc = Sidecar(cfg)
    try:
        assert [sc.post_json("/v1/check", body).status for _ in range(2)] == [200, 429]
    finally:
        sc.stop()
    assert _keys(locked_redis) >= 1  # the counts are in Redis: it took the password

    # systemd's LoadCredential= puts the file in $CREDENTIALS_DIRECTORY
    creds = tmp_path / "creds"
    creds.mkdir()
    (creds / "redis").write_text(PW + "\n")
    monkeypatch.delenv("NL_PW")
    monkeypatch.setenv("CREDENTIALS_DIRECTORY", str(creds))
    extra = "  password_file: ${CREDENTIALS_DIRECTORY}/redis\n"
    cfg2 = write_config(tmp_path / "cred.yaml", HTTP.format(storage=f"redis://127.0.0.1:{locked_redis}/0", extra=extra))
    sc = Sidecar(cfg2)
    try:
        body["descriptors"][0]["entries"][0]["value"] = "10.9.9.8"
        assert [sc.post_json("/v1/check", body).status for _ in range(2)] == [200, 429]
    finally:
        sc.stop()

    # without the variable: the sidecar does not start, and says which and where
    p = subprocess.run(
        [*netlimit_cmd(), "sidecar", "--config", str(cfg), "--listen", "127.0.0.1:0"],
        capture_output=True,
        text=True,
        timeout=60,
        env={k: v for k, v in os.environ.items() if k != "NL_PW"},
    )
    assert p.returncode == 1 and f"{cfg}:4:12: http: storage" in p.stderr and "${NL_PW} is not set" in p.stderr, (
        p.stderr
    )
    assert PW not in p.stderr and sys.executable


def test_a_missing_systemd_credential_says_where_it_comes_from(tmp_path, monkeypatch):
    """The units load /etc/netlimit/credentials/NAME as $CREDENTIALS_DIRECTORY/netlimit_NAME:
    a missing one names the file to create; outside a unit there are no credentials."""
    url = "redis://127.0.0.1:6379/0?password_file=${CREDENTIALS_DIRECTORY}/netlimit_redis"
    monkeypatch.delenv("CREDENTIALS_DIRECTORY", raising=False)
    with pytest.raises(ValueError, match=r"\$\{CREDENTIALS_DIRECTORY\} is not set: this process has no systemd cred"):
        parse_redis_url(url)
    monkeypatch.setenv("CREDENTIALS_DIRECTORY", str(tmp_path))
    with pytest.raises(ValueError) as err:
        parse_redis_url(url)
    assert str(err.value) == (
        f"systemd credential 'netlimit_redis' is missing (not in $CREDENTIALS_DIRECTORY {tmp_path}): "
        "put the password in /etc/netlimit/credentials/redis (mode 0600, root), then restart the unit"
    )
    (tmp_path / "netlimit_redis").write_text(PW + "\n")
    assert parse_redis_url(url).password == PW
    # a file elsewhere keeps the plain message
    with pytest.raises(ValueError, match=r"password file '/nonexistent/pw': cannot read it"):
        parse_redis_url("redis://127.0.0.1:6379/0?password_file=/nonexistent/pw")
