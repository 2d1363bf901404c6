"""The validator's durable per-identity state: evidence and failure counts survive a restart.

Without it a validator restart forgave everything: a worker's evidence (``evidence.py``) and its
accepted/rejected counts (``process.FailureTracker``) lived in memory only. The journal is
``<run_dir>/validator/journal.jsonl``, next to the validator's noise profile, written like the
orchestrator's (``orchestrator/store.py``): one JSON line per event, flushed and fsynced before
the call returns; a torn last line (a crash mid-write) is skipped on replay.

Events (each carries the worker's *cumulative* state, so replay keeps the last line per worker):

* ``{"event": "evidence", "batch_id", "worker_id", "state": WorkerEvidence.snapshot(),
  "ban_reason"}`` after a batch is added to its worker's evidence (before its verdicts are
  posted: a batch counted here is never counted again after a restart);
* ``{"event": "failures", "batch_id", "worker_id", "accepted", "rejected", "banned"}`` after a
  batch's verdicts were posted and counted by the failure tracker.

On open the journal is replayed and then rewritten compactly (one line per worker and kind, the
worker's counted batch ids in its evidence line), atomically (``prime_rl.durable``).

Pitfall: a crash between posting a batch's verdicts and its ``failures`` line loses that batch's
counts (the orchestrator has settled it and will not offer it again); its evidence was journalled
before the post and is kept.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import toploc
from prime_rl.durable import append_event, atomic_path, read_events

if TYPE_CHECKING:
    from prime_rl.validator.evidence import EvidenceLedger, FailureTracker

log = logging.getLogger(__name__)

__all__ = ["JournalError", "JournalState", "ValidatorJournal"]


class JournalError(RuntimeError):
    """The journal cannot be written (disk full, permissions): the validator must not judge on."""


@dataclass
class JournalState:
    """What a replay found, per worker id."""

    evidence: dict[str, dict[str, Any]] = field(default_factory=dict)  # latest WorkerEvidence snapshot
    batches: dict[str, list[str]] = field(default_factory=dict)  # batch ids counted into the evidence
    ban_reasons: dict[str, str] = field(default_factory=dict)  # evidence bans
    failures: dict[str, tuple[int, int]] = field(default_factory=dict)  # (accepted, rejected)
    failure_bans: set[str] = field(default_factory=set)  # bans by rejected share


class ValidatorJournal:
    """Append-only journal of one validator's per-identity state (one process per file)."""

    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)

    # ------------------------------------------------------------- writing

    def _append(self, event: dict[str, Any]) -> None:
        try:
            append_event(self.path, event)
        except OSError as error:
            raise JournalError(f"could not append to {self.path}: {error}") from error

    def evidence(self, batch_id: str, worker_id: str, ledger: EvidenceLedger) -> None:
        """Journal ``worker_id``'s evidence right after ``batch_id`` was counted into it."""
        self._append(
            {
                "event": "evidence",
                "batch_id": batch_id,
                "worker_id": worker_id,
                "state": ledger.workers[worker_id].snapshot(),
                "ban_reason": ledger.ban_reasons.get(worker_id),
            }
        )

    def failures(self, batch_id: str, worker_id: str, tracker: FailureTracker) -> None:
        """Journal ``worker_id``'s cumulative failure counts right after ``batch_id`` was counted."""
        accepted, rejected = tracker.counts.get(worker_id, [0, 0])
        self._append(
            {
                "event": "failures",
                "batch_id": batch_id,
                "worker_id": worker_id,
                "accepted": int(accepted),
                "rejected": int(rejected),
                "banned": worker_id in tracker.banned,
            }
        )

    # ------------------------------------------------------------- replay

    def _events(self) -> Iterator[dict[str, Any]]:
        return read_events(self.path, "validator journal")

    def load(self) -> JournalState:
        """Replay the journal (malformed events are skipped with a warning, never fatal)."""
        state = JournalState()
        for event in self._events():
            try:
                worker = str(event["worker_id"])
                if event["event"] == "evidence":
                    if not isinstance(event["state"], dict):
                        raise TypeError("state is not an object")
                    state.evidence[worker] = event["state"]
                    batches = state.batches.setdefault(worker, [])
                    batches.extend(str(b) for b in event.get("batches", [event["batch_id"]]))
                    if event.get("ban_reason"):
                        state.ban_reasons[worker] = str(event["ban_reason"])
                elif event["event"] == "failures":
                    state.failures[worker] = (int(event["accepted"]), int(event["rejected"]))
                    if event["banned"]:
                        state.failure_bans.add(worker)
            except (KeyError, TypeError, ValueError) as error:
                log.warning("validator journal: skipped a malformed event (%r)", error)
        return state

    def compact(self, state: JournalState) -> None:
        """Rewrite the journal as ``state`` (one line per worker and kind), atomically and durably."""
        lines: list[dict[str, Any]] = []
        for worker, snapshot in state.evidence.items():
            event = {"event": "evidence", "batch_id": "", "worker_id": worker, "state": snapshot}
            lines.append({**event, "batches": state.batches.get(worker, []), "ban_reason": state.ban_reasons.get(worker)})
        for worker, (accepted, rejected) in state.failures.items():
            lines.append(
                {
                    "event": "failures",
                    "batch_id": "",
                    "worker_id": worker,
                    "accepted": accepted,
                    "rejected": rejected,
                    "banned": worker in state.failure_bans,
                }
            )
        text = "".join(json.dumps(line, separators=(",", ":"), allow_nan=False) + "\n" for line in lines)
        try:
            with atomic_path(self.path) as temporary:
                temporary.write_text(text, encoding="utf-8")
        except OSError as error:
            raise JournalError(f"could not rewrite {self.path}: {error}") from error

    def restore(self, ledger: EvidenceLedger | None, tracker: FailureTracker) -> JournalState:
        """Load the journal into a fresh ``ledger`` (None: evidence is off) and ``tracker``, then
        compact it. A worker whose evidence snapshot no longer fits is logged and starts afresh
        (its ban, if any, is kept)."""
        state = self.load()
        for worker, (accepted, rejected) in state.failures.items():
            tracker.counts[worker] = [accepted, rejected]
        tracker.banned |= state.failure_bans
        if ledger is not None:
            for worker, snapshot in list(state.evidence.items()):
                try:
                    ledger.workers[worker] = toploc.WorkerEvidence.restore(ledger.tests, snapshot)
                except toploc.EvidenceError as error:
                    log.warning("validator journal: evidence of %s not restored: %s", worker, error)
                    del state.evidence[worker]
                    continue
                ledger.counted_batches.update(state.batches.get(worker, []))
            ledger.ban_reasons.update(state.ban_reasons)
        self.compact(state)
        if state.evidence or state.failures:
            log.info(
                "validator journal: restored the evidence of %d and the failure counts of %d workers (%d banned)",
                len(state.evidence),
                len(state.failures),
                len(set(state.ban_reasons) | state.failure_bans),
            )
        return state
