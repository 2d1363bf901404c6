"""Wire models of the trusted operators' calls: the worker table, bans, the trainer's claim and commit.

Part of the API that ``protocol.py`` lists whole.
"""

from __future__ import annotations

from typing import Annotated

from pydantic import Field

from prime_rl.api.fields import (
    NonNegInt,
    Reason,
    TokenId,
    WorkerId,
)
from prime_rl.api.protocol_base import ApiModel
from prime_rl.api.segments import Segment
from prime_rl.api.spans import VersionSpan

# ------------------------------------------------------------------ accounting


class WorkerStats(ApiModel):
    """One worker's accounting (GET /workers)."""

    worker_id: WorkerId
    name: str
    banned: bool
    ban_reason: str
    registered_at: float
    last_seen: float
    leases_issued: int
    leases_expired: int
    batches_submitted: int
    samples_submitted: int
    samples_accepted: int
    samples_rejected: int
    samples_pending: int
    samples_expired: int
    malformed_requests: int
    rejected_reasons: dict[str, int]
    retired: bool = False


class WorkerTotals(ApiModel):
    """The whole worker table in numbers (GET /workers, with every page)."""

    registered: int
    active: int
    banned: int
    retired: int
    established: int
    samples_accepted: int
    samples_rejected: int
    samples_pending: int
    samples_submitted: int = 0
    """Samples submitted by identities not banned (the orchestrator's view of honest work)."""
    samples_expired: int = 0
    """Of those, samples given the verdict ``expired``: never judged before their version went stale."""
    expired_share: float = 0.0
    """``samples_expired / samples_submitted`` (0 when nothing was submitted)."""


class WorkersResponse(ApiModel):
    """GET /workers: one page of a snapshot of the worker table (``orchestrator/workers_view.py``)."""

    workers: list[WorkerStats]
    total: int = 0
    """Workers in the order or filter asked for, over all pages."""
    offset: int = 0
    totals: WorkerTotals | None = None
    as_of: float = 0.0
    """Orchestrator time of the snapshot (at most ``workers_view_max_age_s`` old when served)."""


class BanRequest(ApiModel):
    """POST /workers/ban (trusted)."""

    worker_id: WorkerId
    reason: Reason


class BanResponse(ApiModel):
    worker_id: WorkerId
    banned: bool


# ------------------------------------------------------------------ trainer


class ClaimRequest(ApiModel):
    """POST /trainer/claim (trusted)."""

    step: NonNegInt = Field(description="The trainer step this data is for.")
    min_samples: Annotated[int, Field(ge=1, le=1 << 20)] = Field(description="Samples needed for the step.")
    filter_zero_advantage: bool = Field(
        default=True, description="Skip groups whose advantages are all zero."
    )


class TrainSample(ApiModel):
    """One accepted sample handed to the trainer."""

    sample_id: str = Field(description="'<batch_id>/<sample_index>', unique in the run.")
    batch_id: str
    worker_id: WorkerId
    task_id: NonNegInt
    group_index: NonNegInt
    policy_version: NonNegInt
    prompt_tokens: list[TokenId]
    completion_tokens: list[TokenId]
    behaviour_logprobs: list[float] = Field(
        description="Log-prob of each completion token under the generating policy version, recomputed "
        "by the validator's prefill (never the worker's claimed inference_logprobs); 0.0 at env tokens."
    )
    segments: list[Segment] | None = Field(default=None, description="Episode segments (null: single-turn).")
    spans: list[VersionSpan] | None = Field(
        default=None, description="Version spans of an in-flight sample (null: policy_version sampled every token)."
    )
    temperature: float
    reward: float = Field(description="Validator's reward.")
    advantage: float = Field(description="Validator's advantage.")


class ClaimResponse(ApiModel):
    """Answer to POST /trainer/claim: either the step's samples or why they are not ready."""

    ready: bool
    step: NonNegInt
    min_policy_version: NonNegInt
    samples: list[TrainSample] = Field(description="Whole groups, oldest first; empty unless ready.")
    reason: str = Field(description="Why not ready ('' when ready).")
    available_samples: int = Field(
        description="Not ready: accepted, unclaimed, fresh, informative samples; ready: len(samples)."
    )
    pending_batches: int = Field(description="Batches still awaiting validation.")
    pending_samples: int = Field(description="Samples still awaiting validation.")
    stale_samples: int = Field(description="Accepted samples too old to train on (never used).")
    zero_advantage_samples: int = Field(description="Accepted samples in all-zero-advantage groups.")
    held_samples: int = Field(
        default=0,
        description="Accepted, fresh samples held until their workers' evidence covers them (orchestrator.release_*).",
    )


class CommitRequest(ApiModel):
    """POST /trainer/commit (trusted): step's claim consumed, policy_version published."""

    step: NonNegInt
    policy_version: NonNegInt = Field(description="Must be step + 1.")


class CommitResponse(ApiModel):
    step: NonNegInt
    policy_version: NonNegInt
