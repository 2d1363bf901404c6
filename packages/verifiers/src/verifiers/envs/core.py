"""The environment contract: first prompt, environment turns, end of episode, rubric.

An `Environment` turns a `Task` into the first messages, answers each model turn (running the
tool calls it finds in the model's text), says when the episode ends, and scores the finished
transcript with a `Rubric`: a weighted sum of reward functions, where a function of weight 0 is
a metric that is logged but adds nothing (PrimeIntellect verifiers' convention).

Tool-call format (Hermes / Qwen2.5 chat templates): the model writes one JSON object per call
between tags, anywhere in its turn::

    <tool_call>
    {"name": "python", "arguments": {"code": "print(2 ** 10)"}}
    </tool_call>

Each call's result comes back as a `tool` message, in call order. A malformed call (bad JSON, no
"name", unknown tool, arguments not an object) is answered with an error message, not an
exception: the model sees what was wrong and may try again.

Pitfall: `run_episode` is as deterministic as the environment's tools and the policy; the
shipped tools are (see `verifiers.envs.tools`), so a scripted policy gives identical transcripts.
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from numbers import Real

from verifiers.errors import RewardError
from verifiers.task import Task

MAX_TOOL_CALLS_PER_TURN = 8


@dataclass(frozen=True)
class Message:
    """One chat message; `role` is "system", "user", "assistant" or "tool"."""

    role: str
    content: str


@dataclass(frozen=True)
class ToolCall:
    """One parsed call: `name` of the tool and its JSON `arguments` object; `error` says why the
    call could not be parsed (then name/arguments are best effort and the call is not run)."""

    name: str
    arguments: dict = field(default_factory=dict)
    error: str | None = None


_TOOL_CALL = re.compile(r"<tool_call>(.*?)</tool_call>", re.DOTALL)


def parse_tool_calls(text: str) -> tuple[ToolCall, ...]:
    """The tool calls in one model turn, in order (at most MAX_TOOL_CALLS_PER_TURN); never raises.

    >>> parse_tool_calls('<tool_call>{"name": "calculator", "arguments": {"expression": "1+1"}}</tool_call>')
    (ToolCall(name='calculator', arguments={'expression': '1+1'}, error=None),)
    """
    calls: list[ToolCall] = []
    for match in _TOOL_CALL.finditer(text):
        if len(calls) == MAX_TOOL_CALLS_PER_TURN:
            break
        try:
            payload = json.loads(match.group(1))
        except ValueError as exc:
            calls.append(ToolCall("", {}, f"tool call is not valid JSON: {exc}"))
            continue
        if not isinstance(payload, dict) or not isinstance(payload.get("name"), str):
            calls.append(ToolCall("", {}, 'tool call needs a JSON object with a string "name"'))
            continue
        arguments = payload.get("arguments", {})
        if not isinstance(arguments, dict):
            calls.append(ToolCall(payload["name"], {}, '"arguments" must be a JSON object'))
            continue
        calls.append(ToolCall(payload["name"], arguments))
    return tuple(calls)


def reward_value(value: object, function: str) -> float:
    """``value`` as a float if it is a finite real number (an int or a float, not a bool), else
    ``RewardError`` naming ``function``: a string, a bool, None, NaN or inf is a bug in the reward,
    never a number to train on (``float("1.0")`` or ``float(True)`` would hide it).

    >>> reward_value(1, "exact")
    1.0
    >>> reward_value("1.0", "exact")
    Traceback (most recent call last):
      ...
    verifiers.errors.RewardError: reward function 'exact': returned '1.0' (str); a reward must be a finite real number (an int or a float; not a str, bool, None, NaN or inf)
    """
    if isinstance(value, bool) or not isinstance(value, Real) or not math.isfinite(value):
        raise RewardError(value, function=function)
    return float(value)


@dataclass(frozen=True)
class RewardFunc:
    """`fn(task, messages) -> float`; `weight` 0 makes it a logged metric only. What `fn` returns
    must be a finite real number (:func:`reward_value`), or the rubric raises ``RewardError``."""

    name: str
    fn: Callable[[Task, tuple[Message, ...]], float]
    weight: float = 1.0


@dataclass(frozen=True)
class RubricScore:
    """`reward` = sum of weight x value; `metrics` holds every function's value by name."""

    reward: float
    metrics: dict[str, float]


@dataclass(frozen=True)
class Rubric:
    """Weighted reward functions; names must be unique."""

    funcs: tuple[RewardFunc, ...]

    def __post_init__(self) -> None:
        names = [f.name for f in self.funcs]
        if len(set(names)) != len(names):
            raise ValueError(f"rubric function names must be unique, got {names}")

    def score(self, task: Task, messages: Sequence[Message]) -> RubricScore:
        """Every function's value and the weighted sum; ``RewardError`` (naming the function) for a
        value that is not a finite real number."""
        transcript = tuple(messages)
        metrics = {f.name: reward_value(f.fn(task, transcript), f.name) for f in self.funcs}
        reward = sum(f.weight * metrics[f.name] for f in self.funcs)
        return RubricScore(reward, metrics)


@dataclass(frozen=True)
class EnvTurn:
    """What the environment adds after a model turn, and whether the episode is over."""

    messages: tuple[Message, ...]
    done: bool


@dataclass(frozen=True)
class Episode:
    """A finished episode: the whole transcript, its score, and why it ended
    ("done": the environment ended it; "max_turns": the turn budget ran out)."""

    messages: tuple[Message, ...]
    score: RubricScore
    model_turns: int
    ended: str


class Environment:
    """Base class. Subclasses set `rubric` and override `initial_messages` and `respond`."""

    rubric: Rubric
    max_turns: int = 1
    replayable: bool = False
    """True when `respond` is a pure function of (task, messages): re-running it on the same
    transcript gives the same messages (no clock, network or unseeded randomness). A validator
    re-derives the environment's messages only for such environments; an untrusted worker's
    episode in any other environment cannot be checked and must be refused (or its tool outputs
    taken from a trusted service). Subclasses opt in on the class (so class and instance agree);
    the default is the safe one."""
    limit_markers: tuple[str, ...] = ()
    """Texts an environment reply contains where the machine (a time, memory or output limit, a
    sandbox that did not start) may have cut a tool run short; empty for an environment whose
    replies cannot be limited. A validator whose replay of a turn differs from the worker's reply
    calls it unverifiable, not forged, when the worker's reply shows one of these right after
    text the replay agrees with (the worker's machine was the slower one)."""

    def initial_messages(self, task: Task) -> tuple[Message, ...]:
        """The conversation the model sees first (default: the task's prompt as a user turn)."""
        return (Message("user", task.prompt),)

    def respond(self, task: Task, messages: tuple[Message, ...]) -> EnvTurn:
        """Answer the last (assistant) message of `messages`."""
        raise NotImplementedError

    def score(self, task: Task, messages: Sequence[Message]) -> RubricScore:
        """The rubric's score; a ``RewardError`` names this environment's class too."""
        try:
            return self.rubric.score(task, messages)
        except RewardError as error:
            raise error.at(environment=type(self).__name__) from None


def last_assistant(messages: Sequence[Message]) -> str:
    """The content of the last assistant message ("" if there is none)."""
    return next((m.content for m in reversed(messages) if m.role == "assistant"), "")


def run_episode(env: Environment, task: Task, policy: Callable[[tuple[Message, ...]], str]) -> Episode:
    """Play one episode: `policy(messages) -> assistant text`, up to `env.max_turns` model turns."""
    messages = env.initial_messages(task)
    ended = "max_turns"
    turns = 0
    while turns < env.max_turns:
        messages = (*messages, Message("assistant", policy(messages)))
        turns += 1
        reply = env.respond(task, messages)
        messages = (*messages, *reply.messages)
        if reply.done:
            ended = "done"
            break
    return Episode(messages, env.score(task, messages), turns, ended)
