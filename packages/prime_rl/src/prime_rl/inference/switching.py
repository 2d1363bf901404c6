"""An in-flight switch inside one decode batch, as both backends apply it: which rows open a span,
and the sampler seed each row draws with from there on.

The rule (``docs/inflight.md`` sections 3 and 4): at a boundary ``b`` every row still running records
the span ``(version, b)``, and with the switch's nonce (the orchestrator's answer to the announcement)
draws every token from ``b`` on with ``span_seed(its seed, nonce)`` (``seeds.reseeded`` over all the
batch's switches so far). ``HFBackend`` writes the seeds into its seed tensor, ``VLLMBackend`` into its
requests' toploc sampler (``toploc.vllm.reseed``); the episode loop (``worker/episodes.py``) records
its turn switches here too. The spans it hands back are the ``Completion.spans`` of the contract:
``(policy_version, first_token)`` pairs from the start version at token 0, or ``()`` for one version.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from prime_rl.inference.contract import VersionSwitch
from prime_rl.seeds import reseeded

__all__ = ["RowSpans"]


class RowSpans:
    """Per row of a decode batch: the spans it opened and the sampler seed it draws with now."""

    def __init__(self, seeds: Sequence[int], start_version: int) -> None:
        self.start_version = start_version
        self.seeds = [int(seed) for seed in seeds]
        """Each row's sampler seed now (its lease seed until a switch with a nonce)."""
        self.opened: list[list[tuple[int, int]]] = [[] for _ in self.seeds]
        self.nonces: list[int] = []
        """The nonces of the batch's switches so far, oldest first."""
        self.versions = 1

    def switch(self, switch: VersionSwitch, boundaries: Mapping[int, int]) -> list[int]:
        """Open ``switch.version``'s span at ``boundaries[row]`` on each row still running; with the
        switch's nonce, reseed them. Returns the rows whose seed changed (none without a nonce)."""
        self.versions += 1
        if switch.nonce is not None:
            self.nonces.append(switch.nonce)
        for row, boundary in boundaries.items():
            self.opened[row].append((switch.version, boundary))
            if switch.nonce is not None:
                self.seeds[row] = reseeded(self.seeds[row], [switch.nonce])
        return list(boundaries) if switch.nonce is not None else []

    def spans(self, row: int) -> tuple[tuple[int, int], ...]:
        """``Completion.spans`` of ``row``: ``()`` if it never switched."""
        return ((self.start_version, 0), *self.opened[row]) if self.opened[row] else ()
