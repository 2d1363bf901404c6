"""The task set every process shares: task id -> task, task id -> prompt text -> prompt tokens.

The orchestrator, workers, the validator and the evaluator all build the same ``TaskSet`` from
the same ``[tasks]`` config, so a task id means the same prompt everywhere; the validator
recomputes ``encode_prompt(tokenizer, task_set.prompt(task_id))`` and rejects a sample whose
prompt tokens differ ("a changed prompt").

Sources (``tasks.source``):
  - ``arithmetic``: ``verifiers``' seeded arithmetic generator (``num_tasks``, ``seed``, ``ops``, ``digits``);
  - ``jsonl`` / ``parquet``: INTELLECT-2-schema rows ``{prompt, task_type, verification_info}``
    (first ``num_tasks`` rows of ``path``).

Prompt text = ``prompt_template`` with ``{prompt}`` replaced by the task's prompt (plain
replacement, so other braces in a few-shot prefix need no escaping).
"""

from __future__ import annotations

import inspect
import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from prime_rl.config import TasksConfig

__all__ = ["TaskSet", "TaskSourceError", "encode_prompt", "load_tasks"]


class TaskSourceError(ValueError):
    """The task source cannot be read or produced no tasks."""


def encode_prompt(tokenizer: Any, prompt: str) -> list[int]:
    """Token ids of ``prompt``: ``tokenizer(prompt)["input_ids"]`` (HF default special tokens).

    The one definition worker and validator share; changing it invalidates every submission.
    """
    return [int(token) for token in tokenizer(prompt)["input_ids"]]


class TaskSet:
    """An indexable, immutable list of tasks plus the prompt template."""

    def __init__(self, tasks: Sequence[Any], prompt_template: str = "{prompt}") -> None:
        if not tasks:
            raise TaskSourceError("the task set is empty")
        if "{prompt}" not in prompt_template:
            raise TaskSourceError("prompt_template must contain '{prompt}'")
        self._tasks = tuple(tasks)
        self.prompt_template = prompt_template

    def __len__(self) -> int:
        return len(self._tasks)

    def task(self, task_id: int) -> Any:
        """The task object (a ``verifiers.Task`` for real sources); IndexError if out of range."""
        if not 0 <= task_id < len(self._tasks):
            raise IndexError(f"task_id {task_id} out of range [0, {len(self._tasks)})")
        return self._tasks[task_id]

    def prompt(self, task_id: int) -> str:
        """The full prompt text sent to the model for ``task_id``."""
        task = self.task(task_id)
        raw = task.prompt if hasattr(task, "prompt") else task["prompt"]
        return self.prompt_template.replace("{prompt}", str(raw))


def _make_task(row: dict[str, Any]) -> Any:
    import verifiers

    verification_info = row.get("verification_info", {})
    task_class: Any = getattr(verifiers, "Task")  # noqa: B009 - verifiers may predate Task
    return task_class(prompt=row["prompt"], task_type=row["task_type"], verification_info=verification_info)


def _read_rows(config: TasksConfig) -> list[dict[str, Any]]:
    path = Path(config.path)
    if not path.exists():
        raise TaskSourceError(f"tasks.path {path} does not exist")
    if config.source == "jsonl":
        rows: list[dict[str, Any]] = []
        with open(path, encoding="utf-8") as handle:
            for number, line in enumerate(handle, 1):
                if len(rows) >= config.num_tasks:
                    break
                if line.strip():
                    try:
                        rows.append(json.loads(line))
                    except json.JSONDecodeError as error:
                        raise TaskSourceError(f"{path}:{number}: not JSON: {error}") from error
        return rows
    import pyarrow.parquet as pq

    return pq.read_table(path).slice(0, config.num_tasks).to_pylist()


def _arithmetic(config: TasksConfig) -> list[Any]:
    import verifiers

    generate = getattr(verifiers, "arithmetic_tasks", None) or getattr(verifiers, "generate_arithmetic", None)
    if generate is None:
        raise TaskSourceError("this verifiers version has no arithmetic task generator")
    options: dict[str, Any] = {"seed": config.seed, "ops": tuple(config.ops), "digits": config.digits}
    accepted = inspect.signature(generate).parameters
    kwargs = {key: value for key, value in options.items() if key in accepted}
    if "n" in accepted:
        return list(generate(config.num_tasks, **kwargs))
    return list(generate(num_tasks=config.num_tasks, **kwargs))


def load_tasks(config: TasksConfig) -> TaskSet:
    """Build the run's ``TaskSet`` from ``[tasks]``; raises ``TaskSourceError`` on bad sources."""
    if config.source == "arithmetic":
        tasks = _arithmetic(config)
    else:
        rows = _read_rows(config)
        for number, row in enumerate(rows):
            if not isinstance(row, dict) or "prompt" not in row or "task_type" not in row:
                raise TaskSourceError(f"{config.path}: row {number} lacks 'prompt'/'task_type'")
        tasks = [_make_task(row) for row in rows]
    return TaskSet(tasks, config.prompt_template)
