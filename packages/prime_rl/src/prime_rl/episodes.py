"""The run's environment as workers and the validator share it: an episode's environment turns as tokens.

A multi-turn run (``[tasks.environment] name = "python_tool"`` or ``"calculator"``) plays each
sample as an episode of a ``verifiers`` environment (``verifiers.envs``): model turn 0, the
environment's reply, model turn 1, ... up to ``max_turns`` model turns, all in one token sequence
(``api/segments.py``). This module is the one definition both sides use, so that an honest
worker's environment tokens equal the validator's re-derivation exactly:

* :meth:`EpisodeEnv.step`: the transcript after a model turn's text, and the environment's reply
  as tokens (``turn_template`` per message, encoded without special tokens) or ``done``;
* :meth:`EpisodeEnv.score`: the episode's reward, the environment's rubric over the transcript
  (``[components] reward`` and the ``[tasks]`` length term apply to single-turn samples only).

A model turn's text is its tokens decoded without special tokens (``inference.contract.completion_text``).
The episode stops after the turn the environment ends (a final answer) or after ``max_turns``
model turns (the reply to the last turn is not inserted). Torch-free.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from prime_rl.tasks import TaskSet
from verifiers.envs import CalculatorEnv, Environment, Message, PythonToolEnv

if TYPE_CHECKING:
    from prime_rl.config import RunConfig

__all__ = ["EnvStep", "EpisodeEnv", "load_episode_env"]


@dataclass(frozen=True)
class EnvStep:
    """After one model turn: the transcript so far, the tokens the environment inserts (empty when
    ``done``), and whether the environment ended the episode."""

    messages: tuple[Message, ...]
    tokens: tuple[int, ...]
    done: bool


class EpisodeEnv:
    """A ``verifiers`` environment over the run's task set and tokenizer."""

    def __init__(self, env: Environment, task_set: TaskSet, tokenizer: Any, *, turn_template: str) -> None:
        self.env = env
        self.task_set = task_set
        self.tokenizer = tokenizer
        self.turn_template = turn_template

    @property
    def max_turns(self) -> int:
        return int(self.env.max_turns)

    @property
    def replayable(self) -> bool:
        """Whether the environment's replies can be re-derived exactly (``Environment.replayable``)."""
        return bool(self.env.replayable)

    @property
    def limit_markers(self) -> tuple[str, ...]:
        """Texts of a reply the machine may have cut short (``Environment.limit_markers``)."""
        return tuple(getattr(self.env, "limit_markers", ()))

    def start(self, task_id: int) -> tuple[Message, ...]:
        """The transcript before model turn 0 (the environment's first messages)."""
        return self.env.initial_messages(self.task_set.task(task_id))

    def render(self, messages: Sequence[Message]) -> tuple[int, ...]:
        """The tokens the environment inserts for its reply ``messages``."""
        text = "".join(self.turn_template.format(role=m.role, content=m.content) for m in messages)
        return tuple(int(t) for t in self.tokenizer.encode(text, add_special_tokens=False)) if text else ()

    def step(
        self, task_id: int, messages: tuple[Message, ...], model_text: str, *, final: bool = False
    ) -> EnvStep:
        """Add the model turn ``model_text`` to ``messages`` and let the environment answer it
        (``final``: the last turn the budget allows; the environment is not asked, nothing runs)."""
        task = self.task_set.task(task_id)
        messages = (*messages, Message("assistant", model_text))
        if final:
            return EnvStep(messages, (), True)
        reply = self.env.respond(task, messages)
        tokens = () if reply.done else self.render(reply.messages)
        return EnvStep((*messages, *reply.messages), tokens, reply.done or not tokens)

    def score(self, task_id: int, messages: Sequence[Message]) -> float:
        """The episode's reward: the environment's rubric (weight-0 functions are metrics only)."""
        return float(self.env.score(self.task_set.task(task_id), messages).reward)


def load_episode_env(config: RunConfig, task_set: TaskSet, tokenizer: Any) -> EpisodeEnv | None:
    """The run's episode environment, or None for a single-turn run."""
    section = config.tasks.environment
    env: Environment
    if section.name == "single_turn":
        return None
    if section.name == "python_tool":
        env = PythonToolEnv(
            max_turns=section.max_turns, timeout_s=section.tool_timeout_s, feedback=section.feedback
        )
    else:
        env = CalculatorEnv(max_turns=section.max_turns, feedback=section.feedback)
    return EpisodeEnv(env, task_set, tokenizer, turn_template=section.turn_template)
