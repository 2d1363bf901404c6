"""ToolEnv's feedback mode, the `replayable` declaration (issue 28: episodes a validator re-plays; issue
35: the default is False, class and instance agree, no built-in that reads a clock or the network
claims it) and tool errors as answers (issue 35 item 2)."""

from __future__ import annotations

import inspect
import json
import types

import verifiers
import verifiers.envs
from verifiers import Task
from verifiers.envs import (
    FEEDBACK,
    CalculatorEnv,
    Environment,
    MathEnv,
    Message,
    PythonToolEnv,
    ToolEnv,
    run_episode,
)

TASK = Task("47 * 30?", "verifiable_math", {"ground_truth": "1410"})


def test_feedback_answers_a_wrong_final_answer_and_ends_on_a_right_one():
    script = iter(["\\boxed{1400}", "\\boxed{1410}", "never asked"])
    episode = run_episode(CalculatorEnv(feedback=True), TASK, lambda messages: next(script))
    assert [m.role for m in episode.messages[-3:]] == ["assistant", "user", "assistant"]
    assert episode.messages[-2] == Message("user", FEEDBACK)
    assert (episode.model_turns, episode.ended, episode.score.reward) == (2, "done", 1.0)


def test_without_feedback_a_wrong_answer_ends_the_episode():
    episode = run_episode(CalculatorEnv(), TASK, lambda messages: "\\boxed{1400}")
    assert (episode.model_turns, episode.ended, episode.score.reward) == (1, "done", 0.0)


def test_feedback_stops_at_the_turn_budget():
    episode = run_episode(CalculatorEnv(max_turns=3, feedback=True), TASK, lambda messages: "\\boxed{0}")
    assert (episode.model_turns, episode.ended) == (3, "max_turns")
    assert sum(m.role == "user" and m.content == FEEDBACK for m in episode.messages) == 3


def test_only_environments_that_declare_it_are_replayable():
    assert Environment.replayable is False  # the safe default: a validator refuses to trust its replies
    assert ToolEnv.replayable is False and ToolEnv({"now": lambda arguments: "12:00"}).replayable is False
    assert CalculatorEnv().replayable and PythonToolEnv().replayable and MathEnv().replayable
    clock = ToolEnv({"now": lambda arguments: "12:00"}, replayable=False)
    assert clock.replayable is False


IMPURE_MODULES = frozenset({"time", "datetime", "socket", "urllib", "http", "requests", "uuid", "secrets"})
"""Modules whose use makes a tool's output depend on the clock, the network or fresh randomness."""


def impure_names(function) -> set[str]:
    """The IMPURE_MODULES a Python function names, and those the functions of ``verifiers.envs`` it
    calls name. The code sandbox (``verifiers.code``) is not followed: it reads the clock only to
    enforce the time limit, which is reported as a machine limit, never printed as output."""
    seen: set[str] = set()
    found: set[str] = set()

    def visit(code: types.CodeType, globals_: dict) -> None:
        if code in seen:
            return
        seen.add(code)
        for name in code.co_names:
            target = globals_.get(name)
            if name in IMPURE_MODULES or getattr(target, "__name__", "").split(".")[0] in IMPURE_MODULES:
                found.add(name)
            if inspect.isfunction(target) and target.__module__.startswith("verifiers.envs"):
                visit(target.__code__, target.__globals__)
        for const in code.co_consts:
            if isinstance(const, types.CodeType):
                visit(const, globals_)

    visit(function.__code__, function.__globals__)
    return found


def builtin_environments() -> list[Environment]:
    classes = [getattr(verifiers.envs, name) for name in verifiers.envs.__all__]
    return [cls() for cls in classes if isinstance(cls, type) and issubclass(cls, Environment) and cls not in (Environment, ToolEnv)]


def clock_problems(env: Environment) -> list[str]:
    """Why ``env`` must not claim to be replayable (empty: it may)."""
    problems = []
    if type(env).replayable != env.replayable:
        problems.append(f"{type(env).__name__}: class says replayable={type(env).replayable}, instance {env.replayable}")
    if env.replayable:
        for name, tool in getattr(env, "tools", {}).items():
            names = impure_names(tool)
            if names:
                problems.append(f"{type(env).__name__}.{name} reads {sorted(names)} but claims to be replayable")
    return problems


def test_no_builtin_environment_that_reads_the_clock_or_the_network_claims_to_be_replayable():
    envs = builtin_environments()
    assert {type(e).__name__ for e in envs} >= {"CalculatorEnv", "PythonToolEnv", "MathEnv", "CodeEnv"}
    assert [p for env in envs for p in clock_problems(env)] == []
    # the check can fail: a clock tool declared replayable, and a class/instance disagreement
    import time

    class Clock(ToolEnv):
        replayable = True

    clock = Clock({"now": lambda arguments: str(time.time())})
    assert clock_problems(clock) == ["Clock.now reads ['time'] but claims to be replayable"]
    clock.replayable = False
    assert "class says replayable=True, instance False" in clock_problems(clock)[0]


def test_a_tool_that_raises_answers_with_an_error_and_the_episode_goes_on():
    def divide(arguments: dict) -> str:
        return str(arguments["a"] / arguments["b"])

    env = ToolEnv({"divide": divide}, max_turns=3)
    calls = [
        '<tool_call>{"name": "divide", "arguments": {"a": 1, "b": 0}}</tool_call>',
        '<tool_call>{"name": "divide", "arguments": {"a": 2820, "b": 2}}</tool_call>',
        "\\boxed{1410}",
    ]
    script = iter(calls)
    episode = run_episode(env, TASK, lambda messages: next(script))
    tools = [m.content for m in episode.messages if m.role == "tool"]
    assert tools == ["error: divide raised ZeroDivisionError: division by zero", "1410.0"]
    assert (episode.model_turns, episode.ended, episode.score.reward) == (3, "done", 1.0)
    assert episode.score.metrics["bad_tool_calls"] == 1.0  # the rubric sees the failed call
    # a tool that returns something other than text is an error answer too
    odd = ToolEnv({"odd": lambda arguments: 42}).respond(TASK, (Message("assistant", calls[0].replace("divide", "odd")),))
    assert odd.messages[0].content == "error: odd returned int, not text" and not odd.done


def test_the_python_tool_runs_in_the_same_environment_everywhere_and_reports_its_limits():
    from verifiers.envs.tools import LIMIT_MARKERS, TOOL_ENVIRONMENT, python_tool

    shown = python_tool({"code": "import os, random\nprint(sorted(os.environ.items()), random.random())"})
    environment, draw = shown.rsplit(" ", 1)
    assert environment == str(sorted(TOOL_ENVIRONMENT.items())) and float(draw) == 0.8444218515250481  # seed 0
    with verifiers.machine_limits() as seen:
        out = python_tool({"code": "print('x' * 5000, flush=True)\nimport time\ntime.sleep(5)"}, timeout_s=0.3)
    assert seen.causes == ["tool_timeout"] and out.endswith("\n[timeout]\n") and len(out) == 4000
    assert any(marker in out for marker in LIMIT_MARKERS)
    with verifiers.machine_limits() as seen:
        python_tool({"code": "raise ValueError(json)".replace("json", json.dumps("x"))})
    assert seen.causes == []  # a program's own error is not the machine's
