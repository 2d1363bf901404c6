"""One evidence ledger per run: per-identity evidence, failure counts and bans, in the orchestrator.

Before issue 45 each validator kept these in its own journal (``validator/journal.sqlite``), so K
validators would each judge an attacker on the share of its batches they saw. Now every verdict that
opts in (``VerdictRequest.prefilled`` set) carries the batch's evidence *increments* as plain numbers
(``BatchEvidence``: per prefilled sample and per test, the observations and those above the
threshold, with the tests' definitions) and the orchestrator adds them up here, in the verdict's own
store transaction (``RolloutStore.write_verdicts``, table ``evidence``: one row per identity). So K
validators judge an identity exactly as one validator would, batch after batch in the order the
orchestrator records them, and replacing or restarting a validator loses nothing.

The arithmetic is ``toploc.evidence.WorkerEvidence``'s, number for number, without toploc (which
imports torch; the orchestrator never does): per sample, the recent (CUSUM) scores
``R_j = max(R_j, 0) + LLR_j`` and the history counts ``n_j, k_j``; the worker is banned once
``max_j H_j >= history_log_threshold`` or ``max_j R_j >= log_threshold``, with toploc's ban reason.
A worker's state is kept as toploc's snapshot (counts by (statistic, threshold), recent scores with
the tests' fingerprint), so tests that change between verdicts (a re-measured profile) restore as
``WorkerEvidence.restore`` does: counts matched by (statistic, threshold), recent scores kept only
under the same tests.

Per judged batch, in this order (the order the validator process used): the evidence increments;
if the worker's evidence ban stands, its accepted verdicts become ``banned_worker`` rejections
(``api.judgement.reject_banned``); the failure counts (``api.judgement.ban_counts``, with
``validator.ban_failure_rate`` and ``validator.ban_min_samples``); a ban (evidence first, else the
failure rate), written as a ``ban`` event in the same transaction.
"""

from __future__ import annotations

import copy
import hashlib
import json
import math
from collections.abc import Iterable, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

import numpy as np

from prime_rl.api.errors import ApiFailure
from prime_rl.api.judgement import ban_counts, failure_ban, reject_banned
from prime_rl.api.protocol import BatchEvidence, EvidenceTestSpec, Verdict

__all__ = ["EvidenceTests", "Judgement", "RunEvidence", "WorkerLedger"]

SNAPSHOT_FORMAT = "toploc-worker-evidence/1"
"""toploc's ``WorkerEvidence.snapshot`` format: the rows keep it, so they read as toploc's."""


class EvidenceTests:
    """``toploc.EvidenceTests`` from its plain numbers (``EvidenceTestSpec``), torch-free."""

    def __init__(self, spec: EvidenceTestSpec) -> None:
        self.statistics = tuple(spec.statistics)
        self.thresholds = np.array(spec.thresholds, dtype=np.float64)
        self.null_rates = np.array(spec.null_rates, dtype=np.float64)
        self.alternative_rates = np.array(spec.alternative_rates, dtype=np.float64)
        self.log_threshold = float(spec.log_threshold)
        self.history_log_threshold = float(spec.history_log_threshold)
        self.exceed_log = np.log(self.alternative_rates / self.null_rates)
        self.stay_log = np.log1p(-self.alternative_rates) - np.log1p(-self.null_rates)
        digest = hashlib.sha256(repr(self.statistics).encode())
        for array in (self.thresholds, self.null_rates, self.alternative_rates):
            digest.update(np.ascontiguousarray(array, dtype=np.float64).tobytes())
        self.fingerprint = digest.hexdigest()[:16]  # = toploc.EvidenceTests.fingerprint

    def __len__(self) -> int:
        return len(self.statistics)

    def describe(self, j: int) -> str:
        return (
            f"{self.statistics[j]} > {self.thresholds[j]:g} "
            f"(honest <= {self.null_rates[j]:.2g}, bet {self.alternative_rates[j]:.2g})"
        )

    def log_ratio(self, seen: np.ndarray, exceeded: np.ndarray) -> np.ndarray:
        return np.asarray(exceeded * self.exceed_log + (seen - exceeded) * self.stay_log, dtype=np.float64)


@dataclass
class WorkerLedger:
    """One identity's row: failure counts, bans and its evidence snapshot (toploc's format)."""

    accepted: int = 0
    rejected: int = 0
    failure_ban: str = ""
    evidence_ban: str = ""
    evidence: dict[str, Any] | None = None
    fraction: float | None = None  # its evidence after the last batch (fraction of the ban threshold)


@dataclass
class Judgement:
    """What one batch does to its worker's row (computed without changing the ledger: ``commit``)."""

    worker_id: str
    row: WorkerLedger
    verdicts: list[Verdict]
    fraction: float | None
    ban: str = ""  # a ban this judgement decides ('' none)
    evidence_fields: dict[str, Any] = field(default_factory=dict)  # the ``evidence`` metrics line

    def store_row(self) -> tuple[str, str]:
        return self.worker_id, json.dumps(asdict(self.row), separators=(",", ":"), allow_nan=False)


class RunEvidence:
    """The run's ledger (module docstring). ``rows``: the store's ``evidence`` rows (restart)."""

    def __init__(self, *, ban_failure_rate: float, ban_min_samples: int, rows: Iterable[tuple[str, str]] = ()) -> None:
        self.ban_failure_rate = ban_failure_rate
        self.ban_min_samples = ban_min_samples
        self._workers: dict[str, WorkerLedger] = {w: WorkerLedger(**json.loads(text)) for w, text in rows}
        self._tests: dict[str, EvidenceTests] = {}

    def __contains__(self, worker_id: object) -> bool:
        return worker_id in self._workers

    def get(self, worker_id: str) -> WorkerLedger:
        """A copy of ``worker_id``'s row (a fresh one if it has none)."""
        return copy.deepcopy(self._workers.get(worker_id, WorkerLedger()))

    def commit(self, judgement: Judgement) -> None:
        """Apply ``judgement`` (once its row is stored)."""
        self._workers[judgement.worker_id] = judgement.row

    def as_recorded(self, worker_id: str, verdicts: Sequence[Verdict]) -> list[Verdict]:
        """``verdicts`` as the ledger would have recorded them for ``worker_id`` (for an idempotent
        retry: an evidence ban turned its accepted verdicts into ``banned_worker``)."""
        row = self._workers.get(worker_id)
        return reject_banned(verdicts, row.evidence_ban) if row is not None and row.evidence_ban else list(verdicts)

    def judge(
        self, worker_id: str, verdicts: Sequence[Verdict], *, prefilled: bool, evidence: BatchEvidence | None
    ) -> Judgement:
        """The judgement of one batch of ``worker_id`` (module docstring); ApiFailure 400 for
        evidence that does not fit its tests."""
        row = self.get(worker_id)
        fields: dict[str, Any] = {}
        if evidence is not None and evidence.samples:
            fields = self._add_evidence(row, evidence)
        out = reject_banned(verdicts, row.evidence_ban) if row.evidence_ban else list(verdicts)
        before = self._workers.get(worker_id, WorkerLedger())
        accepted, rejected = ban_counts(out, prefilled=prefilled, fresh=row.accepted == 0, min_samples=self.ban_min_samples)
        row.accepted += accepted
        row.rejected += rejected
        ban = ""
        if row.evidence_ban and not before.evidence_ban:
            ban = row.evidence_ban
        elif not row.evidence_ban and not row.failure_ban:
            reason = failure_ban(row.accepted, row.rejected, rate=self.ban_failure_rate, min_samples=self.ban_min_samples)
            if reason is not None:
                row.failure_ban = ban = reason
        return Judgement(worker_id, row, out, row.fraction, ban, fields)

    def _compiled(self, spec: EvidenceTestSpec) -> EvidenceTests:
        tests = EvidenceTests(spec)
        return self._tests.setdefault(tests.fingerprint, tests)

    def _add_evidence(self, row: WorkerLedger, evidence: BatchEvidence) -> dict[str, Any]:
        tests = self._compiled(evidence.tests)
        size = len(tests)
        if any(len(sample.seen) != size for sample in evidence.samples):
            raise ApiFailure(400, "bad_request", f"evidence: every sample needs one count per test ({size} tests)")
        seen, exceeded, scores, snapshot = _restore(tests, row.evidence)
        samples, tokens, banned = int(snapshot["samples"]), int(snapshot["tokens"]), bool(snapshot["banned"])
        state: dict[str, Any] = {}
        for sample in evidence.samples:
            n = np.array(sample.seen, dtype=np.int64)
            k = np.array(sample.exceeded, dtype=np.int64)
            scores = np.maximum(scores, 0.0) + tests.log_ratio(n, k)
            seen += n
            exceeded += k
            samples += 1
            tokens += sample.tokens
            state = _state(tests, seen, exceeded, scores, samples, tokens)
            banned = banned or state["banned"]
            if banned and not row.evidence_ban:  # the sample that crossed, not the last
                reason = (
                    f"evidence {state['score']:.1f} >= {state['log_threshold']:.1f} nats after {samples} samples "
                    f"({tokens} tokens): {state['strongest']}"
                )
                row.evidence_ban = reason[:200]
        counts = {
            (name, float(t)): (int(seen[j]), int(exceeded[j]))
            for j, (name, t) in enumerate(zip(tests.statistics, tests.thresholds, strict=True))
        }
        row.evidence = {
            "format": SNAPSHOT_FORMAT,
            "counts": [[name, t, n_, k_] for (name, t), (n_, k_) in counts.items()],
            "tests": tests.fingerprint,
            "recent": [float(x) for x in scores],
            "samples": samples,
            "tokens": tokens,
            "banned": banned,
        }
        fraction = state["score"] / state["log_threshold"]
        row.fraction = max(0.0, fraction) if math.isfinite(fraction) else 1e9
        return {
            "score": round(state["score"], 4), "log_threshold": round(state["log_threshold"], 4),
            "fraction": round(fraction, 5), "strongest": state["strongest"], "samples": samples,
            "tokens": tokens, "banned": banned,
        }  # fmt: skip


def _restore(tests: EvidenceTests, snapshot: dict[str, Any] | None) -> tuple[np.ndarray, np.ndarray, np.ndarray, dict[str, Any]]:
    """(seen, exceeded, recent scores, snapshot) under ``tests`` (``WorkerEvidence.restore``'s rules)."""
    size = len(tests)
    seen, exceeded, scores = np.zeros(size, dtype=np.int64), np.zeros(size, dtype=np.int64), np.zeros(size)
    if snapshot is None:
        return seen, exceeded, scores, {"samples": 0, "tokens": 0, "banned": False}
    counts = {(str(name), float(t)): (int(n), int(k)) for name, t, n, k in snapshot["counts"]}
    if snapshot["tests"] == tests.fingerprint and len(snapshot["recent"]) == size:
        scores = np.asarray(snapshot["recent"], dtype=np.float64).copy()
    for j, (name, t) in enumerate(zip(tests.statistics, tests.thresholds, strict=True)):
        seen[j], exceeded[j] = counts.get((name, float(t)), (0, 0))
    return seen, exceeded, scores, snapshot


def _state(
    tests: EvidenceTests, seen: np.ndarray, exceeded: np.ndarray, scores: np.ndarray, samples: int, tokens: int
) -> dict[str, Any]:
    """``toploc.WorkerEvidence.state()``, as a dict."""
    history = tests.log_ratio(seen, exceeded)
    best_history, best_recent = int(np.argmax(history)), int(np.argmax(scores))
    history_score, recent_score = float(history[best_history]), float(scores[best_recent])
    history_threshold, recent_threshold = tests.history_log_threshold, tests.log_threshold
    banned = history_score >= history_threshold or recent_score >= recent_threshold
    if history_score / history_threshold >= recent_score / recent_threshold:
        score, threshold, strongest = history_score, history_threshold, f"history: {tests.describe(best_history)}"
    else:
        score, threshold, strongest = recent_score, recent_threshold, f"recent: {tests.describe(best_recent)}"
    return {"score": score, "log_threshold": threshold, "strongest": strongest, "banned": banned,
            "samples": samples, "tokens": tokens}  # fmt: skip
