"""Editors: every example in rules/ names the JSON Schema beside it
(`# yaml-language-server: $schema=netlimit.schema.json`), that file is what
`netlimit schema` prints, and `install-service` puts the schema beside the starter
config, which validates without a warning under every backend."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import jsonschema
import pytest
import yaml

ROOT = Path(__file__).resolve().parents[1]
RULES = sorted((ROOT / "rules").glob("*.yaml"))
EXE = str(Path(sys.executable).with_name("netlimit"))
LINE = "# yaml-language-server: $schema=netlimit.schema.json"


def netlimit(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([EXE, *args], capture_output=True, text=True, timeout=120)


def test_the_schema_in_rules_is_what_netlimit_schema_prints():
    printed = netlimit("schema")
    assert printed.returncode == 0
    committed = (ROOT / "rules" / "netlimit.schema.json").read_text()
    assert committed == printed.stdout, (
        "rules/netlimit.schema.json is stale: regenerate it with `netlimit schema > rules/netlimit.schema.json`"
    )


@pytest.mark.parametrize("path", RULES, ids=[p.name for p in RULES])
def test_every_example_names_the_schema_and_passes_it(path):
    lines = path.read_text().splitlines()
    assert LINE in lines, f"{path.name}: add the line {LINE!r}"
    assert lines.index(LINE) < lines.index("version: 1")  # in the head comment, where editors look
    schema = json.loads((path.parent / "netlimit.schema.json").read_text())
    jsonschema.validate(yaml.safe_load(path.read_text()), schema)


def test_install_service_writes_a_starter_that_validates_without_warnings(tmp_path):
    p = netlimit("install-service", "--root", str(tmp_path))
    assert p.returncode == 0, p.stdout + p.stderr
    conf = tmp_path / "etc/netlimit/netlimit.yaml"
    schema = tmp_path / "etc/netlimit/netlimit.schema.json"
    assert LINE in conf.read_text().splitlines()
    assert schema.read_text() == netlimit("schema").stdout and oct(schema.stat().st_mode & 0o777) == "0o644"
    for backend in ("nftables", "restore", "python-iptables"):
        v = netlimit("validate", str(conf), "--backend", backend)
        assert v.returncode == 0 and v.stdout == f"{conf}: valid (1 network, 0 bandwidth)\n", (backend, v.stdout)
        assert "warning" not in v.stdout + v.stderr
