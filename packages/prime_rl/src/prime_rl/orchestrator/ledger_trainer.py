"""The ledger's rules for the trainer: a step's claim of accepted samples, and its commit.

``TrainerRules`` serves the trusted trainer endpoints over the ledger's books (``LedgerState``,
ledger_state.py). A claim for the current step selects released, accepted samples no older than
the off-policy bound (claims.py), writes it once and answers the same on every retry; a commit
advances the step and folds the settled leases and batches into the run's record (record.py).
``Ledger`` (ledger.py) exposes these methods.
"""

from __future__ import annotations

from prime_rl.api.errors import ApiFailure
from prime_rl.api.protocol import (
    ClaimRequest,
    ClaimResponse,
    CommitRequest,
    CommitResponse,
    SampleId,
    TrainSample,
)
from prime_rl.api.staleness import claim_staleness
from prime_rl.orchestrator.claims import ClaimSelection, select_claim, stale_drops
from prime_rl.orchestrator.ledger_state import LedgerState
from prime_rl.orchestrator.store import ClaimRecord

__all__ = ["TrainerRules"]


class TrainerRules(LedgerState):
    """The trainer endpoints' rules (see module docstring)."""

    def claim(self, request: ClaimRequest) -> ClaimResponse:
        min_version = max(0, request.step - self.orch.off_policy_bound)
        if request.step in self.claims:
            return self._claim_answer(request.step, min_version, self.claims[request.step], None)
        if request.step != self.step:
            raise ApiFailure(
                409, "conflict", f"step {request.step} is not the current step {self.step} and has no claim"
            )
        self._expire_useless()
        banned = self.banned_workers()  # banned since their samples were accepted: not trusted any more
        usable = self._usable(banned)
        selection = select_claim(
            [b for b in self.batches.live() if usable(b)],
            min_policy_version=min_version,
            min_samples=request.min_samples,
            filter_zero_advantage=request.filter_zero_advantage,
        )
        if not selection.ready:
            held = select_claim(
                [b for b in self.batches.live() if b.worker_id not in banned and not usable(b)],
                min_policy_version=min_version,
                min_samples=1 << 62,
                filter_zero_advantage=request.filter_zero_advantage,
            ).available
            reason = (
                f"{selection.available} fresh accepted samples available (policy_version >= {min_version}), "
                f"need {request.min_samples}; {selection.pending_batches} batches ({selection.pending_samples} "
                f"samples) await validation; {held} accepted samples are held until their workers' evidence "
                "covers them (orchestrator.release_after_tokens)"
            )
            return ClaimResponse(
                ready=False,
                step=request.step,
                min_policy_version=min_version,
                samples=[],
                reason=reason,
                available_samples=selection.available,
                pending_batches=selection.pending_batches,
                pending_samples=selection.pending_samples,
                stale_samples=selection.stale + self.batches.past_bound(),
                zero_advantage_samples=selection.zero_advantage,
                held_samples=held,
            )
        chosen = selection.sample_ids
        claimed = self.batches.claimed_after(chosen)
        self.store.write_claim(ClaimRecord(request.step, min_version, self.clock(), chosen), claimed)
        self.claims.add(request.step, chosen)
        self.capacity.claimed(request.step, len(chosen), self.clock())
        self.batches.mark_claimed(claimed)
        samples = self.batches.training_samples(chosen)
        stale = selection.stale + self.batches.past_bound()
        self._settle()
        self.metrics.log(
            "claim",
            step=request.step,
            samples=len(chosen),
            min_policy_version=min_version,
            stale_samples=stale,
            zero_advantage_samples=selection.zero_advantage,
            stale_drops=stale_drops(self.batches.dropped(), past_bound=stale),
            **claim_staleness(samples, request.step).metrics(),
        )
        return self._claim_answer(request.step, min_version, chosen, selection, samples, stale)

    def _claim_answer(
        self,
        step: int,
        min_version: int,
        sample_ids: tuple[SampleId, ...],
        selection: ClaimSelection | None,
        samples: list[TrainSample] | None = None,
        stale: int = 0,
    ) -> ClaimResponse:
        return ClaimResponse(
            ready=True,
            step=step,
            min_policy_version=min_version,
            samples=samples if samples is not None else self.batches.training_samples(sample_ids),
            reason="",
            available_samples=len(sample_ids),
            pending_batches=selection.pending_batches if selection else 0,
            pending_samples=selection.pending_samples if selection else 0,
            stale_samples=stale,
            zero_advantage_samples=selection.zero_advantage if selection else 0,
        )

    def commit(self, request: CommitRequest) -> CommitResponse:
        if request.policy_version != request.step + 1:
            raise ApiFailure(400, "bad_request", f"policy_version must be step + 1 = {request.step + 1}")
        if request.step < self.step:
            return CommitResponse(step=self.step, policy_version=self.step)
        if request.step > self.step:
            raise ApiFailure(409, "conflict", f"step {request.step} is ahead of the current step {self.step}")
        if request.step not in self.claims:
            raise ApiFailure(
                409, "conflict", f"no claim exists for step {request.step}; claim before committing"
            )
        now = self.clock()
        self.store.append_event(
            {"event": "commit", "step": request.step, "policy_version": request.policy_version, "time": now}
        )
        self.committed.add(request.step)
        self.commit_times[request.step + 1] = now
        self.step = request.step + 1
        self.metrics.log("commit", step=request.step, policy_version=self.step)
        # The run's training record (record.py): leases fold first (a batch waits for its lease to fold);
        # the steps a trainer resuming from its oldest checkpoint may claim again stay out.
        self.leases.fold()
        self.batches.compact(request.step, self.config.trainer.checkpoint_every * self.config.trainer.keep_checkpoints)
        return CommitResponse(step=self.step, policy_version=self.step)
