"""`run_tests`: run an untrusted program against tests in the sandbox and score it; `sandbox_runs`:
how many programs this process has run there."""

from __future__ import annotations

import logging
import threading
from collections import Counter
from dataclasses import dataclass

from verifiers.code.compare import outputs_match, results_match
from verifiers.code.sandbox import Limits, run_in_sandbox
from verifiers.code.testcases import TestCase, parse_tests

log = logging.getLogger("verifiers.code")

_RUNS: Counter[str] = Counter()
_RUNS_LOCK = threading.Lock()  # run_tests is called from verify_batch's threads


def sandbox_runs() -> dict[str, int]:
    """Programs `run_tests` has run in this process so far, by sandbox kind ("bwrap", "rlimit").

    One count per `run_tests` call that started the sandbox, i.e. per scored sample, however many
    test cases it ran; a call refused before running anything (no tests, another language) is not
    counted. Cumulative since the process started; thread-safe. Runs in other processes (a
    `multiprocessing` pool's workers) count there, not here.
    """
    with _RUNS_LOCK:
        return dict(_RUNS)


@dataclass(frozen=True)
class TestOutcome:
    """One test's result. `status`: "passed", "wrong_answer", "timeout", "runtime_error",
    "memory", "output_limit", "killed" or "not_run" (the runner died before it)."""

    __test__ = False

    passed: bool
    status: str
    wall_s: float = 0.0
    stderr_tail: str = ""


@dataclass(frozen=True)
class CodeResult:
    """Outcome of `run_tests`.

    Attributes:
        passed: tests passed; total: tests run; outcomes: one `TestOutcome` per test.
        sandbox: "bwrap" (namespaces + rlimits) or "rlimit" (the weaker fallback).
        error: why the run ended early (runner killed, sandbox failed), else None.
        machine_limit: None when every failed test failed on the program's own account, else the
            first machine cause among them ("sandbox_start": the runner never started after its
            retries; "test_timeout": a test hit its wall-clock limit, or the run its deadline).
        machine_failed: how many tests failed for such a cause (a re-run might pass them).
    """

    passed: int
    total: int
    outcomes: tuple[TestOutcome, ...]
    sandbox: str
    error: str | None = None
    machine_limit: str | None = None
    machine_failed: int = 0

    @property
    def fraction(self) -> float:
        """passed / total (0.0 for no tests): GENESYS's partial credit."""
        return self.passed / self.total if self.total else 0.0

    @property
    def all_passed(self) -> bool:
        """INTELLECT-2's binary reward."""
        return self.total > 0 and self.passed == self.total


def run_tests(
    program: str,
    tests: object,
    *,
    language: str = "python",
    timeout_per_test: float = 5.0,
    memory_mb: int = 512,
    rel_tol: float = 1e-5,
    abs_tol: float = 1e-8,
    order_insensitive: bool = False,
    sandbox: str | None = None,
    limits: Limits | None = None,
) -> CodeResult:
    """Run `program` on every test in a sandbox and compare outputs in this process.

    Args:
        program: Python source. It runs once per test in a fresh forked child.
        tests: anything `parse_tests` accepts (INTELLECT-2 `{inputs, outputs, fn_name?}`, ...).
        language: only "python" is supported.
        timeout_per_test: wall seconds per test (5 s); memory_mb: address space (512 MiB).
        rel_tol, abs_tol, order_insensitive: output comparison (see `outputs_match`).
        sandbox: "bwrap", "rlimit" or None (best available; reported in the result).
        limits: full `Limits` (overrides timeout_per_test/memory_mb).

    Pitfall: expected outputs never enter the sandbox; a program cannot read them.
    """
    if language != "python":
        raise ValueError(f"language {language!r} is not supported; only 'python' runs in the sandbox")
    cases: list[TestCase] = parse_tests(tests)
    if not cases:
        return CodeResult(0, 0, (), sandbox or "none", "no tests")
    limits = limits or Limits(timeout_s=timeout_per_test, memory_mb=memory_mb)
    by_mode: dict[str | None, list[int]] = {}
    for i, case in enumerate(cases):
        by_mode.setdefault(case.fn_name, []).append(i)
    outcomes: list[TestOutcome | None] = [None] * len(cases)
    kind, error = sandbox or "", None
    run_limit: str | None = None  # why a run ended early for the machine's sake (its not_run tests)
    for fn_name, indices in by_mode.items():
        raw = run_in_sandbox(
            program,
            "call" if fn_name else "stdio",
            [cases[i].input for i in indices],
            fn_name=fn_name,
            limits=limits,
            sandbox=sandbox,
        )
        kind, error = raw.sandbox, error or raw.runner_error
        run_limit = run_limit or raw.machine_limit
        for report in raw.tests:
            case = cases[indices[report["index"]]]
            outcomes[indices[report["index"]]] = _judge(case, report, rel_tol, abs_tol, order_insensitive)
    with _RUNS_LOCK:
        _RUNS[kind] += 1
    final = tuple(o or TestOutcome(False, "not_run") for o in outcomes)
    if error is not None or any(o.status == "timeout" for o in final):
        # Not the program's answer but the machine's: a scorer and a re-scorer can disagree here.
        log.warning("sandbox %s: %s", kind, error or f"tests timed out: {[o.status for o in final]}")
    causes = [_machine_cause(o, run_limit) for o in final if not o.passed]
    found = [c for c in causes if c is not None]
    return CodeResult(
        sum(o.passed for o in final), len(final), final, kind, error, found[0] if found else None, len(found)
    )


def _machine_cause(outcome: TestOutcome, run_limit: str | None) -> str | None:
    """Why a failed test may be the machine's fault, or None when it is the program's: a wall-clock
    timeout, or a test never run because the runner never started or the run hit its deadline.
    (A test not run because the runner died mid-run is the program's: it can kill its runner.)"""
    if outcome.status == "timeout":
        return "test_timeout"
    if outcome.status == "not_run":
        return run_limit
    return None


def _judge(
    case: TestCase, report: dict, rel_tol: float, abs_tol: float, order_insensitive: bool
) -> TestOutcome:
    status = report["status"]
    if status == "ok":
        if case.fn_name:
            ok = results_match(report["result"], case.output, rel_tol=rel_tol, abs_tol=abs_tol)
        else:
            ok = outputs_match(
                report["stdout"],
                str(case.output),
                rel_tol=rel_tol,
                abs_tol=abs_tol,
                order_insensitive=order_insensitive,
            )
        status = "passed" if ok else "wrong_answer"
    return TestOutcome(status == "passed", status, report.get("wall_s", 0.0), report.get("stderr_tail", ""))
