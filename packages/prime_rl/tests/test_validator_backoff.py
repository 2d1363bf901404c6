"""The validator process when its own device fails (issue 46, item 3): the batch stays pending, is
judged again after a backoff, and its honest worker is neither rejected nor banned.

A real orchestrator and a real validator process loop; the validator's HF backend runs out of
memory on its first four prefills (``torch.OutOfMemoryError``, as CUDA raises it), then recovers.
Before this, the out-of-memory became ``malformed`` verdicts counted against the worker.
"""

from __future__ import annotations

import threading

import torch
from validator_setup import validator_at_orchestrator  # tests/support

from prime_rl import metrics
from prime_rl.api.client import OrchestratorClient
from prime_rl.redteam.attacks import HostileWorker


def test_an_out_of_memory_leaves_the_batch_pending_and_the_honest_worker_unharmed(tmp_path, tiny_lm_dir, monkeypatch):
    writer = metrics.MetricsWriter(tmp_path / "metrics" / "validator.jsonl", role="validator", name="validator")
    monkeypatch.setattr(metrics, "_METRICS", writer)
    with validator_at_orchestrator(
        tmp_path, tiny_lm_dir,
        "--validator.max_batches", "1", "--validator.ban_min_samples", "4", "--validator.poll_interval_s", "0.05",
        num_tasks=20, group_size=2, max_new_tokens=4,
    ) as (_, server, validator):  # fmt: skip
        real_prefill, failures = validator.backend.prefill, []

        def prefill(prompts, completions):
            if len(failures) < 4:
                failures.append(len(prompts))
                raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 622.00 MiB")
            return real_prefill(prompts, completions)

        monkeypatch.setattr(validator.backend, "prefill", prefill)
        with OrchestratorClient(server.url) as client:
            worker_id = client.register("honest").worker_id
            lease = client.get_tasks(worker_id)
            honest = HostileWorker(
                "honest", validator.tasks.encode, validator.tasks.score, validator.tasks.prompt_tokens,
                validator.tasks.num_tasks,
            )  # fmt: skip
            client.submit_rollouts(honest.answer(lease, validator.backend))
            judging = threading.Thread(target=validator.run_loop)
            judging.start()
            judging.join(timeout=120)
            assert not judging.is_alive()
            validator.close()
            stats = {w.worker_id: w for w in client.workers().workers}[worker_id]
    # halved (4 -> 2 -> 1); one sample still does not fit: pending, backed off; the next try halves once and fits
    assert failures == [4, 2, 1, 4]
    assert (stats.samples_accepted, stats.samples_rejected, stats.banned) == (4, 0, False)
    writer.close()
    records = list(metrics.read_metrics(tmp_path / "metrics" / "validator.jsonl"))
    events = [r for r in records if r["event"] in {"verdict", "backend_failure"}]
    assert [r["event"] for r in events] == ["backend_failure", "verdict"]
    assert events[0]["kind"] == "out_of_memory" and events[0]["attempts"] == 1 and events[1]["rejected"] == 0
    assert validator.backoff == {}
