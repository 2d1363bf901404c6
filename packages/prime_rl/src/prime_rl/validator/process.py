"""The trusted validator process: pull submitted batches, judge every sample, post verdicts, ban cheats.

Loop: ``POST /validator/leases`` (the batches this validator takes exclusively, named by
``validator.validator_id``; freshest policy version first, then submission order; a ``LeaseKeeper``
renews them while they are judged) -> batches grouped by policy version (one weight reload per
version) -> :func:`prime_rl.validator.verdicts.validate_batch` with the claimed version's weights
(fetched through shardcast by :class:`~prime_rl.weights.store.PolicyStore`) ->
``POST /validator/verdicts`` with the batch's evidence increments (every prefilled sample's
observations against the run's evidence tests, ``evidence.py``, ``validator.evidence``) and whether
it was prefilled. The run's ledger in the orchestrator (``orchestrator/evidence_ledger.py``) adds
them up whatever validator judged the batch: failure counts (a worker whose rejected share reaches
``ban_failure_rate`` after ``ban_min_samples`` samples is banned; a batch rejected before any model
check, or any rejected batch of an identity with no accepted sample yet, counts at least
``ban_min_samples`` rejections), evidence (a worker whose evidence passes the false-ban-bounded
threshold is banned, and the batch that crossed it is rejected: ``banned_worker``), bans, and the
evidence for the release of accepted samples (``orchestrator/release.py``); this process keeps no
per-identity state of its own beyond its tool budget. One ``verdict`` metrics line per judged batch
(the ``evidence`` lines are the orchestrator's now), and one ``prefill`` line (batch id, validator
id, pid) when a batch's prefill starts, so a harness can count batches prefilled twice. Each ``verdict``
line carries ``sandbox_runs`` ({sandbox kind: count}, cumulative for the process): the code samples
whose rewards this validator recomputed by running them in ``verifiers``' sandbox, so the last line
of a run says how many it ran; and ``tool_seconds`` (cumulative too) and ``batch_tool_seconds``: the
time episode replays spent in tool calls (``validator.tool_seconds_per_lease`` bounds one lease's,
``tool_budget.py`` each identity's and each fresh address's: ``identity_tool_seconds`` and
``address_tool_seconds`` are what the batch's identity and client address spent in all, with what
they have left).

A batch whose version cannot be fetched *right now* (relay lagging, network) stays pending and is
retried on the next poll; a version that is not published is judged ``unknown_policy``. A forward
that fails on this machine (out of memory even for one sample, a device fault: ``BackendFailure``)
leaves the batch pending too, judged again after an exponential backoff (one ``backend_failure``
metrics line each time): never a verdict, so never a ban. Nothing a
worker submits can crash the loop: ``validate_batch`` turns every surprise into a rejection. In a
multi-turn run it stops (exit code 2) when its Python tool runs another interpreter version than the
run pins (``GET /status`` ``tool_python``): its replays would reject honest tool outputs.

The validator is a trusted process: it reads the run's admin token and assignment key
(``api/secrets.py``). It stops (exit code 2) rather than judge when the orchestrator refuses its
token or issues leases its key does not reproduce: either would reject every honest worker.

Tolerances are the run's, not this machine's: the validator judges by the run's one noise profile,
kept by the orchestrator, and refuses to judge (exit code 2) when its own honest noise is out of line
with it (``agreement.py``). A validator on another machine joins a running orchestrator with
``--orchestrator.public_url``, the run's ``orchestrator.admin_token`` and ``orchestrator.assignment_secret``
(and ``--orchestrator.trusted_public_url`` where the orchestrator has a trusted listener,
``orchestrator.trusted_port``: its calls go there).
"""

from __future__ import annotations

import dataclasses
import enum
import logging
import math
import os
import time
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING

import toploc
from prime_rl.api.client import (
    ClientRequestError,
    OrchestratorClient,
    OrchestratorUnavailable,
)
from prime_rl.api.protocol import PendingBatch, Verdict, VerdictRequest, VerdictResponse, host_validator_id
from prime_rl.api.secrets import SecretsError, run_secrets
from prime_rl.config.validator import ValidatorConfig
from prime_rl.devices import choose_device
from prime_rl.episodes import check_same_environment, load_episode_env
from prime_rl.inference.backend import HFBackend
from prime_rl.metrics import WAIT_LOG_EVERY_S, WaitLog, get_metrics
from prime_rl.reward import run_tasks
from prime_rl.role import orchestrator_call_times, run_role
from prime_rl.validator import tolerances
from prime_rl.validator.agreement import NoiseMismatch, validator_profile
from prime_rl.validator.checks import (
    BackendFailure,
    Checks,
    GenerationBackend,
    Reason,
    RetryLater,
    tool_seconds,
)
from prime_rl.validator.emulated_cost import floor_prefill
from prime_rl.validator.evidence import FailureTracker, batch_evidence, evidence_tests, reject_banned
from prime_rl.validator.lease_keeper import LeaseKeeper
from prime_rl.validator.structure import AssignmentKeyMismatch
from prime_rl.validator.tool_budget import ToolBudget
from prime_rl.validator.verdicts import validate_batch
from prime_rl.weights.store import LocalPolicies, PolicyStore, PolicyUnavailable
from verifiers.code import sandbox_runs
from verifiers.envs import ToolPythonMismatch, tool_python_problem

if TYPE_CHECKING:
    from prime_rl.config import RunConfig

log = logging.getLogger(__name__)


class Posted(enum.Enum):
    """What became of a batch's verdicts at the orchestrator."""

    OK = "posted"
    REFUSED = "refused"  # a 4xx (e.g. the batch was settled meanwhile): skip it for good
    RETRY = "retry"  # the orchestrator is unreachable: judge the batch again on the next poll


class Validator:
    """Holds one backend and switches its weights to the version each batch claims."""

    wait_log_every_s = WAIT_LOG_EVERY_S
    """Seconds between progress lines while there is nothing to judge."""

    def __init__(self, config: RunConfig, name: str = "validator") -> None:
        self.run = config
        self.run_name = name
        self.cfg: ValidatorConfig = config.validator
        with OrchestratorClient(config.orchestrator.trusted_url) as probe:  # another copy of the environment: exit 2 now
            published = probe.status().environment
        check_same_environment(config.tasks.environment, published, role="validator", url=config.orchestrator.trusted_url)
        self.backend = HFBackend(
            config.model.path,
            dtype=config.model.dtype,
            device=choose_device(self.cfg.device),
            max_batch_size=self.cfg.max_batch_size,
        )
        tokenizer = self.backend.tokenizer
        cache = Path(self.cfg.cache_dir or Path(config.run_dir) / "validator" / "policies")
        self.store = PolicyStore(
            config.shardcast.client_servers,
            cache,
            self.backend.model.state_dict(),
            keep=config.orchestrator.off_policy_bound + 3,
            local=LocalPolicies.of_run(config),  # the trainer's own file when it runs on this machine
        )
        self.tasks = run_tasks(config, tokenizer)
        vocab, hidden = self.backend.model.get_output_embeddings().weight.shape
        trusted = run_secrets(config)
        self.checks = Checks.from_config(
            config,
            vocab_size=int(vocab),
            eos_token_ids=self.backend.eos_token_ids,
            assignment_key=trusted.assignment_key,
            hidden_size=int(hidden),
        )
        self.client = OrchestratorClient(  # per-window latencies (metrics: orchestrator_calls)
            config.orchestrator.trusted_url, admin_token=trusted.admin_token, on_answer=orchestrator_call_times().record
        )
        self.admin_token = trusted.admin_token
        self.validator_id = self.cfg.validator_id or host_validator_id(str(os.getpid()))
        self.established: set[str] = set()  # identities this validator saw accepted (its tool budget only)
        self.tool_budget = ToolBudget(
            self.cfg.tool_seconds_per_identity, self.cfg.tool_seconds_per_address, self.cfg.tool_budget_window_s
        )
        self.evidence: toploc.EvidenceTests | None = None  # the run's ledger adds up what they measure
        profile: toploc.NoiseProfile | None = None
        if self.cfg.evidence:
            profile = self._noise_profile(config)
            policy = toploc.EvidencePolicy(
                false_ban_rate=self.cfg.false_ban_rate, horizon_samples=self.cfg.evidence_horizon_samples
            )
            try:
                tests = evidence_tests(profile, policy)  # per sample, or per token on a small calibration
            except toploc.EvidenceError as error:
                # Too few honest tokens measured to bound any honest rate (a tiny task set, very
                # short completions): run on the per-sample checks alone, at their configured
                # tolerances, rather than not at all.
                log.warning(
                    "per-worker evidence is off: %s; measure more honest tokens (validator.calibration_tokens, "
                    "or a profile from `prime-rl calibrate-noise`) to turn it on",
                    error,
                )
            else:
                self.evidence = tests
        # Per sample, per precision: exact in fp32, statistical in bf16 with the evidence behind it
        # (a rejected sample rejects its whole lease, so honest drift must pass; tolerances.py).
        self.checks = tolerances.for_precision(
            self.checks, config.model.dtype, profile if self.evidence is not None else None
        )
        # A multi-turn run: episodes are re-played in the run's environment (validator/episodes.py).
        self.checks = dataclasses.replace(
            self.checks, episode_env=load_episode_env(config, self.tasks.task_set, tokenizer)
        )
        # Per-identity evidence, failure counts and bans live in the run's ledger, in the orchestrator
        # (orchestrator/evidence_ledger.py): nothing of them is kept here (journal.py: migration note).
        self.done = 0
        self.bans_seen: set[str] = set()
        self.refused: set[str] = set()  # batches whose verdicts the orchestrator refused (4xx)
        self.tool_python_checked = False  # a multi-turn run's tool interpreter compared with GET /status
        self.backoff: dict[str, tuple[int, float]] = {}  # batch id -> (backend failures, monotonic time of the next try)
        floor_prefill(self.backend, self.cfg.emulated_prefill_s_per_token)  # benchmark emulation only (0: off)

    def _noise_profile(self, config: RunConfig) -> toploc.NoiseProfile:
        """The run's noise profile (``agreement.py``), saved in ``<run_dir>/validator/noise-profile.json``."""
        return validator_profile(config, self.client, self.backend, self.tasks, self.run_name)

    def decode(self, tokens: Sequence[int]) -> str:
        return str(self.backend.tokenizer.decode(list(tokens), skip_special_tokens=True))

    def backend_for(self, version: int) -> GenerationBackend | None:
        if self.backend.policy_version == version:
            return self.backend
        try:
            path = self.store.ensure(version)
        except PolicyUnavailable as exc:
            if exc.permanent:
                return None
            raise RetryLater(str(exc)) from exc
        self.backend.load_weights(path, version)
        return self.backend

    def judge(self, batch: PendingBatch, newest_version: int) -> bool:
        """Validate one batch, then :meth:`post`, :meth:`log` and :meth:`banned`; False if it must be
        retried later (its version cannot be fetched now, or the orchestrator is unreachable)."""
        started, tools_before = time.monotonic(), tool_seconds()
        established = batch.worker_id in self.established
        tool_seconds_left = self.tool_budget.left(batch.worker_id, batch.client, established=established)
        observed: dict[int, toploc.Observations] = {}  # by sample index, in the order observed
        loaded: list[int] = []  # a backend was handed out: the whole batch was prefilled, else none was

        def backend_for(version: int) -> GenerationBackend | None:
            backend = self.backend_for(version)
            if backend is not None and not loaded:  # before the prefill: a kill -9 during it is counted too
                get_metrics().log("prefill", batch_id=batch.batch_id, validator_id=self.validator_id, pid=os.getpid())
            if backend is not None:
                loaded.append(version)
            return backend

        try:
            verdicts = validate_batch(
                batch,
                tasks=self.tasks,
                backend_for=backend_for,
                decode=self.decode,
                checks=self.checks,
                newest_version=newest_version,
                observe=observed.__setitem__,
                tool_seconds_left=tool_seconds_left,
            )
        except RetryLater as exc:
            log.warning("batch %s: %s; retrying later", batch.batch_id, exc)
            if isinstance(exc, BackendFailure):  # the machine's, never the worker's: the batch stays pending
                self._back_off(batch, exc)
            return False
        finally:  # tools that ran cost their time whatever became of the batch
            self.tool_budget.spend(batch.worker_id, batch.client, tool_seconds() - tools_before, established=established)
        self.backoff.pop(batch.batch_id, None)
        posted, answer = self.post(batch, verdicts, list(observed.values()), prefilled=bool(loaded))
        if posted is not Posted.OK or answer is None:
            return posted is Posted.REFUSED  # refused: settled, never judged again; else retried
        if answer.ban_reason.startswith("evidence") and any(v.accepted for v in verdicts) and not answer.accepted:
            verdicts = reject_banned(verdicts, answer.ban_reason)  # as the run's ledger recorded them
        self.log(
            batch, verdicts, prefilled=len(verdicts) if loaded else 0, seconds=time.monotonic() - started,
            batch_tool_seconds=tool_seconds() - tools_before,
        )  # fmt: skip
        self.banned(batch, answer)
        self.done += 1
        return True

    def _back_off(self, batch: PendingBatch, failure: BackendFailure) -> None:
        """Judge a batch whose forward failed on this machine again after ``poll_interval_s * 2^k``
        (k earlier failures, at most 5 minutes), so one batch that does not fit cannot hold the device."""
        attempts = self.backoff.get(batch.batch_id, (0, 0.0))[0] + 1
        delay = min(300.0, self.cfg.poll_interval_s * 2 ** min(attempts, 16))
        if len(self.backoff) >= 10_000:  # batches settled elsewhere (expired) are forgotten
            self.backoff.pop(next(iter(self.backoff)))
        self.backoff[batch.batch_id] = (attempts, time.monotonic() + delay)
        get_metrics().log(
            "backend_failure", batch_id=batch.batch_id, worker_id=batch.worker_id, kind=failure.kind,
            attempts=attempts, retry_in_s=round(delay, 3), message=str(failure)[:300],
        )  # fmt: skip

    def due(self, batch_id: str) -> bool:
        """Whether a pending batch may be judged now (not refused, not backing off after a backend failure)."""
        return batch_id not in self.refused and self.backoff.get(batch_id, (0, 0.0))[1] <= time.monotonic()

    def post(
        self, batch: PendingBatch, verdicts: list[Verdict], observed: Sequence[toploc.Observations] = (), *, prefilled: bool = True
    ) -> tuple[Posted, VerdictResponse | None]:
        """``POST /validator/verdicts`` with the batch's evidence increments (the run's ledger adds them
        up: ``orchestrator/evidence_ledger.py``); a refused batch is remembered and skipped."""
        try:
            answer = self.client.post_verdicts(
                VerdictRequest(
                    batch_id=batch.batch_id,
                    verdicts=verdicts,
                    validator_id=getattr(self, "validator_id", None),
                    prefilled=prefilled,
                    evidence=batch_evidence(self.evidence, observed) if self.evidence is not None and observed else None,
                )
            )
        except ClientRequestError as exc:  # e.g. the orchestrator already settled the batch: skip it
            log.warning("verdicts for %s refused: %s", batch.batch_id, exc)
            get_metrics().log(
                "verdict_refused", batch_id=batch.batch_id, status=exc.status, message=exc.message
            )
            self.refused.add(batch.batch_id)
            return Posted.REFUSED, None
        except OrchestratorUnavailable as exc:  # judged again on the next poll
            log.warning("cannot post verdicts for %s: %s", batch.batch_id, exc)
            return Posted.RETRY, None
        return Posted.OK, answer

    def log(
        self, batch: PendingBatch, verdicts: list[Verdict], *, prefilled: int, seconds: float, batch_tool_seconds: float = 0.0
    ) -> None:
        """One log line and one ``verdict`` metrics line for a posted batch."""
        rejections = [v for v in verdicts if not v.accepted]
        reasons: dict[str, int] = {}
        for v in rejections:
            reasons[str(v.reason)] = reasons.get(str(v.reason), 0) + 1
        accepted = len(verdicts) - len(rejections)
        log.info(
            "batch %s (v%d): %d accepted, %d rejected %s in %.2fs",
            batch.batch_id,
            batch.policy_version,
            accepted,
            len(rejections),
            reasons or "",
            seconds,
        )
        get_metrics().log(
            "verdict",
            batch_id=batch.batch_id,
            worker_id=batch.worker_id,
            policy_version=batch.policy_version,
            step=batch.step,
            accepted=accepted,
            rejected=len(rejections),
            reasons=reasons,
            # why, for the first rejections (group mates repeat the first reason; a few suffice)
            details={str(v.sample_index): f"{v.reason}: {v.detail}" for v in rejections[:4]},
            seconds=seconds,
            samples=len(verdicts),
            spanned_samples=sum(1 for sample in batch.samples if sample.spans),  # in-flight: >1 version
            prefilled=prefilled,
            sandbox_runs=sandbox_runs(),
            batch_tool_seconds=round(batch_tool_seconds, 3),  # this batch's episode replays (tool runs)
            tool_seconds=round(tool_seconds(), 3),  # cumulative for this process
            **self._tool_budget_metrics(batch),
        )

    def _tool_budget_metrics(self, batch: PendingBatch) -> dict[str, float | None]:
        """What the batch's identity and client address spent on tool runs, in all, and have left."""
        state = self.tool_budget.state(batch.worker_id, batch.client)

        def finite(seconds: float) -> float | None:
            return round(seconds, 3) if math.isfinite(seconds) else None

        return {
            "identity_tool_seconds": round(state.identity_spent_s, 3),
            "address_tool_seconds": round(state.address_spent_s, 3),
            "identity_tool_seconds_left": finite(state.identity_left_s),
            "address_tool_seconds_left": finite(state.address_left_s),
        }

    def banned(self, batch: PendingBatch, answer: VerdictResponse) -> None:
        """Note what the run's ledger answered for a posted batch: the identity is established for this
        validator's tool budget once it has accepted work, and a ban the ledger decided is logged (the
        orchestrator banned it in the verdicts' transaction)."""
        if answer.accepted:
            self.established.add(batch.worker_id)
        if answer.ban_reason and batch.worker_id not in self.bans_seen:
            self.bans_seen.add(batch.worker_id)
            log.info("worker %s banned by the run's ledger: %s", batch.worker_id, answer.ban_reason)
            get_metrics().log("ban", worker_id=batch.worker_id, reason=answer.ban_reason)

    def run_loop(self) -> None:
        """Take batches exclusively (``POST /validator/leases`` as ``validator_id``), judge them in the
        orchestrator's order while a ``LeaseKeeper`` renews the leases of those not judged yet, post
        verdicts; a batch whose lease was lost meanwhile is skipped (another validator judges it)."""
        idle = WaitLog(self.wait_log_every_s)
        while not self.cfg.max_batches or self.done < self.cfg.max_batches:
            try:
                pending = self.client.take_batches(self.validator_id, self.cfg.batches_per_poll)
            except (OrchestratorUnavailable, ClientRequestError) as exc:
                if isinstance(exc, ClientRequestError) and exc.status == 401:
                    raise  # a wrong admin token never heals by waiting
                log.warning("cannot fetch pending batches: %s", exc)
                time.sleep(self.cfg.poll_interval_s)
                continue
            if self.checks.episode_env is not None and not self.tool_python_checked:
                # the run pins its tool interpreter: replays on another would judge honest tool outputs wrong
                if (why := tool_python_problem(self.client.status().tool_python)) is not None:
                    raise ToolPythonMismatch(why)
                self.tool_python_checked = True
            progressed = False
            ids = [batch.batch_id for batch in pending.batches]
            with LeaseKeeper(self.run.orchestrator.trusted_url, self.admin_token, self.validator_id, ids, pending.lease_s) as keeper:
                # The orchestrator hands out the freshest policy versions first; keep its order.
                for batch in pending.batches:
                    if self.due(batch.batch_id) and not keeper.lost(batch.batch_id):
                        progressed |= self.judge(batch, pending.policy_version)
                    keeper.done(batch.batch_id)
            if progressed:
                idle = WaitLog(self.wait_log_every_s)
            else:
                if (waited := idle.due()) is not None:  # an idle validator must not look hung
                    log.info(
                        "no batch to judge for %.0f s (orchestrator at policy v%d; %d batches judged so far)",
                        waited,
                        pending.policy_version,
                        self.done,
                    )
                time.sleep(self.cfg.poll_interval_s)

    def close(self) -> None:
        self.client.close()


def main(config: RunConfig, name: str = "validator") -> int:
    """Entry point of ``prime-rl validator`` (:func:`prime_rl.role.run_role`). It stops with exit code 2
    rather than judge when its secrets cannot be read, or the orchestrator refuses its admin token
    (401) or issues leases its assignment key does not reproduce: either would reject every honest
    worker. On SIGTERM an unposted batch stays pending and is judged again after a restart."""
    return run_role(
        "validator", name, config, num_threads=config.validator.num_threads, start=lambda: Validator(config, name),
        loop=Validator.run_loop, refuse=(SecretsError, AssignmentKeyMismatch, ClientRequestError, ToolPythonMismatch, NoiseMismatch),
        url=config.orchestrator.trusted_url,
    )  # fmt: skip


__all__ = ["FailureTracker", "Reason", "Validator", "ValidatorConfig", "main"]
