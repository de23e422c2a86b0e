"""The CLI frame: help for every command, validate's output and exit codes, schema."""

import json
import subprocess
import sys
from pathlib import Path

import pytest
from typer.testing import CliRunner

from netlimit.cli import app

ROOT = Path(__file__).resolve().parents[1]
RULES = sorted((ROOT / "rules").glob("*.yaml"))
runner = CliRunner()


def command_names() -> list[str]:
    import typer.main

    group = typer.main.get_command(app)
    return sorted(group.commands)


def test_console_script_help_and_version():
    exe = Path(sys.executable).with_name("netlimit")
    out = subprocess.run([str(exe), "--help"], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert "validate" in out.stdout and "schema" in out.stdout
    out = subprocess.run([str(exe), "--version"], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0 and out.stdout.startswith("netlimit ")


def test_core_commands_exist():
    assert {"validate", "schema"} <= set(command_names())


@pytest.mark.parametrize("name", command_names())
def test_every_command_has_help(name):
    res = runner.invoke(app, [name, "--help"])
    assert res.exit_code == 0, res.output
    assert "Usage:" in res.output and name in res.output


@pytest.mark.parametrize("path", RULES, ids=[p.name for p in RULES])
def test_every_example_in_rules_is_valid(path):
    res = runner.invoke(app, ["validate", str(path), "--backend", "restore"])
    assert res.exit_code == 0, res.output
    assert res.output.startswith(f"{path}: valid (")
    text = path.read_text()
    assert text.startswith("#"), "every example opens with a comment saying when to use it"
    # under nftables, a `method: recent` rule gets a warning naming the difference; still valid
    nft = runner.invoke(app, ["validate", str(path), "--backend", "nftables"])
    assert nft.exit_code == 0 and nft.output.endswith(res.output), nft.output
    assert ("warning: under the nftables backend, method: recent" in nft.output) == ("method: recent" in text)


def test_rules_has_the_promised_examples():
    names = {p.name for p in RULES}
    for n in (
        "ssh-bruteforce.yaml",
        "api-per-ip.yaml",
        "dns-per-24.yaml",
        "bandwidth-per-port.yaml",
        "ingress-cap.yaml",
        "http-descriptors.yaml",
    ):
        assert n in names


def test_validate_reports_every_problem_and_exits_1(tmp_path):
    good = tmp_path / "good.yaml"
    good.write_text("version: 1\n")
    bad = tmp_path / "bad.yaml"
    bad.write_text("version: 1\nnetwork:\n  - name: a\n    limit: 5/fortnight\n  - name: b\n    limt: 1/s\n")
    res = runner.invoke(app, ["validate", str(good), str(bad)])
    assert res.exit_code == 1
    assert res.output.splitlines() == [
        f"{good}: valid (0 network, 0 bandwidth)",
        f"{bad}:4:12: a: bad rate unit 'fortnight' in '5/fortnight': expected second, minute, hour or day (s, m, h, d)",
        f"{bad}:6:5: b: unknown field 'limt' (did you mean 'limit'?)",
    ]


def test_validate_quiet_and_missing_file(tmp_path):
    good = tmp_path / "good.yaml"
    good.write_text("version: 1\n")
    res = runner.invoke(app, ["validate", "-q", str(good)])
    assert (res.exit_code, res.output) == (0, "")
    res = runner.invoke(app, ["validate", str(tmp_path / "nope.yaml")])
    assert res.exit_code == 1 and res.output == f"{tmp_path}/nope.yaml:0:0: file: no such file\n"


def test_bad_flag_is_a_usage_error():
    res = runner.invoke(app, ["validate", "--frobnicate", "x.yaml"])
    assert res.exit_code == 64 and "No such option" in res.output


def test_schema_is_valid_json_schema():
    res = runner.invoke(app, ["schema"])
    assert res.exit_code == 0
    s = json.loads(res.output)
    assert s["$schema"].endswith("2020-12/schema")
    assert s["required"] == ["version"]
    assert {"NetworkRule", "BandwidthRule", "HttpConfig", "Descriptor"} <= set(s["$defs"])


@pytest.mark.parametrize("path", RULES, ids=[p.name for p in RULES])
def test_schema_accepts_every_example(path):
    import jsonschema
    import yaml

    res = runner.invoke(app, ["schema"])
    jsonschema.validate(yaml.safe_load(path.read_text()), json.loads(res.output))


def test_schema_rejects_unknown_fields():
    import jsonschema

    s = json.loads(runner.invoke(app, ["schema"]).output)
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate({"version": 1, "network": [{"name": "a", "limt": "1/s"}]}, s)


def test_validate_checks_the_http_rule_tree_as_the_sidecar_does(tmp_path):
    """One validation path: what the sidecar refuses at start, validate refuses too."""
    f = tmp_path / "dup.yaml"
    f.write_text(
        "version: 1\n"
        "http:\n"
        "  domain: api\n"
        "  actions: [[remote_address]]\n"
        "  descriptors:\n"
        "    - key: remote_address\n"
        "      rate_limit: {unit: second, requests_per_unit: 5}\n"
        "    - key: remote_address\n"
        "      rate_limit: {unit: second, requests_per_unit: 6}\n"
    )
    res = runner.invoke(app, ["validate", str(f)])
    assert res.exit_code == 1
    assert f"{f}:8:" in res.output and "duplicate descriptor composite key 'api.remote_address'" in res.output
    from netlimit.config.validate import load_file
    from netlimit.errors import ConfigError
    from netlimit.limit.rules import from_loaded

    with pytest.raises(ConfigError) as exc:  # the sidecar's own loading says the same
        from_loaded(load_file(f))
    assert str(exc.value.problems[0]) in res.output
