"""The vLLM backend's lock-step guard without vLLM: when may a batch switch versions in flight?

A keep-KV switch is exact only if every request of the batch holds the same number of tokens at
every step and none is ever recomputed (``vllm_backend.lockstep_problem``); each way the engine
could break that is refused with its own reason, and a batch that fits exactly is allowed.
"""

from __future__ import annotations

import dataclasses

import pytest

from prime_rl.inference.vllm_backend import EngineLimits, lockstep_problem

FITS = EngineLimits(
    max_num_seqs=8, max_num_batched_tokens=1024, block_size=128, free_blocks=16, async_scheduling=False, busy=False
)
PROMPTS = [100] * 8  # 8 requests of 100 + 156 = 256 tokens: 2 blocks each, 16 in all


def test_a_batch_that_fits_one_step_and_the_free_blocks_may_switch():
    assert lockstep_problem(PROMPTS, 156, FITS) is None


@pytest.mark.parametrize(
    ("change", "prompts", "max_new_tokens", "message"),
    [
        ({"busy": True}, PROMPTS, 156, "running other requests"),
        ({"async_scheduling": True}, PROMPTS, 156, "asynchronously"),
        ({"max_num_seqs": 7}, PROMPTS, 156, "exceed the engine's max_num_seqs 7"),
        ({"max_num_batched_tokens": 799}, PROMPTS, 156, "800 prompt tokens exceed one step's budget of 799"),
        ({}, PROMPTS, 157, "may need 24 KV blocks, 16 are free"),  # one token more: a third block each
        ({"free_blocks": 15}, PROMPTS, 156, "may need 16 KV blocks, 15 are free"),
    ],
)
def test_each_way_to_lose_lock_step_is_refused_with_its_reason(change, prompts, max_new_tokens, message):
    problem = lockstep_problem(prompts, max_new_tokens, dataclasses.replace(FITS, **change))
    assert problem is not None and message in problem
