"""The environment contract, checked before any episode is played.

An environment written by hand can break the contract in ways that only show after minutes of
generation: a reward that returns a string, a rubric set on the wrong attribute, a tool that takes
no arguments. :func:`check_environment` reads what can be read without playing (types,
signatures, return annotations) and raises :class:`~verifiers.errors.EnvironmentSpecError` with
where the environment is defined, the attribute and the rule, for the first mistake it finds:

* ``rubric`` is a :class:`Rubric`; each function is callable as ``fn(task, messages)``, its
  return annotation (when it has one) is a number type (``float`` or ``int``: not ``str``,
  ``bool``, ``None`` or an ``Optional``), its weight a finite real number;
* ``max_turns`` is an int >= 1; ``replayable`` a bool; ``limit_markers`` a tuple of non-empty
  strings; an environment of more than one turn overrides ``respond``;
* a :class:`ToolEnv`'s ``tools`` maps names (``[A-Za-z_][A-Za-z0-9_.-]*``, what a model writes in
  ``"name"``) to callables taking one argument (the call's ``arguments`` object), returning
  ``str`` where annotated.

Values are checked as they are returned too (``Rubric.score``, ``reward_value``): an annotation
cannot promise that ``fn`` never returns NaN.
"""

from __future__ import annotations

import inspect
import math
import re
import typing
from numbers import Real

from verifiers.envs.core import Environment, Rubric
from verifiers.envs.tools import ToolEnv
from verifiers.errors import EnvironmentSpecError

__all__ = ["check_environment", "defined_at", "reward_return_problem"]

_TOOL_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_.-]*")
_NUMBER_TYPES: tuple[object, ...] = (float, int, Real, "float", "int")


def defined_at(obj: object) -> str:
    """``path/to/file.py:QualifiedName`` of a class or function (``<unknown>`` parts when not known)."""
    target = obj if inspect.isclass(obj) or inspect.isroutine(obj) else type(obj)
    try:
        source = inspect.getsourcefile(target) or "<unknown file>"  # type: ignore[arg-type]
    except TypeError:  # a builtin
        source = "<built-in>"
    return f"{source}:{getattr(target, '__qualname__', type(target).__name__)}"


def _return_annotation(fn: object) -> object:
    """``fn``'s return annotation, resolved where possible; ``inspect.Signature.empty`` when none."""
    try:
        hints = typing.get_type_hints(fn)
    except Exception:  # an unresolvable forward reference: fall back to the raw annotation
        hints = {}
    if "return" in hints:
        return hints["return"]
    try:
        return inspect.signature(fn).return_annotation  # type: ignore[arg-type]
    except (TypeError, ValueError):
        return inspect.Signature.empty


def _type_name(annotation: object) -> str:
    """``str`` for a class, ``typing.Optional[float]`` for a typing form, the text of a string."""
    return annotation.__name__ if isinstance(annotation, type) else str(annotation)


def _takes(fn: object, count: int) -> str | None:
    """None when ``fn`` can be called with ``count`` positional arguments, else its signature."""
    try:
        signature = inspect.signature(fn)  # type: ignore[arg-type]
    except (TypeError, ValueError):  # no signature to read (some builtins): nothing to check
        return None
    try:
        signature.bind(*range(count))
    except TypeError:
        return str(signature)
    return None


def reward_return_problem(fn: object) -> str | None:
    """What is wrong with a reward function's return annotation (a sentence), or None: none, or a
    number type (``float``, ``int``, ``numbers.Real``)."""
    returns = _return_annotation(fn)
    if returns is inspect.Signature.empty or returns in _NUMBER_TYPES:
        return None
    return (
        f"is annotated to return {_type_name(returns)}; a reward must return a finite real number "
        "(annotate it -> float, and return a float, not a str, bool or None)"
    )


def _check_rubric(env: Environment, where: str) -> None:
    rubric = getattr(env, "rubric", None)
    if not isinstance(rubric, Rubric):
        raise EnvironmentSpecError(
            where, "rubric",
            f"must be a verifiers.envs.Rubric, got {type(rubric).__name__} (set self.rubric = Rubric((RewardFunc(...),)) "
            "in __init__, or pass rubric= to SingleTurnEnv)",
        )  # fmt: skip
    if not rubric.funcs:
        raise EnvironmentSpecError(where, "rubric", "has no reward functions, so every reward would be 0")
    for func in rubric.funcs:
        attribute = f"rubric function {func.name!r} ({defined_at(func.fn)})"
        if not callable(func.fn):
            raise EnvironmentSpecError(where, attribute, f"must be callable as fn(task, messages), got {type(func.fn).__name__}")
        if (signature := _takes(func.fn, 2)) is not None:
            raise EnvironmentSpecError(where, attribute, f"must be callable as fn(task, messages); its signature is {signature}")
        if (problem := reward_return_problem(func.fn)) is not None:
            raise EnvironmentSpecError(where, attribute, problem)
        weight = func.weight
        if isinstance(weight, bool) or not isinstance(weight, Real) or not math.isfinite(weight):
            raise EnvironmentSpecError(where, attribute, f"weight {weight!r} is not a finite real number")


def _check_tools(env: ToolEnv, where: str) -> None:
    if not isinstance(env.tools, dict) or not env.tools:
        raise EnvironmentSpecError(where, "tools", f"must be a non-empty dict of name -> tool, got {env.tools!r:.80}")
    for name, tool in env.tools.items():
        if not isinstance(name, str) or not _TOOL_NAME.fullmatch(name):
            raise EnvironmentSpecError(
                where, "tools", f"tool name {name!r} must match {_TOOL_NAME.pattern} (what a model writes in \"name\")"
            )
        attribute = f"tools[{name!r}] ({defined_at(tool)})"
        if not callable(tool):
            raise EnvironmentSpecError(where, attribute, f"must be callable as tool(arguments) -> str, got {type(tool).__name__}")
        if (signature := _takes(tool, 1)) is not None:
            raise EnvironmentSpecError(
                where, attribute, f"must be callable as tool(arguments) -> str (one dict); its signature is {signature}"
            )
        returns = _return_annotation(tool)
        if returns is not inspect.Signature.empty and returns not in (str, "str"):
            raise EnvironmentSpecError(
                where, attribute, f"is annotated to return {_type_name(returns)}; a tool returns str"
            )


def check_environment(env: Environment) -> None:
    """Raise ``EnvironmentSpecError`` for the first rule ``env`` breaks (module docstring); None if
    it keeps them all. Plays nothing and calls no reward or tool."""
    where = defined_at(env)
    if not isinstance(env, Environment):
        raise EnvironmentSpecError(where, "class", "must be a verifiers.envs.Environment")
    turns = env.max_turns
    if isinstance(turns, bool) or not isinstance(turns, int) or turns < 1:
        raise EnvironmentSpecError(where, "max_turns", f"must be an int >= 1, got {turns!r}")
    if not isinstance(env.replayable, bool):
        raise EnvironmentSpecError(where, "replayable", f"must be True or False, got {env.replayable!r}")
    markers = env.limit_markers
    if not isinstance(markers, tuple) or not all(isinstance(m, str) and m for m in markers):
        raise EnvironmentSpecError(where, "limit_markers", f"must be a tuple of non-empty strings, got {markers!r:.80}")
    if turns > 1 and type(env).respond is Environment.respond:
        raise EnvironmentSpecError(where, "respond", f"max_turns is {turns}, but respond is not overridden")
    _check_rubric(env, where)
    if isinstance(env, ToolEnv):
        _check_tools(env, where)
