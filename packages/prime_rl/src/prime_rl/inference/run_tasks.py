"""The run's tasks as workers and the validator use them: prompt tokens and the run's reward.

Wraps CONTROL's :class:`prime_rl.tasks.TaskSet` (the same task ids the orchestrator leases) with
the model tokenizer, implementing :class:`prime_rl.validator.checks.TaskScorer`. Both sides tokenise
with :meth:`prime_rl.tasks.TaskSet.encode` (:func:`prime_rl.tasks.encode_prompt` with the run's chat
settings) and score with the same reward, so an honest worker's claims match the validator's
recomputation exactly.

The reward is ``reward(task, completion, num_tokens, budget) -> float``: :func:`default_reward`
(``verifiers.verify`` plus INTELLECT-2's length term), or the callable ``[components] reward``
names (``examples/intellect2.py:reward``), imported when the worker or validator starts.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from functools import lru_cache
from numbers import Real
from typing import TYPE_CHECKING, Any

import verifiers
from prime_rl.config import ComponentError, load_component
from prime_rl.config.components import check_signature
from prime_rl.tasks import TaskSet, load_tasks
from verifiers.length import ALPHA

if TYPE_CHECKING:
    from prime_rl.config import RunConfig

__all__ = [
    "REWARD_PARAMETERS",
    "LengthBudget",
    "Reward",
    "RunTasks",
    "default_reward",
    "load_reward",
    "run_tasks",
]


@dataclass(frozen=True)
class LengthBudget:
    """A task's thinking budget and how the length term scores against it (``[tasks] length_*``)."""

    target: int
    """Tokens the prompt asks the model to think for (``verifiers.sample_target_length``)."""
    mode: str
    """``verifiers.length_reward`` mode: "exact", "max" or "clip"."""
    alpha: float
    """Reward per token of distance from the target (INTELLECT-2: 3e-4)."""


Reward = Callable[[Any, str, int, "LengthBudget | None"], float]
REWARD_PARAMETERS = ("task", "completion", "num_tokens", "budget")


def default_reward(task: Any, completion: str, num_tokens: int, budget: LengthBudget | None) -> float:
    """``verifiers.verify``'s reward, then the length term toward ``budget`` (None: no length term)."""
    score = float(verifiers.verify(task, completion).reward)
    if budget is None:
        return score
    return float(verifiers.length_reward(score, num_tokens, budget.target, budget.mode, alpha=budget.alpha))


def load_reward(path: str) -> Reward:
    """The reward ``path`` names (``module:attribute``); ``ComponentError`` if it is not one."""
    return load_component("components.reward", path, check_signature(REWARD_PARAMETERS))  # type: ignore[return-value]


class RunTasks:
    """``TaskScorer`` over a ``TaskSet``: prompt tokens, and ``score`` with ``reward``."""

    def __init__(
        self,
        task_set: TaskSet,
        tokenizer: Any,
        *,
        reward: Reward = default_reward,
        length_alpha: float = ALPHA,
    ) -> None:
        self.task_set = task_set
        self.tokenizer = tokenizer
        self.reward = reward
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

    def budget(self, task_id: int) -> LengthBudget | None:
        """The task's thinking budget, or None when ``[tasks] length_reward = "none"``."""
        target = self.task_set.target_length(task_id) if hasattr(self.task_set, "target_length") else None
        if target is None:
            return None
        return LengthBudget(target, self.task_set.length_reward, self.length_alpha)

    def score(self, task_id: int, completion: str, num_tokens: int) -> float:
        """The reward of ``completion`` (``num_tokens`` generated tokens) for task ``task_id``.

        Raises ``ComponentError`` if the reward returns anything but a finite number: a NaN would
        make every honest claim differ from the validator's recomputation.
        """
        value = self.reward(self.task_set.task(task_id), completion, num_tokens, self.budget(task_id))
        if not isinstance(value, Real) or not math.isfinite(value):
            raise ComponentError(
                f"the reward {getattr(self.reward, '__qualname__', self.reward)!r} returned {value!r} for task "
                f"{task_id}; a reward must be a finite number"
            )
        return float(value)


def run_tasks(config: RunConfig, tokenizer: Any) -> RunTasks:
    """The run's tasks (``[tasks]``) with this model's tokenizer and the run's reward (``[components]``).

    A reward component is called once here, on task 0 with an empty completion: a callable of the
    right arity but the wrong kind (a loss, say) fails at start-up with ``ComponentError``, not on
    the first batch.
    """
    path = config.components.reward
    reward = load_reward(path) if path else default_reward
    tasks = RunTasks(
        load_tasks(config.tasks), tokenizer, reward=reward, length_alpha=config.tasks.length_alpha
    )
    if path:
        try:
            tasks.score(0, "", 0)
        except Exception as error:
            raise ComponentError(
                f"components.reward = {path!r}: calling it for task 0 with an empty completion failed: {error!r:.300}"
            ) from error
    return tasks
