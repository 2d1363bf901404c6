"""Benchmark emulation of a GPU-like prefill cost (``validator/emulated_cost.py``, issue 45 item 6).

The floor is checked by what the validator asks ``time.sleep`` for (no timed assertions): the real
prefill runs and its results are unchanged; the sleep tops its time up to ``tokens * s_per_token``;
0 (the default) leaves the backend alone.
"""

from __future__ import annotations

import threading
import time
from pathlib import Path
from typing import Any

import pytest
import torch
from tiny_lm import save_tiny_lm

from prime_rl.config import RunConfig
from prime_rl.inference.backend import HFBackend
from prime_rl.validator import emulated_cost
from prime_rl.validator.emulated_cost import floor_prefill


@pytest.fixture(scope="module")
def backend(tmp_path_factory: pytest.TempPathFactory) -> HFBackend:
    return HFBackend(str(save_tiny_lm(tmp_path_factory.mktemp("model"))), dtype="float32", device=torch.device("cpu"))


def test_the_floor_is_off_by_default_and_in_no_shipped_config() -> None:
    assert RunConfig().validator.emulated_prefill_s_per_token == 0.0
    for path in (Path(__file__).resolve().parents[3] / "configs").glob("*.toml"):
        assert "emulated_prefill" not in path.read_text(), path


def test_a_prefill_is_topped_up_to_its_floor_and_its_results_are_the_real_ones(
    backend: HFBackend, monkeypatch: pytest.MonkeyPatch
) -> None:
    prompts, completions = [[5, 6, 7], [8, 9]], [[10, 11], [12, 13, 14, 15]]
    real = backend.prefill(prompts, completions)
    slept: list[float] = []
    this_thread, real_sleep = threading.get_ident(), time.sleep

    def sleep(seconds: float) -> None:
        # ``time`` is the one module every thread shares: a thread another test left running (a
        # benchmark helper's 20 ms loop) sleeps for real, and only this test's own sleeps are recorded.
        if threading.get_ident() == this_thread:
            slept.append(seconds)
        else:
            real_sleep(seconds)

    monkeypatch.setattr(emulated_cost.time, "sleep", sleep)
    monkeypatch.setattr(backend, "prefill", backend.prefill)  # restored after the test
    floor_prefill(backend, 0.5)  # 11 tokens: a floor of 5.5 s, far above a tiny model's prefill
    started = time.monotonic()
    got = backend.prefill(prompts, completions)
    elapsed = time.monotonic() - started
    assert len(slept) == 1 and 5.5 - elapsed <= slept[0] <= 5.5, slept
    for a, b in zip(real, got, strict=True):
        assert torch.equal(a.logits, b.logits)


def test_no_floor_leaves_the_backend_alone(backend: HFBackend, monkeypatch: pytest.MonkeyPatch) -> None:
    before: Any = backend.prefill
    floor_prefill(backend, 0.0)
    assert backend.prefill == before
