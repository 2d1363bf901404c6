"""The reward, next to the tasks it scores: the contract every worker and the validator share.

A reward is ``reward(task, completion, num_tokens, budget) -> float`` (:data:`Reward`):
:func:`default_reward` (``verifiers.verify`` plus INTELLECT-2's length term toward the task's
:class:`LengthBudget`), or the callable ``[components] reward`` names
(``examples/intellect2.py:reward``), imported when the worker or validator starts
(:func:`load_reward`). A recipe composes its reward from weighted terms (:func:`weighted`), the
way TRL and ``verifiers`` take ``reward_funcs`` with ``reward_weights``: ``default_reward`` plus
its own terms, one line each.

:class:`RunTasks` is the run's tasks as both sides use them: prompt tokens through
:meth:`prime_rl.tasks.TaskSet.encode` (the run's chat settings) and ``score`` with the run's
reward, implementing :class:`prime_rl.validator.checks.TaskScorer`, so an honest worker's claims
match the validator's recomputation exactly.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from functools import lru_cache
from typing import TYPE_CHECKING, Any

import verifiers
from prime_rl.config import ComponentError, load_component
from prime_rl.config.components import check_signature
from prime_rl.tasks import TaskSet, load_tasks
from verifiers.envs import reward_value
from verifiers.envs.checks import reward_return_problem
from verifiers.errors import RewardError
from verifiers.length import ALPHA

if TYPE_CHECKING:
    from prime_rl.config import RunConfig

__all__ = [
    "REWARD_PARAMETERS",
    "LengthBudget",
    "Reward",
    "RunTasks",
    "WeightedReward",
    "default_reward",
    "load_reward",
    "run_tasks",
    "weighted",
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


@dataclass(frozen=True)
class WeightedReward:
    """``sum(weight * term(...))`` over ``terms``, in order; a term of weight 0 is not computed
    (TRL logs such a term as a metric; nothing here logs per-term values yet).

    Pitfall: the sum must come out bit-identical on every worker and on the validator, so the
    terms are added in their listed order (a single term of weight 1 is that term's value exactly).
    """

    terms: tuple[tuple[Reward, float], ...]

    def __post_init__(self) -> None:
        for term, weight in self.terms:
            problem = check_signature(REWARD_PARAMETERS)(term)
            if problem or not math.isfinite(weight):
                raise ValueError(f"reward term {term!r}: {problem or f'weight {weight} is not finite'}")

    def __call__(self, task: Any, completion: str, num_tokens: int, budget: LengthBudget | None) -> float:
        total = 0.0
        for term, weight in self.terms:
            if weight:
                total += weight * float(term(task, completion, num_tokens, budget))
        return total


def weighted(*terms: tuple[Reward, float]) -> WeightedReward:
    """The reward ``sum(weight * term)`` of ``(term, weight)`` pairs, e.g.
    ``weighted((default_reward, 1.0), (format_reward, 0.2))``.

    Raises ``ValueError`` for a term that is not a reward or a weight that is not finite.
    """
    return WeightedReward(tuple(terms))


def load_reward(path: str) -> Reward:
    """The reward ``path`` names (``module:attribute``); ``ComponentError`` if it is not one: not
    callable as ``(task, completion, num_tokens, budget)``, or annotated to return something other
    than a number (``verifiers.envs.checks.reward_return_problem``)."""
    signature = check_signature(REWARD_PARAMETERS)

    def accepts(value: object) -> str | None:
        return signature(value) or reward_return_problem(value)

    return load_component("components.reward", path, accepts)  # type: ignore[return-value]


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
        # Tokenising a few-shot prompt costs more than judging its sample's structure; a worker and
        # the validator see the same few tasks again and again.
        self._cached_prompt_tokens = lru_cache(maxsize=4096)(self._encode_prompt)

    @property
    def num_tasks(self) -> int:
        return len(self.task_set)

    def _encode_prompt(self, task_id: int) -> tuple[int, ...]:
        return tuple(self.task_set.encode(self.tokenizer, self.task_set.prompt(task_id)))

    def prompt_tokens(self, task_id: int) -> tuple[int, ...]:
        """The token ids a worker must feed for task ``task_id`` (cached)."""
        return self._cached_prompt_tokens(task_id)

    def encode(self, text: str) -> list[int]:
        return self.task_set.encode(self.tokenizer, text)

    def budget(self, task_id: int) -> LengthBudget | None:
        """The task's thinking budget, or None when ``[tasks] length_reward = "none"``."""
        target = self.task_set.target_length(task_id)
        if target is None:
            return None
        return LengthBudget(target, self.task_set.length_reward, self.length_alpha)

    def score(self, task_id: int, completion: str, num_tokens: int) -> float:
        """The reward of ``completion`` (``num_tokens`` generated tokens) for task ``task_id``.

        Raises ``verifiers.RewardError`` (naming the single-turn environment, the reward and the task)
        if the reward returns anything but a finite real number: a string, a bool, None, NaN or inf
        (``verifiers.envs.reward_value``); converting it would train on a bug.
        """
        value = self.reward(self.task_set.task(task_id), completion, num_tokens, self.budget(task_id))
        name = str(getattr(self.reward, "__qualname__", self.reward))
        try:
            return reward_value(value, name)
        except RewardError as error:
            raise error.at(environment="'single_turn'", task_id=task_id) from None


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
