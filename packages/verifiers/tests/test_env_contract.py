"""Issue 48: rewards are numbers or an error, and an environment's contract is checked before it plays.

A reward that returns ``"1.0"`` or ``True`` used to be converted by ``float()``, and NaN or inf
passed the rubric; each is now a ``RewardError`` that names the function (and, through
``Environment.score``, the environment). ``check_environment`` reads what can be read without
playing: the rubric, each function's signature and return annotation, the tools, the turns.
"""

from __future__ import annotations

import math
from typing import Optional

import pytest

from verifiers import EnvironmentSpecError, RewardError, Task
from verifiers.envs import (
    CalculatorEnv,
    CodeEnv,
    Environment,
    MathEnv,
    Message,
    PythonToolEnv,
    RewardFunc,
    Rubric,
    SingleTurnEnv,
    ToolEnv,
    check_environment,
    reward_value,
)

TASK = Task("Reverse 'abc'.", "verifiable_math", {"ground_truth": "cba"})
ANSWER = (Message("user", TASK.prompt), Message("assistant", "cba"))
NOT_NUMBERS = ["1.0", True, False, None, math.nan, math.inf, -math.inf]


def exact(task: Task, messages: tuple[Message, ...]) -> float:
    return float(messages[-1].content == "cba")


@pytest.mark.parametrize("value", NOT_NUMBERS, ids=repr)
def test_a_reward_that_is_not_a_finite_real_number_is_an_error_naming_the_environment_and_function(value: object):
    class Reverse(SingleTurnEnv):
        pass

    env = Reverse(Rubric((RewardFunc("exact", exact), RewardFunc("bad", lambda task, messages: value, 0.0))))
    with pytest.raises(RewardError) as refused:
        env.score(TASK, ANSWER)
    assert refused.value.function == "bad" and refused.value.environment == "Reverse"
    assert str(refused.value).startswith(f"environment Reverse, reward function 'bad': returned {value!r} (")
    assert "a reward must be a finite real number" in str(refused.value)
    assert str(refused.value.at(task_id=7)).startswith("environment Reverse, reward function 'bad', task 7: ")


@pytest.mark.parametrize("value", [0, 1, 0.25, -3, 2**40])
def test_ints_and_floats_are_rewards(value: float):
    assert reward_value(value, "f") == float(value) and type(reward_value(value, "f")) is float


def test_single_turn_env_takes_its_own_rubric():
    env = SingleTurnEnv(Rubric((RewardFunc("exact", exact),)))
    assert env.score(TASK, ANSWER).reward == 1.0 and env.score(TASK, ANSWER).metrics == {"exact": 1.0}
    assert SingleTurnEnv().rubric.funcs[0].name == "verify"  # the default: the task type's verifier
    with pytest.raises(TypeError, match=r"rubric must be a verifiers\.envs\.Rubric, got function"):
        SingleTurnEnv(exact)  # type: ignore[arg-type]


def as_text(task: Task, messages: tuple[Message, ...]) -> str:
    return "1.0"


def as_bool(task: Task, messages: tuple[Message, ...]) -> bool:
    return True


def maybe(task: Task, messages: tuple[Message, ...]) -> Optional[float]:  # noqa: UP045 - what an author writes
    return None


def as_int(task: Task, messages: tuple[Message, ...]) -> int:
    return 1


def one_argument(messages: tuple[Message, ...]) -> float:
    return 1.0


@pytest.mark.parametrize(
    ("fn", "rule"),
    [
        (as_text, "is annotated to return str; a reward must return a finite real number"),
        (as_bool, "is annotated to return bool;"),
        (maybe, "is annotated to return typing.Optional[float];"),
        (one_argument, "must be callable as fn(task, messages); its signature is (messages:"),
    ],
)
def test_a_reward_function_with_the_wrong_signature_or_return_type_is_refused_before_playing(fn, rule: str):
    env = SingleTurnEnv(Rubric((RewardFunc(fn.__name__, fn),)))
    with pytest.raises(EnvironmentSpecError) as refused:
        check_environment(env)
    assert refused.value.attribute.startswith(f"rubric function {fn.__name__!r} ({__file__}:{fn.__name__})")
    assert refused.value.where.endswith("single_turn.py:SingleTurnEnv") and rule in refused.value.rule


def test_the_tool_schema_and_the_turns_are_checked():
    def no_arguments() -> str:
        return ""

    def returns_a_number(arguments: dict) -> int:
        return 1

    for tools, rule in [
        ({}, "must be a non-empty dict of name -> tool"),
        ({"look up": lambda arguments: ""}, "tool name 'look up' must match"),
        ({"lookup": no_arguments}, "must be callable as tool(arguments) -> str (one dict); its signature is ()"),
        ({"lookup": returns_a_number}, "is annotated to return int; a tool returns str"),
        ({"lookup": "not callable"}, "must be callable as tool(arguments) -> str, got str"),
    ]:
        with pytest.raises(EnvironmentSpecError, match="tools") as refused:
            check_environment(ToolEnv(tools, replayable=True))  # type: ignore[arg-type]
        assert rule in str(refused.value), (tools, str(refused.value))
    with pytest.raises(EnvironmentSpecError, match="max_turns: must be an int >= 1, got 0"):
        check_environment(ToolEnv({"a": lambda arguments: ""}, max_turns=0))

    class NoRespond(Environment):
        max_turns = 2
        rubric = Rubric((RewardFunc("exact", exact),))

    with pytest.raises(EnvironmentSpecError, match="respond: max_turns is 2, but respond is not overridden"):
        check_environment(NoRespond())


def test_every_builtin_environment_keeps_the_contract():
    for env in (SingleTurnEnv(), MathEnv(), CodeEnv(), CalculatorEnv(), PythonToolEnv()):
        check_environment(env)
    check_environment(SingleTurnEnv(Rubric((RewardFunc("exact", exact), RewardFunc("n", as_int, 0.0)))))
