"""Fixtures of the daemon tests: a namespace per test, daemons killed in teardown."""

from __future__ import annotations

import os
import re

import pytest
from daemon_proc import Daemon, sh


@pytest.fixture
def netns(request):
    name = f"nlt-d{os.getpid() % 100000}-{re.sub('[^A-Za-z0-9]', '', request.node.name)[-14:]}"[:30]
    sh("ip", "netns", "add", name)
    try:
        sh("ip", "-n", name, "link", "set", "lo", "up")
        sh("ip", "-n", name, "link", "add", "nlta", "type", "veth", "peer", "name", "nltb")
        sh("ip", "-n", name, "link", "set", "nlta", "up")
        sh("ip", "-n", name, "link", "set", "nltb", "up")
        yield name
    finally:
        sh("ip", "netns", "del", name, check=False)


@pytest.fixture
def daemon_factory(tmp_path, netns):
    made: list[Daemon] = []

    def make(text: str, **kw) -> Daemon:
        d = Daemon(tmp_path, netns, text, **kw)
        made.append(d)
        return d

    try:
        yield make
    finally:
        for d in made:
            d.kill()
