"""Loading a config: a TOML file plus command-line overrides ``--section.key value``.

Values are parsed as TOML literals, falling back to a bare string: ``--model.path /tmp/m`` and
``--sampling.stop '["\\n"]'`` both work. Unknown keys anywhere are errors (``ConfigError``) naming
the dotted key.
"""

from __future__ import annotations

import tomllib
from collections.abc import Sequence
from pathlib import Path
from typing import Any, TypeVar

from pydantic import BaseModel, ValidationError

from prime_rl.config.base import ConfigError
from prime_rl.config.run import RunConfig

__all__ = ["load_config", "parse_overrides", "with_overrides"]


M = TypeVar("M", bound=BaseModel)


def _parse_value(text: str) -> Any:
    try:
        return tomllib.loads(f"v = {text}")["v"]
    except tomllib.TOMLDecodeError:
        return text


def parse_overrides(overrides: Sequence[str]) -> dict[str, Any]:
    """``["--a.b", "1", "--c=x"]`` -> ``{"a": {"b": 1}, "c": "x"}`` (values as TOML literals).

    Raises ``ConfigError`` on a token that is not ``--key`` or lacks a value.
    """
    result: dict[str, Any] = {}
    index = 0
    tokens = list(overrides)
    while index < len(tokens):
        token = tokens[index]
        if not token.startswith("--") or len(token) <= 2:
            raise ConfigError(f"expected an override '--section.key value', got {token!r}")
        key = token[2:]
        if "=" in key:
            key, raw = key.split("=", 1)
            index += 1
        else:
            if index + 1 >= len(tokens):
                raise ConfigError(f"override --{key} has no value")
            raw = tokens[index + 1]
            index += 2
        parts = key.replace("-", "_").split(".")
        if any(not part for part in parts):
            raise ConfigError(f"malformed override key {key!r}")
        node = result
        for part in parts[:-1]:
            child = node.setdefault(part, {})
            if not isinstance(child, dict):
                raise ConfigError(f"override --{key} conflicts with an earlier override of {part!r}")
            node = child
        node[parts[-1]] = _parse_value(raw)
    return result


def _merge(base: dict[str, Any], update: dict[str, Any], prefix: str = "") -> dict[str, Any]:
    """``update`` over ``base``, table by table; a value replaces a value or a whole table.

    Raises ``ConfigError`` when ``update`` sets keys inside a key that ``base`` holds as a plain
    value (``--trainer.loss.eps_high 0.3`` over ``loss = "recipe.py:loss"``): the value would be
    dropped without a word.
    """
    merged = dict(base)
    for key, value in update.items():
        if isinstance(value, dict) and isinstance(merged.get(key), dict):
            merged[key] = _merge(merged[key], value, f"{prefix}{key}.")
        elif isinstance(value, dict) and merged.get(key) is not None:
            raise ConfigError(
                f"--{prefix}{key}.{next(iter(value), '')} sets a key inside {prefix}{key}, which is "
                f"{merged[key]!r}, not a table; replace the whole value (--{prefix}{key} ...) instead"
            )
        else:
            merged[key] = value
    return merged


def _format_validation_error(error: ValidationError, source: str) -> str:
    lines = [f"invalid configuration ({source}):"]
    for item in error.errors():
        key = ".".join(str(part) for part in item["loc"]) or "<root>"
        if item["type"] == "extra_forbidden":
            lines.append(f"  unknown key '{key}'")
        else:
            lines.append(f"  {key}: {item['msg']} (got {item.get('input')!r})")
    return "\n".join(lines)


def load_config(
    path: str | Path | None,
    overrides: Sequence[str] = (),
    model: type[M] = RunConfig,  # type: ignore[assignment]
) -> M:
    """Read TOML ``path`` (None = defaults only), apply ``overrides``, validate into ``model``.

    Raises ``ConfigError`` with every problem listed by dotted key (unknown keys included).
    """
    data: dict[str, Any] = {}
    source = "defaults"
    if path is not None:
        source = str(path)
        try:
            data = tomllib.loads(Path(path).read_text(encoding="utf-8"))
        except FileNotFoundError as error:
            raise ConfigError(f"config file not found: {path}") from error
        except (tomllib.TOMLDecodeError, UnicodeDecodeError) as error:
            raise ConfigError(f"{path}: not valid TOML: {error}") from error
    if overrides:
        data = _merge(data, parse_overrides(overrides))
        source += " + overrides"
    try:
        return model.model_validate(data)
    except ValidationError as error:
        raise ConfigError(_format_validation_error(error, source)) from None


def with_overrides(config: M, overrides: Sequence[str]) -> M:
    """``config`` with more ``--section.key value`` overrides applied and validated (no file is read).

    A launcher that adds settings after loading (a fresh run directory, free ports, the model
    path) gets the same config its children get from ``load_config(path, overrides + added)``.
    Raises ``ConfigError`` like :func:`load_config`.
    """
    if not overrides:
        return config
    data = _merge(config.model_dump(), parse_overrides(overrides))
    try:
        return type(config).model_validate(data)
    except ValidationError as error:
        raise ConfigError(_format_validation_error(error, "config + overrides")) from None
