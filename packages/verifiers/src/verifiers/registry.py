"""Task type -> verifier registry and the single entry point `verify(task, completion)`."""

from __future__ import annotations

import dataclasses
import threading
import time
from collections.abc import Callable, Mapping
from typing import Any, overload

from verifiers import machine
from verifiers.completions import Completion, completion_text
from verifiers.errors import TaskFormatError, UnknownTaskTypeError
from verifiers.task import Score, Task

Verifier = Callable[[Task, str], Score]

_REGISTRY: dict[str, Verifier] = {}
_LOCK = threading.Lock()


@overload
def register_verifier(task_type: str, verifier: Verifier, *, replace: bool = False) -> Verifier: ...
@overload
def register_verifier(
    task_type: str, verifier: None = None, *, replace: bool = False
) -> Callable[[Verifier], Verifier]: ...
def register_verifier(
    task_type: str, verifier: Verifier | None = None, *, replace: bool = False
) -> Verifier | Callable[[Verifier], Verifier]:
    """Register `verifier(task, completion) -> Score` for `task_type` (one call, or a decorator).

    Raises ValueError if the type is taken and `replace` is False.
    """

    def add(fn: Verifier) -> Verifier:
        with _LOCK:
            if task_type in _REGISTRY and not replace:
                raise ValueError(f"a verifier for {task_type!r} is registered; pass replace=True to override")
            _REGISTRY[task_type] = fn
        return fn

    return add(verifier) if verifier is not None else add


def get_verifier(task_type: str) -> Verifier:
    """The verifier for `task_type`; raises `UnknownTaskTypeError` listing the known types."""
    try:
        return _REGISTRY[task_type]
    except KeyError:
        raise UnknownTaskTypeError(
            f"no verifier registered for task_type {task_type!r}; known: {sorted(_REGISTRY)}"
        ) from None


def registered_task_types() -> list[str]:
    return sorted(_REGISTRY)


def as_task(task: Task | Mapping[str, Any]) -> Task:
    return task if isinstance(task, Task) else Task.from_row(task)


def verify(task: Task | Mapping[str, Any], completion: Completion) -> Score:
    """Score `completion` for `task` with the verifier registered for its `task_type`.

    `task` may be a `Task` or a raw dataset row. `completion` is text or a chat completion
    (a message or a list of messages, as TRL passes for conversational data): the verifier
    reads its assistant messages' text (`verifiers.completion_text`). Malformed tasks raise `TaskFormatError` and
    unknown types `UnknownTaskTypeError`; any other exception inside a verifier becomes
    `Score(0, failure="error")` so one bad item cannot stop a training step. Every score is
    reported to the enclosing `verifiers.machine_limits()` block, if any (`Score.machine_limit`).
    """
    task = as_task(task)
    verifier = get_verifier(task.task_type)
    completion = completion_text(completion)  # TypeError for anything but text or chat messages
    start = time.perf_counter()
    try:
        score = verifier(task, completion)
    except TaskFormatError:
        raise
    except Exception as exc:
        return Score(0.0, {"error": f"{type(exc).__name__}: {exc}"[:500]}, "error")
    if not isinstance(score, Score):
        raise TypeError(f"verifier for {task.task_type!r} returned {type(score).__name__}, not Score")
    if "elapsed_s" not in score.details:
        score = dataclasses.replace(score, details={**score.details, "elapsed_s": time.perf_counter() - start})
    machine.report(score.machine_limit, wall_clock=score.wall_clock_checked)
    return score
