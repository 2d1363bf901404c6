"""Built-in verifiers, registered on import: math, code (INTELLECT-2 and GENESYS) and ours.

| task_type          | verification_info keys (defaults)                                      | reward |
|--------------------|-------------------------------------------------------------------------|--------|
| verifiable_math    | ground_truth (str/number/list), timeout (5), require_think_close (False), fallbacks (["final_answer"]) | {0, 1} |
| prime_rl_code      | test_cases ({inputs, outputs, fn_name?} or JSON), partial_credit (False), timeout_per_test (5), memory_mb (512), program_prefix/suffix ("") | {0, 1} or fraction |
| verifiable_code    | GENESYS: language, test_cases [{type, input, output, fn_name?}], partial_credit (True) | fraction |
| arithmetic_exact   | answer (int), match ("first_integer" / "last_integer" / "boxed")        | {0, 1} |
"""

from __future__ import annotations

import re

from verifiers.code import extract_code, run_tests
from verifiers.errors import TaskFormatError
from verifiers.math import compare_answers, extract_answer
from verifiers.math.extract import last_boxed
from verifiers.registry import register_verifier
from verifiers.task import Score, Task


def _require(task: Task, key: str) -> object:
    if key not in task.verification_info:
        raise TaskFormatError(
            f"{task.task_type} task {task.problem_id!r} lacks verification_info[{key!r}]; "
            f"has {sorted(task.verification_info)}"
        )
    return task.verification_info[key]


def gold_answers(ground_truth: object) -> list[str]:
    """INTELLECT-2's gold list: each element as str, boxed golds unboxed."""
    golds = ground_truth if isinstance(ground_truth, list | tuple) else [ground_truth]
    out = []
    for gold in golds:
        text = str(gold)
        boxed = last_boxed(text) if "\\boxed" in text or "\\fbox" in text else None
        out.append(boxed if boxed is not None else text)
    return out


def verify_math(task: Task, completion: str) -> Score:
    """`verifiable_math`: extracted answer equivalent to any gold (see `verifiers.math`)."""
    info = task.verification_info
    golds = gold_answers(_require(task, "ground_truth"))
    answer = extract_answer(
        completion,
        require_think_close=bool(info.get("require_think_close", False)),
        fallbacks=tuple(info.get("fallbacks", ("final_answer",))),
    )
    if answer is None:
        return Score(0.0, {"answer": None}, "no_answer")
    timed_out = False
    for gold in golds:
        verdict = compare_answers(gold, answer, timeout=float(info.get("timeout", 5.0)))
        if verdict.equal:
            return Score(1.0, {"answer": answer, "gold": gold, "reason": verdict.reason}, wall_clock_checked=True)
        timed_out = timed_out or verdict.reason == "timeout"
    return Score(
        0.0,
        {"answer": answer, "gold": golds},
        "timeout" if timed_out else "mismatch",
        machine_limit="math_timeout" if timed_out else None,
        wall_clock_checked=True,
    )


def _score_code(task: Task, completion: str, *, partial_default: bool) -> Score:
    info = task.verification_info
    tests = _require(task, "test_cases")
    language = str(info.get("language", "python")).lower()
    if language not in ("python", "python3", "py"):
        return Score(0.0, {"language": language}, "unsupported_language")
    code = extract_code(completion, require_think_close=bool(info.get("require_think_close", False)))
    if code is None:
        return Score(0.0, {"code": None}, "no_code")
    program = f"{info.get('program_prefix', '')}{code}{info.get('program_suffix', '')}"
    result = run_tests(
        program,
        tests,
        timeout_per_test=float(info.get("timeout_per_test", 5.0)),
        memory_mb=int(info.get("memory_mb", 512)),
    )
    partial = bool(info.get("partial_credit", partial_default))
    reward = result.fraction if partial else float(result.all_passed)
    details = {
        "passed": result.passed,
        "total": result.total,
        "statuses": [o.status for o in result.outcomes],
        "sandbox": result.sandbox,
    }
    if result.error and result.passed < result.total:
        details["error"] = result.error
    # Limited by the machine only where a re-run could raise the reward: with partial credit, any
    # test the machine failed; binary, only when the machine failed every test that failed.
    limited = result.machine_failed > 0 and (partial or result.passed + result.machine_failed == result.total)
    return Score(
        reward,
        details,
        None if result.all_passed else "tests_failed",
        machine_limit=result.machine_limit if limited else None,  # type: ignore[arg-type]
        wall_clock_checked=True,
    )


def verify_code(task: Task, completion: str) -> Score:
    """`prime_rl_code`: last fenced block run against the tests; binary unless partial_credit."""
    return _score_code(task, completion, partial_default=False)


def verify_genesys_code(task: Task, completion: str) -> Score:
    """`verifiable_code` (GENESYS): fraction of tests passed."""
    return _score_code(task, completion, partial_default=True)


_INTEGER = re.compile(r"(?<![\d.])-?\d+(?![\d.]*\d)")


def first_integer(text: str, match: str = "first_integer") -> int | None:
    """The integer a completion states: first/last integer in the text or the boxed one."""
    if match == "boxed":
        boxed = last_boxed(text)
        text = boxed if boxed is not None else ""
        match = "first_integer"
    found = _INTEGER.findall(text.replace(",", ""))
    if not found:
        return None
    if match not in ("first_integer", "last_integer"):
        raise TaskFormatError(f"match must be first_integer, last_integer or boxed, got {match!r}")
    return int(found[0] if match == "first_integer" else found[-1])


def verify_arithmetic(task: Task, completion: str) -> Score:
    """`arithmetic_exact`: the chosen integer in the completion equals the exact answer."""
    answer = _require(task, "answer")
    match = str(task.verification_info.get("match", "first_integer"))
    stated = first_integer(completion[:10_000], match)
    if stated is None:
        return Score(0.0, {"stated": None, "answer": answer}, "no_answer")
    ok = stated == int(answer)  # type: ignore[call-overload]
    return Score(float(ok), {"stated": stated, "answer": answer}, None if ok else "mismatch")


def register_builtin() -> None:
    for task_type, fn in (
        ("verifiable_math", verify_math),
        ("prime_rl_code", verify_code),
        ("verifiable_code", verify_genesys_code),
        ("arithmetic_exact", verify_arithmetic),
    ):
        register_verifier(task_type, fn, replace=True)
