"""Conversions between wire models (``protocol``) and the store's payload rows (``store.BATCH_SCHEMA``).

Pure functions: a submitted batch becomes column lists; stored rows become the samples the
validator receives and the samples the trainer receives. Proofs are bytes in the models and in
the store (base64 exists only on the wire, in ``api.fields.ProofBytes``). Round trip:
``rollout_samples(table_of(batch_rows(batch))) == batch.samples`` exactly (floats are float64).
"""

from __future__ import annotations

from collections.abc import Collection, Sequence
from typing import Any

import pyarrow as pa

from prime_rl.api.protocol import (
    RolloutBatch,
    RolloutSample,
    SampleId,
    Segment,
    TrainSample,
    Verdict,
    VersionSpan,
)
from prime_rl.orchestrator.store import BatchMeta

__all__ = ["batch_rows", "rollout_samples", "train_samples"]

_SAMPLE_FIELDS = (
    "task_id",
    "group_index",
    "prompt_tokens",
    "completion_tokens",
    "sampling_seed",
    "temperature",
    "reward",
    "advantage",
    "proofs",
    "inference_logprobs",
)


def batch_rows(batch: RolloutBatch) -> dict[str, Sequence[Any]]:
    """``BATCH_SCHEMA`` columns of ``batch``."""
    rows: dict[str, Sequence[Any]] = {"sample_index": list(range(len(batch.samples)))}
    for name in _SAMPLE_FIELDS:
        rows[name] = [getattr(sample, name) for sample in batch.samples]
    rows["segments"] = [
        None if sample.segments is None else [s.model_dump() for s in sample.segments]
        for sample in batch.samples
    ]
    rows["spans"] = [
        None if sample.spans is None else [s.model_dump() for s in sample.spans] for sample in batch.samples
    ]
    return rows


def _segments(row: dict[str, Any]) -> list[Segment] | None:
    """A stored row's episode segments (None: single-turn, or a batch stored before episodes)."""
    stored = row.get("segments")
    return None if stored is None else [Segment.model_construct(**s) for s in stored]


def _spans(row: dict[str, Any]) -> list[VersionSpan] | None:
    """A stored row's version spans (None: one version, or a batch stored before in-flight updates)."""
    stored = row.get("spans")
    return None if stored is None else [VersionSpan.model_construct(**s) for s in stored]


def rollout_samples(table: pa.Table) -> list[RolloutSample]:
    """The stored samples as submitted (trusted data: constructed without re-validation)."""
    return [
        RolloutSample.model_construct(
            **{name: row[name] for name in _SAMPLE_FIELDS}, segments=_segments(row), spans=_spans(row)
        )
        for row in table.to_pylist()
    ]


_TRAIN_COLUMNS = (
    "sample_index", "task_id", "group_index", "prompt_tokens", "completion_tokens", "temperature", "segments", "spans",
)  # fmt: skip


def train_samples(
    meta: BatchMeta, table: pa.Table, verdicts: Sequence[Verdict], indices: Collection[int]
) -> dict[int, TrainSample]:
    """Samples ``indices`` of one stored batch as the trainer receives them.

    Every value the trainer learns from is the validator's: reward, advantage and the behaviour
    log-probs recomputed in its prefill (``verdicts[i].logprobs``); the worker's claims (its reward,
    advantage and ``inference_logprobs``) stay in the store for audit and never leave it here.
    Tokens, task and group are the worker's, each checked by the validator before it accepted.
    """
    result = {}
    wanted = [name for name in _TRAIN_COLUMNS if name in table.column_names]  # not the proofs, nor the worker's log-probs
    for row in table.select(wanted).to_pylist():
        index = row["sample_index"]
        if index in indices:
            verdict = verdicts[index]
            result[index] = TrainSample.model_construct(
                sample_id=str(SampleId(meta.batch_id, index)),
                batch_id=meta.batch_id,
                worker_id=meta.worker_id,
                task_id=row["task_id"],
                group_index=row["group_index"],
                policy_version=meta.policy_version,
                prompt_tokens=row["prompt_tokens"],
                completion_tokens=row["completion_tokens"],
                behaviour_logprobs=list(verdict.logprobs),
                temperature=row["temperature"],
                reward=verdict.reward,
                advantage=verdict.advantage,
                segments=_segments(row),
                spans=_spans(row),
            )
    return result
