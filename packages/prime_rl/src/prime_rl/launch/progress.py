"""Live progress of a run: one line per finished policy step, read incrementally from the metrics
JSONL files (``<run_dir>/metrics/*.jsonl``) while the run writes them, and the supervisor's own
progress line and ``progress`` record (``orchestrator_progress``); the end-of-run report is
:mod:`prime_rl.launch.report`.

What is logged about workers is bounded whatever their number: the table's totals plus the
``TOP_WORKERS`` with the most accepted samples and up to ``TOP_WORKERS`` banned ones (a swarm's
whole table once made ``run.jsonl`` grow with the number of identities: ``benchmarks/results/swarm.md``). Worker names are the workers'
own text: ``printable`` wherever they are printed (JSON escapes them in the metrics).
"""

from __future__ import annotations

from collections import defaultdict
from pathlib import Path
from typing import Any

from prime_rl.api.client import OrchestratorClient
from prime_rl.api.fields import printable
from prime_rl.api.protocol import WorkerStats
from prime_rl.launch.report import WorkerTally, finite_number, format_or_dash, worker_tallies

__all__ = ["TOP_WORKERS", "OrchestratorProgress", "ProgressTracker", "orchestrator_progress"]

TOP_WORKERS = 8
"""Workers named in a progress line or record: the most accepted samples, and as many banned ones."""


class OrchestratorProgress:
    """One progress reading: ``line`` for the console, ``record`` (keyword arguments of the
    ``progress`` metrics event: step, policy_version, pending_batches, worker_totals, workers)."""

    def __init__(self, line: str, record: dict[str, Any]) -> None:
        self.line, self.record = line, record


def orchestrator_progress(client: OrchestratorClient, total_steps: int | None) -> OrchestratorProgress:
    """Read ``/status`` and bounded pages of ``/workers`` (raises ``ApiError`` if unanswered)."""
    status = client.status()
    top = client.workers(limit=TOP_WORKERS, order="accepted")
    banned = client.workers(limit=TOP_WORKERS, banned_only=True)
    shown: dict[str, WorkerStats] = {w.worker_id: w for w in [*top.workers, *banned.workers]}
    parts = [f"step {status.step}" + (f"/{total_steps}" if total_steps else ""), f"policy v{status.policy_version}"]
    parts.append(f"awaiting validation {status.pending_batches}")
    totals = top.totals
    if totals is not None and totals.registered > len(shown):
        parts.append(f"{totals.registered} workers ({totals.established} with accepted work, {totals.banned} banned)")
    for worker in shown.values():
        text = f"{printable(worker.name or worker.worker_id)}: +{worker.samples_accepted} -{worker.samples_rejected}"
        if worker.banned:
            text += " BANNED"
        parts.append(text)
    record = {
        "step": status.step,
        "policy_version": status.policy_version,
        "pending_batches": status.pending_batches,
        "worker_totals": totals.model_dump() if totals is not None else None,
        "workers": {
            w.worker_id: {
                "name": w.name,
                "accepted": w.samples_accepted,
                "rejected": w.samples_rejected,
                "reasons": w.rejected_reasons,
                "banned": w.banned,
            }
            for w in shown.values()
        },
    }
    return OrchestratorProgress(" | ".join(parts), record)


class ProgressTracker:
    """Incremental reader of a live run's metrics: one line per finished policy step.

    ``lines(workers)`` returns the lines of steps committed since the last call, e.g.::

        step 3/12 | reward 0.41 | worker-0 +96 -0 | worker-1 +64 -0 | hostile-0 +0 -32 | 41 tok/s | waited: trainer 12s, workers 3s

    Verdict counts per worker come from the orchestrator (``/workers``), which ``prime-rl run``
    records in ``run.jsonl`` as ``progress`` events every few seconds.
    """

    def __init__(self, run_dir: str | Path, total_steps: int | None = None) -> None:
        self.run_dir = Path(run_dir)
        self.total_steps = total_steps
        self._offsets: dict[Path, int] = {}
        self._rewards: dict[int, list[float]] = defaultdict(list)
        self._trainer_wait = 0.0
        self._worker_wait = 0.0
        self._tokens = 0.0
        self._generate_s = 0.0
        self._committed: list[int] = []
        self._accuracy: dict[int, float] = {}
        self._workers: tuple[WorkerTally, ...] = ()
        self._reported = 0

    def _new_records(self) -> list[tuple[str, dict[str, Any]]]:
        import json

        out = []
        for path in sorted((self.run_dir / "metrics").glob("*.jsonl")):
            offset = self._offsets.get(path, 0)
            with path.open("rb") as handle:
                handle.seek(offset)
                data = handle.read()
            complete = data[: data.rfind(b"\n") + 1]  # a half-written last line waits for next time
            self._offsets[path] = offset + len(complete)
            for line in complete.splitlines():
                try:
                    record = json.loads(line)
                except json.JSONDecodeError:
                    continue
                if isinstance(record, dict):
                    out.append((path.stem, record))
        return out

    def _ingest(self) -> None:
        for stem, record in self._new_records():
            event = record.get("event")
            if stem.startswith("trainer"):
                if event == "train" and (reward := finite_number(record.get("reward_mean"))) is not None:
                    self._rewards[int(record.get("step", 0))].append(reward)
                elif event == "batch":
                    self._trainer_wait += finite_number(record.get("waited_s")) or 0.0
                elif event == "commit":
                    self._committed.append(int(record.get("policy_version", 0)))
            elif stem.startswith("evaluator") and event == "eval":
                if (value := finite_number(record.get("accuracy"))) is not None:
                    self._accuracy[int(record.get("policy_version", 0))] = value
            elif event == "rollouts":
                self._tokens += finite_number(record.get("completion_tokens")) or 0.0
                self._generate_s += finite_number(record.get("generate_s")) or 0.0
            elif event == "weights_wait":
                self._worker_wait += finite_number(record.get("waited_s")) or 0.0
            elif stem == "run" and event == "progress":
                self._workers = worker_tallies(record)

    def lines(self, workers: dict[str, tuple[int, int]] | None = None) -> list[str]:
        """Lines for the steps committed since the last call (may be empty).

        ``workers`` defaults to the tallies of the newest ``progress`` record in ``run.jsonl``.
        """
        self._ingest()
        if workers is None:
            workers = {w.name: (w.accepted, w.rejected) for w in self._workers}
        out = []
        for version in sorted(v for v in self._committed if v > self._reported):
            step = version - 1
            rewards = self._rewards.get(step)
            parts = [f"step {version}" + (f"/{self.total_steps}" if self.total_steps else "")]
            parts.append(f"reward {format_or_dash(sum(rewards) / len(rewards) if rewards else None, '.2f')}")
            for name, (accepted, rejected) in sorted(workers.items()):
                parts.append(f"{printable(name)} +{accepted} -{rejected}")
            rate = self._tokens / self._generate_s if self._generate_s > 0 else None
            parts.append(f"{format_or_dash(rate, '.0f')} tok/s")
            parts.append(f"waited: trainer {self._trainer_wait:.0f}s, workers {self._worker_wait:.0f}s")
            known = [v for v in self._accuracy if v <= version]
            if known:
                parts.append(f"held-out acc {self._accuracy[max(known)]:.2f} (v{max(known)})")
            out.append(" | ".join(parts))
            self._reported = version
        return out
