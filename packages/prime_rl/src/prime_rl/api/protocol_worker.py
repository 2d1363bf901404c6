"""Wire models of a worker's calls: status, registration, leases, switches and rollouts.

Part of the API that ``protocol.py`` lists whole.
"""

from __future__ import annotations

from typing import Annotated

from pydantic import Field, StringConstraints, model_validator

from prime_rl.api.fields import (
    PACKED_FLOAT64,
    PACKED_INT32,
    NonNegInt,
    ProofBytes,
    Seed,
    TokenId,
    WorkerId,
    WorkerName,
    unpacking,
)
from prime_rl.api.protocol_base import ApiModel
from prime_rl.api.segments import Segment, segments_problem
from prime_rl.api.spans import MAX_SPANS, VersionSpan

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
        "/validator/noise-profile); 'validator_leases' once pending batches are leased to one validator each; "
        "'packed_arrays' where packed per-token arrays are read and, on request (arrays=packed), sent.",
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
    prompt_tokens: Annotated[list[TokenId], Field(min_length=1), unpacking(PACKED_INT32)] = Field(
        description="Token ids: a JSON list, or packed ({'dtype': '<i4', 'b64': ...}, api.fields.packed_array)."
    )
    completion_tokens: Annotated[list[TokenId], Field(min_length=1), unpacking(PACKED_INT32)] = Field(
        description="Token ids: a JSON list, or packed ({'dtype': '<i4', 'b64': ...})."
    )
    sampling_seed: Seed
    temperature: Annotated[float, Field(gt=0.0, le=100.0)]
    reward: float = Field(description="Claimed reward (the validator recomputes it).")
    advantage: float = Field(description="Claimed group advantage (the validator recomputes it).")
    proofs: ProofBytes = Field(
        description="Base64 (standard alphabet, padded) of the concatenated toploc proofs."
    )
    inference_logprobs: Annotated[list[float], unpacking(PACKED_FLOAT64)] = Field(
        description="Log-prob of each completion token under the sampler (0.0 at environment tokens): a JSON "
        "list, or packed ({'dtype': '<f8', 'b64': ...})."
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
