"""The ledger's rules for validators: the queue of batches to judge, validator leases, verdicts.

``ValidatorRules`` serves the trusted validator endpoints over the ledger's books (``LedgerState``,
ledger_state.py): the listing and leasing of batches awaiting verdicts (``BatchBook.pending_unread``,
established workers' first; validator_leases.py), and the verdicts, stored with the run's evidence
ledger's judgement and the release count in one store transaction (evidence_ledger.py, release.py).
A rejected batch costs its worker what walking away costs and hands its tasks to another identity
(leases.py, lease_rules.py). ``Ledger`` (ledger.py) exposes these methods.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from prime_rl.api.protocol import (
    PendingResponse,
    ValidatorLeaseRequest,
    ValidatorLeaseResponse,
    Verdict,
    VerdictRequest,
    VerdictResponse,
)
from prime_rl.orchestrator.batch_verdicts import UnreadSamples
from prime_rl.orchestrator.lease_rules import machine_caused
from prime_rl.orchestrator.ledger_state import LedgerState, rejected_batch
from prime_rl.orchestrator.release import withheld

__all__ = ["ValidatorRules"]


class ValidatorRules(LedgerState):
    """The validator endpoints' rules (see module docstring)."""

    def pending(self, limit: int) -> PendingResponse:
        """``GET /validator/pending``: a listing of the batches no validator holds (takes nothing)."""
        answer, unread = self.pending_unread(limit)
        return unread.into(answer)

    def pending_unread(self, limit: int) -> tuple[PendingResponse, UnreadSamples]:
        """``pending``, its samples read after this call (``UnreadSamples.into``, off the ledger's thread)."""
        self._expire_useless()
        free = self.validator_leases.free_for("")
        return self.batches.pending_unread(limit, self.step, established=self._has_history, client=self._client_of, free=free)

    def take_batches(self, request: ValidatorLeaseRequest) -> ValidatorLeaseResponse:
        """``POST /validator/leases``: renew ``request.renew``, then lease up to ``request.limit`` more
        batches to the validator, in the queue's order (``validator_leases.py``)."""
        answer, unread = self.take_batches_unread(request)
        return unread.into(answer)

    def take_batches_unread(self, request: ValidatorLeaseRequest) -> tuple[ValidatorLeaseResponse, UnreadSamples]:
        """``take_batches``, its samples read after this call (``UnreadSamples.into``, off the ledger's
        thread). A batch settled before they are read is left out of the answer; its lease goes
        with it at the next ``prune``."""
        self._expire_useless()
        leases, validator_id = self.validator_leases, request.validator_id
        leases.prune()
        renewed, lost = leases.renew(validator_id, request.renew, lambda b: b in self.batches.waiting_ids())
        free = leases.free_for(validator_id)
        renewing = set(renewed)
        answer, unread = self.batches.pending_unread(
            request.limit, self.step, established=self._has_history, client=self._client_of,
            free=lambda batch_id: batch_id not in renewing and free(batch_id),
        )  # fmt: skip
        expires_at = leases.take(validator_id, [batch.batch_id for batch in answer.batches])
        if answer.batches:
            self.metrics.log("validator_lease", validator_id=validator_id, batches=[b.batch_id for b in answer.batches])
        response = ValidatorLeaseResponse(
            batches=answer.batches, renewed=renewed, lost=lost, expires_at=expires_at, lease_s=leases.lease_s,
            pending_batches=answer.pending_batches, policy_version=self.step, step=self.step,
        )  # fmt: skip
        return response, unread

    def record_verdicts(self, request: VerdictRequest) -> VerdictResponse:
        """Store the verdicts and count the judgement for release in one store transaction; a rejected
        batch costs its worker what walking away costs (``LeaseRules``: allowance, address cap,
        abandonment ban) and hands its lease's tasks to another identity."""
        batch = self.batches.get(request.batch_id)
        judged = judgement = None
        events: list[dict[str, Any]] = []
        if batch is not None and (batch.verdicts is None or batch.expired):  # (unknown: 404 from the batch book)
            self.validator_leases.check_verdict(batch.batch_id, request.validator_id or "")  # not judged: the holder's
            evidence = request.worker_evidence
            if request.prefilled is not None and len(request.verdicts) == len(batch.task_ids):  # (else 400 below)
                judgement = self.run_evidence.judge(
                    batch.worker_id, request.verdicts, prefilled=request.prefilled, evidence=request.evidence
                )
                request, evidence = request.model_copy(update={"verdicts": judgement.verdicts}), judgement.fraction
                if judgement.ban and not self.workers[batch.worker_id].banned:
                    events.append({"event": "ban", "worker_id": batch.worker_id, "reason": judgement.ban, "time": self.clock()})
            judged = self.release.judged_event(batch.batch_id, batch.worker_id, request.verdicts, evidence)
        elif batch is not None and request.prefilled is not None:  # a retry: compared as the ledger recorded it
            recorded = self.run_evidence.as_recorded(batch.worker_id, request.verdicts)
            if _normalized(recorded) == batch.verdicts:  # (judged after the worker's evidence ban)
                request = request.model_copy(update={"verdicts": recorded})
        answer = self.batches.record_verdicts(
            request, [e for e in (judged, *events) if e is not None], self._keeps_open,
            evidence=[judgement.store_row()] if judgement is not None else (),
        )  # fmt: skip
        self.validator_leases.release(request.batch_id)
        if judgement is not None:
            answer = self._apply_judgement(judgement, events, answer)
        elif batch is not None and batch.worker_id in self.run_evidence:
            row = self.run_evidence.get(batch.worker_id)
            answer = answer.model_copy(update={"worker_evidence": row.fraction, "ban_reason": row.evidence_ban or row.failure_ban})
        if judged is not None:
            self.capacity.judged(self.clock(), len(request.verdicts), self.batches.waiting_count())
            self.release.replay(judged)
            if not self.batches.is_open(request.batch_id):
                self.release.forget([request.batch_id])
            self._snapshot_release_if_due()
            stored = self.batches[request.batch_id]
            rejected = rejected_batch(stored.verdicts or [])
            if not rejected and withheld(stored.verdicts or []):
                # Never trained (``release.py``): its tasks go to another identity, so a worker cannot
                # keep tasks out of training with one token beyond the tolerance; no charge, since
                # honest noise puts such tokens there too (before mark_judged: a returned lease never folds).
                self.leases.return_tasks(stored.worker_id, stored.meta.batch_index)
            machine = rejected and machine_caused(stored.verdicts or [])  # never towards the abandonment ban
            self.leases.mark_judged(stored.worker_id, stored.meta.batch_index, rejected=rejected, machine=machine)
            if rejected:
                self.rules.ban_abandoners({stored.worker_id})
        return answer

    def _apply_judgement(self, judgement: Any, bans: Sequence[dict[str, Any]], answer: VerdictResponse) -> VerdictResponse:
        """Apply a stored judgement of the run's evidence ledger (its row and ``ban`` events were written
        with the verdicts) to memory; the answer tells the validator the worker's evidence and ban."""
        self.run_evidence.commit(judgement)
        for event in bans:
            self.workers.replay(event)
            self.metrics.log("ban", worker_id=event["worker_id"], reason=event["reason"])
        if judgement.evidence_fields:
            self.metrics.log("evidence", worker_id=judgement.worker_id, **judgement.evidence_fields)
        row = judgement.row
        return answer.model_copy(update={"worker_evidence": row.fraction, "ban_reason": row.evidence_ban or row.failure_ban})


def _normalized(verdicts: Sequence[Verdict]) -> list[Verdict]:
    """``verdicts`` as the batch book stores them (by sample index; a rejected one keeps no log-probs)."""
    kept = (v if v.accepted or not v.logprobs else v.model_copy(update={"logprobs": []}) for v in verdicts)
    return sorted(kept, key=lambda v: v.sample_index)
