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

from prime_rl.api.client import ApiError, OrchestratorClient
from prime_rl.api.protocol import RolloutBatch, RolloutSample, TaskLease
from prime_rl.api.secrets import run_secrets
from prime_rl.config import load_config
from prime_rl.orchestrator.store import RolloutStore

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
    # No trainer and no validator run here: with lease_judgeable (the default) the orchestrator rightly
    # stops leasing once one step's window is full, before the 12 batches this stream needs.
    config_path, run_dir = tiny_run(orchestrator={"lease_judgeable": False})
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
    client = OrchestratorClient(url, timeout_s=10, admin_token=run_secrets(config).admin_token)
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
        record.meta.batch_id for record in RolloutStore(run_dir / "orchestrator", reader=True).batch_records()
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
    # No trainer and no validator: with lease_judgeable (the default) the orchestrator rightly stops
    # leasing once one step's window is full, and a worker that waits (429) holds no lease to kill.
    config_path, run_dir = tiny_run(
        orchestrator={"task_timeout_s": 4.0, "lease_judgeable": False}, shardcast={"relay_ports": []}
    )
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
    for _ in range(200):
        process.send_signal(signal.SIGSTOP)
        time.sleep(1.0)  # a submission already on the wire completes server-side meanwhile
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


def _start_core(tiny_run: Any, harness_for: Any, trainer: dict[str, Any], *, validator: bool) -> tuple[Any, Path]:
    """A run of one worker and no relay, with ``trainer``'s settings: its orchestrator, shardcast
    origin, trainer, validator (if ``validator``) and worker started; (the harness, the run dir)."""
    config_path, run_dir = tiny_run(shardcast={"relay_ports": []}, trainer=trainer, workers={"count": 1})
    harness = harness_for(config_path)
    harness.start("orchestrator", "orchestrator")
    OrchestratorClient(load_config(config_path).orchestrator.url).wait_until_up(90)
    harness.start("origin", "shardcast-origin")
    harness.start("trainer", "trainer", "--trainer.serve_origin", "false")
    if validator:
        harness.start("validator", "validator")
    harness.start("worker", "worker-0")
    return harness, run_dir


def _events(run_dir: Path, helpers: Any, name: str, kind: str) -> list[dict[str, Any]]:
    return [e for e in helpers.metrics_of(run_dir, name) if e["event"] == kind]


def _exited(harness: Any, name: str) -> bool:
    return harness.processes[name].poll() is not None


def test_trainer_killed_resumes_without_losing_or_reusing_rollouts(
    tiny_run: Any, harness_for: Any, helpers: Any
) -> None:
    """SIGKILL the trainer after its first commit; the restarted one finishes with every claim used once."""
    harness, run_dir = _start_core(
        tiny_run, harness_for, {"total_steps": 3, "samples_per_step": 8, "checkpoint_every": 2}, validator=True
    )
    helpers.wait_for(
        lambda: _events(run_dir, helpers, "orchestrator", "commit") or _exited(harness, "trainer"),
        150,
        "the first commit",
    )
    harness.kill("trainer", signal.SIGKILL)
    assert harness.processes["trainer"].returncode == -signal.SIGKILL, harness.output("trainer")[-3000:]
    killed_at = len(_events(run_dir, helpers, "orchestrator", "commit"))
    harness.start("trainer", "trainer-restarted", "--trainer.serve_origin", "false")
    helpers.wait_for(lambda: _exited(harness, "trainer-restarted"), 170, "the restarted trainer to finish")
    assert harness.processes["trainer-restarted"].returncode == 0, harness.output("trainer-restarted")[-3000:]

    store = RolloutStore(run_dir / "orchestrator", reader=True)
    claims = {claim.step: claim.sample_ids for claim in store.claims()}
    assert sorted(claims) == [0, 1, 2]
    every = [sample for samples in claims.values() for sample in samples]
    assert len(every) == len(set(every)), "an accepted rollout was claimed for two steps"
    verdicts = store.all_verdicts()
    for sample_id in every:
        assert verdicts[sample_id.batch_id][sample_id.index].accepted
    # Whatever each trainer incarnation trained a step on is exactly that step's claim (a replay reuses it).
    trained = _events(run_dir, helpers, "trainer", "commit") + _events(
        run_dir, helpers, "trainer-restarted", "commit"
    )
    # Steps before the checkpoint the restarted trainer resumed from were trained by the killed one,
    # which may have died between its commit and the metrics line; they are never trained again.
    resumed = _events(run_dir, helpers, "trainer-restarted", "resumed")
    restored = resumed[0]["step"] if resumed else 0
    assert all(e["step"] >= restored for e in _events(run_dir, helpers, "trainer-restarted", "commit"))
    assert {e["step"] for e in trained} | set(range(restored)) == {0, 1, 2}
    for event in trained:
        assert tuple(event["samples"]) == tuple(map(str, claims[event["step"]])), event["step"]
    assert [e["step"] for e in _events(run_dir, helpers, "orchestrator", "commit")] == [0, 1, 2]
    assert killed_at >= 1
    assert _events(run_dir, helpers, "trainer-restarted", "resumed") or any(
        e["step"] < killed_at for e in _events(run_dir, helpers, "trainer-restarted", "commit")
    ), "the restarted trainer neither resumed from a checkpoint nor replayed a committed step"


def test_validator_behind_trainer_waits_and_never_trains_unvalidated(
    tiny_run: Any, harness_for: Any, helpers: Any
) -> None:
    """No validator: the trainer logs why it waits and claims nothing; start it and the step completes."""
    harness, run_dir = _start_core(
        tiny_run, harness_for, {"total_steps": 1, "samples_per_step": 8, "wait_log_every_s": 1.0}, validator=False
    )
    stored = lambda: len(_events(run_dir, helpers, "orchestrator", "batch_stored"))  # noqa: E731
    # Two batches are the window lease_judgeable (the default) allows without a claim: 2 steps x 8 samples.
    helpers.wait_for(lambda: stored() >= 2, 150, "2 stored batches (16 samples > 8 needed)")
    log_path = run_dir / "logs" / "trainer.log"
    # The trainer names the cause (trainer/waiting.py): batches await validation, none accepted yet.
    helpers.wait_for(
        lambda: log_path.exists() and ": batches await validation (0/8 fresh informative samples" in log_path.read_text(),
        60,
        "the trainer's waiting log line naming validation",
    )
    store = RolloutStore(run_dir / "orchestrator", reader=True)
    assert store.claims() == [] and not store.all_verdicts()
    assert not _events(run_dir, helpers, "trainer", "commit")
    harness.start("validator", "validator")
    helpers.wait_for(
        lambda: _exited(harness, "trainer"), 150, "the trainer to finish once validation caught up"
    )
    assert harness.processes["trainer"].returncode == 0, harness.output("trainer")[-3000:]
    (claim,) = store.claims()
    verdicts = store.all_verdicts()
    for sample_id in claim.sample_ids:
        assert verdicts[sample_id.batch_id][sample_id.index].accepted, sample_id
