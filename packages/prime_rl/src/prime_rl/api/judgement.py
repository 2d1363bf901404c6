"""How a judged batch counts against its worker: the failure-rate rule, shared by every validator.

The orchestrator keeps one ledger per run (``orchestrator/evidence_ledger.py``): whatever validator
judged a batch, its counts are added by these rules, in the verdict's own transaction, so K
validators judge an identity exactly as one would. Torch-free (the orchestrator imports it);
``validator.verdicts`` re-exports ``ban_counts`` for the validator's side.
"""

from __future__ import annotations

from collections.abc import Sequence

from prime_rl.api.fields import MAX_DETAIL_CHARS
from prime_rl.api.protocol import FOLLOWER_REASONS, Verdict, machine_rejected

__all__ = ["BANNED_WORKER", "NOISE_REASONS", "NOT_THE_WORKERS", "ban_counts", "failure_ban", "reject_banned"]

BANNED_WORKER = "banned_worker"
"""The reason of an accepted sample whose worker the evidence banned at or before its batch."""

NOT_THE_WORKERS = frozenset({"unknown_policy", "internal_error"})
"""Failures found before any prefill that the validator's own state may explain (a version it cannot
fetch, a bug of its own): such a batch counts as many rejections as it has samples, no more."""

NOISE_REASONS = frozenset({"sampling_mismatch", "logprobs_mismatch"})
"""Per-token rules an honest worker fails at their calibrated false-rejection rate (bf16 decode
against prefill noise): a fresh identity keeps the ``ban_min_samples`` grace for them, so one unlucky
first lease does not ban an honest newcomer; the evidence still sees every such token."""


def ban_counts(
    verdicts: Sequence[Verdict], *, prefilled: bool = True, fresh: bool = False, min_samples: int = 0
) -> tuple[int, int]:
    """(accepted, rejected) of one judged batch as they count towards its worker's ban.

    A batch whose only own failures are ``reward_unverifiable`` or ``tool_unverifiable``
    (``protocol.machine_rejected``; every other rejection follows them: ``lease_rejected``,
    ``group_rejected``) counts (0, 0): the machine, not the worker, may explain it, and an honest
    worker must not near a ban for it (``rewards.py`` and ``episodes.py`` say why this gives a
    cheater nothing). A batch rejected before any model check (``prefilled`` False: its lease,
    tasks, version, prompts, seeds or termination are wrong, which no honest worker's noise can
    cause) counts at least ``min_samples`` rejections (the validator's ``ban_min_samples``), so a
    fresh identity's one failed lease reaches the ban whatever its size. So does any own failure of a
    ``fresh`` worker's batch (one with no accepted sample yet): ``min_samples`` is a grace that keeps a
    rare noisy sample from banning a worker with a record, and a fresh identity has none; without
    this, every new identity got one free lease of fabricated episodes with random proofs
    (``toploc_mismatch`` after the prefill, 8 samples < 16), and identities cost nothing (issue 34,
    ``test_redteam_round3.py``), except where its only own failures are ``NOISE_REASONS``. Any other
    failure in the batch counts the whole batch as before.
    """
    accepted = sum(v.accepted for v in verdicts)
    rejected = len(verdicts) - accepted
    if machine_rejected(verdicts):
        return 0, 0
    own = {str(v.reason) for v in verdicts if not v.accepted} - FOLLOWER_REASONS
    graced = fresh and prefilled and own <= NOISE_REASONS
    if rejected and (fresh or not prefilled) and not own & NOT_THE_WORKERS and not graced:
        rejected = max(rejected, min_samples)
    return accepted, rejected


def failure_ban(accepted: int, rejected: int, *, rate: float, min_samples: int) -> str | None:
    """The failure-rate ban reason for cumulative counts (None: not banned): ``rate`` of the samples
    rejected once at least ``min_samples`` were counted."""
    total = accepted + rejected
    if total < min_samples or total == 0 or rejected / total < rate:
        return None
    return f"{rejected}/{total} samples rejected (threshold {rate:.0%})"


def reject_banned(verdicts: Sequence[Verdict], reason: str) -> list[Verdict]:
    """The batch of a worker banned by evidence trains nothing: its accepted verdicts become
    ``banned_worker`` rejections (the evidence that banned it includes these very samples)."""
    return [
        v.model_copy(update={"accepted": False, "reason": BANNED_WORKER, "detail": reason[:MAX_DETAIL_CHARS]})
        if v.accepted
        else v
        for v in verdicts
    ]
