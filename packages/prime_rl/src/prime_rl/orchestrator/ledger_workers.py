"""The ledger's rules for workers: registration, authentication, leases, switches, done, submission.

``WorkerRules`` applies API.md's worker endpoints over the ledger's books (``LedgerState``,
ledger_state.py): registration under ``orchestrator.max_workers`` and the per-network cap of fresh
identities (identities.py), the lease rules (``LeaseRules``, lease_rules.py: allowance, address
cap, abandonment bans, backpressure) before a lease is issued (leases.py), in-flight switches and
done declarations (switches.py), and a submitted batch's checks (its version spans, the mandatory
switch) before the batch book stores it (batches.py). ``Ledger`` (ledger.py) exposes these methods.
"""

from __future__ import annotations

from pathlib import Path

from prime_rl.api.errors import ApiFailure
from prime_rl.api.protocol import (
    BanRequest,
    BanResponse,
    BatchVerdicts,
    DoneRequest,
    DoneResponse,
    LeaseRecord,
    RegisterResponse,
    RolloutBatch,
    SubmitResponse,
    SwitchRequest,
    SwitchResponse,
    TaskLease,
    WorkersResponse,
)
from prime_rl.api.segments import turn_starts
from prime_rl.api.spans import future_span, lease_digest, spans_problem
from prime_rl.config.sections import BUILTIN_ENVIRONMENTS
from prime_rl.orchestrator.leases import HeldLease
from prime_rl.orchestrator.ledger_state import WORKER_LIMIT_RETRY_S, LedgerState
from prime_rl.orchestrator.switches import decide_done, decide_switch, mandatory_problem
from prime_rl.orchestrator.workers import WorkerRecord

__all__ = ["WorkerRules"]


class WorkerRules(LedgerState):
    """The worker endpoints' rules (see module docstring)."""

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

    # ------------------------------------------------------------------ leases

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

    # ------------------------------------------------------------------ rollouts

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
