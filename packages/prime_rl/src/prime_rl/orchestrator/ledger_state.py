"""The ledger's shared state: the collaborators every caller's rules read, and the queries they share.

``LedgerState`` builds the run's books (see ledger.py's docstring for what each owns) and answers
the questions that workers', validators' and the trainer's rules all ask: is a worker established
(``_has_history``), which batches a claim may still take (``_usable``), how much admitted work is
buffered (backpressure), which batches no step can use any more (``_expire_useless``) and which
judged batches settle (``_settle``). The rules themselves live by caller: ``WorkerRules``
(ledger_workers.py), ``ValidatorRules`` (ledger_validators.py) and ``TrainerRules``
(ledger_trainer.py), each a subclass of this one, and ``Ledger`` (ledger.py) joins them and
rebuilds the state after a restart. Base classes rather than separate objects because the three
share nearly every book and the step, and ``Ledger``'s public methods stay where callers find them.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from collections.abc import Set as AbstractSet
from typing import Any

from prime_rl.api.protocol import Verdict
from prime_rl.api.secrets import RunSecrets, run_secrets
from prime_rl.config import RunConfig
from prime_rl.config.environment import environment_digest
from prime_rl.metrics import MetricsWriter
from prime_rl.orchestrator.batches import BatchBook, StoredBatch
from prime_rl.orchestrator.claims import StoredClaims
from prime_rl.orchestrator.evidence_ledger import RunEvidence
from prime_rl.orchestrator.identities import FreshIdentities
from prime_rl.orchestrator.judge_capacity import JudgeCapacity
from prime_rl.orchestrator.lease_rules import LeaseRules
from prime_rl.orchestrator.leases import LeaseBook
from prime_rl.orchestrator.release import ReleaseBook
from prime_rl.orchestrator.store import RolloutStore
from prime_rl.orchestrator.validator_leases import ValidatorLeases
from prime_rl.orchestrator.workers import WorkerRegistry
from verifiers.envs import tool_python

__all__ = ["WORKER_LIMIT_RETRY_S", "LedgerState", "rejected_batch", "run_tool_python"]


WORKER_LIMIT_RETRY_S = 60.0
"""``Retry-After`` of a registration refused because ``orchestrator.max_workers`` is reached."""


def run_tool_python(config: RunConfig) -> str | None:
    """The run's pinned Python tool version: ``tasks.environment.tool_python``, else this machine's tool
    interpreter (probed through the sandbox); None in a single-turn run or where the sandbox cannot run."""
    env = config.tasks.environment
    if env.name == "single_turn":
        return None
    return env.tool_python or tool_python() or None


class LedgerState:
    """The books of a run and the queries shared by every caller's rules (see module docstring).

    ``workers`` (id -> ``WorkerRecord``) and ``batches`` (id -> ``StoredBatch``) are read-only
    mappings; ``claims`` maps each claimed step to its sample ids.
    ``secrets``: the run's (``api/secrets.py``; default: configured or generated for ``run_dir``).
    """

    def __init__(
        self,
        config: RunConfig,
        tasks: Any,
        store: RolloutStore,
        *,
        metrics: MetricsWriter | None = None,
        clock: Callable[[], float] = time.time,
        secrets: RunSecrets | None = None,
    ) -> None:
        self.config = config
        self.orch = config.orchestrator
        self.tool_python = run_tool_python(config)  # GET /status states it (issue 46: one tool interpreter per run)
        self.tasks = tasks
        self.environment = environment_digest(config.tasks.environment)  # GET /status (config/environment.py)
        self.store = store
        self.metrics = metrics or MetricsWriter(None, role="orchestrator", name="orchestrator")
        self.clock = clock
        self.step = 0
        self.workers = WorkerRegistry(store, self.metrics, clock)
        secrets = secrets or run_secrets(config)
        self.leases = LeaseBook(config, tasks, store, self.metrics, key=secrets.assignment_key)
        self.batches = BatchBook(config, store, self.metrics, clock)
        self.validator_leases = ValidatorLeases(self.orch.validator_lease_s, clock)  # memory only: open work
        self.run_evidence = RunEvidence(
            ban_failure_rate=config.validator.ban_failure_rate, ban_min_samples=config.validator.ban_min_samples,
            rows=store.evidence_rows(),
        )  # one evidence ledger per run, whatever validator judged (evidence_ledger.py)
        self.release = ReleaseBook(
            store,
            after_tokens=self.orch.release_after_tokens,
            max_evidence=self.orch.release_max_evidence,
            probation_tokens=self.orch.probation_tokens_or_default,
            probation_max_evidence=self.orch.probation_max_evidence,
            probation_release_share=self.orch.probation_release_share,
        )
        self.capacity = JudgeCapacity(self.orch.judge_rate_window_s)  # moving estimates (judge_capacity.py)
        self.rules = LeaseRules(
            self.orch,
            self.leases,
            self.workers,
            has_history=self._has_history,
            buffered=self._buffered,
            clock=clock,
            lease_samples=self.orch.prompts_per_batch * config.sampling.group_size,
            capacity=self.capacity,
            step=lambda: self.step,
            samples_per_step=config.trainer.samples_per_step,
            unjudged=self._unjudged_samples,
        )
        self.fresh = FreshIdentities(
            self.workers,
            max_per_network=self.orch.max_fresh_workers_per_network,
            ttl_s=self.orch.fresh_worker_ttl_s,
            has_history=self._has_history,
            clock=clock,
        )
        self.claims = StoredClaims(store)
        self.committed: set[int] = set()
        self.commit_times: dict[int, float] = {}  # policy version -> orchestrator time of its commit
        if self.orch.prompts_per_batch > len(tasks):
            raise ValueError(
                f"orchestrator.prompts_per_batch ({self.orch.prompts_per_batch}) exceeds the task set ({len(tasks)} tasks)"
            )
        limit = self.orch.max_buffered_samples
        needed = config.trainer.samples_per_step + self.orch.prompts_per_batch * (
            config.sampling.group_size
        )
        if limit and limit < needed:
            raise ValueError(
                f"orchestrator.max_buffered_samples ({limit}) must be at least trainer.samples_per_step + one "
                f"lease ({needed}); 2x that is a good value"
            )
        self._load()

    def _load(self) -> None:
        """Rebuild memory from the store after a restart (``Ledger``'s: ledger.py)."""
        raise NotImplementedError

    def _snapshot_release_if_due(self) -> None:
        """Snapshot the release book when enough changed since the last one (``Ledger``'s: ledger.py)."""
        raise NotImplementedError

    def _has_history(self, worker_id: str) -> bool:
        """Whether the validator accepted any of ``worker_id``'s tokens (an established worker)."""
        return self.release.worker_tokens(worker_id) > 0

    @property
    def min_policy_version(self) -> int:
        return max(0, self.step - self.orch.async_level)

    def banned_workers(self) -> AbstractSet[str]:
        """The banned workers' ids (``WorkerRegistry.banned_ids``: read-only, asked on every lease)."""
        return self.workers.banned_ids()

    def buffered_samples(self, *, unproven: bool = False) -> int:
        """Answered samples that may still reach the trainer soon (``BatchBook.buffered``): held samples
        and open leases never count (counting held ones would stop the very batches that release them).
        Batches of identities without accepted work that await verdicts (unproven work) count only
        with ``unproven``: the backpressure of fresh identities, never of established workers (a
        flood of it from fresh identities would otherwise refuse established workers their leases)."""
        everything, of_unproven = self._buffered()
        return everything if unproven else everything - of_unproven

    def _buffered(self) -> tuple[int, int]:
        """``buffered_samples(unproven=True)``, and the unproven work in it: in one walk."""
        return self.batches.buffered(
            self.min_policy_version,
            self._usable(self.banned_workers()),
            self.config.trainer.filter_zero_advantage,
            self._has_history,
        )

    def _unjudged_samples(self) -> tuple[int, int | None]:
        """Samples awaiting verdicts that a claim may still take, and their oldest policy version (None:
        none). O(waiting batches)."""
        banned = self.banned_workers()
        floor = self.capacity.next_claim_step(self.step) - self.orch.off_policy_bound
        every = 0
        oldest: int | None = None
        for batch in self.batches.waiting():
            if batch.policy_version >= floor and batch.worker_id not in banned:
                every += len(batch.task_ids)
                oldest = batch.policy_version if oldest is None else min(oldest, batch.policy_version)
        return every, oldest

    def _usable(self, banned: AbstractSet[str]) -> Callable[[StoredBatch], bool]:
        """Batches a claim may take from or that may become claimable by judgement alone: of workers
        not banned, and awaiting validation or released (``ReleaseBook``)."""
        return lambda batch: batch.worker_id not in banned and (
            batch.verdicts is None or self.release.released(batch.batch_id, batch.worker_id)
        )

    def _client_of(self, batch: StoredBatch) -> str:
        """The client address ``batch``'s lease was handed to ("" when unknown)."""
        held = self.leases.get(batch.worker_id, batch.meta.batch_index)
        return held.address if held is not None else ""

    def _expire_useless(self) -> None:
        """Expire the batches no step can use any more; their leases' tasks go to another identity
        (no charge: a slow validator may be the cause), so answering late is no veto either."""
        for batch in self.batches.expire_useless(self.step, self.orch.async_level, self.orch.off_policy_bound):
            self.leases.return_tasks(batch.worker_id, batch.meta.batch_index)
            self.validator_leases.release(batch.batch_id)
        self.capacity.observe(self.clock(), self.batches.waiting_count())

    def _keeps_open(self, batch: StoredBatch, verdicts: Sequence[Verdict]) -> bool:
        """Whether a batch judged ``verdicts`` may still train (else it settles with its verdicts). A
        stale or withheld one stays open until the claim after it is stale settles it (``_settle`` counts
        its drops; the claim counts a withheld one as held until then)."""
        return any(v.accepted for v in verdicts) and not self.workers[batch.worker_id].banned

    def _settle(self) -> None:
        """Settle the open judged batches no claim can take from any more (``batches.py``): of banned
        workers, fully claimed, or older than the next claim's bound (their accepted unclaimed
        samples of usable batches add to the run's ``past_bound`` drops). One store transaction,
        only when something settles; O(open batches)."""
        min_version = max(0, self.step - self.orch.off_policy_bound)
        banned = self.banned_workers()
        usable = self._usable(banned)
        settled: list[str] = []
        past_bound = 0
        for batch in self.batches.live():
            if batch.verdicts is None:
                continue
            left = sum(1 for v in batch.verdicts if v.accepted and v.sample_index not in batch.claimed)
            if batch.policy_version < min_version:
                past_bound += left if usable(batch) else 0
                settled.append(batch.batch_id)
            elif batch.worker_id in banned or left == 0:
                settled.append(batch.batch_id)
        self.batches.settle(settled, past_bound)
        self.release.forget(settled)


def rejected_batch(verdicts: Sequence[Verdict]) -> bool:
    """Whether the validator rejected a judged batch (a lease is accepted whole or rejected whole)."""
    return any(not v.accepted for v in verdicts)
