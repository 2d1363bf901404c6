"""Orchestrator ingest benchmark: durable rollout submissions per second over real HTTP.

One table, measured in one run on this machine:
  - ours: register + GET /tasks + POST /rollouts through ``OrchestratorClient`` against an
    in-process orchestrator (strict validation, parquet + fsync before the ack), per batch;
  - limit: the same rows written straight to a parquet file + fsync (no HTTP, no validation);
  - naive: the same batch written as a JSON file + fsync (what a minimal file-drop server does).
Batches: 8 prompts x 8 samples, 128 prompt + 256 completion tokens, 8 toploc proofs of 258 B each.
Repeated ``REPEATS`` times; min and median of the per-batch time.

Run: ``OMP_WAIT_POLICY=PASSIVE .venv/bin/python benchmarks/orchestrator_bench.py``
"""

from __future__ import annotations

import base64
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests" / "support"))  # synthetic_batches

from history_ledger import judgeable_off  # benchmarks/
from synthetic_batches import synthetic_batch  # tests/support

from prime_rl.api.client import OrchestratorClient
from prime_rl.api.protocol import RolloutBatch, TaskLease
from prime_rl.config import load_config
from prime_rl.orchestrator.records import batch_rows
from prime_rl.orchestrator.server import OrchestratorServer
from prime_rl.orchestrator.store import RolloutStore
from prime_rl.orchestrator.store_schema import BatchMeta
from prime_rl.tasks import TaskSet

BATCHES = 20
REPEATS = 3
PROMPT_TOKENS, COMPLETION_TOKENS = 128, 256


def _batch(lease: TaskLease, version: int = 0) -> RolloutBatch:
    return synthetic_batch(
        lease, version, prompt_tokens=range(3, 3 + PROMPT_TOKENS),
        completion=lambda g: [(7 * i + g) % 30000 for i in range(COMPLETION_TOKENS)],
        reward=lambda g: float(g % 2), advantage=lambda g: 0.5 - g % 2,
        logprobs=[-0.01 * (i % 50) for i in range(COMPLETION_TOKENS)],
        proofs=base64.b64encode(os.urandom(258 * (COMPLETION_TOKENS // 32))).decode(),
    )  # fmt: skip


def _ours(root: Path) -> tuple[list[float], int]:
    config = load_config(
        None,
        ["--run_dir", str(root), "--orchestrator.port", "0", "--orchestrator.prompts_per_batch", "8",
         "--sampling.group_size", "8", *judgeable_off()],
    )  # fmt: skip
    tasks = TaskSet([{"prompt": f"What is {i} + {i}?"} for i in range(1000)])
    times = []
    with OrchestratorServer(config, tasks) as server, OrchestratorClient(server.url) as client:
        worker = client.register("bench").worker_id
        size = 0
        for _ in range(BATCHES):
            lease = client.get_tasks(worker)
            batch = _batch(lease)
            size = len(batch.model_dump_json())
            started = time.perf_counter()
            client.submit_rollouts(batch)
            times.append(time.perf_counter() - started)
    return times, size


def _limit(root: Path, batch: RolloutBatch) -> list[float]:
    store = RolloutStore(root / "limit")
    times = []
    for index in range(BATCHES):
        started = time.perf_counter()
        meta = BatchMeta(f"b{index}", "bench", 0, index, 0, time.time(), f"{index:064x}", index, None)
        store.write_batch(meta, batch_rows(batch), {})
        times.append(time.perf_counter() - started)
    return times


def _naive(root: Path, batch: RolloutBatch) -> list[float]:
    (root / "naive").mkdir()
    times = []
    for index in range(BATCHES):
        started = time.perf_counter()
        text = batch.model_dump_json()
        with open(root / "naive" / f"b{index}.json", "w") as handle:
            handle.write(text)
            handle.flush()
            os.fsync(handle.fileno())
        times.append(time.perf_counter() - started)
    return times


def main() -> None:
    rows: dict[str, list[float]] = {"ours (HTTP, validated, parquet+fsync)": [], "limit (parquet+fsync)": [],
                                    "naive (JSON file+fsync)": []}  # fmt: skip
    size = 0
    for _ in range(REPEATS):
        with tempfile.TemporaryDirectory() as tmp:
            root = Path(tmp)
            ours, size = _ours(root / "ours")
            lease = TaskLease(
                worker_id="w0000", step=0, batch_index=0, policy_version=0, min_policy_version=0, deadline=0.0, group_size=8,
                temperature=1.0, max_new_tokens=COMPLETION_TOKENS, stop=[],
                tasks=[{"task_id": i, "prompt": "p", "sampling_seeds": list(range(8))} for i in range(8)],  # type: ignore[misc]
            )  # fmt: skip
            batch = _batch(lease)
            rows["ours (HTTP, validated, parquet+fsync)"] += ours
            rows["limit (parquet+fsync)"] += _limit(root, batch)
            rows["naive (JSON file+fsync)"] += _naive(root, batch)
    print(
        f"orchestrator ingest: {BATCHES} batches x {REPEATS} repeats, 64 samples/batch, {size / 1e6:.2f} MB JSON/batch"
    )
    print(f"{'method':<40} {'min ms/batch':>13} {'median ms/batch':>16} {'samples/s (median)':>19}")
    for name, times in rows.items():
        median = statistics.median(times)
        print(f"{name:<40} {min(times) * 1e3:>13.1f} {median * 1e3:>16.1f} {64 / median:>19.0f}")


if __name__ == "__main__":
    main()
