"""The JSON Schema of the config file, as `netlimit schema` prints it and
`install-service` writes it beside the starter config (for the
`# yaml-language-server: $schema=` line editors read)."""

from __future__ import annotations

import json

from .model import Config


def schema_text(indent: int = 2) -> str:
    s = Config.model_json_schema(mode="validation")
    s["$schema"] = "https://json-schema.org/draft/2020-12/schema"
    s["$id"] = "https://netlimit.invalid/schema/v1.json"
    return json.dumps(s, indent=indent, sort_keys=False) + "\n"
