"""Packed per-token arrays on the wire (``api.fields.packed_array`` / ``unpacking``).

A sample's ``prompt_tokens``, ``completion_tokens`` and ``inference_logprobs`` may travel as
``{"dtype": "<i4" | "<f8", "b64": ...}`` instead of JSON lists: the validators' listings send them so
(``?arrays=packed``), and a submission may. A packed array is checked exactly as the list it stands
for; anything else in its place is a 400 that stores nothing.
"""

from __future__ import annotations

import base64
import json
from typing import Any

import numpy as np
import pytest
import requests

from prime_rl.api.client import OrchestratorClient
from prime_rl.api.fields import packed_array
from prime_rl.api.protocol import RolloutSample

SAMPLE = {
    "task_id": 1, "group_index": 0, "prompt_tokens": [1, 2, 3], "completion_tokens": [4, 5, 2**31 - 1],
    "sampling_seed": 9, "temperature": 1.0, "reward": 0.0, "advantage": 0.0, "proofs": "",
    "inference_logprobs": [-0.5, -1.0 / 3.0, -1e-300],
}  # fmt: skip


def _packed(sample: dict[str, Any]) -> dict[str, Any]:
    return {
        **sample,
        "prompt_tokens": packed_array(np.array(sample["prompt_tokens"], np.int32)),
        "completion_tokens": packed_array(np.array(sample["completion_tokens"], np.int32)),
        "inference_logprobs": packed_array(np.array(sample["inference_logprobs"], np.float64)),
    }


def test_a_packed_sample_is_the_sample_its_lists_make() -> None:
    packed = _packed(SAMPLE)
    assert packed["prompt_tokens"] == {"dtype": "<i4", "b64": base64.b64encode(bytes([1, 0, 0, 0, 2, 0, 0, 0, 3, 0, 0, 0])).decode()}
    as_lists = RolloutSample.model_validate_json(json.dumps(SAMPLE))
    assert RolloutSample.model_validate_json(json.dumps(packed)) == as_lists
    assert RolloutSample.model_validate(packed) == as_lists
    assert json.loads(as_lists.model_dump_json())["inference_logprobs"] == SAMPLE["inference_logprobs"]  # answers stay lists


def _b64(data: bytes) -> str:
    return base64.b64encode(data).decode()


BAD = {
    "a token below 0": ("prompt_tokens", packed_array(np.array([3, -1], np.int32)), "greater than or equal to 0"),
    "no tokens": ("completion_tokens", {"dtype": "<i4", "b64": ""}, "at least 1 item"),
    "floats for tokens": ("prompt_tokens", packed_array(np.array([1.0, 2.0])), "this field takes '<i4'"),
    "big-endian": ("prompt_tokens", {"dtype": ">i4", "b64": _b64(b"\0\0\0\1")}, "this field takes '<i4'"),
    "int64 tokens": ("prompt_tokens", {"dtype": "<i8", "b64": _b64(bytes(8))}, "this field takes '<i4'"),
    "a ragged byte count": ("prompt_tokens", {"dtype": "<i4", "b64": _b64(bytes(6))}, "not a whole number"),
    "not base64": ("prompt_tokens", {"dtype": "<i4", "b64": "AAAA*AAA"}, "not standard padded base64"),
    "b64 not a string": ("prompt_tokens", {"dtype": "<i4", "b64": [1, 2]}, "must be a string"),
    "another key": ("prompt_tokens", {"dtype": "<i4", "b64": _b64(bytes(4)), "shape": [1]}, "exactly the keys"),
    "NaN": ("inference_logprobs", {"dtype": "<f8", "b64": _b64(np.array([np.nan, 0, 0]).tobytes())}, "finite"),
    "infinity": ("inference_logprobs", {"dtype": "<f8", "b64": _b64(np.array([-np.inf, 0, 0]).tobytes())}, "finite"),
    "float32 log-probs": ("inference_logprobs", {"dtype": "<f4", "b64": _b64(bytes(12))}, "this field takes '<f8'"),
    "one log-prob too few": ("inference_logprobs", packed_array(np.array([-0.5, -0.5])), "2 entries for 3"),
}


@pytest.mark.parametrize("case", sorted(BAD))
def test_a_bad_packed_array_is_refused_as_its_list_would_be(case: str) -> None:
    field, value, why = BAD[case]
    with pytest.raises(ValueError, match=why):
        RolloutSample.model_validate_json(json.dumps({**SAMPLE, field: value}))


def test_a_packed_submission_is_stored_as_its_lists_and_a_bad_one_stores_nothing(
    client: OrchestratorClient, server: Any, batch_for: Any
) -> None:
    """Through the real server: a batch whose samples are packed is acknowledged and stored with the
    values its lists hold; one with a bad packed array is a 400 and stores nothing."""
    registered = client.register()
    headers = {"Authorization": f"Bearer {client.worker_token}", "Content-Type": "application/json"}
    lease = client.get_tasks(registered.worker_id)
    batch = json.loads(batch_for(lease).model_dump_json())
    bad = {**batch, "samples": [_packed(s) for s in batch["samples"]]}
    bad["samples"][1]["completion_tokens"] = {"dtype": "<i4", "b64": _b64(bytes(5))}
    answer = requests.post(f"{server.url}/rollouts", data=json.dumps(bad), headers=headers, timeout=10)
    assert answer.status_code == 400 and "samples.1.completion_tokens" in answer.json()["message"]
    assert len(server.ledger.batches) == 0
    packed = {**batch, "samples": [_packed(s) for s in batch["samples"]]}
    answer = requests.post(f"{server.url}/rollouts", data=json.dumps(packed), headers=headers, timeout=10)
    assert answer.status_code == 200, answer.text
    stored = server.ledger.pending(8).batches
    assert [b.batch_id for b in stored] == [answer.json()["batch_id"]]
    assert stored[0].samples == [RolloutSample.model_validate(s) for s in batch["samples"]]
