"""Task schema, registry and the built-in verifiers through `verify`."""

from __future__ import annotations

import json
import math

import pytest

from verifiers import (
    Score,
    Task,
    TaskFormatError,
    UnknownTaskTypeError,
    get_verifier,
    register_verifier,
    registered_task_types,
    verify,
)


def test_task_accepts_dict_json_and_python_literal():
    a = Task("p", "verifiable_math", {"ground_truth": "1"})
    b = Task("p", "verifiable_math", '{"ground_truth": "1"}')
    c = Task("p", "verifiable_math", "{'ground_truth': '1'}")  # GENESYS stores Python literals
    assert a.verification_info == b.verification_info == c.verification_info == {"ground_truth": "1"}
    with pytest.raises(TaskFormatError):
        Task("p", "verifiable_math", "[1, 2]")
    with pytest.raises(TaskFormatError):
        Task("p", "verifiable_math", "{broken")
    with pytest.raises(TaskFormatError):
        Task("p", "", {})


def test_intellect2_row_round_trip():
    row = {
        "problem_id": "id-1",
        "task_type": "verifiable_math",
        "prompt": "What is 2+2?",
        "verification_info": json.dumps({"ground_truth": "4"}),
        "solve_rate_qwen_r1_distill_7b": 0.5,
        "extra_column": 7,
    }
    task = Task.from_row(row)
    assert task.solve_rate == 0.5 and task.metadata == {"extra_column": 7}
    back = task.to_row()
    assert json.loads(back["verification_info"]) == {"ground_truth": "4"}
    assert Task.from_row(back).verification_info == task.verification_info
    with pytest.raises(TaskFormatError, match="lacks"):
        Task.from_row({"prompt": "x"})


def test_score_is_frozen_and_bounded():
    score = Score(1, {"a": 1})
    assert score.reward == 1.0 and isinstance(score.reward, float)
    with pytest.raises(AttributeError):
        score.reward = 0.5  # type: ignore[misc]
    for bad in (-0.1, 1.5, math.nan, math.inf):
        with pytest.raises(ValueError):
            Score(bad)


def test_unknown_task_type_is_a_specific_error():
    with pytest.raises(UnknownTaskTypeError, match="known:"):
        verify(Task("p", "no_such_type", {}), "x")
    assert {"verifiable_math", "prime_rl_code", "verifiable_code", "arithmetic_exact"} <= set(
        registered_task_types()
    )


def test_register_in_one_call_and_errors_become_scores():
    register_verifier(
        "test_echo", lambda task, completion: Score(float(completion == task.prompt)), replace=True
    )
    assert verify(Task("hi", "test_echo"), "hi").reward == 1.0
    with pytest.raises(ValueError, match="registered"):
        register_verifier("test_echo", lambda t, c: Score(0))

    @register_verifier("test_boom", replace=True)
    def boom(task, completion):
        raise RuntimeError("bug in verifier")

    score = verify(Task("x", "test_boom"), "y")
    assert score.reward == 0.0 and score.failure == "error" and "bug in verifier" in score.details["error"]
    assert get_verifier("test_boom") is boom


@pytest.mark.parametrize(
    ("completion", "reward", "failure"),
    [
        ("<think>hmm</think> The answer is $\\boxed{\\frac{3}{4}}$", 1.0, None),
        ("\\boxed{0.75}", 1.0, None),
        ("\\boxed{0.7}", 0.0, "mismatch"),
        ("no box here", 0.0, "no_answer"),
        ("The final answer is 3/4", 1.0, None),
    ],
)
def test_math_verifier(warm_pool, completion, reward, failure):
    task = Task("1/2 + 1/4?", "verifiable_math", {"ground_truth": "\\boxed{\\frac34}"})
    score = verify(task, completion)
    assert (score.reward, score.failure) == (reward, failure)


def test_math_verifier_think_gate_and_gold_lists(warm_pool):
    gated = Task("q", "verifiable_math", {"ground_truth": ["2", "-2"], "require_think_close": True})
    assert verify(gated, "<think>\\boxed{2}").failure == "no_answer"
    assert verify(gated, "<think>x</think>\\boxed{-2}").reward == 1.0
    with pytest.raises(TaskFormatError, match="ground_truth"):
        verify(Task("q", "verifiable_math", {}), "\\boxed{1}")


def test_code_verifier_binary_and_partial():
    tests = json.dumps({"inputs": ["1\n", "2\n"], "outputs": ["2\n", "3\n"]})
    half = "```python\nn = int(input())\nprint(2 if n == 1 else 0)\n```"
    binary = Task("inc", "prime_rl_code", {"test_cases": tests})
    partial = Task("inc", "prime_rl_code", {"test_cases": tests, "partial_credit": True})
    assert verify(binary, half).reward == 0.0
    assert verify(partial, half).reward == 0.5
    assert verify(binary, "```python\nprint(int(input()) + 1)\n```").reward == 1.0
    assert verify(binary, "no code").failure == "no_code"
    genesys = Task(
        "inc",
        "verifiable_code",
        {
            "language": "python",
            "test_cases": [
                {"type": "stdin_stdout", "input": "1\n", "output": "2\n"},
                {"type": "stdin_stdout", "input": "2\n", "output": "3\n"},
            ],
        },
    )
    assert verify(genesys, half).reward == 0.5
    rust = Task("inc", "verifiable_code", {"language": "rust", "test_cases": []})
    assert verify(rust, "```rust\nfn main(){}\n```").failure == "unsupported_language"


def test_arithmetic_verifier_match_modes():
    task = Task("2+3?", "arithmetic_exact", {"answer": 5})
    assert verify(task, "5").reward == 1.0
    assert verify(task, "5, because 2+3=5").reward == 1.0
    assert verify(task, "2+3=5").reward == 0.0  # first integer is 2
    assert (
        verify(Task("2+3?", "arithmetic_exact", {"answer": 5, "match": "last_integer"}), "2+3=5").reward
        == 1.0
    )
    assert verify(Task("-1?", "arithmetic_exact", {"answer": -1}), "-1").reward == 1.0
    assert (
        verify(
            Task("x", "arithmetic_exact", {"answer": 1234, "match": "boxed"}), "1 so \\boxed{1,234}"
        ).reward
        == 1.0
    )
    assert verify(task, "no digits").failure == "no_answer"
