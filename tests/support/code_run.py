"""A tiny run whose every reward is one program run in the real code sandbox, and a schedule of
sandbox runner starts that die on purpose: the validator's re-scoring tests and the worker's
(``test_reward_rescore.py``, ``test_worker_rescore.py``) share them."""

from __future__ import annotations

import subprocess
import threading
import time
from dataclasses import dataclass

import pytest
from tiny_lm import make_tiny_lm, make_tiny_tokenizer
from validator_setup import TinyRun

import verifiers
from prime_rl.api.protocol import LeaseRecord, PendingBatch, RolloutBatch
from prime_rl.inference.backend import HFBackend
from prime_rl.validator.verdicts import validate_batch
from verifiers.code import sandbox as sandbox_module
from verifiers.code.privileges import fallback_python

KEY = b"rescore-test-assignment-key"
GROUP, PER_BATCH = 4, 2
SAMPLES = GROUP * PER_BATCH
TOKENIZER = make_tiny_tokenizer()
CODE_TASK = verifiers.Task(
    "double it", "prime_rl_code", {"test_cases": {"inputs": ["3\n", "5\n"], "outputs": ["6\n", "10\n"]}}
)
CORRECT, WRONG = "print(int(input()) * 2)", "print(int(input()) + 1)"
STARTS_PER_SCORING = 1 + sandbox_module.START_RETRIES  # dead starts that spoil one scoring


@dataclass(frozen=True)
class CodeRun(TinyRun):
    """The tiny run, but every task's reward is one program run in the sandbox (the tiny model's
    completions are not programs): ``program`` passes both tests (reward 1) or none (0)."""

    program: str = CORRECT
    scorings: list[int] | None = None

    def score(self, task_id: int, completion: str, num_tokens: int) -> float:
        if self.scorings is not None:
            self.scorings.append(task_id)
        return verifiers.verify(CODE_TASK, f"```python\n{self.program}\n```").reward


def code_run(program: str = CORRECT) -> CodeRun:
    return CodeRun(
        KEY, TOKENIZER, lambda t: f"{t}+{t * 3}=", 12, GROUP, PER_BATCH, 6, program=program, scorings=[]
    )


def code_backend() -> HFBackend:
    """The tiny model's backend (module fixtures call it); skips the test where no sandbox can run."""
    if sandbox_module.default_sandbox() == "rlimit" and fallback_python().path is None:
        pytest.skip("no sandbox can run here")
    return HFBackend("unused", model=make_tiny_lm(), tokenizer=TOKENIZER)


def sandbox_schedule(monkeypatch: pytest.MonkeyPatch, dead: list[bool], *, then_dead: bool = False) -> None:
    """Runner starts (spare or fresh) follow ``dead``: True dies before it is ready; after the list,
    every start is ``then_dead``."""
    real = sandbox_module._start_runner
    remaining = list(dead)
    lock = threading.Lock()

    def start(kind: str) -> subprocess.Popen:
        with lock:
            fails = remaining.pop(0) if remaining else then_dead
        if fails:
            return subprocess.Popen(
                ["true"], stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE
            )
        return real(kind)

    monkeypatch.setattr(sandbox_module._SPARES, "take", start)
    monkeypatch.setattr(sandbox_module, "_start_runner", start)


SPOILED = [True] * STARTS_PER_SCORING  # one scoring: every start and retry dies
CLEAN = [False]  # one scoring: the first start works


def judge(run: CodeRun, batch: RolloutBatch, record: LeaseRecord, backend, *overrides: str, observed=None):
    run.scorings.clear()
    pending = PendingBatch(
        batch_id=f"{batch.worker_id}-{batch.batch_index}", worker_id=batch.worker_id, step=batch.step,
        batch_index=batch.batch_index, policy_version=batch.policy_version, received_at=time.time(),
        lease=record, samples=batch.samples,
    )  # fmt: skip
    observe = None if observed is None else (lambda index, observations: observed.append(index))
    return validate_batch(
        pending, tasks=run, backend_for=lambda v: backend, decode=run.decode, checks=run.checks(*overrides),
        observe=observe,
    )  # fmt: skip
