"""The validator in bounded memory, and the machine's failures never the worker's (issue 46, item 3).

A spanned batch used to be prefilled whole: every sample's KV cache and fp32 logits held until the
last version was forwarded, and a forward that ran out of memory rejected the lease as
``malformed`` (which counts towards bans). Here the validator's backend is the real HF backend
behind a memory budget: it raises the real ``torch.OutOfMemoryError`` once the logits it handed out
and that are still alive exceed the budget. Same decodes as ``test_inflight.py`` and
``test_inflight_episodes.py`` (real tiny models, real keep-KV / recompute-KV switches).
"""

from __future__ import annotations

import dataclasses
import weakref
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pytest
import torch
from validator_setup import pending_of  # tests/support

from prime_rl.api.protocol import LeaseRecord, RolloutBatch
from prime_rl.inference.backend import HFBackend
from prime_rl.validator.checks import BackendFailure, Checks, RetryLater, backend_failure
from prime_rl.validator.verdicts import validate_batch

from . import test_inflight as single
from . import test_inflight_episodes as multi
from .test_inflight import decodes, files  # noqa: F401  (module fixtures)

VOCAB = 100  # tiny_lm's


class Budget:
    """The validator's HF backend with a device-memory budget of ``samples`` completions' fp32 logits:
    a forward that would hold more logits alive than that raises ``torch.OutOfMemoryError``, as CUDA
    does. ``fail``: raise this on every forward instead (a device that is gone)."""

    def __init__(self, inner: HFBackend, budget: int, fail: BaseException | None = None) -> None:
        self.inner, self.fail, self.budget = inner, fail, budget
        self.live: list[weakref.ref[torch.Tensor]] = []
        self.peak = 0

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)

    def _held(self) -> int:
        self.live = [r for r in self.live if r() is not None]
        return sum(t.numel() * t.element_size() for r in self.live if (t := r()) is not None)

    def _admit(self, new_bytes: int) -> None:
        if self.fail is not None:
            raise self.fail
        held = self._held()
        if held + new_bytes > self.budget:
            raise torch.OutOfMemoryError(
                f"CUDA out of memory. Tried to allocate {new_bytes} bytes ({held} held, budget {self.budget})"
            )

    def _track(self, tensors: Sequence[torch.Tensor]) -> None:
        self.live.extend(weakref.ref(t) for t in tensors)
        self.peak = max(self.peak, self._held())

    def extend(self, tokens: Sequence[int], cache: Any) -> tuple[torch.Tensor, Any]:
        self._admit(len(tokens) * VOCAB * 4)
        return self.inner.extend(tokens, cache)

    def head(self, hidden: torch.Tensor) -> torch.Tensor:
        logits = self.inner.head(hidden)
        self._track([logits])
        return logits

    def prefill(self, prompts: Sequence[Sequence[int]], completions: Sequence[Sequence[int]]) -> list:
        self._admit(sum(len(c) for c in completions) * VOCAB * 4)
        out = self.inner.prefill(prompts, completions)
        self._track([p.logits for p in out])
        return out


def judge(
    backend: Budget, version_files: dict[int, Path], batch: RolloutBatch, record: LeaseRecord, checks: Checks
) -> list:
    """``validate_batch`` with ``backend`` loading each version in place (starting from v0)."""

    def backend_for(version: int) -> Budget | None:
        if version not in version_files:
            return None
        if version != backend.inner.policy_version:
            backend.inner.load_weights(version_files[version], version)
        return backend

    backend_for(0)
    return validate_batch(
        pending_of(batch, record), tasks=checks_tasks(checks), backend_for=backend_for, decode=checks_decode(checks), checks=checks,
        newest_version=2,
    )  # fmt: skip


def checks_tasks(checks: Checks) -> Any:
    return multi.RUN if checks.episode_env is not None else single.RUN


def checks_decode(checks: Checks) -> Any:
    return checks_tasks(checks).decode


def budget(batch: RolloutBatch, samples: float) -> int:
    """Bytes of ``samples`` of the batch's longest completions' fp32 logits."""
    return int(samples * max(len(s.completion_tokens) for s in batch.samples) * VOCAB * 4)


def single_backend(limit: int, fail: BaseException | None = None) -> Budget:
    inner = HFBackend("unused", model=single.make_tiny_lm(seed=0), tokenizer=single.TOKENIZER)
    return Budget(inner, limit, fail)


def with_batch_size(checks: Checks, size: int) -> Checks:
    return dataclasses.replace(checks, validator=checks.validator.model_copy(update={"max_batch_size": size}))


def spanned_count(batch: RolloutBatch) -> int:
    return sum(1 for s in batch.samples if s.spans is not None and len(s.spans) > 1)


def test_a_spanned_batch_is_judged_in_chunks_within_a_budget_it_would_overrun_whole(files, decodes):  # noqa: F811
    batch, record = decodes["two"], single.RECORDS["two"]
    assert spanned_count(batch) >= 4, "the decode needs several spanned samples"
    checks = with_batch_size(single.CHECKS, 2)
    backend = single_backend(budget(batch, 2.5))  # room for two samples' logits, not the whole batch's
    verdicts = judge(backend, files, batch, record, checks)
    assert [v.reason for v in verdicts] == ["ok"] * len(batch.samples), [(v.reason, v.detail) for v in verdicts]
    assert 0 < backend.peak <= backend.budget
    for v, s in zip(verdicts, batch.samples, strict=True):  # same recomputation as in one piece
        assert max(abs(a - b) for a, b in zip(v.logprobs, s.inference_logprobs, strict=True)) < 1e-4


@pytest.mark.parametrize("which", ["none", "two"], ids=["one_version", "spanned"])
def test_a_chunk_out_of_memory_is_halved_until_it_fits_never_malformed(files, decodes, which):  # noqa: F811
    """The configured chunk (64) holds the whole batch; the device holds two samples: the validator
    halves the chunk after the out-of-memory and judges the lease as it would have (today: every
    sample ``malformed``, a lease counted against an honest worker)."""
    batch, record = decodes[which], single.RECORDS[which]
    backend = single_backend(budget(batch, 2.5))
    verdicts = judge(backend, files, batch, record, single.CHECKS)
    assert [v.reason for v in verdicts] == ["ok"] * len(batch.samples), [(v.reason, v.detail) for v in verdicts]
    assert backend.peak <= backend.budget


@pytest.mark.parametrize(
    "failure",
    [
        torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 600.00 MiB"),
        RuntimeError("CUDA error: an illegal memory access was encountered"),
        RuntimeError("CUDA error: unspecified launch failure"),
    ],
    ids=["oom", "illegal_access", "device_lost"],
)
@pytest.mark.parametrize("which", ["none", "two"], ids=["one_version", "spanned"])
def test_a_backend_failure_leaves_the_batch_pending_never_a_verdict(files, decodes, failure, which):  # noqa: F811
    batch, record = decodes[which], single.RECORDS[which]
    backend = single_backend(budget(batch, 1000), fail=failure)
    with pytest.raises(RetryLater) as info:  # validator/process.py: not posted, judged again later
        judge(backend, files, batch, record, single.CHECKS)
    assert isinstance(info.value, BackendFailure)
    assert info.value.out_of_memory == isinstance(failure, torch.OutOfMemoryError)


def test_the_backends_refusal_of_an_input_stays_the_samples():
    from prime_rl.inference.contract import GenerationError

    assert backend_failure(GenerationError("prefill needs a non-empty prompt and completion")) is None
    assert backend_failure(ValueError("2 prompts but 3 completions")) is None
    assert backend_failure(IndexError("index out of range in self")) is None
    assert backend_failure(KeyError("x")) is None
    oom = backend_failure(torch.OutOfMemoryError("CUDA out of memory"))
    assert oom is not None and oom.kind == "out_of_memory"
    device = backend_failure(RuntimeError("CUDA error: device-side assert triggered"))
    assert device is not None and device.kind == "device"


@pytest.mark.cuda
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_on_cuda_a_real_out_of_memory_is_retried_smaller_and_chunks_bound_the_peak(files, decodes):  # noqa: F811
    """On a GPU: the chunked spanned path accepts the honest lease with a lower peak than one chunk
    for the whole batch, and a real allocator out-of-memory inside a forward raises BackendFailure."""
    batch, record = decodes["two"], single.RECORDS["two"]
    peaks = {}
    for size in (64, 1):
        inner = HFBackend("unused", model=single.make_tiny_lm(seed=0), tokenizer=single.TOKENIZER, device="cuda")
        backend = Budget(inner, budget(batch, 1e6))
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
        base = torch.cuda.memory_allocated()
        verdicts = judge(backend, files, batch, record, with_batch_size(single.CHECKS, size))
        assert [v.reason for v in verdicts] == ["ok"] * len(batch.samples), [(v.reason, v.detail) for v in verdicts]
        peaks[size] = torch.cuda.max_memory_allocated() - base
    assert peaks[1] < peaks[64], peaks

    class Hungry(Budget):
        def extend(self, tokens: Sequence[int], cache: Any) -> tuple[torch.Tensor, Any]:
            total = torch.cuda.get_device_properties(0).total_memory
            torch.empty(2 * total, dtype=torch.uint8, device="cuda")  # the allocator's own OutOfMemoryError
            return super().extend(tokens, cache)

    inner = HFBackend("unused", model=single.make_tiny_lm(seed=0), tokenizer=single.TOKENIZER, device="cuda")
    with pytest.raises(BackendFailure) as info:
        judge(Hungry(inner, budget(batch, 1e6)), files, batch, record, single.CHECKS)
    assert info.value.out_of_memory
