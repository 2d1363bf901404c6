"""The orchestrator's state machine: the API's rules over workers, leases, batches, claims and the step.

``Ledger`` applies every rule of API.md. It is one object with the methods callers know
(server.py, tests, benchmarks), written in rooms by caller, each a base class over one shared state:

  - ``LedgerState`` (ledger_state.py): builds the books below and answers the queries every caller
    shares (established workers, usable batches, backpressure, expiry and settling of batches);
  - ``WorkerRules`` (ledger_workers.py): register, authenticate, lease, switch, done, submit;
  - ``ValidatorRules`` (ledger_validators.py): pending, take_batches, record_verdicts;
  - ``TrainerRules`` (ledger_trainer.py): claim, commit (the trainer's side: claims and the step);
  - ``Ledger`` (here): joins them, rebuilds the state after a restart (``_load``) and answers ``status``.

Base classes rather than objects that forward to each other: the three callers' rules share nearly
every book and the step, call none of each other's methods, and stay reachable as ``Ledger``'s.

The books, each with its store events:

  - ``WorkerRegistry`` (workers.py): workers, token hashes, bans, malformed counts;
  - ``LeaseBook`` (leases.py, over lease_history.py): leases, batch indices, reassignment of
    expired leases; ``LeaseRules`` (lease_rules.py): who may hold how many;
  - ``BatchBook`` (batches.py): stored batches, verdicts, expiry of batches too old to use;
  - ``ReleaseBook`` (release.py): which accepted batches the worker's evidence already covers;
  - ``RunEvidence`` (evidence_ledger.py): the run's evidence per worker, whatever validator judged;
  - ``ValidatorLeases`` (validator_leases.py): which validator holds which batch (memory only);
  - ``StoredClaims`` (claims.py) and ``JudgeCapacity`` (judge_capacity.py): claims, judging rate;
  - ``FreshIdentities`` (identities.py): identities without accepted work, capped per network and
    retired when idle past ``fresh_worker_ttl_s``.

Every mutating method writes to the ``RolloutStore`` (durably) *before* it changes memory and
returns, so the HTTP layer can acknowledge as soon as a method returns, and ``Ledger.load``
rebuilds the same state after a restart. Methods raise ``ApiFailure(status, error, message)``
for requests the API refuses; the HTTP layer turns it into the JSON error answer.

Not thread-safe: the HTTP layer calls one method at a time (under one lock).

Leases a worker cannot hoard or abandon for free (``LeaseRules``, lease_rules.py): a fresh
identity holds one unanswered lease, one more per answered lease up to ``max_open_leases``, less
one per lease it let expire; identities without accepted work share a per-address cap that
identities with accepted work are exempt from, and take turns under it first come, first served; a worker whose expired leases reach
``ban_abandoned_leases`` and ``ban_abandoned_share`` of its leases is banned; abandoned tasks go
to other workers first (``LeaseBook``). A lease whose batch the validator rejects counts as
abandoned in all of these (but never towards the ban when the machine may explain it:
``lease_rules.machine_caused``), so spoiling a lease costs what walking away costs. Backpressure
(``max_buffered_samples``) bounds the admitted work, answered samples plus open leases, and fresh
identities' share of it (``LeaseRules.check_backpressure``), so unproven work never stops an
established worker; the validator's queue serves established workers' batches first (``BatchBook.pending_unread``).

Accepted samples are held from claims until the validator has accepted
``release_after_tokens`` more tokens of the same worker and its evidence is below
``release_max_evidence`` of the ban threshold (release.py), so what a worker sends before its
evidence bans it is not trained on.

Invariants (tested): a sample is in at most one claim; a claim for a step never changes once
written; ``step`` only grows; every sample handed to the trainer for step ``s`` has
``policy_version >= s - max_off_policy_steps`` (default ``async_level``), an ``accepted`` verdict, the validator's reward, advantage
and log-probs, and a worker that was not banned when the claim was made and had it released.
"""

from __future__ import annotations

from prime_rl.api.errors import ApiFailure
from prime_rl.api.protocol import StatusResponse
from prime_rl.orchestrator.batches import EXPIRED, StoredBatch
from prime_rl.orchestrator.lease_rules import machine_caused
from prime_rl.orchestrator.leases import TaskPrompts
from prime_rl.orchestrator.ledger_state import WORKER_LIMIT_RETRY_S as WORKER_LIMIT_RETRY_S
from prime_rl.orchestrator.ledger_state import rejected_batch
from prime_rl.orchestrator.ledger_state import run_tool_python as run_tool_python
from prime_rl.orchestrator.ledger_trainer import TrainerRules
from prime_rl.orchestrator.ledger_validators import ValidatorRules
from prime_rl.orchestrator.ledger_workers import WorkerRules
from prime_rl.orchestrator.release import SNAPSHOT_EVERY, ReleaseBook, withheld
from prime_rl.orchestrator.workers import WorkerRegistry
from prime_rl.weights.layout import POLICY_FILENAME

__all__ = ["EXPIRED", "ApiFailure", "Ledger", "TaskPrompts"]


class Ledger(WorkerRules, ValidatorRules, TrainerRules):
    """All orchestrator state and rules (see module docstring); ``Ledger(config, tasks, store, *,
    metrics=None, clock=time.time, secrets=None)`` builds the books (``LedgerState``) and rebuilds
    them from ``store`` (``_load``).
    """

    def _load(self) -> None:
        """Rebuild memory from the store: leases (folded totals, lease events), the other events,
        then batches and verdicts, then claims."""
        self.leases.load()  # its own events, read as columns
        judged_after = self.release.restore(self.store.release_rows())
        for event in self.store.replay_events(WorkerRegistry.EVENTS | {"commit"}, judged_after):
            kind = event.get("event")
            if kind in WorkerRegistry.EVENTS:
                self.workers.replay(event)
            elif kind in ReleaseBook.EVENTS:
                self.release.replay(event)
            elif kind == "commit":
                self.committed.add(int(event["step"]))
                self.commit_times[int(event["step"]) + 1] = float(event.get("time", 0.0))
                self.step = max(self.step, int(event["step"]) + 1)
        loaded = self.batches.load()
        for batch in loaded:
            self._replay_batch(batch)
        # Settled batches whose leases are not folded yet (a restart before the fold): one lookup each.
        open_ids = {batch.batch_id for batch in loaded}
        for worker_id, batch_index, step in self.leases.unfolded_keys():
            batch_id = f"{worker_id}-s{step}-b{batch_index}"
            if batch_id not in open_ids and (settled := self.batches.get(batch_id)) is not None:
                self._replay_batch(settled, settled=True)
        self.claims.load_latest()
        self.capacity.restore_claims(self.claims.latest_step(), self.store.claim)  # two indexed reads
        self.leases.queue_expired_after_replay()
        for worker in self.workers.values():
            self.fresh.track(worker)
        self._settle()
        # Judgements replayed after the snapshot of batches that settled before the restart.
        self.release.forget([b for b in self.release.batch_ids() if not self.batches.is_open(b)])
        if self.release.since_snapshot:
            self._snapshot_release()

    def _snapshot_release(self) -> None:
        """Write the release book's changes since its last snapshot (``release.py``)."""
        rows, deletes = self.release.snapshot()
        self.store.write_release(rows, deletes)

    def _snapshot_release_if_due(self) -> None:
        """Snapshot the release book every ``SNAPSHOT_EVERY`` changes (after a verdict; the restart
        path above reads the snapshots, so both live here)."""
        if self.release.since_snapshot >= SNAPSHOT_EVERY:
            self._snapshot_release()

    def _replay_batch(self, batch: StoredBatch, settled: bool = False) -> None:
        """Apply a stored batch to the leases and release state on restart (as submit and
        record_verdicts did; a ``settled`` one was counted for release before it settled)."""
        self.leases.mark_answered(batch.worker_id, batch.meta.batch_index)
        validator_judged = batch.verdicts is not None and not batch.expired
        if validator_judged and not settled and not self.release.counted(batch.batch_id):
            self.release.judged(batch.batch_id, batch.worker_id, batch.verdicts or [], None)  # crashed between writes
        if validator_judged:
            rejected = rejected_batch(batch.verdicts or [])
            if not rejected and withheld(batch.verdicts or []):  # as in record_verdicts
                self.leases.return_tasks(batch.worker_id, batch.meta.batch_index, replaying=True)
            self.leases.mark_judged(
                batch.worker_id, batch.meta.batch_index, rejected=rejected,
                machine=rejected and machine_caused(batch.verdicts or []), replaying=True,
            )  # fmt: skip
        elif batch.expired:  # never judged: its tasks go to another identity, as in _expire_useless
            self.leases.return_tasks(batch.worker_id, batch.meta.batch_index, replaying=True)

    def status(self) -> StatusResponse:
        """``GET /status``. Reads only counters and config (no iteration, no change): the HTTP layer
        calls it without the lock, from the event loop."""
        sampling = self.config.sampling
        return StatusResponse(
            step=self.step,
            policy_version=self.step,
            async_level=self.orch.async_level,
            min_policy_version=self.min_policy_version,
            group_size=sampling.group_size,
            prompts_per_batch=self.orch.prompts_per_batch,
            temperature=sampling.temperature,
            max_new_tokens=sampling.max_new_tokens,
            stop=list(sampling.stop),
            num_tasks=len(self.tasks),
            task_timeout_s=self.orch.task_timeout_s,
            weights_servers=self.config.shardcast.client_servers,
            weights_file=POLICY_FILENAME,
            workers=len(self.workers),
            pending_batches=self.batches.waiting_count(),
            time=self.clock(),
            environment=self.environment,
            tool_python=self.tool_python,
            **self.rules.status_fields(),
        )
