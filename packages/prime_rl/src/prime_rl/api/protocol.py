"""The orchestrator's HTTP wire format: one pydantic model per request and response body.

These models ARE the API (API.md documents them field by field; a test checks the two agree).
The orchestrator validates every request body with ``Model.model_validate_json`` (strict JSON
types, unknown keys rejected, NaN/Infinity rejected) and answers 4xx on any failure; the client
parses every response with the same models.

Pitfall: integers are strict: ``"3"`` or ``3.0`` is not an int, ``true`` is not an int.

The models live in four homes, one per caller: ``protocol_base`` (the base model and the error body),
``protocol_worker`` (a worker's calls), ``protocol_validator`` (the validator's calls and the run's noise
profile) and ``protocol_trainer`` (the trusted operators' calls); this module lists them all, and is
where callers import them from.
"""

from __future__ import annotations

from prime_rl.api.fields import (
    SampleId,
)
from prime_rl.api.protocol_base import (
    ApiModel,
    ErrorResponse,
)
from prime_rl.api.protocol_trainer import (
    BanRequest,
    BanResponse,
    ClaimRequest,
    ClaimResponse,
    CommitRequest,
    CommitResponse,
    TrainSample,
    WorkersResponse,
    WorkerStats,
    WorkerTotals,
)
from prime_rl.api.protocol_validator import (
    FOLLOWER_REASONS,
    UNVERIFIABLE_REASONS,
    BatchEvidence,
    BatchVerdicts,
    EvidenceTestSpec,
    NoiseProfileAnswer,
    NoiseProfileRecord,
    PendingBatch,
    PendingResponse,
    SampleEvidence,
    ValidatorLeaseRequest,
    ValidatorLeaseResponse,
    Verdict,
    VerdictRequest,
    VerdictResponse,
    host_validator_id,
    machine_rejected,
)
from prime_rl.api.protocol_worker import (
    DoneRequest,
    DoneResponse,
    LeaseDone,
    LeaseRecord,
    LeaseSource,
    LeaseSwitch,
    LeaseTask,
    RegisterRequest,
    RegisterResponse,
    RolloutBatch,
    RolloutSample,
    StatusResponse,
    SubmitResponse,
    SwitchRequest,
    SwitchResponse,
    TaskLease,
)
from prime_rl.api.segments import (
    Segment,
)
from prime_rl.api.spans import (
    VersionSpan,
)

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
    "host_validator_id",
    "machine_rejected",
]
