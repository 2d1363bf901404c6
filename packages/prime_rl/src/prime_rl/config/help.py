"""The configuration reference, generated from the pydantic models (so it cannot drift from them).

``describe_config(RunConfig, sections)`` renders every key of the chosen sections, grouped by
section, as ``--section.key TYPE (default VALUE, CONSTRAINTS)`` followed by the field's
description; ``prime-rl <role> --help`` prints it for the sections that role reads. Types are
written as a TOML user sees them (``int``, ``list[str]``, ``{a,b}`` for a choice), defaults as
TOML literals.
"""

from __future__ import annotations

import json
import textwrap
import types
from collections.abc import Iterable
from typing import Any, Literal, Union, get_args, get_origin

from pydantic import BaseModel
from pydantic.fields import FieldInfo

__all__ = ["describe_config", "format_default", "format_type"]

_CONSTRAINTS = (("ge", ">="), ("gt", ">"), ("le", "<="), ("lt", "<"))


def format_type(annotation: Any) -> str:
    """``int``, ``float | unset``, ``list[str]``, ``[float, float]``, ``{a,b}`` (one of), ``table``."""
    origin = get_origin(annotation)
    args = get_args(annotation)
    if origin is Literal:
        return "{" + ",".join(str(arg) for arg in args) + "}"
    if origin in (Union, types.UnionType):
        named = [format_type(arg) for arg in args if arg is not type(None)]
        return " | ".join(named) + (" | unset" if type(None) in args else "")
    if origin in (list, set, frozenset):
        return f"list[{format_type(args[0])}]" if args else "list"
    if origin is tuple:
        return "[" + ", ".join(format_type(arg) for arg in args if arg is not Ellipsis) + "]"
    if origin is dict:
        return f"table {{{format_type(args[0])} = {format_type(args[1])}}}" if args else "table"
    if isinstance(annotation, type):
        return annotation.__name__
    return str(annotation).replace("typing.", "")


def format_default(value: Any) -> str:
    """A default as the TOML literal a user would write (``unset`` for None)."""
    if value is None:
        return "unset"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, BaseModel):
        return "{...}"
    if isinstance(value, tuple | list | set | frozenset | dict | str):
        return json.dumps(list(value) if isinstance(value, tuple | set | frozenset) else value, ensure_ascii=False)
    return repr(value)


def _constraints(field: FieldInfo) -> list[str]:
    found = []
    for item in field.metadata:
        for attribute, symbol in _CONSTRAINTS:
            bound = getattr(item, attribute, None)
            if bound is not None:
                found.append(f"{symbol} {bound}")
    return found


def _key_lines(prefix: str, name: str, field: FieldInfo) -> list[str]:
    default = field.get_default(call_default_factory=True)
    facts = [f"default {format_default(default)}", *_constraints(field)]
    head = f"  --{prefix}{name} {format_type(field.annotation)} ({', '.join(facts)})"
    body = textwrap.wrap(field.description or "", width=96, initial_indent=" " * 6, subsequent_indent=" " * 6)
    return [head, *body]


def _is_section(field: FieldInfo) -> bool:
    return isinstance(field.annotation, type) and issubclass(field.annotation, BaseModel)


def _model_lines(prefix: str, model: type[BaseModel]) -> list[str]:
    """The keys of ``model``; a nested model's keys follow with a longer prefix (``trainer.loss.x``)."""
    lines: list[str] = []
    nested = []
    for name, field in model.model_fields.items():
        if _is_section(field):
            nested.append(name)
        else:
            lines.extend(_key_lines(prefix, name, field))
    for name in nested:
        sub = model.model_fields[name].annotation
        assert isinstance(sub, type) and issubclass(sub, BaseModel)
        lines.extend(_model_lines(f"{prefix}{name}.", sub))
    return lines


def describe_config(model: type[BaseModel], sections: Iterable[str] | None = None) -> str:
    """Every key of ``model``'s top-level keys and of the named ``sections`` (None = all), grouped.

    Raises ``KeyError`` for a section name ``model`` does not have.
    """
    fields = model.model_fields
    chosen = [name for name in fields if _is_section(fields[name])] if sections is None else list(sections)
    for name in chosen:
        if name not in fields or not _is_section(fields[name]):
            raise KeyError(f"{model.__name__} has no section {name!r}")
    top = [name for name, field in fields.items() if not _is_section(field)]
    lines: list[str] = []
    if top:
        lines.append("top-level keys:")
        for name in top:
            lines.extend(_key_lines("", name, fields[name]))
    for section in chosen:
        section_model = fields[section].annotation
        assert isinstance(section_model, type) and issubclass(section_model, BaseModel)
        summary = (section_model.__doc__ or "").strip().splitlines()[0] if section_model.__doc__ else ""
        summary = summary.removeprefix(f"[{section}]:").strip()
        lines.append("")
        lines.append(f"[{section}]" + (f"  {summary}" if summary else ""))
        lines.extend(_model_lines(f"{section}.", section_model))
    return "\n".join(lines)
