"""The run's tasks as workers and the validator use them: prompt tokens and verifiers rewards.

Wraps CONTROL's :class:`prime_rl.tasks.TaskSet` (the same task ids the orchestrator leases) with
the model tokenizer, implementing :class:`prime_rl.validator.checks.TaskScorer`. Both sides tokenise with
:meth:`prime_rl.tasks.TaskSet.encode` (:func:`prime_rl.tasks.encode_prompt` with the run's chat
settings) and score with ``verifiers.verify(task, text).reward``, so an
honest worker's claims match the validator's recomputation exactly.
"""

from __future__ import annotations

from functools import lru_cache
from typing import TYPE_CHECKING, Any

from prime_rl.tasks import TaskSet, load_tasks

if TYPE_CHECKING:
    from prime_rl.config import RunConfig


class RunTasks:
    """``TaskScorer`` over a ``TaskSet``; ``score`` defaults to ``verifiers.verify``."""

    def __init__(
        self, task_set: TaskSet, tokenizer: Any, *, length_mode: str = "exact", length_alpha: float = 0.0003
    ) -> None:
        self.task_set = task_set
        self.tokenizer = tokenizer
        self.length_mode = length_mode
        self.length_alpha = length_alpha
        self.prompt_tokens = lru_cache(maxsize=4096)(self._prompt_tokens)  # type: ignore[method-assign]

    @property
    def num_tasks(self) -> int:
        return len(self.task_set)

    def _prompt_tokens(self, task_id: int) -> tuple[int, ...]:
        return tuple(self.task_set.encode(self.tokenizer, self.task_set.prompt(task_id)))

    def prompt_tokens(self, task_id: int) -> tuple[int, ...]:  # replaced by the cached version
        return self._prompt_tokens(task_id)

    def encode(self, text: str) -> list[int]:
        return self.task_set.encode(self.tokenizer, text)

    def score(self, task_id: int, completion: str, num_tokens: int) -> float:
        """``verifiers.verify`` reward, plus the INTELLECT-2 length term when ``[tasks] length_reward`` is set."""
        import verifiers

        reward = float(verifiers.verify(self.task_set.task(task_id), completion).reward)
        target = self.task_set.target_length(task_id) if hasattr(self.task_set, "target_length") else None
        if target is None:
            return reward
        return float(
            verifiers.length_reward(reward, num_tokens, target, self.length_mode, alpha=self.length_alpha)
        )


def run_tasks(config: RunConfig, tokenizer: Any) -> RunTasks:
    """The run's tasks (``[tasks]``) with this model's tokenizer."""
    mode = config.tasks.length_reward
    return RunTasks(
        load_tasks(config.tasks),
        tokenizer,
        length_mode=mode if mode != "none" else "exact",
        length_alpha=config.tasks.length_alpha,
    )
