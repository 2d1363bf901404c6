"""The orchestrator's HTTP wire format: one pydantic model per request and response body.

These models ARE the API (API.md documents them field by field; a test checks the two agree).
The orchestrator validates every request body with ``Model.model_validate_json`` (strict JSON
types, unknown keys rejected, NaN/Infinity rejected) and answers 4xx on any failure; the client
parses every response with the same models.

Pitfall: integers are strict: ``"3"`` or ``3.0`` is not an int, ``true`` is not an int.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Annotated

from pydantic import BaseModel, ConfigDict, Field, StringConstraints, model_validator

from prime_rl.api.fields import (
    MAX_DETAIL_CHARS,
    NonNegInt,
    ProofBytes,
    Reason,
    SampleId,
    Seed,
    TokenId,
    WorkerId,
    WorkerName,
)
from prime_rl.api.segments import Segment, segments_problem
from prime_rl.api.spans import MAX_SPANS, VersionSpan

__all__ = [
    "FOLLOWER_REASONS",
    "UNVERIFIABLE_REASONS",
    "ApiModel",
    "BanRequest",
    "BanResponse",
    "BatchEvidence",
    "BatchVerdicts",
    "ClaimRequest",
    "ClaimResponse",
    "CommitRequest",
    "CommitResponse",
    "DoneRequest",
    "DoneResponse",
    "ErrorResponse",
    "EvidenceTestSpec",
    "LeaseDone",
    "LeaseRecord",
    "LeaseSource",
    "LeaseSwitch",
    "LeaseTask",
    "NoiseProfileAnswer",
    "NoiseProfileRecord",
    "PendingBatch",
    "PendingResponse",
    "RegisterRequest",
    "RegisterResponse",
    "RolloutBatch",
    "RolloutSample",
    "SampleEvidence",
    "SampleId",
    "Segment",
    "StatusResponse",
    "SubmitResponse",
    "SwitchRequest",
    "SwitchResponse",
    "TaskLease",
    "TrainSample",
    "ValidatorLeaseRequest",
    "ValidatorLeaseResponse",
    "Verdict",
    "VerdictRequest",
    "VerdictResponse",
    "VersionSpan",
    "WorkerStats",
    "WorkerTotals",
    "WorkersResponse",
    "machine_rejected",
]

class ApiModel(BaseModel):
    """Base of every wire model: strict types, unknown keys rejected, finite floats only."""

    model_config = ConfigDict(extra="forbid", strict=True, allow_inf_nan=False, frozen=True)


class ErrorResponse(ApiModel):
    """Body of every 4xx/5xx answer."""

    error: str = Field(description="Short machine-readable code, e.g. 'bad_request', 'not_found'.")
    message: str = Field(description="What was wrong and what to do.")


# ------------------------------------------------------------------ status and registration


class StatusResponse(ApiModel):
    """GET /status."""

    step: NonNegInt = Field(description="Trainer step rollouts are collected for now.")
    policy_version: NonNegInt = Field(description="Newest published policy version (weights after N steps).")
    async_level: NonNegInt = Field(description="Lease window: a new lease fixes a version >= step - async_level.")
    min_policy_version: NonNegInt = Field(
        description="max(0, step - async_level): oldest version a new lease may fix."
    )
    group_size: int = Field(description="Completions per prompt.")
    prompts_per_batch: int = Field(description="Prompts per lease.")
    temperature: float = Field(description="Sampling temperature.")
    max_new_tokens: int = Field(description="Max completion tokens.")
    stop: list[str] = Field(description="Stop strings.")
    num_tasks: int = Field(description="Size of the task set (task ids are < num_tasks).")
    task_timeout_s: float = Field(description="Seconds before an unsubmitted lease is reassigned.")
    weights_servers: list[str] = Field(description="shardcast servers to fetch policy versions from.")
    weights_file: str = Field(description="File name of a policy version inside shardcast.")
    workers: int = Field(description="Registered workers.")
    pending_batches: int = Field(description="Submitted batches waiting for validation.")
    time: float = Field(description="Server unix time.")
    environment: str = Field(
        default="",
        description="Digest of the run's [tasks.environment] (settings and source file: "
        "prime_rl.config.environment); a worker whose own differs stops. '' = not known here.",
    )
    tool_python: str | None = Field(
        default=None,
        description="Multi-turn runs: the Python version ('3.11') the run's Python tool runs in; a worker whose tool "
        "runs another refuses to start (its tool outputs would not match the validator's replays). Null: no pin.",
    )
    lease_budget_samples: int | None = Field(
        default=None,
        description="Samples that may be outstanding (open leases, awaiting verdicts, judged and unclaimed) so each "
        "can still be judged and trained in the off-policy window, at the last lease decision "
        "(orchestrator.lease_judgeable); a lease beyond it is answered 429 busy. Null: off or not computed yet.",
    )
    unjudged_budget_samples: int | None = Field(
        default=None,
        description="Of those, the samples that may be unjudged (open leases, awaiting verdicts): what the validators "
        "judge before the oldest goes stale, at the last lease decision. Null: no estimate of their pace yet.",
    )
    admitted_samples: int | None = Field(
        default=None, description="Outstanding samples counted at the last lease decision (null before any)."
    )
    judge_samples_per_s: float | None = Field(
        default=None,
        description="Moving estimate: samples all validators together judge per second while work waits (null "
        "before the first verdict since the orchestrator started).",
    )
    trainer_samples_per_step: float | None = Field(
        default=None, description="Moving estimate: samples per trainer claim (null before the first claim)."
    )
    trainer_step_s: float | None = Field(
        default=None, description="Moving estimate: seconds between consecutive claims (null before two)."
    )
    capabilities: list[str] = Field(
        default_factory=list,
        description="Optional features this orchestrator serves, e.g. 'noise_profile' (GET/POST "
        "/validator/noise-profile); 'validator_leases' once pending batches are leased to one validator each.",
    )


class RegisterRequest(ApiModel):
    """POST /workers/register."""

    name: WorkerName = Field(default="", description="Free-form label for logs: at most 64 printable characters.")


class RegisterResponse(ApiModel):
    """Answer to POST /workers/register."""

    worker_id: WorkerId = Field(description="Id to use in every later request.")
    token: str = Field(description="Secret; send 'Authorization: Bearer <token>' on /tasks and /rollouts.")


# ------------------------------------------------------------------ tasks


class LeaseSource(ApiModel):
    """The lease whose tasks a reassigned lease re-issues."""

    worker_id: WorkerId
    step: NonNegInt
    batch_index: NonNegInt


class LeaseTask(ApiModel):
    """One prompt of a lease."""

    task_id: NonNegInt = Field(description="Index into the task set.")
    prompt: str = Field(
        description="Full prompt text (template applied); tokenize it with the model tokenizer."
    )
    sampling_seeds: list[Seed] = Field(description="Seed of completion g (g = 0..group_size-1).")


class TaskLease(ApiModel):
    """GET /tasks answer: the work of one batch."""

    worker_id: WorkerId
    step: NonNegInt
    batch_index: NonNegInt
    policy_version: NonNegInt = Field(
        description="Generate with exactly this policy version: the one the worker asked for (GET /tasks "
        "`version`) if inside the async window, else the newest committed when the lease was issued (its step). "
        "A batch with any other version is rejected (wrong_policy_version)."
    )
    min_policy_version: NonNegInt = Field(
        description="max(0, step - async_level): a batch of this step with an older version is stale_policy."
    )
    deadline: float = Field(description="Unix time after which the tasks may be reassigned.")
    group_size: int
    temperature: float
    max_new_tokens: int
    stop: list[str]
    tasks: list[LeaseTask]
    reassigned_from: LeaseSource | None = Field(
        default=None, description="Set when these tasks were reassigned."
    )


class LeaseSwitch(ApiModel):
    """A worker's in-flight switch, as the orchestrator recorded it (``POST /leases/switch``): the
    lease's samples still running at token ``32 * chunk`` are sampled by ``policy_version`` from there,
    with the seeds ``span_seed(seed, switch_nonce(...))``."""

    policy_version: NonNegInt
    chunk: Annotated[int, Field(ge=1)] = Field(
        description="Proof-chunk index of the switch (first token 32 * chunk); in a multi-turn run the model turn it starts."
    )
    announced_at: float = Field(description="Orchestrator (unix) time of the first announcement.")


class LeaseDone(ApiModel):
    """A worker's declaration that its lease's samples are all decoded (``POST /leases/done``)."""

    digest: Annotated[str, StringConstraints(pattern=r"^[0-9a-f]{64}$")] = Field(
        description="api.spans.lease_digest of the batch the worker will submit."
    )
    declared_at: float = Field(description="Orchestrator (unix) time of the declaration.")


class LeaseRecord(ApiModel):
    """A lease as stored by the orchestrator (given to the validator)."""

    worker_id: WorkerId
    step: NonNegInt
    batch_index: NonNegInt
    task_ids: list[NonNegInt]
    issued_at: float
    deadline: float
    source_worker_id: WorkerId = Field(
        description="Tasks are task_ids(seed, source_worker_id, source_step, source_batch_index)."
    )
    source_step: NonNegInt
    source_batch_index: NonNegInt
    policy_version: NonNegInt | None = Field(
        default=None,
        description="The policy version the lease fixes (None: its step; leases stored before this field).",
    )
    switches: list[LeaseSwitch] = Field(
        default_factory=list,
        description="In-flight switches announced for this lease, oldest first (versions and chunks increase).",
    )
    done: LeaseDone | None = Field(default=None, description="The worker's done declaration, if any.")

    @property
    def fixed_version(self) -> int:
        """The one policy version a batch answering this lease may be generated with."""
        return self.step if self.policy_version is None else self.policy_version


class SwitchRequest(ApiModel):
    """POST /leases/switch: the worker announces an in-flight switch of its open lease."""

    worker_id: WorkerId
    step: NonNegInt
    batch_index: NonNegInt
    policy_version: NonNegInt = Field(description="The committed version to switch to (newer than the lease's current).")
    chunk: Annotated[int, Field(ge=1, le=1 << 19)] = Field(
        description="Proof-chunk index of the switch: the new version samples from completion token 32 * chunk. "
        "In a multi-turn run (tasks.environment not single_turn): the model turn t >= 1 at whose start it switches."
    )


class DoneRequest(ApiModel):
    """POST /leases/done: the worker declares its lease decoded, with the digest of its batch."""

    worker_id: WorkerId
    step: NonNegInt
    batch_index: NonNegInt
    digest: Annotated[str, StringConstraints(pattern=r"^[0-9a-f]{64}$")] = Field(
        description="api.spans.lease_digest(samples) of the batch the worker will submit (SHA-256 hex)."
    )


class DoneResponse(ApiModel):
    """Answer to POST /leases/done."""

    digest: str
    declared_at: float = Field(description="Orchestrator time of the first declaration.")


class SwitchResponse(ApiModel):
    """Answer to POST /leases/switch: the nonce that seeds every token from the switch on."""

    policy_version: NonNegInt
    chunk: Annotated[int, Field(ge=1)]
    nonce: Seed = Field(description="span_seed(sample seed, nonce) samples the sample's tokens from 32 * chunk on.")


# ------------------------------------------------------------------ rollouts


class RolloutSample(ApiModel):
    """One completion of a submitted batch."""

    task_id: NonNegInt
    group_index: NonNegInt = Field(description="Which of the group_size completions (0-based).")
    prompt_tokens: Annotated[list[TokenId], Field(min_length=1)]
    completion_tokens: Annotated[list[TokenId], Field(min_length=1)]
    sampling_seed: Seed
    temperature: Annotated[float, Field(gt=0.0, le=100.0)]
    reward: float = Field(description="Claimed reward (the validator recomputes it).")
    advantage: float = Field(description="Claimed group advantage (the validator recomputes it).")
    proofs: ProofBytes = Field(
        description="Base64 (standard alphabet, padded) of the concatenated toploc proofs."
    )
    inference_logprobs: list[float] = Field(
        description="Log-prob of each completion token under the sampler (0.0 at environment tokens)."
    )
    segments: list[Segment] | None = Field(
        default=None,
        description="Multi-turn episode: the completion as alternating model and env segments "
        "(api/segments.py); null: single-turn, every completion token sampled by the model.",
    )
    spans: Annotated[list[VersionSpan], Field(max_length=MAX_SPANS)] | None = Field(
        default=None,
        description="In-flight weight updates: which policy version sampled which tokens (api/spans.py); "
        "null: the batch's policy_version sampled every token.",
    )

    @model_validator(mode="after")
    def _lengths(self) -> RolloutSample:
        if len(self.inference_logprobs) != len(self.completion_tokens):
            raise ValueError(
                f"inference_logprobs has {len(self.inference_logprobs)} entries for "
                f"{len(self.completion_tokens)} completion tokens"
            )
        segments = self.segments
        problem = None if segments is None else segments_problem(segments, len(self.completion_tokens), self.inference_logprobs)
        if problem is not None:
            raise ValueError(f"segments: {problem}")
        return self


class RolloutBatch(ApiModel):
    """POST /rollouts body."""

    worker_id: WorkerId
    step: NonNegInt = Field(description="The lease's step.")
    batch_index: NonNegInt = Field(description="The lease's batch index.")
    policy_version: NonNegInt = Field(description="Policy version that generated every sample.")
    samples: Annotated[list[RolloutSample], Field(min_length=1)]


class SubmitResponse(ApiModel):
    """Answer to POST /rollouts (sent only after the batch is durably on disk)."""

    batch_id: str
    num_samples: int
    duplicate: bool = Field(description="True if this exact batch was already stored (a retry).")


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
