"""The untrusted inference worker process: follow the policy, answer task leases, submit rollouts.

Loop (``prime-rl worker --config FILE``):

1. register with the orchestrator (``POST /workers/register``);
2. a background :class:`~prime_rl.weights.store.VersionFollower` downloads every new policy
   version (as a delta against the held one when the trainer published one) while generation continues; between batches the worker
   hot-reloads the newest downloaded version in place (``HFBackend.load_weights``);
3. ``GET /tasks?version=<held>`` -> a lease, which fixes the policy version to generate with
   (``policy_version``): the held one if it is inside the async window (``step - async_level``),
   else the newest committed, which the worker then waits for (``wait_for_version``);
4. generate ``group_size`` completions per prompt with the lease's seeds (toploc's verifiable
   sampler, proofs built during decoding), score them with ``verifiers`` (a score the machine
   limited is scored again, :mod:`prime_rl.worker.scoring`), compute the group advantages and
   ``POST /rollouts``.

The loop meets what a batch holds only through the hooks of :class:`Answers`, which :class:`Honest`
answers honestly. The red team (``prime-rl redteam``, :mod:`prime_rl.redteam.process`) plays its
hostile behaviours inside this same loop by overriding :meth:`Worker.make_answers`; this module
never imports it, and ``prime-rl worker`` runs only ``workers.behaviour = "honest"``.
"""

from __future__ import annotations

import logging
import math
import threading
import time
from pathlib import Path
from typing import TYPE_CHECKING, Protocol

import toploc
from prime_rl.api.client import (
    ClientRequestError,
    OrchestratorBusy,
    OrchestratorClient,
    OrchestratorUnavailable,
)
from prime_rl.api.protocol import RolloutBatch, StatusResponse, TaskLease
from prime_rl.api.spans import lease_digest
from prime_rl.config.worker import WorkerConfig
from prime_rl.devices import choose_device
from prime_rl.episodes import EpisodeEnv, check_same_environment, load_episode_env
from prime_rl.inference.backend import GenerationBackend, GenerationError, HFBackend
from prime_rl.inference.select import make_backend
from prime_rl.inference.vllm_backend import VLLMBackend  # the class only: vLLM is imported when one is built
from prime_rl.metrics import WAIT_LOG_EVERY_S, WaitLog, get_metrics
from prime_rl.reward import RunTasks, run_tasks
from prime_rl.role import run_role
from prime_rl.weights.store import LocalPolicies, PolicyStore, PolicyUnavailable, VersionFollower
from prime_rl.worker.episodes import build_episode_batch
from prime_rl.worker.identity import IDENTITY_FILE, Identity, load_identity, save_identity
from prime_rl.worker.inflight import CommittedVersions
from prime_rl.worker.rollout import build_batch
from prime_rl.worker.scoring import rescoring
from verifiers.envs import ToolPythonMismatch, tool_python_problem
from verifiers.errors import RewardError

if TYPE_CHECKING:
    from prime_rl.config import RunConfig

log = logging.getLogger(__name__)


class Answers(Protocol):
    """What the worker loop asks of the code that answers a lease (:meth:`Worker.one_batch`)."""

    @property
    def follows_new_weights(self) -> bool:
        """Reload every newly committed policy version (the honest worker does)."""
        ...

    def ready(self, status: StatusResponse) -> bool:
        """Take a lease now (False: wait ``workers.poll_interval_s`` and ask again)."""
        ...

    def resolve(self, lease: TaskLease) -> str:
        """The behaviour that answers ``lease`` (logged with its batch)."""
        ...

    def answer(self, lease: TaskLease, backend: GenerationBackend) -> RolloutBatch:
        """The batch submitted for ``lease``."""
        ...

    def before_submit(self, lease: TaskLease, client: OrchestratorClient) -> None:
        """Anything sent before the batch is submitted."""
        ...


class Honest:
    """The honest worker's :class:`Answers`: it follows every policy version, is always ready,
    builds the batch with the run's tasks, sends nothing else."""

    follows_new_weights = True

    def __init__(self, tasks: RunTasks, env: EpisodeEnv | None = None) -> None:
        self.tasks = tasks
        self.env = env

    def ready(self, status: StatusResponse) -> bool:
        return True

    def resolve(self, lease: TaskLease) -> str:
        return "honest"

    def answer(self, lease: TaskLease, backend: GenerationBackend) -> RolloutBatch:
        if self.env is not None:  # a multi-turn run: every sample is an episode
            return build_episode_batch(lease, backend, self.env, encode=self.tasks.encode)[0]
        # A score the machine may have spoiled (sandbox start, timeouts) is scored again before it is sent.
        return build_batch(lease, backend, encode=self.tasks.encode, score=rescoring(self.tasks.score))[0]

    def before_submit(self, lease: TaskLease, client: OrchestratorClient) -> None:
        return None


class Worker:
    """State of one worker process (see the module docstring)."""

    wait_log_every_s = WAIT_LOG_EVERY_S
    """Seconds between progress lines while it waits for a policy version."""
    behaviours: tuple[str, ...] = ("honest",)
    """The ``workers.behaviour`` values this process plays (the red team's subclass plays more)."""

    def __init__(self, config: RunConfig, name: str) -> None:
        self.run = config
        self.cfg: WorkerConfig = config.workers
        if self.cfg.behaviour not in self.behaviours:
            raise ValueError(
                f"workers.behaviour {self.cfg.behaviour!r} is not played by {type(self).__name__} "
                f"(choose from {self.behaviours}); hostile behaviours run with `prime-rl redteam`"
            )
        self.name = name
        self.client = OrchestratorClient(
            config.orchestrator.url, registration_token=config.orchestrator.registration_token
        )
        # Before the model loads: another copy of the environment than the run's is refused (exit code 2).
        check_same_environment(
            config.tasks.environment, self.client.status().environment, role="worker", url=config.orchestrator.url
        )
        self.backend = make_backend(
            config,
            backend=self.backend_name(),
            device=choose_device(self.cfg.device),
            max_batch_size=self.cfg.batch_size,
        )
        cache = Path(self.cfg.cache_dir or Path(config.run_dir) / name / "policies")
        # Version 0 is only ever read back by an HF backend (a vLLM worker never reloads its start weights).
        initial = self.backend.model.state_dict() if isinstance(self.backend, HFBackend) else None
        self.store = PolicyStore(
            config.shardcast.client_servers, cache, initial, local=LocalPolicies.of_run(config)
        )
        self.follower = VersionFollower(self.store, poll_s=self.cfg.weights_poll_s)
        self.tasks = run_tasks(config, self.backend.tokenizer)
        self.env = load_episode_env(config, self.tasks.task_set, self.backend.tokenizer)
        if self.cfg.inflight_updates:
            self.start_inflight()
        self.worker_id = ""
        self.resuming = False  # resumed a saved identity and has not asked for a lease yet
        self.identity_path = Path(config.run_dir) / name / IDENTITY_FILE
        self.submitted = 0
        self.reward_errors = 0  # leases not submitted because a reward was not a number
        self.stop_event = threading.Event()
        self.answers: Answers = self.make_answers()

    def backend_name(self) -> str:
        """The generation engine this process builds (``workers.backend``)."""
        return self.cfg.backend

    def make_answers(self) -> Answers:
        """What answers each lease: :class:`~prime_rl.worker.process.Honest` (the red team overrides this hook)."""
        return Honest(self.tasks, self.env)

    # -- weights ------------------------------------------------------------------------------
    def start_inflight(self) -> None:
        """Let the backend switch to a newer committed version mid-lease (``worker/inflight.py``):
        honest workers on HF or vLLM; episodes (HF only) switch only at model-turn starts
        (``worker/episodes.py``)."""
        if (
            not isinstance(self.backend, HFBackend | VLLMBackend)
            or (self.env is not None and not isinstance(self.backend, HFBackend))
        ):
            log.warning("workers.inflight_updates needs an honest HF or vLLM worker (HF for episodes): off for this one")
            return
        self.backend.version_source = self.committed_versions()

    def committed_versions(self) -> CommittedVersions:
        """The versions this worker may switch to in flight: committed by the orchestrator, downloaded here."""
        return CommittedVersions(
            lambda: self.client.status().policy_version,
            lambda: self.follower.newest_local,
            self.store.path,
            max_versions=self.run.orchestrator.max_versions_per_sample,
            poll_s=self.cfg.weights_poll_s,
            announce=lambda step, batch_index, version, chunk: self.client.announce_switch(
                self.worker_id, step=step, batch_index=batch_index, policy_version=version, chunk=chunk
            ).nonce,
        )

    def reload_newest(self, limit: int) -> None:
        """Swap in the newest downloaded version ``<= limit`` (between batches, so no batch mixes versions).

        ``limit`` is the orchestrator's committed version: shardcast may already hold the next version
        while the trainer has not committed it, and a version newer than the committed one is rejected.
        """
        newest = min(self.follower.newest_local, limit)
        if newest > self.backend.policy_version and self.store.path(newest).is_file():
            started = time.monotonic()
            self.backend.load_weights(self.store.path(newest), newest)
            log.info("loaded policy v%d", newest)
            get_metrics().log(
                "weights_loaded",
                policy_version=newest,
                source="shardcast",
                seconds=time.monotonic() - started,
            )

    def wait_for_version(self, version: int, deadline: float = math.inf) -> bool:
        """Block until policy ``version`` is loaded: a lease fixes the version its batch is generated
        with (the newest committed when it was issued), and any other is ``wrong_policy_version``.
        False once Unix time ``deadline`` (the lease's) has passed or the worker is stopping.

        When ``version`` is the newest published one, the follower may be fetching it already: wait
        for the follower rather than download the same file twice. Any other (an older one, which the
        follower never fetches, or one the follower has not reached) is fetched here.
        """
        if self.backend.policy_version == version:
            return True
        started = time.monotonic()
        log.info("waiting for policy v%d (holding v%d)", version, self.backend.policy_version)
        progress = WaitLog(self.wait_log_every_s)
        while not self.stop_event.is_set():
            if (waited := progress.due()) is not None:
                log.info(
                    "still waiting for policy v%d after %.0f s (holding v%d; weights from %s)",
                    version,
                    waited,
                    self.backend.policy_version,
                    ", ".join(self.store.servers) or "none",
                )
            try:
                fetching = version == self.store.newest_available() and self.follower.newest_local < version
                if fetching and self.follower.is_alive() and not self.store.path(version).is_file():
                    self.follower.wait_newer(version - 1, timeout_s=self.cfg.weights_poll_s)
                    continue
                path = self.store.ensure(version)
            except PolicyUnavailable as exc:
                if time.time() > deadline:
                    log.warning("policy v%d still unavailable at the lease's deadline (%s): lease given up", version, exc)
                    return False
                log.debug("policy not ready: %s", exc)
                self.stop_event.wait(self.cfg.weights_poll_s)
                continue
            self.backend.load_weights(path, version)
            get_metrics().log("weights_wait", policy_version=version, waited_s=time.monotonic() - started)
            get_metrics().log("weights_loaded", policy_version=version, source="shardcast")
            return True
        return False

    # -- one batch ----------------------------------------------------------------------------
    def one_batch(self) -> bool:
        """Fetch, answer and submit one lease; False if there was no work to do."""
        status = self.client.status()
        if self.env is not None and (why := tool_python_problem(status.tool_python)) is not None:
            raise ToolPythonMismatch(why)  # its tool outputs would not match the validator's replays
        if not self.answers.ready(status):
            self.stop_event.wait(self.cfg.poll_interval_s)
            return False
        if self.answers.follows_new_weights:
            self.reload_newest(status.policy_version)
        # The lease fixes the version we hold if it is recent enough: generation goes on while the
        # follower downloads the next one (else the lease fixes the newest and we fetch it first).
        lease = self.client.get_tasks(self.worker_id, version=self.backend.policy_version, resume=self.resuming)
        self.resuming = False
        if self.answers.follows_new_weights and not self.wait_for_version(lease.policy_version, lease.deadline):
            return False  # the lease expired waiting for its version: it goes to another worker
        started = time.monotonic()
        if isinstance(source := getattr(self.backend, "version_source", None), CommittedVersions):
            source.lease = (lease.step, lease.batch_index)  # its switches are announced for this lease
        if isinstance(forger := getattr(self.answers, "versions", None), CommittedVersions):
            forger.lease = (lease.step, lease.batch_index)  # a span forger announces like an honest worker
        try:
            batch = self.answers.answer(lease, self.backend)
        except RewardError as error:  # the environment's bug, not this worker's: report it, take the next lease
            self.report_reward_error(lease, error)
            return False
        seconds = time.monotonic() - started
        if isinstance(source, CommittedVersions):
            self.declare_done(lease, batch)
        self.answers.before_submit(lease, self.client)
        try:
            answer = self.client.submit_rollouts(batch)
        except ClientRequestError as exc:  # a refused batch leaves its lease unanswered: say which rule refused it
            get_metrics().log(
                "submit_refused", step=lease.step, batch_index=lease.batch_index, behaviour=self.answers.resolve(lease),
                status=exc.status, error=exc.error, message=exc.message[:500],
            )  # fmt: skip
            raise
        self.submitted += 1
        self.log_batch(lease, batch, answer.batch_id, seconds)
        return True

    def report_reward_error(self, lease: TaskLease, error: RewardError) -> None:
        """Log and record a reward that is not a finite real number (``verifiers.RewardError``: the
        environment, the function, the task id). The lease is not submitted, so the sample never
        reaches a batch; its tasks go to another worker when it expires, and this worker goes on."""
        self.reward_errors += 1
        log.error(
            "lease %d of step %d not submitted (its tasks go to another worker when it expires): %s",
            lease.batch_index, lease.step, error,
        )  # fmt: skip
        get_metrics().log(
            "reward_error", step=lease.step, batch_index=lease.batch_index, environment=error.environment,
            function=error.function, task_id=error.task_id, value=repr(error.value)[:80], message=str(error)[:500],
        )  # fmt: skip

    def declare_done(self, lease: TaskLease, batch: RolloutBatch) -> None:
        """``POST /leases/done`` with the batch's digest, as soon as it is decoded: under
        ``orchestrator.switch_deadline_s`` it stands in for the switches to versions committed from
        now until the batch is stored (``orchestrator/switches.py``). Best effort: a failed
        declaration only leaves the submission to fix the batch."""
        try:
            self.client.declare_done(
                self.worker_id, step=lease.step, batch_index=lease.batch_index, digest=lease_digest(batch.samples)
            )
        except (ClientRequestError, OrchestratorUnavailable, OrchestratorBusy) as error:
            log.warning("could not declare lease %d done: %s", lease.batch_index, error)

    def log_batch(self, lease: TaskLease, batch: RolloutBatch, batch_id: str, seconds: float) -> None:
        """One ``rollouts`` metrics line and one log line per submitted batch."""
        tokens = sum(len(s.completion_tokens) for s in batch.samples)
        rewards = [s.reward for s in batch.samples]
        behaviour = self.answers.resolve(lease)
        fields = {
            "batch_id": batch_id,
            "step": lease.step,
            "batch_index": lease.batch_index,
            "policy_version": batch.policy_version,
            "samples": len(batch.samples),
            "completion_tokens": tokens,
            "generate_s": seconds,
            "tokens_per_s": tokens / max(seconds, 1e-9),
            "reward_mean": sum(rewards) / len(rewards),
            "behaviour": behaviour,
            # multi-turn runs: model turns and environment (tool) replies in the batch's episodes
            "model_turns": sum(
                1 if x.segments is None else sum(g.kind == "model" for g in x.segments) for x in batch.samples
            ),
            "env_turns": sum(
                0 if x.segments is None else sum(g.kind == "env" for g in x.segments) for x in batch.samples
            ),
            # in-flight updates: samples that switched version mid-completion, and the newest version in them
            "switched_samples": sum(bool(x.spans) for x in batch.samples),
            "newest_span_version": max((x.spans[-1].policy_version for x in batch.samples if x.spans), default=batch.policy_version),
        }
        get_metrics().log("rollouts", **fields)
        log.info(
            "submitted step %d batch %d (v%d, %s): %d samples, %.1f tok/s, mean reward %.3f",
            lease.step,
            lease.batch_index,
            batch.policy_version,
            behaviour,
            len(batch.samples),
            fields["tokens_per_s"],
            fields["reward_mean"],
        )

    def run_loop(self) -> int:
        self.client.wait_until_up(self.run.orchestrator.connect_timeout_s)
        self.start_identity()
        get_metrics().log("weights_loaded", policy_version=0, source="initial")
        if self.answers.follows_new_weights:
            self.follower.start()
        return self.serve()

    def start_identity(self) -> None:
        """Resume the identity saved in ``identity_path``, or register a new one."""
        identity = load_identity(self.identity_path, self.run.orchestrator.url)
        if identity is None:
            self.register()
        else:  # a restart: the same identity keeps its leases, its held batches and its standing
            self.worker_id, self.client.worker_token = identity.worker_id, identity.token
            self.resuming = True  # the first GET /tasks asks for the lease it held when it stopped
            log.info("resumed as %s (behaviour %s)", self.worker_id, self.cfg.behaviour)
            get_metrics().log("resumed", worker_id=self.worker_id, behaviour=self.cfg.behaviour)

    def serve(self) -> int:
        """Answer leases until stopped, banned, or ``workers.max_batches`` are submitted; exit code 0."""
        while not self.stop_event.is_set() and (
            not self.cfg.max_batches or self.submitted < self.cfg.max_batches
        ):
            try:
                if not self.one_batch():
                    continue
            except ClientRequestError as exc:
                if exc.status == 401 or (exc.status == 404 and "unknown worker_id" in exc.message):
                    log.warning("the orchestrator does not know identity %s (%s): registering anew", self.worker_id, exc)
                    self.register()
                    continue
                if exc.status == 403:
                    log.info("banned by the orchestrator: %s", exc.message)
                    get_metrics().log("banned", worker_id=self.worker_id, message=exc.message)
                    return 0
                log.warning("request refused: %s", exc)
                self.stop_event.wait(self.cfg.poll_interval_s)
            except OrchestratorBusy as exc:  # backpressure: ask again when the orchestrator says
                log.info("orchestrator busy: %s", exc)
                self.stop_event.wait(max(self.cfg.poll_interval_s, exc.retry_after_s))
            except OrchestratorUnavailable as exc:
                log.warning("orchestrator unavailable: %s", exc)
                self.stop_event.wait(self.cfg.poll_interval_s)
            except (GenerationError, toploc.ActivationError) as exc:  # e.g. NaN hidden states: skip the lease
                log.exception("generation failed: %s", exc)
                get_metrics().log("error", kind=type(exc).__name__, message=str(exc)[:500])
                self.stop_event.wait(self.cfg.poll_interval_s)
        return 0

    def register(self) -> None:
        """Register a new identity and save it for this worker's restarts (``worker/identity.py``)."""
        self.worker_id = self.client.register(self.cfg.name or self.name).worker_id
        save_identity(self.identity_path, Identity(self.worker_id, self.client.worker_token, self.run.orchestrator.url))
        log.info("registered as %s (behaviour %s)", self.worker_id, self.cfg.behaviour)
        get_metrics().log("registered", worker_id=self.worker_id, behaviour=self.cfg.behaviour)

    def close(self) -> None:
        self.follower.stop()
        self.client.close()


def main(config: RunConfig, name: str = "worker") -> int:
    """Entry point of ``prime-rl worker`` (:func:`prime_rl.role.run_role`). Nothing a worker holds
    needs saving on SIGTERM: submissions are atomic."""
    return run_role(
        "worker", name, config, num_threads=config.workers.num_threads, start=lambda: Worker(config, name),
        loop=Worker.run_loop, refuse=(ToolPythonMismatch,),
    )  # fmt: skip
