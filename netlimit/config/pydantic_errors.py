"""Pydantic's validation errors as Problems: FILE:LINE:COL, the rule's name, a
message a person can act on (did-you-mean for an unknown field)."""

from __future__ import annotations

import difflib
from typing import Any

from pydantic import BaseModel, ValidationError

from .loader import Document, Problem
from .model import BandwidthRule, BansConfig, Config, Descriptor, Escalate, HttpConfig, NetworkRule, RateLimit, Replaces


def _rule_label(data: Any, loc: tuple[Any, ...]) -> str:
    """The name an error is reported under: the rule's name, or the section."""
    if not loc:
        return "file"
    section = loc[0]
    if section in ("network", "bandwidth") and len(loc) >= 2 and isinstance(loc[1], int):
        try:
            name = data[section][loc[1]].get("name")
        except (AttributeError, IndexError, KeyError, TypeError):
            name = None
        return str(name) if isinstance(name, str) and name else f"{section}[{loc[1]}]"
    if section == "http":
        return "http"
    return str(section)


def _model_at(loc: tuple[Any, ...], root: type[BaseModel] = Config) -> type[BaseModel] | None:
    """The model whose fields live at `loc` (for did-you-mean)."""
    model: type[BaseModel] | None = root
    items: dict[str, type[BaseModel]] = {
        "network": NetworkRule,
        "bandwidth": BandwidthRule,
        "http": HttpConfig,
        "descriptors": Descriptor,
        "rate_limit": RateLimit,
        "replaces": Replaces,
        "escalate": Escalate,
        "bans": BansConfig,
    }
    for part in loc:
        if isinstance(part, int):
            continue
        nxt = items.get(part) if model is not None and part in model.model_fields else None
        if nxt is None:
            return None
        model = nxt
    return model


def _plain_loc(loc: tuple[Any, ...]) -> tuple[Any, ...]:
    """Drop pydantic's function-name segments (e.g. 'function-after[...]')."""
    return tuple(
        p for p in loc if isinstance(p, int) or not (isinstance(p, str) and ("[" in p or p.startswith("function")))
    )


def map_errors(
    exc: ValidationError, doc: Document, filename: str, *, root: type[BaseModel] = Config, label: str | None = None
) -> list[Problem]:
    problems: list[Problem] = []
    seen: set[tuple[int, int, str]] = set()
    for err in exc.errors(include_url=False):
        loc = _plain_loc(tuple(err["loc"]))
        etype = err["type"]
        msg = err["msg"]
        if msg.startswith("Value error, "):
            msg = msg[len("Value error, ") :]
        if etype == "extra_forbidden":
            field_name = loc[-1]
            model = _model_at(loc[:-1], root)
            hint = ""
            if model is not None:
                close = difflib.get_close_matches(str(field_name), list(model.model_fields), n=1, cutoff=0.6)
                if close:
                    hint = f" (did you mean '{close[0]}'?)"
                else:
                    hint = f"; known fields: {', '.join(model.model_fields)}"
            msg = f"unknown field '{field_name}'{hint}"
            line, col = doc.pos(loc, key=True)
        elif etype == "missing":
            msg = f"missing required field '{loc[-1]}'"
            line, col = doc.pos(loc[:-1])
        elif etype == "literal_error":
            expected = err.get("ctx", {}).get("expected", "")
            msg = f"'{loc[-1]}' must be one of {expected.replace(' or ', ', ')}, got {err.get('input')!r}"
            line, col = doc.pos(loc)
        elif etype in ("int_type", "int_parsing", "int_from_float"):
            msg = f"'{loc[-1]}' must be a whole number, got {err.get('input')!r}"
            line, col = doc.pos(loc)
        elif etype in ("bool_type", "bool_parsing"):
            msg = f"'{loc[-1]}' must be true or false, got {err.get('input')!r}"
            line, col = doc.pos(loc)
        elif etype in ("list_type",):
            msg = f"'{_last_name(loc)}' must be a list (YAML '- item' lines or [a, b])"
            line, col = doc.pos(loc)
        elif etype in ("model_type", "dict_type", "model_attributes_type"):
            msg = f"'{_last_name(loc)}' must be a mapping of fields, got {type(err.get('input')).__name__}"
            line, col = doc.pos(loc)
        elif etype in ("greater_than_equal", "less_than_equal", "greater_than", "less_than"):
            msg = f"'{loc[-1]}' {msg[0].lower()}{msg[1:]}, got {err.get('input')!r}"
            line, col = doc.pos(loc)
        elif etype == "too_short":
            need = err.get("ctx", {}).get("min_length", 1)
            msg = f"'{_last_name(loc)}' needs at least {need} item{'s' if need != 1 else ''}, got an empty list"
            line, col = doc.pos(loc)
        elif etype == "invalid_key":
            key_val = err.get("input")
            msg = f"key is not of type string: {key_val!r}"
            line, col = doc.pos(loc[:-1] + (key_val,), key=True)
        elif etype == "string_type":
            msg = f"'{_last_name(loc)}' must be text, got {err.get('input')!r}"
            line, col = doc.pos(loc)
        else:
            line, col = doc.pos(loc)
            if (
                loc
                and isinstance(loc[-1], str)
                and not msg.startswith(("'", "set ", "bad "))
                and etype != "value_error"
            ):
                msg = f"'{loc[-1]}': {msg}"
        key = (line, col, msg)
        if key in seen:
            continue
        seen.add(key)
        label_loc = loc[:-1] if etype in ("missing", "extra_forbidden") and len(loc) == 1 else loc
        problems.append(Problem(filename, line, col, label or _rule_label(doc.data, label_loc), msg))
    return problems


def _last_name(loc: tuple[Any, ...]) -> str:
    for part in reversed(loc):
        if isinstance(part, str):
            return part
    return "value"
