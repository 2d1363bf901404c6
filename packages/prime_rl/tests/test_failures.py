"""Failure behaviour with real processes: kill -9 the orchestrator, the trainer, a worker; starve the trainer.

Each test starts `prime-rl <role>` processes on loopback, breaks one of them, and checks the
guarantee on what the run left on disk (the orchestrator's store) and in the metrics files.
"""

from __future__ import annotations

import base64
import signal
import threading
import time
from pathlib import Path
from typing import Any

import pytest

from prime_rl.client import ApiError, OrchestratorClient
from prime_rl.config import load_config
from prime_rl.protocol import RolloutBatch, RolloutSample, TaskLease
from prime_rl.store import RolloutStore

pytestmark = pytest.mark.slow


def _fake_batch(lease: TaskLease, salt: int) -> RolloutBatch:
    samples = [
        RolloutSample(
            task_id=task.task_id,
            group_index=g,
            prompt_tokens=[3, 4, salt % 90 + 3],
            completion_tokens=[5, 6],
            sampling_seed=seed,
            temperature=lease.temperature,
            reward=0.5,
            advantage=0.25 * g,
            proofs=base64.b64encode(bytes([salt % 256]) * 258).decode(),
            inference_logprobs=[-0.1, -0.2 - salt],
        )
        for task in lease.tasks
        for g, seed in enumerate(task.sampling_seeds)
    ]
    return RolloutBatch(
        worker_id=lease.worker_id,
        step=lease.step,
        batch_index=lease.batch_index,
        policy_version=0,
        samples=samples,
    )


def test_orchestrator_killed_keeps_every_acknowledged_rollout(
    tiny_run: Any, harness_for: Any, helpers: Any
) -> None:
    """Submit batches from 3 threads, SIGKILL the orchestrator mid-stream, restart: every 2xx is on disk."""
    config_path, run_dir = tiny_run()
    config = load_config(config_path)
    harness = harness_for(config_path)
    harness.start("orchestrator", "orchestrator")
    url = config.orchestrator.url
    OrchestratorClient(url).wait_until_up(60)
    acknowledged: dict[str, RolloutBatch] = {}
    lock = threading.Lock()
    stop = threading.Event()

    def submitter(index: int) -> None:
        client = OrchestratorClient(url, timeout_s=5, retries=0)
        try:
            worker_id = client.register(f"submitter-{index}").worker_id
        except ApiError:
            return
        salt = index * 1000
        while not stop.is_set():
            try:
                lease = client.get_tasks(worker_id)
                batch = _fake_batch(lease, salt)
                salt += 1
                answer = client.submit_rollouts(batch)
            except ApiError:
                return  # the orchestrator is gone: anything not acknowledged may be lost
            with lock:
                acknowledged[answer.batch_id] = batch

    threads = [threading.Thread(target=submitter, args=(i,), daemon=True) for i in range(3)]
    for thread in threads:
        thread.start()
    helpers.wait_for(lambda: len(acknowledged) >= 12, 60, "12 acknowledged batches")
    harness.kill("orchestrator", signal.SIGKILL)
    stop.set()
    for thread in threads:
        thread.join(30)
    with lock:
        acked = dict(acknowledged)
    harness.start("orchestrator", "orchestrator-restarted")
    client = OrchestratorClient(url, timeout_s=10)
    client.wait_until_up(60)
    status = client.status()
    assert status.workers == 3
    stored = {}
    while True:  # page through everything pending (nothing is validated in this test)
        page = client.pending(limit=256)
        stored.update({batch.batch_id: batch for batch in page.batches})
        if page.pending_batches <= len(stored):
            break
        pytest.fail("more than 256 pending batches; raise the page size")
    missing = set(acked) - set(stored)
    assert not missing, f"acknowledged batches lost by the crash: {sorted(missing)}"
    for batch_id, batch in acked.items():
        assert stored[batch_id].samples == list(batch.samples), batch_id
    # The store itself (what a later process reads) agrees.
    assert set(acked) <= {
        record.batch_id for record in RolloutStore(run_dir / "orchestrator").batch_records()
    }


def _open_lease_of(run_dir: Path, helpers: Any, worker_id: str) -> dict[str, Any] | None:
    events = helpers.metrics_of(run_dir, "orchestrator")
    stored = {
        (e["worker_id"], e["step"], e["batch_id"].rsplit("-b", 1)[1])
        for e in events
        if e["event"] == "batch_stored"
    }
    for event in events:
        key = (worker_id, event.get("step"), str(event.get("batch_index")))
        if event["event"] == "lease" and event["worker_id"] == worker_id and key not in stored:
            return event
    return None


def _worker_ids(run_dir: Path, helpers: Any) -> dict[str, str]:
    return {
        e["worker_name"]: e["worker_id"]
        for e in helpers.metrics_of(run_dir, "orchestrator")
        if e["event"] == "register"
    }


def test_worker_killed_mid_batch_tasks_are_reassigned(tiny_run: Any, harness_for: Any, helpers: Any) -> None:
    """SIGKILL a worker holding an unanswered lease: the lease expires, another worker answers its tasks."""
    config_path, run_dir = tiny_run(orchestrator={"task_timeout_s": 4.0}, shardcast={"relay_ports": []})
    harness = harness_for(config_path)
    harness.start("orchestrator", "orchestrator")
    OrchestratorClient(load_config(config_path).orchestrator.url).wait_until_up(60)
    harness.start("worker", "worker-0")
    harness.start("worker", "worker-1")
    ids = helpers.wait_for(
        lambda: (w := _worker_ids(run_dir, helpers)) and len(w) == 2 and w, 90, "2 registrations"
    )
    victim = ids["worker-0"]
    # Freeze the victim, and kill it only once it provably holds a lease it has not answered.
    process = harness.processes["worker-0"]
    for _ in range(600):
        process.send_signal(signal.SIGSTOP)
        lease = _open_lease_of(run_dir, helpers, victim)
        if lease is not None:
            harness.kill("worker-0", signal.SIGKILL)
            break
        process.send_signal(signal.SIGCONT)
        time.sleep(0.2)
    else:
        pytest.fail("worker-0 never held an open lease")
    abandoned = lease["task_ids"]

    def reassigned() -> dict[str, Any] | None:
        for event in helpers.metrics_of(run_dir, "orchestrator"):
            if (
                event["event"] == "lease"
                and event["worker_id"] == ids["worker-1"]
                and event.get("reassigned")
            ) and event["task_ids"] == abandoned:
                return event
        return None

    event = helpers.wait_for(reassigned, 90, "the dead worker's tasks to be reassigned to worker-1")
    batch_id = f"{ids['worker-1']}-s{event['step']}-b{event['batch_index']}"
    helpers.wait_for(
        lambda: any(
            e["event"] == "batch_stored" and e["batch_id"] == batch_id
            for e in helpers.metrics_of(run_dir, "orchestrator")
        ),
        90,
        "worker-1 to submit the reassigned batch",
    )
    expired = [e for e in helpers.metrics_of(run_dir, "orchestrator") if e["event"] == "lease_expired"]
    assert any(e["worker_id"] == victim and e["task_ids"] == abandoned for e in expired)
    # worker-1 keeps working afterwards: nothing blocks on the dead worker.
    before = sum(1 for e in helpers.metrics_of(run_dir, "orchestrator") if e["event"] == "batch_stored")
    helpers.wait_for(
        lambda: (
            sum(1 for e in helpers.metrics_of(run_dir, "orchestrator") if e["event"] == "batch_stored")
            > before + 1
        ),
        90,
        "worker-1 to keep submitting",
    )
    assert harness.processes["worker-1"].poll() is None, harness.output("worker-1")[-2000:]
