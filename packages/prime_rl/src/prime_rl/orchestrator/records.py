"""Conversions between wire models (``protocol``) and the store's payload rows (``store.BATCH_SCHEMA``).

Pure functions: a submitted batch becomes column lists; stored rows become the samples the
validator receives and the samples the trainer receives. Proofs are bytes in the models and in
the store (base64 exists only on the wire, in ``api.fields.ProofBytes``). Round trip:
``rollout_samples(table_of(batch_rows(batch))) == batch.samples`` exactly (floats are float64).
"""

from __future__ import annotations

import base64
import itertools
from collections.abc import Collection, Sequence
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from prime_rl.api.fields import PACKED_FLOAT64, PACKED_INT32, packed_array
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

__all__ = ["batch_rows", "rollout_samples", "sample_documents", "train_samples"]

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


def sample_documents(table: pa.Table, *, packed: bool = False) -> list[dict[str, Any]]:
    """The stored samples as the JSON documents of their ``RolloutSample`` (the plain values its
    ``model_dump(mode="json")`` gives: proofs in base64, segments and spans as objects or null), read
    straight from the payload table without building the models: ``TypeAdapter(Any).dump_json`` of them
    is byte for byte the models' ``model_dump_json`` (``tests/test_validator_leases.py``).

    ``packed``: the token and log-prob lists in their packed form (``api.fields.packed_array``),
    taken from the table's buffers; a listing of 64 samples is mostly those lists
    (``batch_verdicts.UnreadSamples.json``)."""
    names = [*_SAMPLE_FIELDS, *(name for name in ("segments", "spans") if name in table.column_names)]
    lists = _PER_TOKEN_LISTS if packed else ()
    documents = table.select([name for name in names if name not in lists]).to_pylist()
    for name in lists:
        dtype = PACKED_FLOAT64 if name == "inference_logprobs" else PACKED_INT32
        for document, values in zip(documents, _row_arrays(table.column(name), dtype), strict=True):
            document[name] = packed_array(values, dtype)
    for document in documents:
        document["proofs"] = base64.b64encode(document["proofs"]).decode("ascii")
        document.setdefault("segments", None)  # a batch stored before episodes or in-flight updates
        document.setdefault("spans", None)
    return [{name: document[name] for name in (*_SAMPLE_FIELDS, "segments", "spans")} for document in documents]


_PER_TOKEN_LISTS = ("prompt_tokens", "completion_tokens", "inference_logprobs")


def _row_arrays(column: pa.ChunkedArray, dtype: str) -> list[np.ndarray]:
    """Each row of a list column as a NumPy view of its values as ``dtype`` (no Python number is made)."""
    lists = column.combine_chunks()
    values = lists.flatten().to_numpy(zero_copy_only=False).astype(dtype, copy=False)
    bounds = np.concatenate(([0], np.cumsum(pc.list_value_length(lists).fill_null(0).to_numpy(zero_copy_only=False))))
    return [values[start:end] for start, end in itertools.pairwise(bounds)]


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
