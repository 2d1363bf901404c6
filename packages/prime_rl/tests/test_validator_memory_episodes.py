"""Mixed-version episodes in bounded memory (issue 46, item 3): the episode path of the validator's
spanned checks prefilled in chunks, halved on out-of-memory, and a failing device never the worker's.
The backend and its budget are ``test_validator_memory.py``'s; the plays are ``test_inflight_episodes.py``'s."""

from __future__ import annotations

import pytest
import torch

from prime_rl.inference.backend import HFBackend
from prime_rl.validator.checks import BackendFailure

from . import test_inflight_episodes as multi
from .test_inflight_episodes import files, plays  # noqa: F401  (module fixtures)
from .test_validator_memory import Budget, budget, judge


def backend(limit: int, fail: BaseException | None = None) -> Budget:
    return Budget(HFBackend("unused", model=multi.make_tiny_lm(seed=0), tokenizer=multi.TOKENIZER), limit, fail)


def test_a_mixed_version_episode_lease_is_halved_on_out_of_memory_never_malformed(files, plays):  # noqa: F811
    batch, record = plays["two"], multi.RECORDS["two"]
    limited = backend(budget(batch, 2.5))  # the whole lease's logits at once would not fit
    verdicts = judge(limited, files, batch, record, multi.CHECKS)
    assert [v.reason for v in verdicts] == ["ok"] * len(batch.samples), [(v.reason, v.detail) for v in verdicts]
    assert 0 < limited.peak <= limited.budget


def test_a_failing_device_leaves_a_mixed_version_episode_lease_pending(files, plays):  # noqa: F811
    batch, record = plays["two"], multi.RECORDS["two"]
    with pytest.raises(BackendFailure):
        judge(backend(budget(batch, 1000), torch.OutOfMemoryError("CUDA out of memory")), files, batch, record, multi.CHECKS)
