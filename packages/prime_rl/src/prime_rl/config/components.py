"""Import paths of the algorithm's swappable parts (``[components]`` and ``[trainer.loss]``), and their loader.

A run's reward and loss are Python objects (``examples/intellect2.py`` builds them from
``verifiers`` and ``grpo``); processes on other machines get the same objects by importing them
from the path in the config:

    [components]
    reward = "examples.intellect2:reward"          # module:attribute (the module must be importable)

    [trainer]
    loss = "/srv/recipes/intellect2.py:loss"       # or path/to/file.py:attribute (config/loss.py)

The config checks only the syntax (no import: the control plane stays torch-free). The role that
uses a component imports it at start-up with :func:`load_component`, which raises
:class:`ComponentError` naming the key and path when the module is not found, the attribute is
missing, or the object is of the wrong type or signature; ``prime-rl <role>`` then exits with
code 2 and that message.
"""

from __future__ import annotations

import hashlib
import importlib
import importlib.util
import inspect
import json
import keyword
import sys
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType
from typing import Any

from pydantic import Field, field_validator, model_validator

from prime_rl.config.base import ConfigError, Section

__all__ = ["ComponentError", "ComponentsConfig", "ImportPath", "check_signature", "load_component"]


class ComponentError(ConfigError):
    """A component's import path cannot be imported or names an object of the wrong kind, or two
    sources name two different components for one key."""


@dataclass(frozen=True)
class ImportPath:
    """``module:attribute`` (dotted module name) or ``path/to/file.py:attribute`` (a file).

    ``attribute`` may be dotted (``Recipe.reward``). The split is at the last ``:``, so an
    absolute Windows path keeps its drive letter.
    """

    source: str
    attribute: str

    @property
    def is_file(self) -> bool:
        return self.source.endswith(".py")

    @classmethod
    def parse(cls, text: str) -> ImportPath:
        """Raises ``ComponentError`` unless ``text`` is ``module:attribute`` or ``file.py:attribute``."""
        source, colon, attribute = text.strip().rpartition(":")
        example = "e.g. 'examples.intellect2:reward' or 'path/to/recipe.py:reward'"
        if not colon or not source or not attribute:
            raise ComponentError(f"import path {text!r} must be 'module:attribute' ({example})")
        if not all(part.isidentifier() and not keyword.iskeyword(part) for part in attribute.split(".")):
            raise ComponentError(f"import path {text!r}: {attribute!r} is not a Python attribute name")
        if not source.endswith(".py") and not all(part.isidentifier() for part in source.split(".")):
            raise ComponentError(
                f"import path {text!r}: {source!r} is neither a dotted module name nor a .py file ({example})"
            )
        return cls(source, attribute)

    def __str__(self) -> str:
        return f"{self.source}:{self.attribute}"


class ComponentsConfig(Section):
    """[components]: the reward by import path ('' = the runtime's built-in one; the loss is [trainer.loss])."""

    reward: str = Field(
        default="",
        description="Callable reward(task, completion, num_tokens, budget) -> float used by workers and the "
        "validator ('' = verifiers.verify plus the [tasks] length term).",
    )

    @model_validator(mode="before")
    @classmethod
    def _the_loss_lives_in_the_trainer(cls, data: Any) -> Any:
        if isinstance(data, Mapping) and "loss" in data:
            raise ValueError(
                f"the loss is one key, [trainer.loss] (a recipe table or an import path): "
                f"--trainer.loss {json.dumps(data['loss'])}, not components.loss"
            )
        return data

    @field_validator("reward")
    @classmethod
    def _syntax(cls, value: str) -> str:
        if value:
            ImportPath.parse(value)  # a ComponentError is a ValueError: pydantic names the key
        return value


def _import_file(path: Path) -> ModuleType:
    """Import ``path`` once per process as its own module (so every role gets the same objects)."""
    name = f"_component_{path.stem}_{hashlib.sha256(str(path).encode()).hexdigest()[:12]}"
    if name in sys.modules:
        return sys.modules[name]
    spec = importlib.util.spec_from_file_location(name, path)
    if spec is None or spec.loader is None:
        raise ComponentError(f"cannot import {path}: not a Python source file")
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module  # before exec: dataclasses and pickling look the module up by name
    try:
        spec.loader.exec_module(module)
    except BaseException:
        del sys.modules[name]
        raise
    return module


def _import(key: str, target: ImportPath) -> ModuleType:
    if target.is_file:
        path = Path(target.source).expanduser().resolve()
        if not path.is_file():
            raise ComponentError(f"{key} = {str(target)!r}: file {path} does not exist")
        return _import_file(path)
    try:
        return importlib.import_module(target.source)
    except ModuleNotFoundError as error:
        missing = error.name or ""
        if missing == target.source or target.source.startswith(missing + "."):
            raise ComponentError(
                f"{key} = {str(target)!r}: module {target.source!r} not found (not installed and not on "
                f"sys.path; run from the directory that holds it, or give the .py file's path)"
            ) from error
        raise ComponentError(  # the module exists but one of its own imports is missing
            f"{key} = {str(target)!r}: importing {target.source!r} failed: {error}"
        ) from error


def load_component(key: str, path: str, accepts: Callable[[object], str | None] | None = None) -> object:
    """Import the object ``path`` names; ``key`` (e.g. ``components.reward``) goes into every error.

    ``accepts(obj)`` returns None if the object fits, else what is wrong with it (a sentence).
    Raises ``ComponentError`` for a malformed path, a module or file not found, a missing
    attribute and an object ``accepts`` refuses. Errors raised while the module runs its own
    top-level code propagate unchanged (they are bugs in that module, not in the config).
    """
    target = ImportPath.parse(path)
    value: object = _import(key, target)
    for depth, name in enumerate(target.attribute.split(".")):
        if not hasattr(value, name):
            where = target.source if depth == 0 else ".".join(target.attribute.split(".")[:depth])
            public = sorted(n for n in dir(value) if not n.startswith("_"))
            raise ComponentError(
                f"{key} = {path!r}: {where!r} has no attribute {name!r} (it has: {', '.join(public[:20])})"
            )
        value = getattr(value, name)
    problem = accepts(value) if accepts is not None else None
    if problem:
        raise ComponentError(f"{key} = {path!r}: {problem}")
    return value


def check_signature(parameters: Sequence[str]) -> Callable[[object], str | None]:
    """An ``accepts`` for :func:`load_component`: a callable taking these positional arguments."""
    call = f"({', '.join(parameters)})"

    def accepts(value: object) -> str | None:
        if not callable(value):
            return f"must be callable as {call}, got a {type(value).__name__}"
        try:
            inspect.signature(value).bind(*parameters)
        except TypeError:
            return f"must be callable as {call}; its signature is {inspect.signature(value)}"
        except ValueError:  # no signature (some builtins): nothing to check
            return None
        return None

    return accepts
