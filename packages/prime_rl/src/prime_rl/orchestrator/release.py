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
  - the *largest* evidence the validator reported for that worker with this batch's verdicts
    or any later ones is below ``orchestrator.release_max_evidence`` of the ban threshold. Not
    the latest: a deviation that lifted the evidence once holds every batch judged up to then
    for good, however many honest tokens follow and whatever the statistic does after.

**Probation.** An identity is *on probation* until the validator has accepted
``orchestrator.probation_tokens`` of its tokens (default: ``release_after_tokens``) while the
largest evidence ever reported for it stayed below ``orchestrator.probation_max_evidence``; it
is *trusted* from the judgement that completes that, and never again on probation. An identity
whose evidence reaches the probation bound first is never trusted, so nothing it sent during
probation is released. Batches judged while their worker was on probation (*probation batches*)
are released, beyond the two rules above, only when their worker is trusted *and* a run-wide
budget covers them: released probation tokens stay within ``orchestrator.probation_release_share``
of the accepted tokens of batches judged after their workers' probations (*trusted work*),
granted first come first served in the order the identities became trusted. So steering hidden
in fresh identities' first batches reaches training at most at that share of real trusted work,
however many identities it is spread over: each identity pays ``probation_tokens`` of accepted
work before any of its work counts, and all of them share one budget.

**Tokens beyond the sampling tolerance.** A batch with an accepted sample that has any token whose
sampling margin lies beyond the validator's sampling tolerance (``Verdict.beyond_tolerance``) is
never released. The bf16 rule accepts a few such tokens per sample because honest noise puts them
there and a rejection costs the whole lease, but the seeded sampler tells a worker every margin in
advance, so it can spend exactly that allowance on tokens of its choosing. One to five such tokens
in a sample lift an identity's evidence less than one release bound, and a Sybil attacker gives
each identity too few samples for a ban, so those samples were trained on (issue #34 item 9).
Withheld, they train nothing, whatever the identity's history.
The cost is the share of honest samples with such a token (none in fp32, where the rule allows
none; ``benchmarks/results/steering_bf16_tiny.md`` for bf16). A withheld batch still counts as
accepted tokens towards releasing its worker's later batches (it was prefilled and fed the
evidence), but it never counts as trusted work funding the probation budget, and a probation batch
withheld is never granted.
Residual: a worker can put one such token into a batch it does not want trained; its tasks then go
to another identity, whose fresh samples train instead. That is walking away without its cost (no
allowance or ban charge here, since honest noise puts such tokens too): it chooses which of its own
honest samples train, not which tasks do, and the replacement is another identity's draw.

A deviation the evidence bans within ``release_after_tokens`` of its start therefore trains
nothing; a deviation too weak to be banned trains nothing either once it lifts its worker's score
above ``release_max_evidence`` (honest workers' evidence against it: ``benchmarks/results/release.md``). Held
samples are not buffered work (``BatchBook.buffered``), so holding never stops leases.

What it costs honest workers: each batch waits for ``release_after_tokens`` of its worker's later
accepted tokens, i.e. about one batch of latency when a batch has at least that many tokens; a
worker's last batches before it leaves are never trained on; a new worker's probation batches wait
for the budget (about ``1 / probation_release_share`` times their tokens of trusted work).

Durable like the rest of the ledger: one ``judged`` store event per batch whose verdicts the
validator posted (the worker's accepted tokens and evidence after it); ``replay`` rebuilds the
same state, probation and budget included, since both are functions of the ``judged`` events in
order. The ``judged`` event is written in the same store transaction as the batch's verdicts
(``Ledger.record_verdicts``); a batch with verdicts but no ``judged`` event (a data dir written
before, when a crash could fall between the two writes) is counted when the ledger loads.

Sized by open work: every ``SNAPSHOT_EVERY`` judgements the changed per-worker and per-batch
state and the run's budget are written to the store (``RolloutStore.write_release``) with the
sequence number of the last ``judged`` event they include; a restart restores that snapshot and
replays only the ``judged`` events after it (never the whole history). A settled batch
(``BatchBook``) is forgotten (``forget``) unless a probation grant still waits for it.
"""

from __future__ import annotations

import bisect
import json
from collections import deque
from collections.abc import Iterable, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

from prime_rl.api.protocol import Verdict
from prime_rl.orchestrator.store import RolloutStore

__all__ = ["SNAPSHOT_EVERY", "ReleaseBook", "accepted_tokens", "withheld"]

SNAPSHOT_EVERY = 256
"""Judgements between two release snapshots (a restart replays at most this many ``judged`` events)."""


def accepted_tokens(verdicts: Sequence[Verdict]) -> int:
    """Completion tokens of the accepted samples (each carries one recomputed log-prob per token)."""
    return sum(len(v.logprobs) for v in verdicts if v.accepted)


def withheld(verdicts: Sequence[Verdict]) -> bool:
    """Whether an accepted sample of the batch has a token beyond the sampling tolerance (module
    docstring: such a batch is never released)."""
    return any(v.accepted and v.beyond_tolerance > 0 for v in verdicts)


@dataclass
class _Worker:
    accepted_tokens: int = 0
    judgements: int = 0
    max_evidence: float = 0.0  # over the whole history (probation)
    trusted: bool = False
    probation_batches: list[str] = field(default_factory=list)
    # Suffix maxima of the reported evidence: (judgement number, value), values strictly decreasing,
    # so the largest evidence reported at judgement >= n is the first entry whose number is >= n.
    suffix_max: list[tuple[int, float]] = field(default_factory=list)

    def report(self, evidence: float) -> None:
        self.max_evidence = max(self.max_evidence, evidence)
        while self.suffix_max and self.suffix_max[-1][1] <= evidence:
            self.suffix_max.pop()
        self.suffix_max.append((self.judgements, evidence))

    def max_since(self, judgement: int) -> float | None:
        """The largest evidence reported with judgement ``judgement`` or later (None: none reported)."""
        at = bisect.bisect_left(self.suffix_max, (judgement, -1.0))
        return self.suffix_max[at][1] if at < len(self.suffix_max) else None


@dataclass
class _Batch:
    worker_id: str
    judgement: int  # its worker's judgement number
    release_at: int  # its worker's accepted tokens that release it
    tokens: int
    probation: bool
    granted: bool = False
    withheld: bool = False  # a sample with tokens beyond the sampling tolerance: never released


class ReleaseBook:
    """Which judged batches are released to claims (see module docstring).

    ``after_tokens`` 0, ``max_evidence`` None and ``probation_tokens`` 0 release every judged
    batch at once.
    """

    EVENTS = frozenset({"judged"})
    """Store event kinds this book writes and replays."""

    def __init__(
        self,
        store: RolloutStore,
        *,
        after_tokens: int,
        max_evidence: float | None,
        probation_tokens: int = 0,
        probation_max_evidence: float = 1.0,
        probation_release_share: float = 1.0,
    ) -> None:
        self._store = store
        self.after_tokens = after_tokens
        self.max_evidence = max_evidence
        self.probation_tokens = probation_tokens
        self.probation_max_evidence = probation_max_evidence
        self.probation_release_share = probation_release_share
        self._workers: dict[str, _Worker] = {}
        self._batches: dict[str, _Batch] = {}
        self._grant_queue: deque[str] = deque()  # probation batches of trusted workers awaiting budget
        self.trusted_tokens = 0
        self.granted_tokens = 0
        self._dirty: set[tuple[str, str]] = set()  # ("worker" | "batch", key) changed since the snapshot
        self._forgotten: set[str] = set()  # batch rows to delete at the next snapshot
        self.since_snapshot = 0  # judgements applied since the snapshot

    # ------------------------------------------------------------------ snapshots

    def restore(self, rows: Iterable[tuple[str, str, str]]) -> int:
        """Restore a snapshot (``snapshot``'s rows as the store keeps them); returns the sequence
        number of the last ``judged`` event it includes (0: none)."""
        upto = 0
        for kind, key, text in rows:
            state = json.loads(text)
            if kind == "worker":
                state["suffix_max"] = [tuple(pair) for pair in state["suffix_max"]]
                self._workers[key] = _Worker(**state)
            elif kind == "batch":
                self._batches[key] = _Batch(**state)
            else:
                self.trusted_tokens, self.granted_tokens = state["trusted_tokens"], state["granted_tokens"]
                self._grant_queue = deque(state["grant_queue"])
                upto = int(state["upto"])
        return upto

    def snapshot(self) -> tuple[list[tuple[str, str, str]], list[tuple[str, str]]]:
        """The rows changed since the last snapshot (``(kind, key, json)``, the run's row last) and the
        rows to delete; marks them written (call once the store has them)."""
        rows = []
        for kind, key in sorted(self._dirty):
            state = self._workers.get(key) if kind == "worker" else self._batches.get(key)
            if state is not None:
                rows.append((kind, key, json.dumps(asdict(state), separators=(",", ":"))))
        run = {"trusted_tokens": self.trusted_tokens, "granted_tokens": self.granted_tokens,
               "grant_queue": list(self._grant_queue)}  # fmt: skip
        rows.append(("run", "", json.dumps(run, separators=(",", ":"))))
        deletes = [("batch", key) for key in sorted(self._forgotten)]
        self._dirty.clear()
        self._forgotten.clear()
        self.since_snapshot = 0
        return rows, deletes

    def batch_ids(self) -> list[str]:
        """The judged batches the book keeps (open ones, and probation ones awaiting a grant)."""
        return list(self._batches)

    def forget(self, batch_ids: Iterable[str]) -> None:
        """Drop settled batches (no claim will ask about them), unless a probation grant waits for one."""
        for batch_id in batch_ids:
            batch = self._batches.get(batch_id)
            if batch is not None and not (batch.probation and not batch.granted and not batch.withheld):
                del self._batches[batch_id]
                self._forgotten.add(batch_id)
                self._dirty.discard(("batch", batch_id))

    def replay(self, event: dict[str, Any]) -> None:
        """Apply one logged event of a kind in ``EVENTS`` (restart rebuild)."""
        evidence = event.get("evidence")
        batch_id, worker_id, tokens = str(event["batch_id"]), str(event["worker_id"]), int(event["tokens"])
        self._apply(batch_id, worker_id, tokens, evidence, withheld=bool(event.get("withheld", False)))

    def judged(self, batch_id: str, worker_id: str, verdicts: Sequence[Verdict], evidence: float | None) -> None:
        """Count a batch the validator just judged (once per batch; ``evidence``: the worker's
        evidence as a fraction of the ban threshold after it, None when the validator keeps none)."""
        event = self.judged_event(batch_id, worker_id, verdicts, evidence)
        if event is not None:
            self._store.append_event(event)
            self.replay(event)

    def judged_event(
        self, batch_id: str, worker_id: str, verdicts: Sequence[Verdict], evidence: float | None
    ) -> dict[str, Any] | None:
        """The store event that counts this judgement (None: counted already); write it durably,
        then ``replay`` it. (``judged`` in two steps, so the event can share the verdicts' transaction.)"""
        if batch_id in self._batches:
            return None
        tokens = accepted_tokens(verdicts)
        event = {"event": "judged", "batch_id": batch_id, "worker_id": worker_id, "tokens": tokens, "evidence": evidence}
        if withheld(verdicts):
            event["withheld"] = True  # absent otherwise: events written before it replay the same
        return event

    def counted(self, batch_id: str) -> bool:
        return batch_id in self._batches

    def worker_tokens(self, worker_id: str) -> int:
        """Completion tokens of ``worker_id``'s samples the validator accepted (0 for a fresh identity)."""
        worker = self._workers.get(worker_id)
        return worker.accepted_tokens if worker else 0

    def trusted(self, worker_id: str) -> bool:
        """Whether ``worker_id`` has completed its probation (always, with ``probation_tokens`` 0)."""
        worker = self._workers.get(worker_id)
        return self.probation_tokens == 0 or (worker is not None and worker.trusted)

    def _apply(self, batch_id: str, worker_id: str, tokens: int, evidence: float | None, *, withheld: bool) -> None:
        if batch_id in self._batches:
            return
        worker = self._workers.setdefault(worker_id, _Worker(trusted=self.probation_tokens == 0))
        worker.judgements += 1
        worker.accepted_tokens += tokens
        if evidence is not None:
            worker.report(float(evidence))
        batch = _Batch(worker_id, worker.judgements, worker.accepted_tokens + self.after_tokens, tokens, not worker.trusted)
        batch.withheld = withheld
        self._batches[batch_id] = batch
        self._dirty.update((("worker", worker_id), ("batch", batch_id)))
        self._forgotten.discard(batch_id)
        self.since_snapshot += 1
        if batch.probation:
            if not withheld:
                worker.probation_batches.append(batch_id)
            if worker.accepted_tokens >= self.probation_tokens and worker.max_evidence < self.probation_max_evidence:
                worker.trusted = True
                self._grant_queue.extend(worker.probation_batches)
                self._dirty.add(("worker", worker_id))
                worker.probation_batches.clear()
        elif not withheld:
            self.trusted_tokens += tokens
        self._grant()

    def _grant(self) -> None:
        """Grant queued probation batches, first come first served, while the budget covers them."""
        budget = self.probation_release_share * self.trusted_tokens
        while self._grant_queue:
            batch = self._batches[self._grant_queue[0]]
            if self.granted_tokens + batch.tokens > budget:
                return
            self._dirty.add(("batch", self._grant_queue.popleft()))
            batch.granted = True
            self.granted_tokens += batch.tokens

    def released(self, batch_id: str, worker_id: str) -> bool:
        """Whether the judged batch ``batch_id`` of ``worker_id`` may be claimed now."""
        batch = self._batches.get(batch_id)
        if batch is None or batch.withheld:  # not judged by the validator (awaiting validation, or expired)
            return False
        worker = self._workers[worker_id]
        if worker.accepted_tokens < batch.release_at or (batch.probation and not batch.granted):
            return False
        if self.max_evidence is None:
            return True
        largest = worker.max_since(batch.judgement)
        return largest is None or largest < self.max_evidence
