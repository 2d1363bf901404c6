"""The task set every process shares: task id -> task, task id -> prompt text -> prompt tokens.

The orchestrator, workers, the validator and the evaluator all build the same ``TaskSet`` from
the same ``[tasks]`` config, so a task id means the same prompt everywhere; the validator
recomputes ``encode_prompt(tokenizer, task_set.prompt(task_id))`` and rejects a sample whose
prompt tokens differ ("a changed prompt").

Sources (``tasks.source``):
  - ``arithmetic``: ``verifiers``' seeded arithmetic generator (``num_tasks``, ``seed``, ``ops``, ``digits``);
  - ``jsonl`` / ``parquet``: INTELLECT-2-schema rows ``{prompt, task_type, verification_info}``
    (first ``num_tasks`` rows of ``path``, read by ``verifiers.load_tasks``).

Prompt text = ``prompt_template`` with ``{prompt}`` replaced by the task's prompt (plain
replacement, so other braces in a few-shot prefix need no escaping).
"""

from __future__ import annotations

from collections.abc import Sequence
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


def _arithmetic(config: TasksConfig) -> list[Any]:
    import verifiers

    return list(
        verifiers.arithmetic_tasks(
            config.num_tasks,
            seed=config.seed,
            ops=tuple(config.ops),
            digits=(config.min_digits, config.digits),
            terms=config.terms,
            match=config.match,
            template=config.arithmetic_template,
        )
    )


def load_tasks(config: TasksConfig) -> TaskSet:
    """Build the run's ``TaskSet`` from ``[tasks]``; raises ``TaskSourceError`` on bad sources."""
    if config.source == "arithmetic":
        tasks = _arithmetic(config)
    else:
        import verifiers

        try:
            tasks = list(verifiers.load_tasks(config.path, limit=config.num_tasks))
        except (OSError, ValueError) as error:
            raise TaskSourceError(f"cannot read tasks from {config.path}: {error}") from error
    return TaskSet(tasks, config.prompt_template)
