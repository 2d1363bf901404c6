"""Environments: tool-call parsing, rubric weights, single-turn rewards unchanged, deterministic tools."""

from __future__ import annotations

from fractions import Fraction

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from verifiers import Task, verify
from verifiers.envs import (
    CalculatorEnv,
    CalculatorError,
    CodeEnv,
    MathEnv,
    Message,
    PythonToolEnv,
    RewardFunc,
    Rubric,
    ToolCall,
    calculate,
    parse_tool_calls,
    run_episode,
)


def call(name: str, **arguments: object) -> str:
    import json

    return f"<tool_call>{json.dumps({'name': name, 'arguments': arguments})}</tool_call>"


def scripted(*turns: str):
    """A policy that plays `turns` in order and records what it was shown."""
    remaining = list(turns)
    seen: list[tuple[Message, ...]] = []

    def policy(messages: tuple[Message, ...]) -> str:
        seen.append(messages)
        return remaining.pop(0)

    policy.seen = seen  # type: ignore[attr-defined]
    return policy


# ------------------------------------------------------------------ parsing and rubric


def test_parse_tool_calls_in_order_with_errors_explained():
    text = (
        "Let me compute. " + call("python", code="print(1)") + " and "
        '<tool_call>{"name": "calculator", "arguments": "1+1"}</tool_call>'
        "<tool_call>{not json}</tool_call><tool_call>[1, 2]</tool_call>"
    )
    calls = parse_tool_calls(text)
    assert calls[0] == ToolCall("python", {"code": "print(1)"})
    assert calls[1].name == "calculator" and "must be a JSON object" in calls[1].error
    assert "not valid JSON" in calls[2].error
    assert 'string "name"' in calls[3].error
    assert parse_tool_calls("no calls here, \\boxed{3}") == ()
    assert len(parse_tool_calls(call("python", code="1") * 50)) == 8  # bounded per turn


@given(st.text(max_size=300))
@settings(max_examples=200, deadline=None)
def test_parse_tool_calls_never_raises(text):
    for parsed in parse_tool_calls(text) + parse_tool_calls(f"<tool_call>{text}</tool_call>"):
        assert isinstance(parsed, ToolCall)


def test_rubric_weight_zero_is_logged_not_added():
    task = Task("q", "verifiable_math", {"ground_truth": "1"})
    rubric = Rubric(
        (
            RewardFunc("a", lambda t, m: 1.0, 0.5),
            RewardFunc("b", lambda t, m: 4.0, 0.25),
            RewardFunc("length", lambda t, m: 123.0, 0.0),
        )
    )
    score = rubric.score(task, ())
    assert score.reward == 0.5 * 1.0 + 0.25 * 4.0  # 1.5; the metric adds nothing
    assert score.metrics == {"a": 1.0, "b": 4.0, "length": 123.0}
    with pytest.raises(ValueError, match="unique"):
        Rubric((RewardFunc("a", lambda t, m: 0.0), RewardFunc("a", lambda t, m: 0.0)))


# ------------------------------------------------------------------ single turn


@pytest.mark.parametrize(
    ("answer", "expected"),
    [("so $\\boxed{0.75}$", 1.0), ("$\\boxed{\\frac{3}{4}}$", 1.0), ("$\\boxed{0.7}$", 0.0), ("no box", 0.0)],
)
def test_math_env_reward_is_verify(answer, expected):
    task = Task("1/2 + 1/4?", "verifiable_math", {"ground_truth": "3/4"})
    episode = run_episode(MathEnv(), task, scripted(answer))
    assert episode.messages == (Message("user", task.prompt), Message("assistant", answer))
    assert episode.score.reward == verify(task, answer).reward == expected
    assert episode.model_turns == 1 and episode.ended == "done"
    assert episode.score.metrics["answer_chars"] == len(answer)


@pytest.mark.parametrize(
    ("program", "expected"), [("print(int(input()) * 2)", 1.0), ("print(int(input()) + 2)", 0.0)]
)
def test_code_env_reward_is_verify(program, expected):
    task = Task(
        "double it", "prime_rl_code", {"test_cases": {"inputs": ["3\n", "5\n"], "outputs": ["6\n", "10\n"]}}
    )
    answer = f"```python\n{program}\n```"
    episode = run_episode(CodeEnv(), task, scripted(answer))
    assert episode.score.reward == verify(task, answer).reward == expected


# ------------------------------------------------------------------ calculator


@pytest.mark.parametrize(
    ("expression", "value"),
    [
        ("47 * 30", "1410"),
        ("1/3 + 0.5", "5/6"),
        ("2^10 - 1", "1023"),
        ("-(7 // 2) % 5", "2"),
        ("0.1 + 0.2", "3/10"),
    ],
)
def test_calculate_is_exact(expression, value):
    assert calculate(expression) == value


@pytest.mark.parametrize(
    "expression", ["1/0", "2 ** 0.5", "2 ** 100000", "__import__('os')", "x + 1", "(" * 300]
)
def test_calculate_refuses_what_it_cannot_do_exactly(expression):
    with pytest.raises(CalculatorError):
        calculate(expression)


@given(st.integers(-(10**6), 10**6), st.integers(-(10**6), 10**6), st.integers(1, 10**6))
@settings(max_examples=100, deadline=None)
def test_calculate_matches_fraction_arithmetic(a, b, c):
    expected = Fraction(a) * Fraction(b) + Fraction(a, c)
    got = calculate(f"{a} * {b} + {a} / {c}")
    assert Fraction(got) == expected


def test_calculator_episode():
    task = Task("What is 47 * 30 + 1/2?", "verifiable_math", {"ground_truth": "2821/2"})
    policy = scripted(
        call("calculator", expression="47 * 30 + 1/2") + call("calculator", expression="1/0"),
        call("abacus", beads=3),
        "The answer is $\\boxed{1410.5}$.",
    )
    episode = run_episode(CalculatorEnv(), task, policy)
    tools = [m.content for m in episode.messages if m.role == "tool"]
    assert tools[0] == "2821/2" and tools[1] == "error: division by zero"
    assert tools[2].startswith("error: unknown tool 'abacus'")
    assert episode.model_turns == 3 and episode.ended == "done"
    assert episode.score.reward == 1.0
    assert episode.score.metrics == {"verify": 1.0, "tool_calls": 3.0, "bad_tool_calls": 2.0}
    assert policy.seen[1][-2:] == (Message("tool", "2821/2"), Message("tool", "error: division by zero"))


def test_turn_budget_ends_the_episode():
    task = Task("q", "verifiable_math", {"ground_truth": "2"})
    episode = run_episode(
        CalculatorEnv(max_turns=2), task, scripted(*[call("calculator", expression="1+1")] * 2)
    )
    assert episode.ended == "max_turns" and episode.model_turns == 2 and episode.score.reward == 0.0


# ------------------------------------------------------------------ python tool


PROGRAM = (
    "import random\n"
    "words = {'apple', 'banana', 'cherry', 'date', 'elder', 'fig'}\n"
    "print(list(words))\n"  # set order depends on the hash seed
    "print(random.randint(0, 10**9))\n"  # depends on the seed of random
    "print(sum(i * i for i in range(10)))\n"
)


def test_python_tool_scripted_episode_is_identical_when_rerun():
    task = Task("Sum of squares below 10?", "verifiable_math", {"ground_truth": "285"})
    turns = (
        call("python", code=PROGRAM),
        call("python", code="raise ValueError('boom')") + call("python", code="print(input())"),
        "It is $\\boxed{285}$.",
    )
    first = run_episode(PythonToolEnv(), task, scripted(*turns))
    second = run_episode(PythonToolEnv(), task, scripted(*turns))
    assert first == second  # transcripts, scores and turn counts
    tools = [m.content for m in first.messages if m.role == "tool"]
    assert tools[0].splitlines()[-1] == "285"
    assert (
        "[runtime_error]" in tools[1]
        and "ValueError: boom" in tools[1]
        and 'File "<code>", line 1' in tools[1]
    )
    assert tools[2].startswith("\n[runtime_error]") and "input()" in tools[2]  # the tool has no stdin
    assert first.score.reward == 1.0 and first.score.metrics["tool_calls"] == 3.0
    assert first.messages[0].role == "system" and "<tool_call>" in first.messages[0].content


def test_python_tool_output_is_fixed_across_fresh_processes(tmp_path):
    # A new interpreter has a new hash seed: a deterministic tool must not depend on it.
    import json
    import subprocess
    import sys

    script = (
        "import json; from verifiers.envs import python_tool; "
        f"print(json.dumps(python_tool({{'code': {PROGRAM!r}}})))"
    )
    outputs = {
        json.loads(subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, check=True,
                                  timeout=120).stdout)
        for _ in range(3)
    }  # fmt: skip
    assert len(outputs) == 1


def test_python_tool_timeout_and_bad_arguments():
    env = PythonToolEnv(timeout_s=1.0)
    assert env.run_tool("python", {"code": "while True: pass"}).endswith("[timeout]\n")
    assert env.run_tool("python", {"source": "print(1)"}).startswith("error: the python tool needs")
