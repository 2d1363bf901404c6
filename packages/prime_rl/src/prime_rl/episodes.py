"""The run's environment as workers and the validator share it: an episode's environment turns as tokens.

A multi-turn run (``[tasks.environment] name``: ``"python_tool"``, ``"calculator"``, an import path
of your own environment or an entry-point name, :func:`load_environment`) plays each
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
from importlib.metadata import entry_points
from typing import TYPE_CHECKING, Any

from prime_rl.config.components import ComponentError, load_component
from prime_rl.config.environment import environment_digest, environment_source
from prime_rl.config.sections import BUILTIN_ENVIRONMENTS, ENVIRONMENT_ENTRY_POINTS, EnvironmentConfig
from prime_rl.tasks import TaskSet
from verifiers.envs import CalculatorEnv, Environment, Message, PythonToolEnv, check_environment, defined_at
from verifiers.errors import EnvironmentSpecError, RewardError

if TYPE_CHECKING:
    from prime_rl.config import RunConfig

__all__ = [
    "EnvStep",
    "EpisodeEnv",
    "check_run_environment",
    "check_same_environment",
    "load_environment",
    "load_episode_env",
]

KEY = "tasks.environment.name"


@dataclass(frozen=True)
class EnvStep:
    """After one model turn: the transcript so far, the tokens the environment inserts (empty when
    ``done``), and whether the environment ended the episode."""

    messages: tuple[Message, ...]
    tokens: tuple[int, ...]
    done: bool


class EpisodeEnv:
    """A ``verifiers`` environment over the run's task set and tokenizer."""

    def __init__(
        self, env: Environment, task_set: TaskSet, tokenizer: Any, *, turn_template: str, name: str = ""
    ) -> None:
        self.env = env
        self.name = name or type(env).__name__
        """The environment as errors name it: the configured ``[tasks.environment] name``."""
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
        """The episode's reward: the environment's rubric (weight-0 functions are metrics only).

        Raises ``verifiers.RewardError`` naming the environment, the reward function and ``task_id``
        when a function returns anything but a finite real number (``verifiers.envs.reward_value``).
        """
        try:
            return float(self.env.score(self.task_set.task(task_id), messages).reward)
        except RewardError as error:
            raise RewardError(
                error.value, function=error.function, environment=repr(self.name), task_id=task_id
            ) from None


def load_environment(section: EnvironmentConfig) -> Environment | None:
    """The ``verifiers`` environment ``[tasks.environment]`` names, or None for a single-turn run.

    ``name`` is a built-in (``python_tool``, ``calculator``), an import path (``module:attribute``
    or ``path/to/file.py:attribute``, imported like ``[components] reward``), or a name an installed
    package registers under the entry-point group ``verifiers.environments``. What it names is an
    ``Environment`` subclass or a factory, called with ``args`` as keyword arguments, or an instance
    (then ``args`` must be empty). Raises ``ComponentError`` (``prime-rl <role>`` exits 2 with it)
    when it cannot be imported, is not an environment, or breaks the contract
    (:func:`check_run_environment`: ``verifiers.envs.check_environment``, and replayable).
    """
    env = _construct(section)
    if env is not None:
        check_run_environment(env, section)
    return env


def check_run_environment(env: Environment, section: EnvironmentConfig) -> None:
    """Raise ``ComponentError`` with one message naming the key, where ``env`` is defined (file and
    attribute) and the rule it breaks: the ``verifiers`` contract (``check_environment``: rubric,
    reward signatures and return types, tool schema, turns), and the run's own rule that every
    environment is ``replayable``: its episodes come from untrusted workers, and the validator
    accepts one only after re-deriving every message the environment inserted, so an environment
    it cannot re-run could have none of its episodes accepted (a single-turn environment inserts
    nothing and declares it: ``SingleTurnEnv.replayable`` is True).
    """
    try:
        check_environment(env)
    except EnvironmentSpecError as error:
        raise ComponentError(f"{KEY} = {section.name!r}: {error}") from None
    if env.replayable is not True:
        raise ComponentError(
            f"{KEY} = {section.name!r}: {defined_at(env)}: replayable: is False, but every environment of a run must be "
            "replayable: the validator accepts an episode only after re-running the environment on it, so it could "
            "accept none of this one's. Declare `replayable = True` on the class if every reply is a pure function of "
            "the transcript (no clock, network or unseeded randomness)"
        )


def _construct(section: EnvironmentConfig) -> Environment | None:
    """The environment ``section`` names, constructed but not yet checked (:func:`load_environment`)."""
    key = KEY
    if section.name == "single_turn":
        return None
    if section.name == "python_tool":
        return PythonToolEnv(max_turns=section.max_turns, timeout_s=section.tool_timeout_s, feedback=section.feedback)
    if section.name == "calculator":
        return CalculatorEnv(max_turns=section.max_turns, feedback=section.feedback)
    target: object
    if ":" in section.name:
        target = load_component(key, section.name)
    else:
        found = entry_points(group=ENVIRONMENT_ENTRY_POINTS, name=section.name)
        if not found:
            installed = sorted(e.name for e in entry_points(group=ENVIRONMENT_ENTRY_POINTS))
            raise ComponentError(
                f"{key} = {section.name!r}: not a built-in ({', '.join(BUILTIN_ENVIRONMENTS)}), not an import path "
                f"('module:attribute' or 'file.py:attribute'), and no installed package registers it under the "
                f"entry-point group {ENVIRONMENT_ENTRY_POINTS!r} (registered: {', '.join(installed) or 'none'})"
            )
        target = next(iter(found)).load()
    if isinstance(target, Environment):
        if section.args:
            raise ComponentError(f"{key} = {section.name!r} is an environment instance; it takes no args")
        return target
    if not callable(target):
        raise ComponentError(f"{key} = {section.name!r}: must be an Environment, its class or a factory, got {target!r:.80}")
    try:
        env = target(**section.args)
    except TypeError as exc:
        raise ComponentError(f"{key} = {section.name!r} does not take args {section.args}: {exc}") from exc
    if not isinstance(env, Environment):
        raise ComponentError(
            f"{key} = {section.name!r} returned {type(env).__name__}, not a verifiers.envs.Environment"
        )
    return env


def load_episode_env(config: RunConfig, task_set: TaskSet, tokenizer: Any) -> EpisodeEnv | None:
    """The run's episode environment (:func:`load_environment`, checked), or None for a single-turn run."""
    section = config.tasks.environment
    env = load_environment(section)
    if env is None:
        return None
    return EpisodeEnv(env, task_set, tokenizer, turn_template=section.turn_template, name=section.name)


def check_same_environment(section: EnvironmentConfig, published: str, *, role: str, url: str) -> None:
    """Raise ``ComponentError`` when the run's environment digest ``published`` in ``GET /status``
    (``StatusResponse.environment``) differs from this process's own (``config/environment.py``):
    its episodes would be re-derived differently by the validator and every lease rejected. Nothing
    is compared when either side does not know its digest ("")."""
    mine = environment_digest(section)
    if not published or not mine or published == mine:
        return
    source = environment_source(section)
    raise ComponentError(
        f"{KEY} = {section.name!r}: this {role}'s environment (digest {mine}"
        f"{f', source {source}' if source else ''}) differs from the run's (digest {published}, in GET /status "
        f"of {url}): the validator would re-derive its episodes differently and reject them. Use the run's copy of "
        "the environment's file and the same [tasks.environment] settings (args, max_turns, turn_template)"
    )
