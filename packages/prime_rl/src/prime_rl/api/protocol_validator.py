"""Wire models of the validator's calls: pending batches, validator leases, verdicts, evidence and the
run's noise profile.

Part of the API that ``protocol.py`` lists whole.
"""

from __future__ import annotations

import re
import socket
from collections.abc import Sequence
from typing import Annotated

from pydantic import Field, StringConstraints, model_validator

from prime_rl.api.fields import (
    MAX_DETAIL_CHARS,
    NonNegInt,
    Reason,
    WorkerId,
)
from prime_rl.api.protocol_base import ApiModel
from prime_rl.api.protocol_worker import LeaseRecord, RolloutSample

# ------------------------------------------------------------------ validator


class PendingBatch(ApiModel):
    """A stored batch awaiting verdicts."""

    batch_id: str
    worker_id: WorkerId
    step: NonNegInt
    batch_index: NonNegInt
    policy_version: NonNegInt
    received_at: float
    lease: LeaseRecord | None = Field(description="The lease the batch answers; null if none was issued.")
    samples: list[RolloutSample]
    client: str = Field(
        default="",
        description="The client address the lease was handed to (IPv4 address, IPv6 /64; '' if unknown): the "
        "validator's per-address tool-time budget.",
    )


class PendingResponse(ApiModel):
    """GET /validator/pending answer."""

    batches: list[PendingBatch]
    pending_batches: int = Field(description="All batches awaiting verdicts (may exceed len(batches)).")
    policy_version: NonNegInt
    step: NonNegInt


ValidatorId = Annotated[str, StringConstraints(pattern=r"^[A-Za-z0-9._:@-]{1,64}$")]
"""A validator's name for itself (leases, verdicts): 1..64 characters of ``A-Za-z0-9._:@-``."""


def host_validator_id(suffix: str) -> str:
    """``<host>-<suffix>``: a validator id (:data:`ValidatorId`) naming this machine, its host name cut
    to 48 characters and put into the characters an id allows. ``suffix`` (e.g. a pid, a process
    name) keeps two validators on one machine apart."""
    host = re.sub(r"[^A-Za-z0-9._:@-]", "-", socket.gethostname())[:48] or "validator"
    return f"{host}-{suffix}"


class ValidatorLeaseRequest(ApiModel):
    """POST /validator/leases (trusted): take pending batches exclusively, renew the ones still judged."""

    validator_id: ValidatorId = Field(description="Who takes and renews: the same name on every call.")
    limit: Annotated[int, Field(ge=0, le=256)] = Field(
        default=8, description="Batches to take now, beyond those renewed (0: renew only)."
    )
    renew: Annotated[list[str], Field(max_length=1024)] = Field(
        default_factory=list, description="Batch ids this validator holds and still judges: their leases are extended."
    )


class ValidatorLeaseResponse(ApiModel):
    """POST /validator/leases answer."""

    batches: list[PendingBatch] = Field(description="Newly taken (or re-served own) batches, in the queue's order.")
    renewed: list[str] = Field(description="The ``renew`` ids whose leases were extended.")
    lost: list[str] = Field(description="The ``renew`` ids no longer held: judged, expired or passed to another validator.")
    expires_at: float = Field(description="Orchestrator unix time when the leases of this answer run out.")
    lease_s: float = Field(description="Lease length (orchestrator.validator_lease_s): renew well before it.")
    pending_batches: int = Field(description="All batches awaiting verdicts (held by anyone or not).")
    policy_version: NonNegInt
    step: NonNegInt


class Verdict(ApiModel):
    """The validator's decision on one sample."""

    sample_index: NonNegInt = Field(description="Position of the sample in the batch.")
    accepted: bool
    reason: Reason = Field(description="'ok' when accepted, else a short code such as 'toploc_mismatch'.")
    detail: Annotated[str, StringConstraints(max_length=MAX_DETAIL_CHARS)] = Field(
        default="", description="What failed and by how much ('' when accepted)."
    )
    reward: float = Field(description="Reward recomputed by the validator (0 when not computed).")
    advantage: float = Field(description="Group advantage recomputed by the validator (0 when not computed).")
    logprobs: list[float] = Field(
        default_factory=list,
        description="Accepted: the log-prob of each completion token recomputed by the validator's prefill "
        "with the generating policy (what the trainer receives); rejected: empty.",
    )
    beyond_tolerance: NonNegInt = Field(
        default=0,
        description="Accepted: tokens whose sampling margin lies beyond the validator's sampling tolerance (bf16 "
        "allows a few, as honest noise does); a batch with any is never trained on (orchestrator ReleaseBook).",
    )


UNVERIFIABLE_REASONS = frozenset({"reward_unverifiable", "tool_unverifiable"})
"""Rejections the machine, not the worker, may explain (a wall-clock-limited check, a tool output no
replay reproduces): they reject the lease but never count towards the validator's failure-rate ban.
A worker can also cause them on purpose, so the lease costs what walking away costs (the
orchestrator's abandonment accounting, ``orchestrator.lease_rules``)."""

FOLLOWER_REASONS = frozenset({"lease_rejected", "group_rejected"})
"""Rejections that only follow another sample's failure (of the same lease or group)."""


def machine_rejected(verdicts: Sequence[Verdict]) -> bool:
    """True when a judged batch was rejected and its own failures (not ``FOLLOWER_REASONS``) are all
    ``UNVERIFIABLE_REASONS``: it counts nothing towards its worker's failure-rate ban
    (``validator.verdicts.ban_counts``). The orchestrator treats it as any rejected lease: it counts
    as abandoned and its tasks go to another identity (``orchestrator.leases``)."""
    own = {v.reason for v in verdicts if not v.accepted and v.reason not in FOLLOWER_REASONS}
    return bool(own) and own <= UNVERIFIABLE_REASONS


MAX_EVIDENCE_TESTS = 4096
"""Most evidence tests a run's profile may compile to (a profile gives some tens to hundreds)."""


class EvidenceTestSpec(ApiModel):
    """The per-worker evidence tests the validator judges by (``toploc.EvidenceTests`` as plain numbers):
    per test j, the statistic it watches, its threshold, the honest rate bound p0 and the alternative p1."""

    statistics: Annotated[list[Annotated[str, StringConstraints(max_length=64)]], Field(min_length=1, max_length=MAX_EVIDENCE_TESTS)]
    thresholds: Annotated[list[float], Field(max_length=MAX_EVIDENCE_TESTS)]
    null_rates: Annotated[list[Annotated[float, Field(gt=0, lt=1)]], Field(max_length=MAX_EVIDENCE_TESTS)]
    alternative_rates: Annotated[list[Annotated[float, Field(gt=0, lt=1)]], Field(max_length=MAX_EVIDENCE_TESTS)]
    log_threshold: Annotated[float, Field(gt=0)] = Field(description="Recent (CUSUM) score that bans (nats).")
    history_log_threshold: Annotated[float, Field(gt=0)] = Field(description="History score that bans (nats).")

    @model_validator(mode="after")
    def _same_lengths(self) -> EvidenceTestSpec:
        n = len(self.statistics)
        if not len(self.thresholds) == len(self.null_rates) == len(self.alternative_rates) == n:
            raise ValueError("statistics, thresholds, null_rates and alternative_rates need one entry per test")
        if any(p1 <= p0 for p0, p1 in zip(self.null_rates, self.alternative_rates, strict=True)):
            raise ValueError("every alternative rate must exceed its null rate")
        return self


class SampleEvidence(ApiModel):
    """One prefilled sample's evidence increments: per test, its observations and those above the threshold."""

    seen: Annotated[list[NonNegInt], Field(max_length=MAX_EVIDENCE_TESTS)]
    exceeded: Annotated[list[NonNegInt], Field(max_length=MAX_EVIDENCE_TESTS)]
    tokens: NonNegInt

    @model_validator(mode="after")
    def _counts(self) -> SampleEvidence:
        if len(self.seen) != len(self.exceeded) or any(k > n for n, k in zip(self.seen, self.exceeded, strict=True)):
            raise ValueError("seen and exceeded need one count per test, with exceeded <= seen")
        return self


class BatchEvidence(ApiModel):
    """What a judged batch adds to its worker's evidence, in submission order of its prefilled samples."""

    tests: EvidenceTestSpec
    samples: Annotated[list[SampleEvidence], Field(max_length=1 << 16)]


class VerdictRequest(ApiModel):
    """POST /validator/verdicts (trusted): one verdict per sample of the batch."""

    batch_id: str
    verdicts: Annotated[list[Verdict], Field(min_length=1)]
    worker_evidence: Annotated[float, Field(ge=0, allow_inf_nan=False)] | None = Field(
        default=None,
        description="The batch's worker's evidence score after this batch, as a fraction of the ban threshold "
        "(1 bans); null when the validator keeps no per-worker evidence.",
    )
    validator_id: ValidatorId | None = Field(
        default=None,
        description="The validator posting (as in POST /validator/leases); refused with 409 lease_lost while "
        "another validator holds the batch's lease.",
    )
    prefilled: bool | None = Field(
        default=None,
        description="Whether the batch reached the model checks; set, the orchestrator counts the batch in the "
        "run's ledger (failure counts, evidence, bans); null: it keeps no ledger for this verdict.",
    )
    evidence: BatchEvidence | None = Field(
        default=None, description="The batch's evidence increments (with prefilled set); null: none measured."
    )


class VerdictResponse(ApiModel):
    batch_id: str
    accepted: int
    rejected: int
    worker_evidence: float | None = Field(
        default=None, description="The worker's evidence in the run's ledger after this batch (fraction of the ban threshold)."
    )
    ban_reason: str = Field(default="", description="Why the run's ledger banned the worker ('' if it did not).")


class BatchVerdicts(ApiModel):
    """GET /rollouts/verdicts: how the validator judged one of the caller's batches."""

    batch_id: str
    judged: bool = Field(description="False while the batch awaits validation (then verdicts is empty).")
    verdicts: list[Verdict] = Field(description="One per sample, with the reason and detail of each rejection.")


# ------------------------------------------------------------------ the run's noise profile

MAX_PROFILE_CHARS = 1 << 20
"""Longest profile JSON accepted (a profile is ~6 KB; the cap keeps a stored record small)."""


class NoiseProfileRecord(ApiModel):
    """The run's honest-noise profile (trusted: GET /validator/noise-profile, POST /validator/noise-profile/publish).

    One per run: the first validator to publish one sets it, and every validator of the run judges
    by it (``prime_rl.validator.agreement``). The fields beside the profile say what it was
    measured on, so another validator can tell whether its own noise must be checked against it.
    """

    profile: Annotated[str, StringConstraints(max_length=MAX_PROFILE_CHARS)] = Field(
        description="The toploc-noise-profile/1 JSON (toploc.NoiseProfile.to_json)."
    )
    model: Annotated[str, StringConstraints(max_length=256)] = Field(
        description="Fingerprint of the model directory it was measured with (validator/model_fingerprint.py)."
    )
    dtype: Annotated[str, StringConstraints(max_length=32)] = Field(description="model.dtype of the measurement.")
    key: Annotated[str, StringConstraints(max_length=64)] = Field(
        description="Digest of the measurement's calibration key (validator/noise_cache.py): equal keys compute alike."
    )
    calibration_tokens: NonNegInt = Field(description="Honest tokens the measurement asked for.")
    published_by: Annotated[str, StringConstraints(max_length=128)] = Field(
        default="", description="Free-form label of the publishing validator (its process name and host)."
    )


class NoiseProfileAnswer(ApiModel):
    """Answer to GET /validator/noise-profile and POST /validator/noise-profile/publish: the run's profile, or null before the first."""

    record: NoiseProfileRecord | None = Field(description="The run's profile; null when none was published yet.")
