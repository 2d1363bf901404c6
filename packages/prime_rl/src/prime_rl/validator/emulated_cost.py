"""Benchmark emulation only: a declared, GPU-like floor on the validator's prefill time.

``validator.emulated_prefill_s_per_token`` (default 0: off, and never set by a real run) makes every
prefill the validator runs while judging take at least ``tokens * s_per_token`` seconds, ``tokens``
being the prompt and completion tokens of the sequences it prefilled: the real prefill runs, then
the validator sleeps for what is left of the floor. It is what lets the swarm harness
(``benchmarks/swarm.py --emulated-prefill-ms-per-token``) measure how K validators share the work
on a machine with fewer cores than validators: real CPU compute of K processes on 2 cores cannot
scale, while a sleep, like a prefill on a validator's own GPU, costs this machine nothing. Results
measured with it are labelled as emulated (``benchmarks/results/validators.md``).

Only the judging prefills are floored: the start-up calibration and self-check (``noise.py``) run
before :func:`floor_prefill` wraps the backend. Every other check (proofs, sampling margins,
log-probs, rewards) keeps its real cost.
"""

from __future__ import annotations

import functools
import logging
import time
from collections.abc import Sequence
from typing import Any

from prime_rl.inference.backend import HFBackend

log = logging.getLogger(__name__)

__all__ = ["floor_prefill"]


def floor_prefill(backend: HFBackend, s_per_token: float) -> None:
    """Make ``backend.prefill`` last at least ``s_per_token`` per prompt + completion token it
    prefills (module docstring); ``s_per_token <= 0`` leaves the backend as it is."""
    if s_per_token <= 0:
        return
    real = backend.prefill

    @functools.wraps(real)
    def prefill(prompts: Sequence[Sequence[int]], completions: Sequence[Sequence[int]]) -> Any:
        started = time.monotonic()
        out = real(prompts, completions)
        tokens = sum(len(p) + len(c) for p, c in zip(prompts, completions, strict=False))
        left = tokens * s_per_token - (time.monotonic() - started)
        if left > 0:
            time.sleep(left)
        return out

    backend.prefill = prefill  # type: ignore[method-assign]
    log.warning(
        "BENCHMARK EMULATION: every prefill takes at least %.3f ms per token (validator.emulated_prefill_s_per_token)",
        s_per_token * 1e3,
    )
