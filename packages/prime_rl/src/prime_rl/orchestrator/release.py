"""Release: accepted samples reach a claim only once their worker's evidence covers them.

A sample the validator accepts has passed every per-sample check, but a worker that deviates
inside the per-sample tolerances (steering tokens, cheaper or stale weights) is caught only by
its per-worker evidence, which needs tokens (``validator/evidence.py``; how many per deviation:
``benchmarks/detection_bench.py``). Were accepted samples claimable at once, everything such a
worker sent before its ban could be trained on. So a worker's accepted batch is *held* until

  - the validator has accepted at least ``orchestrator.release_after_tokens`` more completion
    tokens of the same worker after it (tokens of accepted samples only: those were prefilled,
    so they added to the evidence; a rejected sample may have been refused before any prefill),
    and
  - that worker's evidence, as the validator reported it with its latest verdicts, is below
    ``orchestrator.release_max_evidence`` of the ban threshold.

A deviation the evidence bans within ``release_after_tokens`` of its start therefore trains
nothing, whether the worker deviates from its first token or after a long honest stretch (the
evidence is a CUSUM: honest tokens before do not dilute it). A deviation too weak to be banned
still trains nothing once it lifts its worker's score above ``release_max_evidence`` (honest
workers stay below 6% of the threshold: README). Held samples are not buffered work
(``BatchBook.buffered``), so holding never stops leases.

What it costs honest workers: each batch waits for ``release_after_tokens`` of its worker's later
accepted tokens, i.e. about one batch of latency when a batch has at least that many tokens,
and a worker's last batches before it leaves are never trained on.

Durable like the rest of the ledger: one ``judged`` store event per batch whose verdicts the
validator posted (the worker's accepted tokens and evidence after it); ``replay`` rebuilds the
same state. A batch with verdicts but no ``judged`` event (a crash between the two writes) is
counted when the ledger loads.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from prime_rl.api.protocol import Verdict
from prime_rl.orchestrator.store import RolloutStore

__all__ = ["ReleaseBook", "accepted_tokens"]


def accepted_tokens(verdicts: Sequence[Verdict]) -> int:
    """Completion tokens of the accepted samples (each carries one recomputed log-prob per token)."""
    return sum(len(v.logprobs) for v in verdicts if v.accepted)


@dataclass
class _Worker:
    accepted_tokens: int = 0
    evidence: float | None = None  # latest fraction of the ban threshold; None = not reported


class ReleaseBook:
    """Which judged batches are released to claims (see module docstring).

    ``after_tokens`` 0 and ``max_evidence`` None release every judged batch at once.
    """

    EVENTS = frozenset({"judged"})
    """Store event kinds this book writes and replays."""

    def __init__(self, store: RolloutStore, *, after_tokens: int, max_evidence: float | None) -> None:
        self._store = store
        self.after_tokens = after_tokens
        self.max_evidence = max_evidence
        self._workers: dict[str, _Worker] = {}
        self._release_at: dict[str, int] = {}  # batch id -> its worker's accepted tokens that release it

    def replay(self, event: dict[str, Any]) -> None:
        """Apply one logged event of a kind in ``EVENTS`` (restart rebuild)."""
        evidence = event.get("evidence")
        self._apply(str(event["batch_id"]), str(event["worker_id"]), int(event["tokens"]), evidence)

    def judged(self, batch_id: str, worker_id: str, verdicts: Sequence[Verdict], evidence: float | None) -> None:
        """Count a batch the validator just judged (once per batch; ``evidence``: the worker's
        evidence as a fraction of the ban threshold after it, None when the validator keeps none)."""
        if batch_id in self._release_at:
            return
        tokens = accepted_tokens(verdicts)
        self._store.append_event(
            {"event": "judged", "batch_id": batch_id, "worker_id": worker_id, "tokens": tokens, "evidence": evidence}
        )
        self._apply(batch_id, worker_id, tokens, evidence)

    def counted(self, batch_id: str) -> bool:
        return batch_id in self._release_at

    def _apply(self, batch_id: str, worker_id: str, tokens: int, evidence: float | None) -> None:
        if batch_id in self._release_at:
            return
        worker = self._workers.setdefault(worker_id, _Worker())
        worker.accepted_tokens += tokens
        if evidence is not None:
            worker.evidence = float(evidence)
        self._release_at[batch_id] = worker.accepted_tokens + self.after_tokens

    def released(self, batch_id: str, worker_id: str) -> bool:
        """Whether the judged batch ``batch_id`` of ``worker_id`` may be claimed now."""
        release_at = self._release_at.get(batch_id)
        if release_at is None:  # not judged by the validator (awaiting validation, or expired)
            return False
        worker = self._workers[worker_id]
        if worker.accepted_tokens < release_at:
            return False
        return self.max_evidence is None or worker.evidence is None or worker.evidence < self.max_evidence
