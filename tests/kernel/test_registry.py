"""The kernel registry (netlimit/kernel/registry.py): the one place that knows the
backends' names. Pure: no kernel, no root."""

from __future__ import annotations

import sys
import textwrap

import pytest

from netlimit.config.model import Config
from netlimit.errors import ApplyError
from netlimit.kernel import registry
from netlimit.kernel.objects import Desired
from netlimit.kernel.render import plan_dict, plan_text


def test_every_alias_names_its_backend(monkeypatch):
    monkeypatch.delenv(registry.BACKEND_ENV, raising=False)
    for r in registry.REGISTERED:
        assert registry.choose(r.key).key == r.key
        for alias in r.aliases:
            assert registry.choose(alias.upper()).key == r.key


def test_backend_by_name_default_and_unknown():
    assert registry.backend(None).key == registry.DEFAULT
    with pytest.raises(ApplyError, match="unknown backend 'nope': choose one of nftables, restore"):
        registry.backend("nope")


def test_the_config_schema_spells_the_registered_names():
    enum = Config.model_json_schema()["properties"]["backend"]["enum"]
    assert enum == ["auto", *registry.BACKENDS]


def test_a_new_backend_is_one_folder_plus_one_registration(tmp_path, monkeypatch):
    """A backend in a package of its own, registered with one entry, is chosen by name
    and drives `plan` without any other module knowing its name."""
    pkg = tmp_path / "nlfake"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("")
    (pkg / "backend.py").write_text(
        textwrap.dedent(
            """
            class FakeBackend:
                key = "fake"
                name = "fake (tests)"
                layer = kind = "fake"
                write_unit = "one fake write"
                tools = ()

                def plan_summary(self, desired):
                    return 1, "1 fake rule"

                def plan_sections(self, desired):
                    return ["", "# --- fake ---", "drop everything, politely"]

                def plan_doc(self, desired):
                    return {"fake": {"rules": 1}}
            """
        )
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.delenv(registry.BACKEND_ENV, raising=False)
    reg = (*registry.REGISTERED, registry.Registration("fake", "nlfake.backend:FakeBackend", ("pretend",)))
    monkeypatch.setattr(registry, "REGISTERED", reg)
    monkeypatch.setattr(registry, "BACKENDS", tuple(r.key for r in reg))
    monkeypatch.setattr(registry, "_ALIASES", {a: r.key for r in reg for a in r.aliases})
    try:
        assert registry.choose("pretend") == registry.Choice("fake", "--backend fake")
        assert registry.others("fake") == []  # switching to it removes no other filter's rules
        text = plan_text(Desired(), backend="fake")
        assert "1 fake rule" in text and "# --- fake ---\ndrop everything, politely" in text
        assert plan_dict(Desired(), backend="fake")["fake"] == {"rules": 1}
        assert registry.help_text().split(". Default")[0].endswith(", fake")  # --backend's help lists it
    finally:
        sys.modules.pop("nlfake.backend", None)
        sys.modules.pop("nlfake", None)
