"""Lyft config files as Lyft users keep them: the text of values as written
(go-yaml's reading, not YAML 1.1's), a leading ``---``, an empty
``descriptors:``, Lyft's own checks with Lyft's messages at FILE:LINE:COL --
the same for ``netlimit validate`` and the sidecar -- and ``lyft_config_dir``
(a directory of Lyft files, one domain each)."""

from __future__ import annotations

import textwrap
from pathlib import Path

import pytest

from netlimit.cli import load_checked
from netlimit.config.validate import ConfigError, load_file, load_lyft_string, load_string
from netlimit.limit.rules import from_loaded


def http(body: str) -> str:
    """A Lyft config pasted, indented, under ``http:``."""
    return "version: 1\nhttp:\n" + textwrap.indent(textwrap.dedent(body).strip("\n") + "\n", "  ")


def problems(text: str, name: str = "f.yaml") -> list[str]:
    with pytest.raises(ConfigError) as ei:
        load_string(text, name)
    return [str(p) for p in ei.value.problems]


def test_values_keep_the_text_written_as_go_yaml_reads_them():
    c = load_string(
        http("""
        domain: d
        descriptors:
          - {key: a, value: 1.10, rate_limit: {unit: second, requests_per_unit: 1}}
          - {key: b, value: 0755, rate_limit: {unit: second, requests_per_unit: 1}}
          - {key: c, value: 1:30, rate_limit: {unit: second, requests_per_unit: 1}}
          - {key: d, value: NO, rate_limit: {unit: second, requests_per_unit: 1}}
          - {key: e, value: 2026-01-02, rate_limit: {unit: second, requests_per_unit: 1}}
          - {key: f, value: " spaced ", rate_limit: {unit: second, requests_per_unit: 1}}
          - {key: 80, value: true, rate_limit: {unit: second, requests_per_unit: 1, name: 1.50}}
          - {key: g, value: ~, rate_limit: {unit: second, requests_per_unit: 1}}
        """)
    ).config
    got = [(d.key, d.value) for d in c.http.descriptors]
    assert got == [
        ("a", "1.10"),
        ("b", "0755"),
        ("c", "1:30"),
        ("d", "NO"),
        ("e", "2026-01-02"),
        ("f", " spaced "),
        ("80", "true"),
        ("g", None),  # null: no value (go-yaml's "")
    ]
    assert c.http.descriptors[6].rate_limit.name == "1.50"
    rs = from_loaded(load_string(http(f"domain: d\ndescriptors:\n  - {{key: a, value: 1.10, {RL}}}"), "x.yaml"))
    assert rs.match([("a", "1.10")]) is not None and rs.match([("a", "1.1")]) is None


RL = "rate_limit: {unit: second, requests_per_unit: 1}"


def test_a_leading_document_marker_works_pasted_or_in_a_lyft_file():
    lyft = "---\ndomain: rl\ndescriptors:\n  - key: k\n    rate_limit: {unit: second, requests_per_unit: 5}\n"
    assert load_lyft_string(lyft, "config.yaml").config.domain == "rl"
    pasted = "version: 1\nhttp:\n" + textwrap.indent(lyft, "  ")
    loaded = load_string(pasted, "n.yaml")
    assert loaded.config.http.domain == "rl"
    assert loaded.position("http", "descriptors", 0, "key") == (6, 12)  # positions unchanged
    # only right under http: -- elsewhere an indented --- is what YAML says it is
    assert problems("version: 1\nnetwork:\n  ---\n  - name: x\n")


def test_an_empty_descriptors_list_is_an_empty_domain():
    for text in (http("domain: d\ndescriptors:"), http("domain: d\ndescriptors: []"), http("domain: d")):
        rs = from_loaded(load_string(text, "e.yaml"))
        assert rs.domain == "d" and rs.rules == [] and rs.match([("k", "v")]) is None
    c = load_string(http(f"domain: d\ndescriptors:\n  - key: a\n    descriptors:\n  - key: b\n    {RL}"), "e.yaml")
    assert c.config.http.descriptors[0].descriptors == []
    assert load_lyft_string("domain: d\ndescriptors:\n", "l.yaml").config.descriptors == []


def test_unlimited_next_to_a_unit_names_the_accepted_form():
    (p,) = problems(http("domain: d\ndescriptors:\n  - key: k\n    rate_limit: {unlimited: true, unit: day}"))
    assert p.startswith("f.yaml:5:7: http: should not specify rate limit unit when unlimited: write ")
    assert "'rate_limit: {unlimited: true}'" in p
    for ok in (
        "rate_limit: {unlimited: true}",
        "unlimited: true",
        "rate_limit: {unlimited: true, requests_per_unit: 5}",
    ):
        rs = from_loaded(load_string(http(f"domain: d\ndescriptors:\n  - key: k\n    {ok}"), "u.yaml"))
        assert rs.match([("k", "x")]).unlimited


def test_replaces_naming_its_own_descriptor_is_refused():
    text = http("""
        domain: d
        descriptors:
          - key: k
            rate_limit:
              name: self
              replaces:
                - name: other
                - name: self
              unit: second
              requests_per_unit: 5
        """)
    assert problems(text) == ["f.yaml:10:19: http: replaces should not contain name of same descriptor"]
    text2 = http(f"domain: d\ndescriptors:\n  - key: k\n    {RL[:-1]}, name: me}}\n    replaces: [{{name: me}}]")
    assert problems(text2) == ["f.yaml:7:25: http: replaces should not contain name of same descriptor"]
    text3 = http(
        "domain: d\ndescriptors:\n  - key: k\n    rate_limit: {unit: second, requests_per_unit: 1, replaces: [{name: }]}"
    )
    assert [p.split(": ", 2)[2] for p in problems(text3)] == ["should not have an empty replaces entry"]


def test_lyft_checks_with_lyft_messages():
    cases = [
        (f"domain: d\ndescriptors:\n  - value: v\n    {RL}", "f.yaml:5:7: http: descriptor has empty key"),
        (
            f"domain: d\ndescriptors:\n  - key: k\n    value: v\n    share_threshold: true\n    {RL}",
            "f.yaml:7:24: http: share_threshold can only be used with wildcard values (containing '*'), "
            "but found key 'k_v'",
        ),
        (
            f"domain: d\ndescriptors:\n  - key: k\n    value: v\n  - key: k\n    value: ''\n  - key: k\n    {RL}",
            "f.yaml:9:12: http: duplicate descriptor composite key 'd.k' (first at line 7)",
        ),
        (
            f"domain: d\ndescriptors:\n  - key: k\n    metadata: {{when: 2026-01-01}}\n    {RL}",
            "f.yaml:6:17: http: error parsing metadata: invalid type: date (datetime.date(2026, 1, 1))",
        ),
        (
            "domain: d\ndescriptors:\n  - key: k\n    quota_mode: true",
            "f.yaml:6:19: http: quota_mode on a descriptor without rate_limit does nothing",
        ),
        (
            f"domain: d\ndescriptors:\n  - key: k\n    algorithm: token_bucket\n    count_denied: false\n    {RL}",
            "f.yaml:5:7: http: 'count_denied' applies to algorithm: fixed_window, not token_bucket",
        ),
        (
            "storage: memory",
            "f.yaml:2:1: http: config file cannot have empty domain: set http.domain (or "
            "http.lyft_config_dir, a directory of Lyft config files, one domain each)",
        ),
    ]
    for body, want in cases:
        assert problems(http(body)) == [want], body


def test_validate_and_the_sidecar_refuse_the_same_file(tmp_path: Path):
    """One validation path: ``netlimit validate`` (load_checked) and the sidecar
    both refuse duplicate siblings (and everything else) with the same
    FILE:LINE:COL problems."""
    from netlimit.sidecar.app import Sidecar

    f = tmp_path / "dup.yaml"
    f.write_text(
        http(f"domain: d\ndescriptors:\n  - key: k\n    value: v\n    {RL}\n  - key: k\n    value: v\n    {RL}")
    )
    with pytest.raises(ConfigError) as by_validate:
        load_checked(f)
    with pytest.raises(ConfigError) as by_sidecar:
        Sidecar(str(f))
    want = [f"{f}:8:12: http: duplicate descriptor composite key 'd.k_v' (first at line 5)"]
    assert [str(p) for p in by_validate.value.problems] == want
    assert [str(p) for p in by_sidecar.value.problems] == want
    with pytest.raises(ConfigError) as by_load:
        load_file(f)  # the daemon's and every other reader's path too
    assert [str(p) for p in by_load.value.problems] == want


def test_validate_cli_reports_the_problem(tmp_path: Path):
    from typer.testing import CliRunner

    from netlimit.cli import app

    f = tmp_path / "self.yaml"
    f.write_text(http(f"domain: d\ndescriptors:\n  - key: k\n    {RL[:-1]}, name: me}}\n    replaces: [{{name: me}}]"))
    res = CliRunner().invoke(app, ["validate", str(f)])
    assert res.exit_code == 1
    assert f"{f}:7:25: http: replaces should not contain name of same descriptor" in res.output


# ---------------------------------------------------------------- lyft_config_dir


def lyft_dir(tmp: Path, files: dict[str, str], main: str = "") -> Path:
    d = tmp / "conf"
    d.mkdir(exist_ok=True)
    for name, text in files.items():
        (d / name).write_text(textwrap.dedent(text))
    m = tmp / "netlimit.yaml"
    m.write_text("version: 1\nhttp:\n  lyft_config_dir: conf\n" + main)
    return m


def test_a_directory_of_lyft_files_is_one_domain_each(tmp_path: Path):
    m = lyft_dir(
        tmp_path,
        {
            "a.yaml": f"domain: a\ndescriptors:\n  - key: k\n    {RL}\n",
            "b.yml": f"---\ndomain: b\ndescriptors:\n  - key: k\n    {RL}\n",
            ".hidden.yaml": "domain: hidden\n",
            "notes.txt": "not config",
        },
        f"  domain: main\n  descriptors:\n    - key: k\n      {RL}\n",
    )
    rs = from_loaded(load_file(m))
    assert set(rs.domains) == {"main", "a", "b"}
    assert rs.domain == "main" and [r.domain for r in rs.all_rules] == ["main", "a", "b"]
    assert rs.domains["a"].match([("k", "x")]).domain == "a"
    for d in rs.domains.values():
        assert d.domains is rs.domains and d.all_rules is rs.all_rules


def test_lyft_dir_problems_name_the_file_line_and_column(tmp_path: Path):
    m = lyft_dir(
        tmp_path,
        {
            "a.yaml": f"domain: a\ndescriptors:\n  - key: k\n    {RL}\n",
            "b.yaml": "domain: a\n",
            "c.yaml": "domain: main\n",
            "d.yaml": f"domain: d\ndescriptors:\n  - key: k\n    ratelimit: {{}}\n    {RL}\n",
        },
        "  domain: main\n",
    )
    with pytest.raises(ConfigError) as ei:
        load_file(m)
    conf = tmp_path / "conf"
    assert [str(p) for p in ei.value.problems] == [
        f"{conf}/b.yaml:1:9: lyft: duplicate domain 'a' in config file (also in {conf}/a.yaml:1)",
        f"{conf}/c.yaml:1:9: lyft: duplicate domain 'main' in config file (also http.domain of {m})",
        f"{conf}/d.yaml:4:5: lyft: unknown field 'ratelimit' (did you mean 'rate_limit'?)",
    ]
    m.write_text("version: 1\nhttp:\n  lyft_config_dir: nowhere\n")
    with pytest.raises(ConfigError) as ei:
        load_file(m)
    assert [str(p) for p in ei.value.problems] == [
        f"{m}:3:20: http: lyft_config_dir {str(tmp_path / 'nowhere')!r}: no such directory"
    ]


def test_merge_domains_makes_one_tree(tmp_path: Path):
    files = {
        "1.yaml": f"domain: a\ndescriptors:\n  - key: k1\n    {RL}\n",
        "2.yaml": f"domain: a\ndescriptors:\n  - key: k2\n    {RL}\n",
    }
    with pytest.raises(ConfigError):
        load_file(lyft_dir(tmp_path, files))
    rs = from_loaded(load_file(lyft_dir(tmp_path, files, "  merge_domains: true\n")))
    a = rs.domains["a"]
    assert a.match([("k1", "x")]) is not None and a.match([("k2", "x")]) is not None


def test_the_directory_is_part_of_the_files_hash(tmp_path: Path):
    m = lyft_dir(tmp_path, {"a.yaml": "domain: a\n"})
    h1 = load_file(m).sha256
    (tmp_path / "conf" / "a.yaml").write_text("domain: a2\n")
    assert load_file(m).sha256 != h1


def test_validate_names_every_domain_it_checked(tmp_path: Path):
    from typer.testing import CliRunner

    from netlimit.cli import app

    m = lyft_dir(tmp_path, {"a.yaml": "domain: a\n", "b.yaml": "domain: b\n"}, "  domain: main\n")
    res = CliRunner().invoke(app, ["validate", str(m)])
    assert res.exit_code == 0 and f"{m}: valid (0 network, 0 bandwidth, http domains 'main', 'a', 'b')" in res.output
    (tmp_path / "conf" / "b.yaml").write_text(
        "domain: b\ndescriptors:\n  - key: k\n    rate_limit: {unit: fortnight}\n"
    )
    res = CliRunner().invoke(app, ["validate", str(m)])
    assert res.exit_code == 1 and f"{tmp_path}/conf/b.yaml:4:24: lyft: 'unit' must be one of" in res.output
