"""A validator's world without processes, for prime_rl's validator tests: a tiny task set, the
checks a run of it configures, and leases exactly as the orchestrator issues them (keyed
assignment, ``async_level`` 1)."""

from __future__ import annotations

import contextlib
import socket
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from prime_rl.api import assignment
from prime_rl.api.protocol import LeaseRecord, LeaseTask, PendingBatch, RolloutBatch, TaskLease
from prime_rl.config import RunConfig, load_config
from prime_rl.redteam.attacks import HostileWorker
from prime_rl.validator.checks import Checks
from prime_rl.validator.verdicts import validate_batch


def pending_of(batch: RolloutBatch, record: LeaseRecord | None, batch_id: str = "") -> PendingBatch:
    """``batch`` as the validator receives it, answering the lease of ``record``."""
    return PendingBatch(
        batch_id=batch_id or f"{batch.worker_id}-s{batch.step}-b{batch.batch_index}", worker_id=batch.worker_id,
        step=batch.step, batch_index=batch.batch_index, policy_version=batch.policy_version,
        received_at=time.time(), lease=record, samples=batch.samples,
    )  # fmt: skip


def process_config(run_dir: Path, model_dir: Path, *overrides: str, num_tasks: int, group_size: int, max_new_tokens: int) -> RunConfig:
    """The config of an in-process orchestrator and validator process on the tiny model: the
    orchestrator on a free loopback port, two prompts a batch, then ``overrides``."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    return load_config(None, [
        "--run_dir", str(run_dir), "--model.path", str(model_dir), "--tasks.num_tasks", str(num_tasks),
        "--orchestrator.port", str(port), "--orchestrator.prompts_per_batch", "2",
        "--sampling.group_size", str(group_size), "--sampling.max_new_tokens", str(max_new_tokens), *overrides,
    ])  # fmt: skip


@contextlib.contextmanager
def validator_at_orchestrator(
    run_dir: Path, model_dir: Path, *overrides: str, num_tasks: int, group_size: int, max_new_tokens: int
) -> Iterator[tuple[RunConfig, Any, Any]]:
    """``(config, server, validator)``: :func:`process_config`'s run, an in-process orchestrator
    serving its tasks and a validator process object of it (its backend loaded, its noise measured);
    the server stops on exit, the validator is the caller's to close."""
    from prime_rl.orchestrator.server import OrchestratorServer
    from prime_rl.tasks import load_tasks
    from prime_rl.validator.process import Validator

    config = process_config(
        run_dir, model_dir, *overrides, num_tasks=num_tasks, group_size=group_size, max_new_tokens=max_new_tokens
    )
    with OrchestratorServer(config, load_tasks(config.tasks)) as server:
        yield config, server, Validator(config)


@dataclass(frozen=True)
class TinyRun:
    """``num_tasks`` prompts ``prompt_text(task_id)`` for a tiny character-level model. Also the
    validator's task scorer: reward = share of digit characters, which varies even for a random model."""

    key: bytes
    tokenizer: Any
    prompt_text: Callable[[int], str]
    num_tasks: int
    group_size: int = 4
    prompts_per_batch: int = 2
    max_new_tokens: int = 6
    hidden_size: int = 64  # tiny_lm's default; the vLLM tests use 128 (vLLM's CPU attention needs head size >= 32)

    def prompt(self, task_id: int) -> str:
        return self.prompt_text(task_id)

    def prompt_tokens(self, task_id: int) -> list[int]:
        return self.encode(self.prompt(task_id))

    def score(self, task_id: int, completion: str, num_tokens: int) -> float:
        return sum(ch.isdigit() for ch in completion) / max(len(completion), 1)

    def encode(self, text: str) -> list[int]:
        return list(self.tokenizer(text)["input_ids"])

    def decode(self, tokens: Sequence[int]) -> str:
        return str(self.tokenizer.decode(list(tokens), skip_special_tokens=True))

    def checks(self, *validator_overrides: str) -> Checks:
        """The validator's checks for this run (hidden size and vocabulary of ``tiny_lm``; every
        tolerance at its ``[validator]`` default, plus ``validator_overrides``)."""
        overrides = [
            "--orchestrator.prompts_per_batch", str(self.prompts_per_batch), "--orchestrator.async_level", "1",
            "--sampling.group_size", str(self.group_size), "--sampling.temperature", "1.0",
            "--sampling.max_new_tokens", str(self.max_new_tokens), "--sampling.stop", "[]",
            *validator_overrides,
        ]  # fmt: skip
        return Checks.from_config(
            load_config(None, overrides), vocab_size=100, eos_token_ids=frozenset({2}), assignment_key=self.key,
            hidden_size=self.hidden_size,
        )

    def judge(self, batch: RolloutBatch, record: LeaseRecord | None, checks: Checks, backend_for: Callable[[int], Any], **kwargs: Any) -> list:
        """``validate_batch`` of ``batch`` answering ``record`` with this run's tasks and decoder."""
        return validate_batch(
            pending_of(batch, record), tasks=self, backend_for=backend_for, decode=self.decode, checks=checks, **kwargs
        )

    def worker(self, behaviour: str) -> HostileWorker:
        """A worker answering leases of this run (``"honest"`` or a hostile behaviour)."""
        return HostileWorker(behaviour, self.encode, self.score, self.prompt_tokens, self.num_tasks)

    def lease(self, worker_id: str, step: int, batch_index: int) -> tuple[TaskLease, LeaseRecord]:
        """The lease the orchestrator hands ``worker_id`` and the record it keeps of it."""
        where = {"worker_id": worker_id, "step": step, "batch_index": batch_index}
        ids = assignment.task_ids(key=self.key, **where, num_tasks=self.num_tasks, prompts_per_batch=self.prompts_per_batch)
        tasks = [
            LeaseTask(
                task_id=t,
                prompt=self.prompt(t),
                sampling_seeds=list(assignment.sampling_seeds(key=self.key, **where, task_id=t, group_size=self.group_size)),
            )
            for t in ids
        ]
        now = time.time()
        lease = TaskLease(
            **where,
            policy_version=step,
            min_policy_version=max(0, step - 1),
            deadline=now + 60,
            group_size=self.group_size,
            temperature=1.0,
            max_new_tokens=self.max_new_tokens,
            stop=[],
            tasks=tasks,
        )
        record = LeaseRecord(
            **where,
            task_ids=list(ids),
            issued_at=now,
            deadline=now + 60,
            source_worker_id=worker_id,
            source_step=step,
            source_batch_index=batch_index,
        )
        return lease, record


def submit_honest_and_steered(url: str, validator: Any, monkeypatch: Any, steer: Callable[..., Any], batches: int) -> dict[str, str]:
    """Register two identities at the orchestrator at ``url`` and have each submit ``batches``
    honest batches generated with ``validator``'s own model and tasks; the ``"steer"`` identity's
    are sampled with ``steer`` in place of ``prime_rl.inference.backend.sample_next``. Their ids by
    name (``"honest"``, ``"steer"``)."""
    import prime_rl.inference.backend as backend_module
    from prime_rl.api.client import OrchestratorClient

    ids = {}
    tasks = validator.tasks
    for behaviour in ("honest", "steer"):
        with OrchestratorClient(url) as client:
            ids[behaviour] = client.register(behaviour).worker_id
            worker = HostileWorker("honest", tasks.encode, tasks.score, tasks.prompt_tokens, tasks.num_tasks)
            with monkeypatch.context() as patch:
                if behaviour == "steer":
                    patch.setattr(backend_module, "sample_next", steer)
                for _ in range(batches):
                    client.submit_rollouts(worker.answer(client.get_tasks(ids[behaviour]), validator.backend))
    return ids
