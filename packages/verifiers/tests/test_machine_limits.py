"""`Score.machine_limit`: set exactly when a wall-clock-limited check may have lowered the reward,
with a sandbox that fails on purpose (its runner start, or a test's time limit)."""

from __future__ import annotations

import subprocess
import threading

import pytest

from verifiers import Score, Task, machine_limits, verify, verify_batch
from verifiers.code import run_tests
from verifiers.code import sandbox as sandbox_module
from verifiers.code.privileges import fallback_python
from verifiers.registry import register_verifier

DOUBLE = {"inputs": ["3\n", "5\n"], "outputs": ["6\n", "10\n"]}
CORRECT = "print(int(input()) * 2)"


def code_task(partial: bool = False, timeout: float = 5.0) -> Task:
    info = {"test_cases": DOUBLE, "partial_credit": partial, "timeout_per_test": timeout}
    return Task("double it", "prime_rl_code", info)


def fenced(program: str) -> str:
    return f"```python\n{program}\n```"


@pytest.fixture
def runnable() -> None:
    if sandbox_module.default_sandbox() == "rlimit" and fallback_python().path is None:
        pytest.skip("no sandbox can run here")


def fail_starts(monkeypatch: pytest.MonkeyPatch, failures: int) -> list[int]:
    """The next `failures` runner starts (spare or fresh) die before reporting ready; then real ones."""
    real = sandbox_module._start_runner
    started = [0]
    lock = threading.Lock()

    def start(kind: str) -> subprocess.Popen:
        with lock:
            started[0] += 1
            dead = started[0] <= failures
        if dead:
            return subprocess.Popen(["true"], stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
        return real(kind)

    monkeypatch.setattr(sandbox_module._SPARES, "take", start)
    monkeypatch.setattr(sandbox_module, "_start_runner", start)
    return started


def test_a_runner_that_never_starts_limits_the_score(runnable, monkeypatch):
    started = fail_starts(monkeypatch, 1 + sandbox_module.START_RETRIES)
    result = run_tests(CORRECT, DOUBLE)
    assert (result.passed, result.machine_limit, result.machine_failed) == (0, "sandbox_start", 2)
    assert started[0] == 1 + sandbox_module.START_RETRIES
    score = verify(code_task(), fenced(CORRECT))
    assert (score.reward, score.machine_limit, score.wall_clock_checked) == (1.0, None, True)  # starts work again


def test_verify_reports_a_spoiled_score_and_a_retry_clears_it(runnable, monkeypatch):
    fail_starts(monkeypatch, 1 + sandbox_module.START_RETRIES)
    spoiled = verify(code_task(), fenced(CORRECT))
    assert (spoiled.reward, spoiled.machine_limit, spoiled.wall_clock_checked) == (0.0, "sandbox_start", True)
    fail_starts(monkeypatch, sandbox_module.START_RETRIES)  # one start short of spoiling: the last retry runs
    assert verify(code_task(), fenced(CORRECT)).machine_limit is None


def test_timeouts_limit_a_score_only_where_a_rerun_could_raise_it(runnable):
    # test 1 ("3") answers wrongly, test 2 ("5") sleeps past its limit
    program = "import time\nn = int(input())\nif n == 5: time.sleep(30)\nprint(n)"
    binary = verify(code_task(timeout=0.5), fenced(program))
    assert (binary.reward, binary.machine_limit) == (0.0, None)  # the wrong answer fails it on any machine
    partial = verify(code_task(partial=True, timeout=0.5), fenced(program))
    assert (partial.reward, partial.machine_limit) == (0.0, "test_timeout")  # test 2 might pass elsewhere
    # test 1 right, test 2 times out: binary 0 only because of the timeout
    slow = "import time\nn = int(input())\nif n == 5: time.sleep(30)\nprint(2 * n)"
    binary_slow = verify(code_task(timeout=0.5), fenced(slow))
    assert (binary_slow.reward, binary_slow.machine_limit) == (0.0, "test_timeout")
    partial_slow = verify(code_task(partial=True, timeout=0.5), fenced(slow))
    assert (partial_slow.reward, partial_slow.machine_limit) == (0.5, "test_timeout")


def test_a_wrong_program_is_not_machine_limited(runnable):
    score = verify(code_task(), fenced("print(int(input()) + 1)"))
    assert (score.reward, score.machine_limit, score.wall_clock_checked) == (0.0, None, True)


def test_only_timed_checks_are_wall_clock_checked():
    arithmetic = verify(Task("1+1?", "arithmetic_exact", {"answer": 2}), "2")
    assert (arithmetic.machine_limit, arithmetic.wall_clock_checked) == (None, False)
    no_code = verify(code_task(), "no program here")
    assert (no_code.machine_limit, no_code.wall_clock_checked) == (None, False)


def test_score_validates_and_stays_positional():
    assert Score(1.0, {}, None) == Score(1.0)
    assert Score(0.0, {}, "deadline", "deadline").wall_clock_checked  # a limit implies a timed check
    with pytest.raises(ValueError, match="machine_limit"):
        Score(0.0, machine_limit="slow")  # type: ignore[arg-type]


def test_machine_limits_sees_through_a_reward_and_batch_threads(runnable, monkeypatch):
    def reward(task: Task, completion: str) -> float:  # a caller that only sees a float
        return 0.5 * verify(task, completion).reward

    with machine_limits() as clean:
        assert reward(code_task(), fenced(CORRECT)) == 0.5
    assert (clean.causes, clean.wall_clock_checks, clean.limited) == ([], 1, False)

    fail_starts(monkeypatch, 100)
    with machine_limits() as outer:
        with machine_limits() as inner:
            assert reward(code_task(), fenced(CORRECT)) == 0.0
        scores = verify_batch([code_task()] * 2, [fenced(CORRECT)] * 2, max_workers=2)
    assert inner.causes == ["sandbox_start"]
    assert [s.machine_limit for s in scores] == ["sandbox_start"] * 2
    assert outer.causes == ["sandbox_start"] * 2  # the batch's threads, not the inner block's score


def test_a_batch_deadline_is_a_machine_limit():
    release = threading.Event()

    @register_verifier("test_machine_slow", replace=True)
    def slow(task: Task, completion: str) -> Score:
        release.wait(10)
        return Score(1.0)

    try:
        with machine_limits() as seen:
            [late] = verify_batch([Task("p", "test_machine_slow")], ["c"], timeout=0.2)
    finally:
        release.set()
    assert (late.reward, late.failure, late.machine_limit) == (0.0, "deadline", "deadline")
    assert seen.causes == ["deadline"]
