"""netlimitd with `include:` (issue 31 item 9): a file added to conf.d goes live as
an edit of the main file does (the include directories are watched); a bad
included file is rejected with its own FILE:LINE:COL and the old rules stay; the
status's sha256 (and netlimit_config_info) follows the included files."""

from __future__ import annotations

import os

import pytest
from daemon_proc import config_text, owned_rules, wait_for

pytestmark = pytest.mark.netns

WEB = """\
network:
  - name: web
    protocol: tcp
    ports: [80]
    limit: {rate}
"""


def _write(path, text: str) -> None:
    tmp = path.with_name("." + path.name + ".new")  # as an editor: write, then rename over
    tmp.write_text(text)
    os.replace(tmp, path)


def test_a_file_added_to_conf_d_goes_live_and_a_bad_one_is_rejected(daemon_factory, netns, tmp_path):
    conf = tmp_path / "conf.d"
    conf.mkdir()
    text = config_text().replace("network:\n", "include: [conf.d/*.yaml]\nnetwork:\n", 1)
    d = daemon_factory(text)
    d.start()
    sha0 = d.status()["config_sha256"]
    assert not any('"netlimit:web' in r for r in owned_rules(netns))

    _write(conf / "20-web.yaml", WEB.format(rate="100/second"))
    wait_for(lambda: any("netlimit:web" in r for r in owned_rules(netns)), 20, "the included rule")
    st = d.status()
    assert st["rules"] == ["udp-flood", "web", "shape"] and st["config_sha256"] != sha0
    assert "included file changed" in d.log.read_text()

    before = owned_rules(netns)
    _write(conf / "20-web.yaml", WEB.format(rate="100/fortnight"))
    st = wait_for(lambda: (s := d.status())["rejected"] and s, 20, "the rejection")
    assert st["rejected"].startswith(f"{conf / '20-web.yaml'}:5:12: web: bad rate unit 'fortnight'"), st["rejected"]
    assert owned_rules(netns) == before
    assert d.stop() == 0
