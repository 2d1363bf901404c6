"""A clock the test moves by hand: ``clock.now += seconds`` (orchestrator and supervisor take a ``clock``)."""

from __future__ import annotations


class SteppedClock:
    """Returns ``now``, which only the test changes."""

    def __init__(self, now: float = 1_000_000.0) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now
