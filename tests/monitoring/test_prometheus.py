"""The dashboard and the alert rules, against a real Prometheus (Debian's package)
scraping a real netlimitd (rules in a namespace of the test, under real traffic) and a
real sidecar (proxy mode, real requests):

* every query of every panel of dashboards/netlimit.json, and every variable's
  label query, returns data (no panel left empty, no metric that does not exist);
* the alert rules load and evaluate in that Prometheus without error;
* `promtool check metrics` passes on both /metrics outputs;
* `promtool check rules` and `promtool test rules` pass on alerts/.

Prometheus listens on loopback only, with its storage in the test's tmp dir."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys
import urllib.parse
import urllib.request
from pathlib import Path

import pytest
from daemon_proc import Daemon, wait_for
from sidecar_proc import Sidecar, Upstream, free_port, request, write_config

from netlimit.kernel import traffic

pytestmark = pytest.mark.netns

ROOT = Path(__file__).resolve().parents[2]
DASHBOARD = ROOT / "dashboards" / "netlimit.json"
RULES = ROOT / "alerts" / "netlimit-rules.yaml"
RULE_TESTS = ROOT / "alerts" / "netlimit-rules.test.yaml"


def need(tool: str) -> str:
    path = shutil.which(tool)
    if not path:
        pytest.fail(f"{tool} is not installed: apt-get install prometheus (scripts/setup.sh does)", pytrace=False)
    return path


def daemon_config(topo, bans_socket: str | None = None) -> str:
    bans = f"bans: {{store: memory, socket: {bans_socket}}}\n" if bans_socket else ""
    return f"""\
version: 1
{bans}network:
  - name: udp-flood
    protocol: udp
    ports: [5000]
    limit: 100/second
    burst: 10
bandwidth:
  - name: egress-cap
    interface: {topo.srv_if}
    rate: 2mbit
"""


SIDECAR = """\
version: 1
http:
  domain: api
  actions: [[path, remote_address]]
  descriptors:
    - key: path
      value: /login
      descriptors:
        - key: remote_address
          rate_limit: {unit: minute, requests_per_unit: 10, name: login}
    - key: path
      value: /search
      descriptors:
        - key: remote_address
          rate_limit: {unit: minute, requests_per_unit: 5, name: search-trial}
          shadow_mode: true
"""


def test_rules_check_and_unit_tests():
    promtool = need("promtool")
    p = subprocess.run([promtool, "check", "rules", str(RULES)], capture_output=True, text=True, timeout=60)
    assert p.returncode == 0 and "SUCCESS: 13 rules found" in p.stdout, p.stdout + p.stderr
    p = subprocess.run(
        [promtool, "test", "rules", str(RULE_TESTS)], capture_output=True, text=True, timeout=120, cwd=RULES.parent
    )
    assert p.returncode == 0 and "SUCCESS" in p.stdout, p.stdout + p.stderr


def test_dashboard_file_is_built_from_the_script():
    p = subprocess.run(
        [sys.executable, str(ROOT / "scripts" / "build_dashboard.py"), "--check"], capture_output=True, text=True
    )
    assert p.returncode == 0, p.stderr
    dash = json.loads(DASHBOARD.read_text())
    names = {v["name"] for v in dash["templating"]["list"]}
    assert {"datasource", "instance", "rule", "domain"} <= names
    panels = [p for p in dash["panels"] if p["type"] != "row"]
    assert len(panels) >= 12 and all(p["targets"] for p in panels)


def queries(dash: dict) -> list[tuple[str, str]]:
    out = []
    for p in dash["panels"]:
        for t in p.get("targets", []):
            out.append((f"{p['title']} [{t['refId']}]", t["expr"]))
    return out


def concrete(expr: str) -> str:
    """The query as Grafana sends it with every variable on All."""
    return (
        expr.replace("$__rate_interval", "30s")
        .replace("$instance", ".*")
        .replace("$rule", ".*")
        .replace("$domain", ".*")
    )


def api(port: int, path: str, **params) -> dict:
    url = f"http://127.0.0.1:{port}{path}?" + urllib.parse.urlencode(params, doseq=True)
    with urllib.request.urlopen(url, timeout=10) as r:
        return json.loads(r.read())


def test_every_panel_has_data_from_a_real_prometheus(topo, tmp_path):
    prometheus, promtool = need("prometheus"), need("promtool")
    sock = str(tmp_path / "netlimitd.sock")  # the Daemon's status socket: the memory ban list's door
    d = Daemon(tmp_path, topo.srv, daemon_config(topo, sock), resync=1.0)
    up = sc = prom = None
    try:
        d.start()
        up = Upstream()
        sc = Sidecar(write_config(tmp_path / "sidecar.yaml", SIDECAR), "--upstream", up.url)
        port = free_port()
        conf = tmp_path / "prometheus.yml"
        conf.write_text(
            "global: {scrape_interval: 1s, evaluation_interval: 1s}\n"
            f"rule_files: [{RULES}]\n"
            "scrape_configs:\n"
            f"  - job_name: netlimitd\n    static_configs: [{{targets: ['127.0.0.1:{d.metrics_port}']}}]\n"
            f"  - job_name: netlimit-sidecar\n    static_configs: [{{targets: ['127.0.0.1:{sc.admin_port}']}}]\n"
        )
        prom = subprocess.Popen(
            [
                prometheus,
                f"--config.file={conf}",
                f"--storage.tsdb.path={tmp_path / 'tsdb'}",
                f"--web.listen-address=127.0.0.1:{port}",
            ],
            stdout=subprocess.DEVNULL,
            stderr=open(tmp_path / "prometheus.log", "w"),
        )

        def ready():
            assert prom.poll() is None, (tmp_path / "prometheus.log").read_text()[-3000:]
            try:
                return urllib.request.urlopen(f"http://127.0.0.1:{port}/-/ready", timeout=2).status == 200
            except OSError:
                return False

        wait_for(ready, 60, "Prometheus ready")

        # bounded traffic: a UDP flood over the kernel limit, bytes through the shaped
        # interface, HTTP requests over a limit and over a shadow limit; a reload of each
        flood = traffic.udp_flood_start(topo.cli, topo.cli4, topo.srv4, 5000, 1000, 6)
        shaped = traffic.udp_flood_start(topo.srv, topo.srv4, topo.cli4, 9, 500, 6)
        for _ in range(30):
            assert request(sc.port, "GET", "/login").status in (200, 429)
            assert request(sc.port, "GET", "/search").status == 200
        traffic.flood_result(flood)
        traffic.flood_result(shaped)
        d.edit(daemon_config(topo, sock).replace("limit: 100/second", "limit: 200/second"))
        wait_for(lambda: d.status()["reloads_ok"] >= 1, 30, "the daemon's reload")
        ban = subprocess.run(
            [str(Path(sys.executable).with_name("netlimit")), "ban", "add", "198.51.100.0/24", "--ttl", "10m"]
            + ["--config", str(d.config)],
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert ban.returncode == 0, ban.stderr

        dash = json.loads(DASHBOARD.read_text())
        qs = queries(dash)
        assert len(qs) >= 20

        def empty() -> list[str]:
            bad = []
            for name, expr in qs:
                res = api(port, "/api/v1/query", query=concrete(expr))
                if res["status"] != "success" or not res["data"]["result"]:
                    bad.append(f"{name}: {concrete(expr)}")
            return bad

        last: list[str] = []

        def all_have_data() -> bool:
            nonlocal last
            last = empty()
            return not last

        try:
            wait_for(all_have_data, 90, "every panel query to return data", step=1.0)
        except AssertionError:
            raise AssertionError("panels without data:\n" + "\n".join(last)) from None

        # the counters moved: the flood was dropped, the shaped class sent bytes, 429s were given
        def value(q: str) -> float:
            r = api(port, "/api/v1/query", query=q)["data"]["result"]
            return sum(float(s["value"][1]) for s in r)

        assert value('max_over_time(netlimit_rule_dropped_packets_total{rule="udp-flood"}[5m])') > 100
        assert value('max_over_time(netlimit_rule_bytes_total{layer="tc", rule="egress-cap"}[5m])') > 10_000
        assert value("netlimit_bandwidth_limit_bytes_per_second") == 2_000_000 / 8
        assert value('netlimit_http_rule_over_limit_total{rule="login"}') == 20
        assert value('netlimit_http_rule_shadow_over_limit_total{rule="search-trial"}') == 25
        assert value("netlimit_bans_in_kernel") == 1 and value("netlimit_bans_added_total") == 1
        # the running configs and the version, one series per process (issue 31 item 9)
        from netlimit.buildinfo import version

        def labels(q: str, name: str) -> list[str]:
            return [s["metric"][name] for s in api(port, "/api/v1/query", query=q)["data"]["result"]]

        sha = d.status()["config_sha256"]
        wait_for(lambda: labels('netlimit_config_info{job="netlimitd"}', "sha256") == [sha], 30, "the reloaded sha")
        from netlimit.config.validate import load_file

        assert labels('netlimit_config_info{job="netlimit-sidecar"}', "sha256") == [
            load_file(tmp_path / "sidecar.yaml").sha256
        ]
        assert sorted(labels("netlimit_build_info", "version")) == [version(), version()]
        assert value("count by (job) (count by (job, sha256) (netlimit_config_info)) > 1") == 0

        for v in dash["templating"]["list"]:
            if v["type"] != "query":
                continue
            m = re.fullmatch(r"label_values\((.*), (\w+)\)", v["query"]["query"])
            assert m, v
            vals = api(port, f"/api/v1/label/{m.group(2)}/values", **{"match[]": m.group(1)})["data"]
            assert vals, f"variable {v['name']}: no values"

        groups = api(port, "/api/v1/rules")["data"]["groups"]
        rules = [r for g in groups for r in g["rules"]]
        assert len(rules) == 13 and all(r["health"] == "ok" for r in rules), rules

        for mport, path in ((d.metrics_port, "/metrics"), (sc.admin_port, "/metrics")):
            text = urllib.request.urlopen(f"http://127.0.0.1:{mport}{path}", timeout=10).read()
            p = subprocess.run([promtool, "check", "metrics"], input=text, capture_output=True, timeout=60)
            assert p.returncode == 0 and not p.stdout.strip() and not p.stderr.strip(), (
                mport,
                p.stdout.decode() + p.stderr.decode(),
            )
    finally:
        if prom is not None:
            prom.terminate()
            try:
                prom.wait(timeout=20)
            except subprocess.TimeoutExpired:
                prom.kill()
        if sc is not None:
            sc.stop()
        if up is not None:
            up.stop()
        d.kill()


def test_alert_fires_in_prometheus_when_the_daemon_runs_an_old_config(topo, tmp_path):
    """An end-to-end alert: a rejected file makes netlimit_config_rejected 1 and the rule
    goes pending in a real Prometheus (its `for` keeps it from firing in a test's time)."""
    prometheus = need("prometheus")
    d = Daemon(tmp_path, topo.srv, daemon_config(topo), resync=5.0)
    prom = None
    try:
        d.start()
        port = free_port()
        conf = tmp_path / "prometheus.yml"
        conf.write_text(
            "global: {scrape_interval: 1s, evaluation_interval: 1s}\n"
            f"rule_files: [{RULES}]\n"
            "scrape_configs:\n"
            f"  - job_name: netlimitd\n    static_configs: [{{targets: ['127.0.0.1:{d.metrics_port}']}}]\n"
        )
        prom = subprocess.Popen(
            [
                prometheus,
                f"--config.file={conf}",
                f"--storage.tsdb.path={tmp_path / 'tsdb'}",
                f"--web.listen-address=127.0.0.1:{port}",
            ],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        d.edit(daemon_config(topo).replace("100/second", "100/fortnight"))
        wait_for(lambda: d.status()["rejected"], 30, "the rejection")

        def pending() -> list[dict]:
            try:
                alerts = api(port, "/api/v1/alerts")["data"]["alerts"]
            except OSError:
                return []
            return [a for a in alerts if a["labels"]["alertname"] == "NetlimitDaemonRunningOldConfig"]

        got = wait_for(pending, 90, "the alert to be pending", step=1.0)
        assert got[0]["state"] in ("pending", "firing")
        assert got[0]["labels"]["instance"] == f"127.0.0.1:{d.metrics_port}"
    finally:
        if prom is not None:
            prom.terminate()
            try:
                prom.wait(timeout=20)
            except subprocess.TimeoutExpired:
                prom.kill()
        d.kill()
