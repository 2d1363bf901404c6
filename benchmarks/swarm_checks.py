"""The rehearsal's invariants, checked from what the run left on disk (``benchmarks/swarm.py``).

Sources: the orchestrator's store (``state.sqlite`` + ``batches/*.arrow``, with the run's evidence
ledger), the processes' metrics (``metrics/*.jsonl``: what a process was told
succeeded, written after the answer) and the swarm hosts' records (``host-*.jsonl``: every rollout
batch answered 2xx, every identity's behaviour, every policy download). Each check returns the ids
that violate it (sample ids ``batch/index``, batch ids or worker ids), so a failure names them.

  acked_rollouts_stored    every rollout batch answered 2xx is in the store
  posted_verdicts_stored   every verdict the validator posted with a 2xx answer is in the store
  no_double_claim          no sample is in two trainer claims
  trained_accepted         every claimed sample was accepted by the validator
  trained_released         every claimed sample's batch is released (``ReleaseBook`` replayed from the
                           store's ``judged`` events; checked at the end of the run, so a batch held
                           later by a rise of its worker's evidence is reported too)
  bans_survive             every ban the orchestrator or validator announced is still in its store
  evidence_survives        every worker the run's ledger kept evidence on still has it in the store
  honest_not_banned        no identity playing honest is banned
  honest_not_rejected      no sample of an honest identity was rejected (``expired``, too old to
                           judge before its step, is not a rejection)
  downloads_resumed        every host holds (fetched, before or after its restarts) the newest version
                           published ``GRACE_S`` before the run ended (a host last started later
                           than that is not judged: it may still be importing torch)
  steps_reached            the run committed ``total_steps`` steps
"""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from prime_rl.config import RunConfig
from prime_rl.orchestrator.release import ReleaseBook
from prime_rl.orchestrator.store import RolloutStore

__all__ = ["GRACE_S", "INVARIANTS", "RunRecords", "check_invariants", "read_jsonl"]

GRACE_S = 30.0
"""Seconds a host is given to fetch a published version (``downloads_resumed``)."""

INVARIANTS = (
    "acked_rollouts_stored", "posted_verdicts_stored", "no_double_claim", "trained_accepted", "trained_released",
    "bans_survive", "evidence_survives", "honest_not_banned", "honest_not_rejected", "downloads_resumed",
    "steps_reached",
)  # fmt: skip


def read_jsonl(path: Path) -> Iterator[dict[str, Any]]:
    """The records of a JSON-lines file; a torn last line (a killed writer) is skipped."""
    if not path.exists():
        return
    for line in path.read_text(encoding="utf-8", errors="replace").splitlines():
        try:
            yield json.loads(line)
        except json.JSONDecodeError:
            continue


@dataclass
class RunRecords:
    """What the harness's own processes recorded: the hosts' JSON lines, read once."""

    records: list[dict[str, Any]]

    @classmethod
    def read(cls, out_dir: Path) -> RunRecords:
        return cls([r for path in sorted(out_dir.glob("host-*.jsonl")) for r in read_jsonl(path)])

    def of(self, kind: str) -> list[dict[str, Any]]:
        return [r for r in self.records if r["kind"] == kind]

    def honest_workers(self) -> set[str]:
        return {r["worker_id"] for r in self.of("identity") if r["behaviour"] == "honest"}


def _metrics(run_dir: Path, name: str, event: str) -> list[dict[str, Any]]:
    return [r for r in read_jsonl(run_dir / "metrics" / f"{name}.jsonl") if r.get("event") == event]


def check_invariants(
    config: RunConfig, records: RunRecords, host_starts: dict[int, float], ended_at: float
) -> dict[str, list[str]]:
    """Each invariant's violations (empty lists when it holds). ``host_starts``: host index -> unix
    time of its last start; ``ended_at``: when the run ended (both for ``downloads_resumed``)."""
    run_dir = Path(config.run_dir)
    store = RolloutStore(config.orchestrator_data_dir)
    try:
        batches = {r.meta.batch_id: r for r in store.batch_records()}
        verdicts = store.all_verdicts()
        claims = store.claims()
        events = list(store.events())
        ledger = {w: json.loads(text) for w, text in store.evidence_rows()}  # the run's evidence ledger
    finally:
        store.close()
    found: dict[str, list[str]] = {name: [] for name in INVARIANTS}
    found["acked_rollouts_stored"] = sorted({r["batch_id"] for r in records.of("submitted")} - set(batches))
    posted = {r["batch_id"] for path in (run_dir / "metrics").glob("validator*.jsonl") for r in read_jsonl(path)
              if r.get("event") == "verdict"}  # every validator's (validator.count)
    found["posted_verdicts_stored"] = sorted(posted - set(verdicts))

    claimed = [sample for claim in claims for sample in claim.sample_ids]
    found["no_double_claim"] = sorted(f"{s.batch_id}/{s.index}" for s, n in Counter(claimed).items() if n > 1)
    for sample in claimed:
        batch_verdicts = verdicts.get(sample.batch_id, [])
        if sample.index >= len(batch_verdicts) or not batch_verdicts[sample.index].accepted:
            found["trained_accepted"].append(f"{sample.batch_id}/{sample.index}")
    orch = config.orchestrator
    release = ReleaseBook(
        store, after_tokens=orch.release_after_tokens, max_evidence=orch.release_max_evidence,
        probation_tokens=orch.probation_tokens_or_default, probation_max_evidence=orch.probation_max_evidence,
        probation_release_share=orch.probation_release_share,
    )  # fmt: skip
    for event in events:
        if event["event"] in ReleaseBook.EVENTS:
            release.replay(event)
    for batch_id in sorted({s.batch_id for s in claimed}):
        record = batches.get(batch_id)
        if record is None or not release.released(batch_id, record.meta.worker_id):
            found["trained_released"].append(batch_id)

    stored_bans = {e["worker_id"] for e in events if e["event"] == "ban"}
    announced = {r["worker_id"] for r in _metrics(run_dir, "orchestrator", "ban")}
    # Since issue 45 the run's ledger (the orchestrator's store, table evidence) holds evidence and bans.
    validator_bans = {w for w, row in ledger.items() if row.get("evidence_ban") or row.get("failure_ban")}
    announced_by_validator = {r["worker_id"] for path in (run_dir / "metrics").glob("validator*.jsonl")
                              for r in read_jsonl(path) if r.get("event") == "ban"}
    found["bans_survive"] = sorted((announced - stored_bans) | (announced_by_validator - validator_bans))
    with_evidence = {r.get("worker_id") for r in _metrics(run_dir, "orchestrator", "evidence")} - {None}
    found["evidence_survives"] = sorted(
        w for w in with_evidence if (ledger.get(w) or {}).get("evidence") is None and w not in validator_bans
    )

    honest = records.honest_workers()
    found["honest_not_banned"] = sorted(honest & (stored_bans | validator_bans))
    for batch_id, record in batches.items():
        if record.meta.worker_id in honest:
            for index, verdict in enumerate(verdicts.get(batch_id, [])):
                if not verdict.accepted and verdict.reason != "expired":
                    found["honest_not_rejected"].append(f"{batch_id}/{index} ({verdict.reason})")

    cutoff = ended_at - GRACE_S
    published = _metrics(run_dir, "trainer", "published")
    due = max((r["policy_version"] for r in published if r["time"] <= cutoff), default=0)
    for host, started in sorted(host_starts.items()):
        fetched = [r["version"] for r in records.of("fetched") if r.get("host") == host]
        if started <= cutoff and max(fetched, default=0) < due:
            found["downloads_resumed"].append(f"host-{host} (fetched {sorted(fetched)}, due v{due})")
    committed = {e["step"] for e in events if e["event"] == "commit"}
    if len(committed) < config.trainer.total_steps:
        found["steps_reached"].append(f"{len(committed)} of {config.trainer.total_steps} steps committed")
    return found
