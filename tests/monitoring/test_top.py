"""`netlimit top` against a real netlimitd (rules in a namespace of the test, under a
real UDP flood) and a real sidecar (real HTTP requests over a limit): on a terminal
(tmux) the screen shows the rules with non-zero rates and quits on `q`; in a pipe it
prints plain lines."""

from __future__ import annotations

import os
import re
import shutil
import subprocess

import pytest
from daemon_proc import EXE, Daemon, wait_for
from sidecar_proc import Sidecar, Upstream, request, write_config

from netlimit.kernel import traffic

pytestmark = pytest.mark.netns

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
          rate_limit: {unit: minute, requests_per_unit: 5, name: login}
"""


def save_svg(ansi: str, path: str) -> None:
    """A terminal screen (with its colour codes) as an SVG picture, as rich draws it."""
    from rich.console import Console
    from rich.text import Text

    console = Console(record=True, width=160, force_terminal=True, color_system="truecolor", file=open(os.devnull, "w"))
    console.print(Text.from_ansi(ansi.rstrip("\n")))
    console.save_svg(path, title="netlimit top")


def daemon_config(topo) -> str:
    return f"""\
version: 1
network:
  - name: udp-flood
    protocol: udp
    ports: [5000]
    limit: 50/second
    burst: 10
bandwidth:
  - name: egress-cap
    interface: {topo.srv_if}
    rate: 1mbit
"""


@pytest.fixture
def host(topo, tmp_path):
    """A daemon in topo.srv and a sidecar in proxy mode; yields (daemon, sidecar)."""
    d = Daemon(tmp_path, topo.srv, daemon_config(topo))
    up = sc = None
    try:
        d.start()
        up = Upstream()
        sc = Sidecar(write_config(tmp_path / "sidecar.yaml", SIDECAR), "--upstream", up.url)
        yield d, sc
    finally:
        if sc is not None:
            sc.stop()
        if up is not None:
            up.stop()
        d.kill()


def test_top_on_a_terminal_shows_live_rates_and_quits_on_q(topo, host):
    if not shutil.which("tmux"):
        pytest.fail("tmux is not installed: apt-get install tmux (scripts/setup.sh does)", pytrace=False)
    d, sc = host
    tmux = ["tmux", "-L", f"nltop{os.getpid()}"]
    cmd = (
        f"env -u COLUMNS -u LINES {EXE} top --socket {d.sock} --sidecar http://127.0.0.1:{sc.admin_port} --interval 0.5"
    )
    # a detached session keeps tmux's default 80x24 unless its window size is manual
    subprocess.run(
        [*tmux, "-f", "/dev/null", "new-session", "-d", "-s", "top", "-x", "160", "-y", "60", cmd,
         ";", "set-option", "-w", "-t", "top", "window-size", "manual",
         ";", "resize-window", "-t", "top", "-x", "160", "-y", "60"],
        check=True, timeout=30,
    )  # fmt: skip
    flood = None
    try:

        def screen() -> str:
            return subprocess.run(
                [*tmux, "capture-pane", "-p", "-t", "top"], capture_output=True, text=True, timeout=10
            ).stdout

        wait_for(lambda: "network rules (kernel)" in screen(), 30, "top's first screen")
        flood = traffic.udp_flood_start(topo.cli, topo.cli4, topo.srv4, 5000, 800, 20)
        shaped = traffic.udp_flood_start(topo.srv, topo.srv4, topo.cli4, 9, 300, 20)
        for _ in range(10):
            assert request(sc.port, "GET", "/login").status in (200, 429)

        # the flood's rule with a non-zero packet rate and drop rate, the HTTP rule with denials
        sep = r"[\s│]+"  # rich's column rules
        layer = "nftables" if d.status()["backend"] == "nftables" else "iptables"  # what auto picked here
        rule_row = re.compile(rf"udp-flood{sep}{layer}{sep}(\d[\d.]*k?)/s{sep}(\d[\d.]*k?)/s")
        login_row = re.compile(rf"api/login{sep}\S+/s{sep}\S+/s{sep}10{sep}5{sep}")

        seen = [""]

        def live() -> str | None:
            s = seen[0] = screen()
            m = rule_row.search(s)
            ok = m and m.group(1) != "0" and m.group(2) != "0" and login_row.search(s)
            # a capture can land mid-frame: wait for a whole one, with every table
            whole = all(
                x in s
                for x in ("busiest sources in the kernel's tables", topo.cli4, "egress-cap", "most denied HTTP clients",
                          "remote_address=127.0.0.1")
            )  # fmt: skip
            return s if ok and whole else None

        try:
            s = wait_for(live, 30, "non-zero rates on top's screen", step=0.5)
        except AssertionError as exc:
            raise AssertionError(f"{exc}; the screen:\n{seen[0]}") from None
        assert re.search(r"egress-cap.*\d[\d.]*k?bit/s.*1\.0Mbit/s", s), s
        if os.environ.get("NETLIMIT_TOP_SVG"):  # scripts/top_screenshot.sh: README's picture of this screen
            colour = subprocess.run(
                [*tmux, "capture-pane", "-e", "-p", "-t", "top"], capture_output=True, text=True, timeout=10
            ).stdout
            save_svg(colour, os.environ["NETLIMIT_TOP_SVG"])
        subprocess.run([*tmux, "send-keys", "-t", "top", "q"], check=True, timeout=10)
        wait_for(
            lambda: subprocess.run([*tmux, "has-session", "-t", "top"], capture_output=True).returncode != 0,
            15,
            "top to quit on q",
        )
        traffic.flood_result(flood)
        traffic.flood_result(shaped)
        flood = None
    finally:
        if flood is not None:
            flood.kill()
        subprocess.run([*tmux, "kill-server"], capture_output=True, timeout=10)


def test_top_in_a_pipe_prints_plain_lines(topo, host):
    d, sc = host
    flood = traffic.udp_flood_start(topo.cli, topo.cli4, topo.srv4, 5000, 500, 3)
    p = subprocess.run(
        [EXE, "top", "--socket", d.sock, "--sidecar", f"http://127.0.0.1:{sc.admin_port}", "--count", "3",
         "--interval", "0.5"],
        capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    traffic.flood_result(flood)
    assert p.returncode == 0, p.stderr
    assert "\x1b[" not in p.stdout  # no terminal codes in a pipe
    assert re.search(r"rule udp-flood \S+: \d[\d.]*k?/s packets", p.stdout), p.stdout
    assert re.search(r"bandwidth egress-cap: .* of 1\.0Mbit/s", p.stdout), p.stdout
    assert re.search(r"http 127\.0\.0\.1:\d+ api/login: ", p.stdout), p.stdout


def test_top_without_a_daemon_says_so(tmp_path):
    p = subprocess.run(
        [EXE, "top", "--socket", str(tmp_path / "none.sock"), "--count", "1"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert p.returncode == 0 and "Traceback" not in p.stderr
    assert f"problem: no netlimitd answers on {tmp_path / 'none.sock'}" in p.stdout
