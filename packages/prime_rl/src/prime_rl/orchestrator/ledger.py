"""The orchestrator's state machine: the API's rules over workers, leases, batches, claims and the step.

``Ledger`` applies every rule of API.md and owns the trainer's side (claims, commits, the
step); three collaborators own the rest of the state, each with its store events:

  - ``WorkerRegistry`` (workers.py): workers, token hashes, bans, malformed counts;
  - ``LeaseBook`` (leases.py): leases, batch indices, reassignment of expired leases;
  - ``BatchBook`` (batches.py): stored batches, verdicts, expiry of batches too old to use;
  - ``ReleaseBook`` (release.py): which accepted batches the worker's evidence already covers;
  - ``FreshIdentities`` (identities.py): identities without accepted work, capped per network and
    retired when idle past ``fresh_worker_ttl_s``.

Every mutating method writes to the ``RolloutStore`` (durably) *before* it changes memory and
returns, so the HTTP layer can acknowledge as soon as a method returns, and ``Ledger.load``
rebuilds the same state after a restart. Methods raise ``ApiFailure(status, error, message)``
for requests the API refuses; the HTTP layer turns it into the JSON error answer.

Not thread-safe: the HTTP layer calls one method at a time (under one lock).

Leases a worker cannot hoard or abandon for free (``LeaseRules``, lease_rules.py): a fresh
identity holds one unanswered lease, one more per answered lease up to ``max_open_leases``, less
one per lease it let expire; identities without accepted work share a per-address cap that
identities with accepted work are exempt from, and take turns under it first come, first served; a worker whose expired leases reach
``ban_abandoned_leases`` and ``ban_abandoned_share`` of its leases is banned; abandoned tasks go
to other workers first (``LeaseBook``). A lease whose batch the validator rejects counts as
abandoned in all of these (but never towards the ban when the machine may explain it:
``lease_rules.machine_caused``), so spoiling a lease costs what walking away costs. Backpressure
(``max_buffered_samples``) bounds the admitted work, answered samples plus open leases, and fresh
identities' share of it (``LeaseRules.check_backpressure``), so unproven work never stops an
established worker; the validator's queue serves established workers' batches first (``BatchBook.pending``).

Accepted samples are held from claims until the validator has accepted
``release_after_tokens`` more tokens of the same worker and its evidence is below
``release_max_evidence`` of the ban threshold (release.py), so what a worker sends before its
evidence bans it is not trained on.

Invariants (tested): a sample is in at most one claim; a claim for a step never changes once
written; ``step`` only grows; every sample handed to the trainer for step ``s`` has
``policy_version >= s - max_off_policy_steps`` (default ``async_level``), an ``accepted`` verdict, the validator's reward, advantage
and log-probs, and a worker that was not banned when the claim was made and had it released.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from prime_rl.api.errors import ApiFailure
from prime_rl.api.protocol import (
    BanRequest,
    BanResponse,
    BatchVerdicts,
    ClaimRequest,
    ClaimResponse,
    CommitRequest,
    CommitResponse,
    DoneRequest,
    DoneResponse,
    LeaseRecord,
    PendingResponse,
    RegisterResponse,
    RolloutBatch,
    SampleId,
    StatusResponse,
    SubmitResponse,
    SwitchRequest,
    SwitchResponse,
    TaskLease,
    TrainSample,
    ValidatorLeaseRequest,
    ValidatorLeaseResponse,
    Verdict,
    VerdictRequest,
    VerdictResponse,
    WorkersResponse,
)
from prime_rl.api.secrets import RunSecrets, run_secrets
from prime_rl.api.segments import turn_starts
from prime_rl.api.spans import future_span, lease_digest, spans_problem
from prime_rl.api.staleness import claim_staleness
from prime_rl.config import RunConfig
from prime_rl.config.environment import environment_digest
from prime_rl.config.sections import BUILTIN_ENVIRONMENTS
from prime_rl.metrics import MetricsWriter
from prime_rl.orchestrator.batches import EXPIRED, BatchBook, StoredBatch
from prime_rl.orchestrator.claims import ClaimSelection, StoredClaims, select_claim, stale_drops
from prime_rl.orchestrator.evidence_ledger import RunEvidence
from prime_rl.orchestrator.identities import FreshIdentities
from prime_rl.orchestrator.judge_capacity import JudgeCapacity
from prime_rl.orchestrator.lease_rules import LeaseRules, machine_caused
from prime_rl.orchestrator.leases import HeldLease, LeaseBook, TaskPrompts
from prime_rl.orchestrator.release import SNAPSHOT_EVERY, ReleaseBook, withheld
from prime_rl.orchestrator.store import ClaimRecord, RolloutStore
from prime_rl.orchestrator.switches import decide_done, decide_switch, mandatory_problem
from prime_rl.orchestrator.validator_leases import ValidatorLeases
from prime_rl.orchestrator.workers import WorkerRecord, WorkerRegistry
from prime_rl.weights.layout import POLICY_FILENAME
from verifiers.envs import tool_python

__all__ = ["EXPIRED", "ApiFailure", "Ledger", "TaskPrompts"]

WORKER_LIMIT_RETRY_S = 60.0
"""``Retry-After`` of a registration refused because ``orchestrator.max_workers`` is reached."""


def run_tool_python(config: RunConfig) -> str | None:
    """The run's pinned Python tool version: ``tasks.environment.tool_python``, else this machine's tool
    interpreter (probed through the sandbox); None in a single-turn run or where the sandbox cannot run."""
    env = config.tasks.environment
    if env.name == "single_turn":
        return None
    return env.tool_python or tool_python() or None


class Ledger:
    """All orchestrator state and rules (see module docstring).

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
            buffered=self._buffered_of,
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
        """Rebuild memory from the store: leases (folded totals, lease events), the other events,
        then batches and verdicts, then claims."""
        self.leases.load()  # its own events, read as columns
        judged_after = self.release.restore(self.store.release_rows())
        for event in self.store.replay_events(WorkerRegistry.EVENTS | {"commit"}, judged_after):
            kind = event.get("event")
            if kind in WorkerRegistry.EVENTS:
                self.workers.replay(event)
            elif kind in ReleaseBook.EVENTS:
                self.release.replay(event)
            elif kind == "commit":
                self.committed.add(int(event["step"]))
                self.commit_times[int(event["step"]) + 1] = float(event.get("time", 0.0))
                self.step = max(self.step, int(event["step"]) + 1)
        loaded = self.batches.load()
        for batch in loaded:
            self._replay_batch(batch)
        # Settled batches whose leases are not folded yet (a restart before the fold): one lookup each.
        open_ids = {batch.batch_id for batch in loaded}
        for worker_id, batch_index, step in self.leases.unfolded_keys():
            batch_id = f"{worker_id}-s{step}-b{batch_index}"
            if batch_id not in open_ids and (settled := self.batches.get(batch_id)) is not None:
                self._replay_batch(settled, settled=True)
        self.claims.load_latest()
        self.capacity.restore_claims(self.claims.latest_step(), self.store.claim)  # two indexed reads
        self.leases.queue_expired_after_replay()
        for worker in self.workers.values():
            self.fresh.track(worker)
        self._settle()
        # Judgements replayed after the snapshot of batches that settled before the restart.
        self.release.forget([b for b in self.release.batch_ids() if not self.batches.is_open(b)])
        if self.release.since_snapshot:
            self._snapshot_release()

    def _snapshot_release(self) -> None:
        """Write the release book's changes since its last snapshot (``release.py``)."""
        rows, deletes = self.release.snapshot()
        self.store.write_release(rows, deletes)

    def _replay_batch(self, batch: StoredBatch, settled: bool = False) -> None:
        """Apply a stored batch to the leases and release state on restart (as submit and
        record_verdicts did; a ``settled`` one was counted for release before it settled)."""
        self.leases.mark_answered(batch.worker_id, batch.meta.batch_index)
        validator_judged = batch.verdicts is not None and not batch.expired
        if validator_judged and not settled and not self.release.counted(batch.batch_id):
            self.release.judged(batch.batch_id, batch.worker_id, batch.verdicts or [], None)  # crashed between writes
        if validator_judged:
            rejected = _rejected(batch.verdicts or [])
            if not rejected and withheld(batch.verdicts or []):  # as in record_verdicts
                self.leases.return_tasks(batch.worker_id, batch.meta.batch_index, replaying=True)
            self.leases.mark_judged(
                batch.worker_id, batch.meta.batch_index, rejected=rejected,
                machine=rejected and machine_caused(batch.verdicts or []), replaying=True,
            )  # fmt: skip
        elif batch.expired:  # never judged: its tasks go to another identity, as in _expire_useless
            self.leases.return_tasks(batch.worker_id, batch.meta.batch_index, replaying=True)

    # ------------------------------------------------------------------ workers

    def _has_history(self, worker_id: str) -> bool:
        """Whether the validator accepted any of ``worker_id``'s tokens (an established worker)."""
        return self.release.worker_tokens(worker_id) > 0


    def register(self, name: str, network: str = "") -> RegisterResponse:
        """A new worker id and token for a client of ``network`` (``rate_limit.network_key``; "" for
        in-process callers, which no network cap limits). ApiFailure 503 ``worker_limit`` once
        ``orchestrator.max_workers`` workers are neither banned nor retired; 429 ``rate_limited``
        once ``network`` holds ``max_fresh_workers_per_network`` identities without accepted work."""
        self.retire_idle()
        active, limit = self.workers.active_count(), self.orch.max_workers
        reserve = min(self.orch.registration_reserve, limit // 10)  # for newcomers from untouched networks
        if active >= limit or (active >= limit - reserve and self.fresh.live_at(network)):
            raise ApiFailure(
                503,
                "worker_limit",
                f"{active} registered workers are neither banned nor retired (orchestrator.max_workers = {limit}; "
                "the last orchestrator.registration_reserve places only for a network holding no identity without "
                "accepted work); registration reopens when workers are banned or retire (orchestrator.fresh_worker_ttl_s)",
                retry_after_s=WORKER_LIMIT_RETRY_S,
            )
        self.fresh.check_register(network)
        worker, token = self.workers.register(name, network)
        self.fresh.track(worker)
        return RegisterResponse(worker_id=worker.worker_id, token=token)

    def retire_idle(self) -> int:
        """Retire the identities without accepted work idle past ``fresh_worker_ttl_s``; how many. An
        identity holding a lease or a batch awaiting verdicts is busy; a place in a lease queue is not
        (issue 46: asking must not keep an identity alive), and a retired one loses it."""
        awaiting: set[str] | None = None

        def busy(worker_id: str) -> bool:
            nonlocal awaiting
            if self.leases.open_count(worker_id) > 0:
                return True
            if awaiting is None:  # once per sweep, only if some identity is due
                awaiting = {batch.worker_id for batch in self.batches.waiting()}
            return worker_id in awaiting

        retired = self.fresh.retire_idle(busy)
        for worker in retired:
            self.rules.queue.leave(worker.worker_id)
        return len(retired)

    def authenticate(self, worker_id: str, token: str) -> WorkerRecord:
        """The registered, unbanned worker owning ``token``; ApiFailure 404/401/403 otherwise."""
        worker = self.workers.get(worker_id)
        if worker is None or worker.retired:
            retired = " (retired: it did no accepted work in time)" if worker is not None else ""
            raise ApiFailure(404, "not_found", f"unknown worker_id {worker_id!r}{retired}; register first")
        if not worker.token_matches(token):
            raise ApiFailure(
                401, "unauthorized", "missing or wrong worker token (Authorization: Bearer <token>)"
            )
        if worker.banned:
            raise ApiFailure(403, "banned", f"worker {worker_id} is banned: {worker.ban_reason}")
        self.workers.touch(worker)
        return worker

    def record_malformed(self, worker_id: str) -> None:
        self.workers.record_malformed(worker_id)

    def ban(self, request: BanRequest) -> BanResponse:
        worker = self.workers.get(request.worker_id)
        if worker is None:
            raise ApiFailure(404, "not_found", f"unknown worker_id {request.worker_id!r}")
        self.workers.ban(worker, request.reason)
        return BanResponse(worker_id=worker.worker_id, banned=True)

    def workers_view(self) -> WorkersResponse:
        counts, reasons = self.batches.sample_counts()
        return self.workers.stats(counts, reasons, leases=lambda w: (self.leases.issued(w), self.leases.expired(w)))

    # ------------------------------------------------------------------ status and leases

    @property
    def min_policy_version(self) -> int:
        return max(0, self.step - self.orch.async_level)

    def status(self) -> StatusResponse:
        """``GET /status``. Reads only counters and config (no iteration, no change): the HTTP layer
        calls it without the lock, from the event loop."""
        sampling = self.config.sampling
        return StatusResponse(
            step=self.step,
            policy_version=self.step,
            async_level=self.orch.async_level,
            min_policy_version=self.min_policy_version,
            group_size=sampling.group_size,
            prompts_per_batch=self.orch.prompts_per_batch,
            temperature=sampling.temperature,
            max_new_tokens=sampling.max_new_tokens,
            stop=list(sampling.stop),
            num_tasks=len(self.tasks),
            task_timeout_s=self.orch.task_timeout_s,
            weights_servers=self.config.shardcast.client_servers,
            weights_file=POLICY_FILENAME,
            workers=len(self.workers),
            pending_batches=self.batches.waiting_count(),
            time=self.clock(),
            environment=self.environment,
            tool_python=self.tool_python,
            **self.rules.status_fields(),
        )

    def banned_workers(self) -> frozenset[str]:
        return frozenset(w.worker_id for w in self.workers.values() if w.banned)

    def buffered_samples(self, *, unproven: bool = False) -> int:
        """Answered samples that may still reach the trainer soon (``BatchBook.buffered``): held samples
        and open leases never count (counting held ones would stop the very batches that release them).
        Batches of identities without accepted work that await verdicts (unproven work) count only
        with ``unproven``: the backpressure of fresh identities, never of established workers (a
        flood of it from fresh identities would otherwise refuse established workers their leases)."""
        return self._buffered_of(None, unproven=unproven)

    def _buffered_of(self, worker_id: str | None, *, unproven: bool = False) -> int:
        """``buffered_samples`` of one worker (None: of all)."""
        usable = self._usable(self.banned_workers())

        def counted(batch: StoredBatch) -> bool:
            if worker_id is not None and batch.worker_id != worker_id:
                return False
            if not unproven and batch.verdicts is None and not self._has_history(batch.worker_id):
                return False
            return usable(batch)

        return self.batches.buffered(self.min_policy_version, counted, self.config.trainer.filter_zero_advantage)

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

    def _usable(self, banned: frozenset[str]) -> Callable[[StoredBatch], bool]:
        """Batches a claim may take from or that may become claimable by judgement alone: of workers
        not banned, and awaiting validation or released (``ReleaseBook``)."""
        return lambda batch: batch.worker_id not in banned and (
            batch.verdicts is None or self.release.released(batch.batch_id, batch.worker_id)
        )

    def expire_leases(self) -> int:
        """Mark unanswered leases past their deadline expired, queue their tasks for reassignment, and
        ban the workers whose abandoned leases pass ``ban_abandoned_leases`` and
        ``ban_abandoned_share``, and retire idle fresh identities (``retire_idle``); returns how many
        leases expired."""
        expired = self.leases.expire(self.clock())
        self.rules.ban_abandoners({record.worker_id for record in expired})
        self.retire_idle()
        return len(expired)

    def lease_allowance(self, worker_id: str) -> int:
        """Open leases ``worker_id`` may hold (``LeaseRules.allowance``)."""
        return self.rules.allowance(worker_id)

    def lease(
        self,
        worker: WorkerRecord,
        step: int | None,
        batch_index: int | None,
        address: str = "",
        version: int | None = None,
        *,
        resume: bool = False,
    ) -> TaskLease:
        """``GET /tasks`` for ``worker`` from client ``address`` (the key of ``rate_limit.client_key``).

        ``version``: the policy version the worker holds (a new lease fixes it if inside the async
        window). ``resume``: a worker restarted under its saved identity gets back its oldest open
        lease, if it holds one, instead of a new one; without it the lease it held when it died would
        expire unanswered and count against it as abandoned (towards an abandonment ban)."""
        if step is not None and step != self.step:
            raise ApiFailure(
                409, "conflict", f"step {step} is not the current step {self.step}; ask without step"
            )
        next_index = self.leases.next_index(worker.worker_id)
        if batch_index is not None and batch_index != next_index:
            held = self.leases.get(worker.worker_id, batch_index)
            if held is None or not held.open:
                raise ApiFailure(
                    409,
                    "conflict",
                    f"batch_index {batch_index} is neither your next index ({next_index}) "
                    "nor a live lease; ask without batch_index",
                )
            return self.leases.answer(held.record)
        self.expire_leases()
        if worker.banned:  # its abandoned leases just passed the limit
            raise ApiFailure(403, "banned", f"worker {worker.worker_id} is banned: {worker.ban_reason}")
        if resume and (held_open := self.leases.open_leases(worker.worker_id)):
            return self.leases.answer(held_open[0].record)
        self.rules.check(worker, address)
        return self.leases.answer(self.leases.issue(worker.worker_id, self.step, self.clock(), address, version))

    @property
    def episode_turns(self) -> int | None:
        """None in a single-turn run; in a multi-turn run the environment's ``max_turns`` where the
        orchestrator knows it (a built-in), else 0 (``switches.decide_switch``: switches are by turn)."""
        section = self.config.tasks.environment
        if section.name == "single_turn":
            return None
        return section.max_turns if section.name in BUILTIN_ENVIRONMENTS else 0

    def _own_lease(self, worker: WorkerRecord, step: int, batch_index: int) -> HeldLease:
        """The lease ``worker`` was handed at ``(step, batch_index)``; 404 if it was never handed one."""
        held = self.leases.get(worker.worker_id, batch_index)
        if held is None or held.record.step != step:
            raise ApiFailure(404, "not_found", f"you hold no lease at step {step}, batch_index {batch_index}")
        return held

    def switch(self, worker: WorkerRecord, request: SwitchRequest) -> SwitchResponse:
        """``POST /leases/switch``: record ``worker``'s in-flight switch of its lease (the first
        announcement per lease and version, durably, before the answer) and answer its nonce; an
        identical retry answers the same (rules: ``switches.py``). 404 for a lease the caller was
        never handed at that step."""
        held = self._own_lease(worker, request.step, request.batch_index)
        record = held.record
        switch = decide_switch(
            record, is_open=held.open, policy_version=request.policy_version, chunk=request.chunk,
            committed=self.step, now=self.clock(), max_versions=self.orch.max_versions_per_sample,
            max_new_tokens=self.config.sampling.max_new_tokens, max_tokens_per_s=self.orch.max_decode_tokens_per_s,
            max_turns=self.episode_turns,
        )  # fmt: skip
        if switch in record.switches:
            nonce = self.leases.nonce(record, switch)
        else:
            nonce = self.leases.record_switch(held, switch)
        return SwitchResponse(policy_version=switch.policy_version, chunk=switch.chunk, nonce=nonce)

    def done(self, worker: WorkerRecord, request: DoneRequest) -> DoneResponse:
        """``POST /leases/done``: record that ``worker``'s lease is decoded, with the digest of the
        batch it will submit (the first declaration, durably; an identical retry answers the same).
        Under ``orchestrator.switch_deadline_s`` it stands in for the switches of versions committed
        later (``switches.mandatory_problem``)."""
        held = self._own_lease(worker, request.step, request.batch_index)
        done = decide_done(held.record, is_open=held.open, digest=request.digest, now=self.clock())
        if held.record.done is None:
            self.leases.record_done(held, done)
        return DoneResponse(digest=done.digest, declared_at=done.declared_at)

    # ------------------------------------------------------------------ rollouts and verdicts

    def submit(
        self, worker: WorkerRecord, batch: RolloutBatch, body_sha256: str, *, payload: Path | None = None
    ) -> SubmitResponse:
        """Store ``batch`` (``body_sha256``: SHA-256 hex of the request body as received; ``payload``:
        its payload file, written by the caller already, ``RolloutStore.write_payload``)."""
        rows = self.batches.check(batch)
        if batch.batch_index >= self.leases.next_index(worker.worker_id) + self.orch.max_open_leases:
            raise ApiFailure(409, "conflict", f"batch_index {batch.batch_index} was never leased to you")
        held = self.leases.get(worker.worker_id, batch.batch_index)
        lease = held.record if held is not None and held.record.step == batch.step else None
        self._check_spans(batch, lease)
        # The mandatory switch (switches.py); a retry of an answered lease was checked the first time.
        if self.orch.switch_deadline_s > 0 and lease is not None and held is not None and not held.answered:
            problem = mandatory_problem(
                lease, digest=lease_digest(batch.samples), longest=max(len(s.completion_tokens) for s in batch.samples),
                commit_times=self.commit_times, now=self.clock(), deadline_s=self.orch.switch_deadline_s,
                max_versions=self.orch.max_versions_per_sample, max_tokens_per_s=self.orch.max_decode_tokens_per_s,
            )  # fmt: skip
            if problem is not None:
                raise ApiFailure(409, "conflict", problem)
        answer = self.batches.add(batch, body_sha256, rows, lease, payload=payload)
        if lease is not None and not answer.duplicate:
            self.leases.mark_answered(worker.worker_id, batch.batch_index)
        self.capacity.observe(self.clock(), self.batches.waiting_count())
        return answer

    def _check_spans(self, batch: RolloutBatch, lease: LeaseRecord | None) -> None:
        """ApiFailure 422 ``bad_spans`` for a sample whose version spans (in-flight updates,
        ``api/spans.py``) break a rule: each rule has its own message."""
        start = lease.fixed_version if lease is not None else batch.policy_version
        for index, sample in enumerate(batch.samples):
            if sample.spans is None:
                continue
            problem = spans_problem(
                sample.spans, len(sample.completion_tokens), start_version=start,
                max_versions=self.orch.max_versions_per_sample,
                turn_starts=None if sample.segments is None else turn_starts(sample.segments),
            )  # fmt: skip
            if problem is None and sample.spans[0].policy_version != batch.policy_version:
                problem = f"spans[0].policy_version {sample.spans[0].policy_version} is not the batch's policy_version {batch.policy_version}"
            future = future_span(sample.spans, self.step)
            if problem is None and future is not None:
                problem = (
                    f"span version {future.policy_version} (from token {future.first_token}) is not committed: "
                    f"the newest committed version is {self.step}"
                )
            if problem is not None:
                raise ApiFailure(422, "bad_spans", f"sample {index}: {problem}")

    def batch_verdicts(self, worker: WorkerRecord, batch_id: str) -> BatchVerdicts:
        """The verdicts of one of ``worker``'s own batches (404 for any other batch id)."""
        batch = self.batches.get(batch_id)
        if batch is None or batch.worker_id != worker.worker_id:
            raise ApiFailure(404, "not_found", f"you submitted no batch {batch_id!r}")
        return BatchVerdicts(batch_id=batch_id, judged=batch.verdicts is not None, verdicts=batch.verdicts or [])

    def pending(self, limit: int) -> PendingResponse:
        """``GET /validator/pending``: a listing of the batches no validator holds (takes nothing)."""
        self._expire_useless()
        free = self.validator_leases.free_for("")
        return self.batches.pending(limit, self.step, established=self._has_history, client=self._client_of, free=free)

    def take_batches(self, request: ValidatorLeaseRequest) -> ValidatorLeaseResponse:
        """``POST /validator/leases``: renew ``request.renew``, then lease up to ``request.limit`` more
        batches to the validator, in the queue's order (``validator_leases.py``)."""
        self._expire_useless()
        leases, validator_id = self.validator_leases, request.validator_id
        leases.prune()
        renewed, lost = leases.renew(validator_id, request.renew, lambda b: b in self.batches.waiting_ids())
        free = leases.free_for(validator_id)
        renewing = set(renewed)
        answer = self.batches.pending(
            request.limit, self.step, established=self._has_history, client=self._client_of,
            free=lambda batch_id: batch_id not in renewing and free(batch_id),
        )  # fmt: skip
        expires_at = leases.take(validator_id, [batch.batch_id for batch in answer.batches])
        if answer.batches:
            self.metrics.log("validator_lease", validator_id=validator_id, batches=[b.batch_id for b in answer.batches])
        return ValidatorLeaseResponse(
            batches=answer.batches, renewed=renewed, lost=lost, expires_at=expires_at, lease_s=leases.lease_s,
            pending_batches=answer.pending_batches, policy_version=self.step, step=self.step,
        )  # fmt: skip

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

    def record_verdicts(self, request: VerdictRequest) -> VerdictResponse:
        """Store the verdicts and count the judgement for release in one store transaction; a rejected
        batch costs its worker what walking away costs (``LeaseRules``: allowance, address cap,
        abandonment ban) and hands its lease's tasks to another identity."""
        batch = self.batches.get(request.batch_id)
        judged = judgement = None
        events: list[dict[str, Any]] = []
        if batch is not None and (batch.verdicts is None or batch.expired):  # (unknown: 404 from the batch book)
            self.validator_leases.check_verdict(batch.batch_id, request.validator_id or "")  # not judged: the holder's
            evidence = request.worker_evidence
            if request.prefilled is not None and len(request.verdicts) == len(batch.task_ids):  # (else 400 below)
                judgement = self.run_evidence.judge(
                    batch.worker_id, request.verdicts, prefilled=request.prefilled, evidence=request.evidence
                )
                request, evidence = request.model_copy(update={"verdicts": judgement.verdicts}), judgement.fraction
                if judgement.ban and not self.workers[batch.worker_id].banned:
                    events.append({"event": "ban", "worker_id": batch.worker_id, "reason": judgement.ban, "time": self.clock()})
            judged = self.release.judged_event(batch.batch_id, batch.worker_id, request.verdicts, evidence)
        elif batch is not None and request.prefilled is not None:  # a retry: compared as the ledger recorded it
            recorded = self.run_evidence.as_recorded(batch.worker_id, request.verdicts)
            if _normalized(recorded) == batch.verdicts:  # (judged after the worker's evidence ban)
                request = request.model_copy(update={"verdicts": recorded})
        answer = self.batches.record_verdicts(
            request, [e for e in (judged, *events) if e is not None], self._keeps_open,
            evidence=[judgement.store_row()] if judgement is not None else (),
        )  # fmt: skip
        self.validator_leases.release(request.batch_id)
        if judgement is not None:
            answer = self._apply_judgement(judgement, events, answer)
        elif batch is not None and batch.worker_id in self.run_evidence:
            row = self.run_evidence.get(batch.worker_id)
            answer = answer.model_copy(update={"worker_evidence": row.fraction, "ban_reason": row.evidence_ban or row.failure_ban})
        if judged is not None:
            self.capacity.judged(self.clock(), len(request.verdicts), self.batches.waiting_count())
            self.release.replay(judged)
            if not self.batches.is_open(request.batch_id):
                self.release.forget([request.batch_id])
            if self.release.since_snapshot >= SNAPSHOT_EVERY:
                self._snapshot_release()
            stored = self.batches[request.batch_id]
            rejected = _rejected(stored.verdicts or [])
            if not rejected and withheld(stored.verdicts or []):
                # Never trained (``release.py``): its tasks go to another identity, so a worker cannot
                # keep tasks out of training with one token beyond the tolerance; no charge, since
                # honest noise puts such tokens there too (before mark_judged: a returned lease never folds).
                self.leases.return_tasks(stored.worker_id, stored.meta.batch_index)
            machine = rejected and machine_caused(stored.verdicts or [])  # never towards the abandonment ban
            self.leases.mark_judged(stored.worker_id, stored.meta.batch_index, rejected=rejected, machine=machine)
            if rejected:
                self.rules.ban_abandoners({stored.worker_id})
        return answer

    def _apply_judgement(self, judgement: Any, bans: Sequence[dict[str, Any]], answer: VerdictResponse) -> VerdictResponse:
        """Apply a stored judgement of the run's evidence ledger (its row and ``ban`` events were written
        with the verdicts) to memory; the answer tells the validator the worker's evidence and ban."""
        self.run_evidence.commit(judgement)
        for event in bans:
            self.workers.replay(event)
            self.metrics.log("ban", worker_id=event["worker_id"], reason=event["reason"])
        if judgement.evidence_fields:
            self.metrics.log("evidence", worker_id=judgement.worker_id, **judgement.evidence_fields)
        row = judgement.row
        return answer.model_copy(update={"worker_evidence": row.fraction, "ban_reason": row.evidence_ban or row.failure_ban})

    # ------------------------------------------------------------------ settling

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

    # ------------------------------------------------------------------ trainer

    def claim(self, request: ClaimRequest) -> ClaimResponse:
        min_version = max(0, request.step - self.orch.off_policy_bound)
        if request.step in self.claims:
            return self._claim_answer(request.step, min_version, self.claims[request.step], None)
        if request.step != self.step:
            raise ApiFailure(
                409, "conflict", f"step {request.step} is not the current step {self.step} and has no claim"
            )
        self._expire_useless()
        banned = self.banned_workers()  # banned since their samples were accepted: not trusted any more
        usable = self._usable(banned)
        selection = select_claim(
            [b for b in self.batches.live() if usable(b)],
            min_policy_version=min_version,
            min_samples=request.min_samples,
            filter_zero_advantage=request.filter_zero_advantage,
        )
        if not selection.ready:
            held = select_claim(
                [b for b in self.batches.live() if b.worker_id not in banned and not usable(b)],
                min_policy_version=min_version,
                min_samples=1 << 62,
                filter_zero_advantage=request.filter_zero_advantage,
            ).available
            reason = (
                f"{selection.available} fresh accepted samples available (policy_version >= {min_version}), "
                f"need {request.min_samples}; {selection.pending_batches} batches ({selection.pending_samples} "
                f"samples) await validation; {held} accepted samples are held until their workers' evidence "
                "covers them (orchestrator.release_after_tokens)"
            )
            return ClaimResponse(
                ready=False,
                step=request.step,
                min_policy_version=min_version,
                samples=[],
                reason=reason,
                available_samples=selection.available,
                pending_batches=selection.pending_batches,
                pending_samples=selection.pending_samples,
                stale_samples=selection.stale + self.batches.past_bound(),
                zero_advantage_samples=selection.zero_advantage,
                held_samples=held,
            )
        chosen = selection.sample_ids
        claimed = self.batches.claimed_after(chosen)
        self.store.write_claim(ClaimRecord(request.step, min_version, self.clock(), chosen), claimed)
        self.claims.add(request.step, chosen)
        self.capacity.claimed(request.step, len(chosen), self.clock())
        self.batches.mark_claimed(claimed)
        samples = self.batches.training_samples(chosen)
        stale = selection.stale + self.batches.past_bound()
        self._settle()
        self.metrics.log(
            "claim",
            step=request.step,
            samples=len(chosen),
            min_policy_version=min_version,
            stale_samples=stale,
            zero_advantage_samples=selection.zero_advantage,
            stale_drops=stale_drops(self.batches.dropped(), past_bound=stale),
            **claim_staleness(samples, request.step).metrics(),
        )
        return self._claim_answer(request.step, min_version, chosen, selection, samples, stale)

    def _claim_answer(
        self,
        step: int,
        min_version: int,
        sample_ids: tuple[SampleId, ...],
        selection: ClaimSelection | None,
        samples: list[TrainSample] | None = None,
        stale: int = 0,
    ) -> ClaimResponse:
        return ClaimResponse(
            ready=True,
            step=step,
            min_policy_version=min_version,
            samples=samples if samples is not None else self.batches.training_samples(sample_ids),
            reason="",
            available_samples=len(sample_ids),
            pending_batches=selection.pending_batches if selection else 0,
            pending_samples=selection.pending_samples if selection else 0,
            stale_samples=stale,
            zero_advantage_samples=selection.zero_advantage if selection else 0,
        )

    def commit(self, request: CommitRequest) -> CommitResponse:
        if request.policy_version != request.step + 1:
            raise ApiFailure(400, "bad_request", f"policy_version must be step + 1 = {request.step + 1}")
        if request.step < self.step:
            return CommitResponse(step=self.step, policy_version=self.step)
        if request.step > self.step:
            raise ApiFailure(409, "conflict", f"step {request.step} is ahead of the current step {self.step}")
        if request.step not in self.claims:
            raise ApiFailure(
                409, "conflict", f"no claim exists for step {request.step}; claim before committing"
            )
        now = self.clock()
        self.store.append_event(
            {"event": "commit", "step": request.step, "policy_version": request.policy_version, "time": now}
        )
        self.committed.add(request.step)
        self.commit_times[request.step + 1] = now
        self.step = request.step + 1
        self.metrics.log("commit", step=request.step, policy_version=self.step)
        # The run's training record (record.py): leases fold first (a batch waits for its lease to fold);
        # the steps a trainer resuming from its oldest checkpoint may claim again stay out.
        self.leases.fold()
        self.batches.compact(request.step, self.config.trainer.checkpoint_every * self.config.trainer.keep_checkpoints)
        return CommitResponse(step=self.step, policy_version=self.step)


def _normalized(verdicts: Sequence[Verdict]) -> list[Verdict]:
    """``verdicts`` as the batch book stores them (by sample index; a rejected one keeps no log-probs)."""
    kept = (v if v.accepted or not v.logprobs else v.model_copy(update={"logprobs": []}) for v in verdicts)
    return sorted(kept, key=lambda v: v.sample_index)


def _rejected(verdicts: Sequence[Verdict]) -> bool:
    """Whether the validator rejected a judged batch (a lease is accepted whole or rejected whole)."""
    return any(not v.accepted for v in verdicts)
