"""Conversions between wire models (``protocol``) and the store's parquet rows (``store.BATCH_SCHEMA``).

Pure functions: a submitted batch becomes column lists (proofs decoded from base64 to bytes);
stored rows become the samples the validator receives and the samples the trainer receives.
Round trip: ``rollout_samples(table_of(batch_rows(batch))) == batch.samples`` exactly (floats are
stored as float64, proofs re-encoded with the standard padded alphabet).
"""

from __future__ import annotations

import base64
import binascii
from collections.abc import Collection, Sequence
from typing import Any

import pyarrow as pa

from prime_rl.api.protocol import RolloutBatch, RolloutSample, TrainSample

__all__ = ["ProofEncodingError", "batch_rows", "rollout_samples", "train_samples"]


class ProofEncodingError(ValueError):
    """A sample's ``proofs`` field is not standard padded base64; ``index`` is the sample."""

    def __init__(self, index: int, detail: str) -> None:
        super().__init__(f"sample {index}: proofs is not base64: {detail}")
        self.index = index


def batch_rows(batch: RolloutBatch) -> dict[str, Sequence[Any]]:
    """``BATCH_SCHEMA`` columns of ``batch``; raises ``ProofEncodingError`` on bad base64."""
    proofs = []
    for index, sample in enumerate(batch.samples):
        try:
            proofs.append(base64.b64decode(sample.proofs, validate=True))
        except (binascii.Error, ValueError) as error:
            raise ProofEncodingError(index, str(error)) from None
    samples = batch.samples
    return {
        "sample_index": list(range(len(samples))),
        "task_id": [s.task_id for s in samples],
        "group_index": [s.group_index for s in samples],
        "prompt_tokens": [s.prompt_tokens for s in samples],
        "completion_tokens": [s.completion_tokens for s in samples],
        "sampling_seed": [s.sampling_seed for s in samples],
        "temperature": [s.temperature for s in samples],
        "reward": [s.reward for s in samples],
        "advantage": [s.advantage for s in samples],
        "proofs": proofs,
        "inference_logprobs": [s.inference_logprobs for s in samples],
    }


def rollout_samples(table: pa.Table) -> list[RolloutSample]:
    """The stored samples as submitted (trusted data: constructed without re-validation)."""
    return [
        RolloutSample.model_construct(
            task_id=row["task_id"],
            group_index=row["group_index"],
            prompt_tokens=row["prompt_tokens"],
            completion_tokens=row["completion_tokens"],
            sampling_seed=row["sampling_seed"],
            temperature=row["temperature"],
            reward=row["reward"],
            advantage=row["advantage"],
            proofs=base64.b64encode(row["proofs"]).decode("ascii"),
            inference_logprobs=row["inference_logprobs"],
        )
        for row in table.to_pylist()
    ]


def train_samples(
    batch_id: str,
    meta: dict[str, Any],
    table: pa.Table,
    verdicts: Sequence[Any],
    indices: Collection[int],
) -> dict[int, TrainSample]:
    """Samples ``indices`` of one stored batch as the trainer receives them.

    Every value the trainer learns from is the validator's: reward, advantage and the behaviour
    log-probs recomputed in its prefill (``verdicts[i].logprobs``); the worker's claims (its reward,
    advantage and ``inference_logprobs``) stay in the store for audit and never leave it here.
    Tokens, task and group are the worker's, each checked by the validator before it accepted.
    """
    result = {}
    for row in table.to_pylist():
        index = row["sample_index"]
        if index in indices:
            verdict = verdicts[index]
            result[index] = TrainSample.model_construct(
                sample_id=f"{batch_id}/{index}",
                batch_id=batch_id,
                worker_id=meta["worker_id"],
                task_id=row["task_id"],
                group_index=row["group_index"],
                policy_version=meta["policy_version"],
                prompt_tokens=row["prompt_tokens"],
                completion_tokens=row["completion_tokens"],
                behaviour_logprobs=list(verdict.logprobs),
                temperature=row["temperature"],
                reward=verdict.reward,
                advantage=verdict.advantage,
            )
    return result
