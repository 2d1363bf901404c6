"""Single-turn environments: today's math and code tasks as environments, with unchanged rewards.

The model answers the task's prompt once; the episode ends; the reward is exactly
`verifiers.verify(task, answer).reward` (weight 1). A weight-0 metric logs the answer's length
in characters.
"""

from __future__ import annotations

from verifiers.envs.core import Environment, EnvTurn, Message, RewardFunc, Rubric, last_assistant
from verifiers.registry import verify
from verifiers.task import Task


def verify_reward(task: Task, messages: tuple[Message, ...]) -> float:
    """The task's registered verifier on the last assistant message."""
    return verify(task, last_assistant(messages)).reward


def answer_chars(task: Task, messages: tuple[Message, ...]) -> float:
    return float(len(last_assistant(messages)))


class SingleTurnEnv(Environment):
    """One prompt, one answer, scored by the task type's verifier (any registered type), or by the
    ``rubric`` you pass (your own reward functions over the task and the transcript).

    >>> from verifiers import Task
    >>> env = SingleTurnEnv()
    >>> task = Task("1/2 + 1/4?", "verifiable_math", {"ground_truth": "3/4"})
    >>> env.score(task, (*env.initial_messages(task), Message("assistant", "$\\\\boxed{0.75}$"))).reward
    1.0
    """

    max_turns = 1
    replayable = True  # it never inserts anything

    def __init__(self, rubric: Rubric | None = None) -> None:
        if rubric is not None and not isinstance(rubric, Rubric):
            raise TypeError(f"rubric must be a verifiers.envs.Rubric, got {type(rubric).__name__}")
        self.rubric = rubric or Rubric(
            (RewardFunc("verify", verify_reward, 1.0), RewardFunc("answer_chars", answer_chars, 0.0))
        )

    def respond(self, task: Task, messages: tuple[Message, ...]) -> EnvTurn:
        return EnvTurn((), done=True)


class MathEnv(SingleTurnEnv):
    """`verifiable_math` tasks (boxed answer checked by `verifiers.math`)."""


class CodeEnv(SingleTurnEnv):
    """`prime_rl_code` / `verifiable_code` tasks (last fenced block run against the tests)."""
