"""The task set every process shares: task id -> task, task id -> prompt text -> prompt tokens.

The orchestrator, workers, the validator and the evaluator all build the same ``TaskSet`` from
the same ``[tasks]`` config, so a task id means the same prompt everywhere; the validator
recomputes ``encode_prompt(tokenizer, task_set.prompt(task_id))`` and rejects a sample whose
prompt tokens differ ("a changed prompt").

Sources (``tasks.source``):
  - ``arithmetic``: ``verifiers``' seeded arithmetic generator (``num_tasks``, ``seed``, ``ops``, ``digits``);
  - ``jsonl`` / ``parquet``: INTELLECT-2-schema rows ``{prompt, task_type, verification_info}``
    (read by ``verifiers.load_tasks``), optionally filtered by pass rate (``difficulty_key``,
    ``min_pass_rate``, ``max_pass_rate``), then the first ``num_tasks``.

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
    """An indexable, immutable list of tasks plus the prompt template (and optional length budgets).

    With ``length_reward != "none"`` every task gets a thinking budget
    ``target_length(task_id) = verifiers.sample_target_length(seed, task_id, targets=target_lengths)``
    and its prompt ends with ``verifiers.length_instruction(T, mode)`` (INTELLECT-2's instruction
    placement, with the space after "for" that the original lacked).
    """

    def __init__(
        self,
        tasks: Sequence[Any],
        prompt_template: str = "{prompt}",
        *,
        length_reward: str = "none",
        target_lengths: Sequence[int] = (),
        seed: int = 0,
    ) -> None:
        if not tasks:
            raise TaskSourceError("the task set is empty")
        if "{prompt}" not in prompt_template:
            raise TaskSourceError("prompt_template must contain '{prompt}'")
        if length_reward != "none" and not target_lengths:
            raise TaskSourceError("a length reward needs target_lengths")
        self._tasks = tuple(tasks)
        self.prompt_template = prompt_template
        self.length_reward = length_reward
        self.target_lengths = tuple(target_lengths)
        self.seed = seed

    def target_length(self, task_id: int) -> int | None:
        """The task's thinking budget in tokens (None without a length reward)."""
        self.task(task_id)
        if self.length_reward == "none":
            return None
        import verifiers

        return int(verifiers.sample_target_length(self.seed, task_id, targets=self.target_lengths))

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
        raw = str(task.prompt if hasattr(task, "prompt") else task["prompt"])
        target = self.target_length(task_id)
        if target is not None:
            from verifiers.length import with_length_instruction

            raw = with_length_instruction(raw, target, self.length_reward)
        return self.prompt_template.replace("{prompt}", raw)


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
            tasks = list(verifiers.load_tasks(config.path))
        except (OSError, ValueError) as error:
            raise TaskSourceError(f"cannot read tasks from {config.path}: {error}") from error
    if config.difficulty_key:
        tasks = [t for t in tasks if _passes_difficulty(t, config)]
    tasks = tasks[: config.num_tasks]
    return TaskSet(
        tasks,
        config.prompt_template,
        length_reward=config.length_reward,
        target_lengths=config.target_lengths,
        seed=config.seed,
    )


def _passes_difficulty(task: Any, config: TasksConfig) -> bool:
    """INTELLECT-2's offline filter: keep min_pass_rate <= rate <= max_pass_rate; tasks without a rate pass."""
    if config.difficulty_key == "solve_rate_qwen_r1_distill_7b":
        rate = getattr(task, "solve_rate", None)
    else:
        rate = (getattr(task, "metadata", None) or {}).get(config.difficulty_key)
    if rate is None:
        return True
    return config.min_pass_rate <= float(rate) <= config.max_pass_rate
