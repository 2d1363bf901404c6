"""Ledger helpers shared by the orchestrator's in-process tests (test_orchestrator_trust.py,
test_orchestrator_identities.py): a ledger on a settable clock, a batch answering a lease, submit,
accept every sample."""

from __future__ import annotations

import base64
import hashlib
from typing import Any

from synthetic_batches import synthetic_batch  # tests/support

from prime_rl.api.protocol import RolloutBatch, Verdict, VerdictRequest
from prime_rl.orchestrator.ledger import Ledger
from prime_rl.orchestrator.store import RolloutStore
from prime_rl.tasks import TaskSet


class _Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def _ledger(config_for: Any, *overrides: str) -> tuple[Ledger, _Clock]:
    clock = _Clock()
    config = config_for("--orchestrator.task_timeout_s", "10", *overrides)
    tasks = TaskSet([{"prompt": f"q{i}"} for i in range(20)])
    return Ledger(config, tasks, RolloutStore(config.orchestrator_data_dir), clock=clock), clock


def _batch(lease: Any, version: int = 0) -> RolloutBatch:
    return synthetic_batch(
        lease, version, prompt_tokens=[1], completion=[2, 3], reward=float, advantage=lambda g: g - 0.5,
        logprobs=[-9.0, -9.0], proofs=base64.b64encode(b"p").decode(), temperature=1.0,
    )  # fmt: skip


def _submit(ledger: Ledger, worker: Any, batch: RolloutBatch) -> Any:
    return ledger.submit(worker, batch, hashlib.sha256(batch.model_dump_json().encode()).hexdigest())


def _accept(ledger: Ledger, batch_id: str, logprobs: list[float] | None = None) -> None:
    n = len(ledger.batches[batch_id].task_ids)
    verdicts = [
        Verdict(sample_index=i, accepted=True, reason="ok", reward=float(i % 2), advantage=float(i % 2) - 0.5,
                logprobs=logprobs if logprobs is not None else [-0.25, -0.75])
        for i in range(n)
    ]  # fmt: skip
    ledger.record_verdicts(VerdictRequest(batch_id=batch_id, verdicts=verdicts))
