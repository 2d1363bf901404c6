"""The in-flight update tests' harness: a validator that loads each claimed version in place, the
trainer's commit that lands while a worker decodes its second lease, and a worker's lease held open
at a real orchestrator while the trainer commits newer versions.

``test_inflight.py`` (HF), ``test_vllm_inflight.py`` (vLLM), ``test_inflight_episodes.py``,
``test_switch_record.py`` and ``test_validator_memory.py`` judge batches whose samples switched
version mid-completion; the two worker-loop tests (HF and vLLM) make the trainer commit v1 while
the worker's second lease decodes; ``test_switch_record.py`` and ``test_inflight_episodes.py``
announce switches of a held lease (:func:`hold_lease_while_v1_commits`).
"""

from __future__ import annotations

import socket
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from synthetic_batches import synthetic_batch  # tests/support
from validator_setup import pending_of  # tests/support

from prime_rl.api.client import OrchestratorClient
from prime_rl.api.protocol import LeaseRecord, PendingBatch, RolloutBatch, TaskLease, Verdict, VerdictRequest
from prime_rl.config import RunConfig, load_config
from prime_rl.inference.contract import VersionSwitch
from prime_rl.validator.checks import Checks
from prime_rl.validator.verdicts import validate_batch
from prime_rl.worker.inflight import CommittedVersions


class VersionedValidator:
    """The validator's one backend, loading each version in place as ``backend_for`` asks (loads
    counted in ``loads``); ``run`` gives the tasks and the decoder (``validator_setup.TinyRun``)."""

    def __init__(self, backend: Any, files: dict[int, Path], run: Any, checks: Checks, *, from_v0: bool = False) -> None:
        self.backend, self.files, self.run, self.checks = backend, files, run, checks
        self.from_v0 = from_v0  # every judgement starts from version 0 with the load count reset
        self.loads: list[int] = []

    def backend_for(self, version: int) -> Any:
        if version not in self.files:
            return None
        if version != self.backend.policy_version:
            self.backend.load_weights(self.files[version], version)
            self.loads.append(version)
        return self.backend

    def judge(self, batch: RolloutBatch, record: LeaseRecord, newest_version: int = 2, batch_id: str = "") -> list:
        if self.from_v0:
            if self.backend.policy_version != 0:
                self.backend.load_weights(self.files[0], 0)
            self.loads = []
        return validate_batch(
            pending_of(batch, record, batch_id), tasks=self.run, backend_for=self.backend_for, decode=self.run.decode,
            checks=self.checks, newest_version=newest_version,
        )  # fmt: skip


def accept_whole(trainer: Any, batch: PendingBatch) -> None:
    """The trusted ``trainer`` client accepts every sample of the pending ``batch`` as claimed (the
    validator's verdicts, posted by hand)."""
    trainer.post_verdicts(VerdictRequest(batch_id=batch.batch_id, verdicts=[
        Verdict(sample_index=i, accepted=True, reason="ok", reward=s.reward, advantage=s.advantage,
                logprobs=s.inference_logprobs) for i, s in enumerate(batch.samples)
    ]))  # fmt: skip


def commit_during_second_lease(worker: Any, server: Any, trainer: Any, source: CommittedVersions) -> Callable[[int, int], VersionSwitch | None]:
    """A ``source.newer`` that, once ``worker`` has submitted its first lease, accepts that batch,
    claims it and commits step 0 (v1, already downloaded), so that the second lease switches to
    v1 mid-decode; it then answers as ``CommittedVersions.newer``."""

    def newer(current: int, boundary: int) -> VersionSwitch | None:
        if worker.submitted == 1 and server.ledger.step == 0:
            deadline = time.monotonic() + 60
            while worker.follower.newest_local < 1 and time.monotonic() < deadline:
                time.sleep(0.05)
            accept_whole(trainer, trainer.pending().batches[0])
            assert trainer.claim(0, 1, filter_zero_advantage=False).ready
            trainer.commit(0, 1)
            time.sleep(0.06)  # past the source's poll period: the next boundary sees v1 committed
        return CommittedVersions.newer(source, current, boundary)

    return newer


@dataclass(frozen=True)
class Feeder:
    """Another worker, whose accepted leases let the trainer commit versions."""

    client: OrchestratorClient
    worker_id: str


def other_worker(url: str) -> Feeder:
    """A new worker at ``url`` whose leases feed the trainer (:func:`commit_next`)."""
    client = OrchestratorClient(url, retries=0)
    return Feeder(client, client.register("trainer-feeder").worker_id)


def commit_next(feeder: Feeder, trainer: OrchestratorClient) -> int:
    """Play one trainer step with ``feeder``'s accepted lease; the new committed version."""
    lease = feeder.client.get_tasks(feeder.worker_id)
    feeder.client.submit_rollouts(synthetic_batch(lease, lease.policy_version, logprobs=[-0.5, -0.25]))
    pending = trainer.pending().batches
    accept_whole(trainer, next(b for b in pending if b.worker_id == lease.worker_id and b.batch_index == lease.batch_index))
    step = trainer.status().step
    assert trainer.claim(step, 1, filter_zero_advantage=False).ready
    return trainer.commit(step, step + 1).policy_version


@dataclass(frozen=True)
class HeldLease:
    """A worker's open v0 lease at a running orchestrator, with the trainer and the feeder whose
    accepted leases let it commit newer versions (:func:`hold_lease_while_v1_commits`)."""

    trainer: OrchestratorClient
    feeder: Feeder
    worker: OrchestratorClient
    worker_id: str
    lease: TaskLease

    @property
    def where(self) -> dict[str, int]:
        return {"step": self.lease.step, "batch_index": self.lease.batch_index}

    def announce(self, version: int, chunk: int) -> int:
        """The orchestrator's nonce for a switch of this lease to ``version`` at ``chunk``."""
        return self.worker.announce_switch(self.worker_id, **self.where, policy_version=version, chunk=chunk).nonce

    def source(self, files: dict[int, Path], kind: type[CommittedVersions] = CommittedVersions) -> CommittedVersions:
        """The worker's ``kind`` of versions for this lease: it follows the trainer's committed version,
        finds each version in ``files`` and announces its switches to the orchestrator."""
        made = kind(
            lambda: self.trainer.status().policy_version, lambda: 1, files.__getitem__, max_versions=4, poll_s=0.0,
            announce=lambda step, index, version, chunk: self.worker.announce_switch(
                self.worker_id, step=step, batch_index=index, policy_version=version, chunk=chunk
            ).nonce,
        )  # fmt: skip
        made.lease = (self.lease.step, self.lease.batch_index)
        return made


def hold_lease_while_v1_commits(server: Any, name: str) -> HeldLease:
    """Worker ``name`` registers and takes a lease (v0); then the trainer commits v1 with another
    worker's accepted batch, so the open lease may switch to v1."""
    trainer = OrchestratorClient(server.url, retries=0, admin_token=server.admin_token)
    worker = OrchestratorClient(server.url, retries=0)
    worker_id = worker.register(name).worker_id
    lease = worker.get_tasks(worker_id)
    feeder = other_worker(server.url)
    assert lease.policy_version == 0 and commit_next(feeder, trainer) == 1
    return HeldLease(trainer, feeder, worker, worker_id, lease)


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def worker_loop_config(run_dir: Path, model_dir: Path, origin_port: int, *overrides: str) -> RunConfig:
    """The worker-loop tests' run: an in-process orchestrator on a free port, shardcast's origin on
    ``origin_port`` and no relay, 4 prompts x 2 samples of 64 tokens, a worker that submits two
    batches with in-flight updates on, then ``overrides`` (``conftest.INFLIGHT``, the backend)."""
    return load_config(None, [
        "--run_dir", str(run_dir), "--model.path", str(model_dir), "--tasks.num_tasks", "20",
        "--orchestrator.port", str(free_port()), "--orchestrator.prompts_per_batch", "4",
        "--orchestrator.async_level", "1", "--orchestrator.release_after_tokens", "0",
        "--sampling.group_size", "2", "--sampling.max_new_tokens", "64", "--sampling.stop", "[]",
        "--shardcast.origin_port", str(origin_port), "--shardcast.relay_ports", "[]",
        "--workers.max_batches", "2", "--workers.weights_poll_s", "0.05", "--workers.inflight_updates", "true",
        *overrides,
    ])  # fmt: skip
