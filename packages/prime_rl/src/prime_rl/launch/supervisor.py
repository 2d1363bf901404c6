"""``prime-rl run``: every process of a run on this machine, supervised.

Starts, each as its own subprocess (``python -m prime_rl.cli <role> --config FILE ...``) with its
output in ``<run_dir>/logs/<name>.out`` and its metrics in ``<run_dir>/metrics/<name>.jsonl``, all
at once, without waiting for any (the roles wait for the orchestrator themselves); which children
there are, in what order, and which restart is ``launch/children.py``. Validators beyond the first
start once the orchestrator announces ``validator_leases`` in ``GET /status`` (else exit code 2: two
validators would judge the same batches). Then it prints a live progress line (step, policy version,
batches awaiting validation, accepted and rejected samples per worker) until the trainer finishes
``trainer.total_steps``. Ctrl-C or SIGTERM stops every child (SIGTERM to its process group, SIGKILL
after ``STOP_GRACE_S``).

Restarts: a child that dies while the run goes on is started again (same command; its error and log
are reported first), after an exponential backoff (``backoff_s``, doubling per recent restart, at
most ``max_backoff_s``), within a budget of ``restart_budget`` restarts per child in
``RESTART_WINDOW_S``. Past the budget, or when a child dies of the same error twice in a row within
``RESTART_WINDOW_S`` (a wrong configuration does not heal by restarting; the same transient error
days apart is not "in a row"), a worker is dropped and reported (``child_dropped``) and the run goes
on without it, while a trusted role (orchestrator, origin, relay, trainer, validator) fails the run
as it did before restarts existed (which children restart, and how each resumes: :func:`should_restart`).

Exit code 0 when the trainer finished, 1 when a trusted child failed past its restart budget (or was
not restartable: its name, its error, read from its output by :func:`first_error`, and its log are
reported) or when every honest worker stopped or was dropped before the trainer finished (with no
``workers.max_batches`` a worker stops on its own only when it is banned; the orchestrator's ban
reasons are reported: a run nobody feeds would wait forever), 2 when a child refused its configuration
(exit code 2: a wrong environment, component, secret or model path; its message is shown and the
run stops at once, since restarting cannot heal it), 130/143 when interrupted.

Before any child starts, the weight copies a killed run left behind are removed and the disk is checked
for what the run's weight copies can take (``launch/cleanup.py``: exit code 2 with the figures when it
cannot hold them); when it ends, however it ends, the copies any process re-creates on demand are removed
again. Before any child starts, the run's secrets (the admin token of the trusted endpoints and the
assignment key) are created in ``<run_dir>/secrets/run.json`` (mode 0600) unless configured; the
orchestrator, validator and trainer read them there, workers are never given them. An orchestrator bound
beyond loopback without a configured ``orchestrator.admin_token`` stops the run before it starts (exit 2).

Pitfall: children run in their own sessions so that a terminal Ctrl-C reaches only this
supervisor, which then stops them in order; killing the supervisor with SIGKILL leaves them
running (their pids are in ``<run_dir>/metrics/run.jsonl``).
"""

from __future__ import annotations

import logging
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any

from prime_rl.api.client import ApiError, OrchestratorClient
from prime_rl.api.secrets import SecretsError, check_bind_address, run_secrets
from prime_rl.config import RunConfig
from prime_rl.launch.child_reports import (
    CONFIG_ERROR_EXIT,
    first_error,
    report_config_error,
    report_failure,
    report_workers_gone,
)
from prime_rl.launch.children import (
    DROPPABLE_ROLES,
    ChildSpec,
    check_validator_leases,
    plan_children,
    should_restart,
    validator_name,
    worker_noise_path,
)
from prime_rl.launch.cleanup import check_free_space, remove_stale_copies, remove_weight_copies
from prime_rl.launch.expiry import expired_summary
from prime_rl.launch.groups import stop_groups
from prime_rl.launch.progress import orchestrator_progress
from prime_rl.launch.waits import trainer_wait_summary
from prime_rl.metrics import MetricsWriter, init_process

__all__ = [
    "STOP_GRACE_S",
    "ChildSpec",
    "Supervisor",
    "first_error",
    "main",
    "plan_children",
    "remove_weight_copies",
    "should_restart",
    "worker_noise_path",
]

log = logging.getLogger(__name__)

STOP_GRACE_S = 10.0
"""Seconds a child gets between SIGTERM and SIGKILL."""
EVALUATOR_GRACE_S = 180.0
"""Seconds the evaluator gets to finish its last evaluation after the trainer is done."""
RESTART_BUDGET = 5
"""Restarts one child may take within ``RESTART_WINDOW_S`` before its death fails the run."""
RESTART_WINDOW_S = 600.0
"""The window of the restart budget (a child that stays up that long earns its budget back)."""
BACKOFF_S = 1.0
"""Wait before a child's first restart in the window; doubled per further one."""
MAX_BACKOFF_S = 30.0
"""Longest wait before a restart."""


@dataclass
class _Child:
    spec: ChildSpec
    process: subprocess.Popen[bytes]
    output: IO[bytes]
    exit_code: int | None = None
    started_at: float = field(default_factory=time.time)
    output_offset: int = 0  # where this start's output begins in logs/<name>.out (appended across runs)


class Supervisor:
    """Start, watch and stop the children of one run (restarting dead ones: module docstring)."""

    def __init__(
        self,
        config: RunConfig,
        config_path: str | None,
        overrides: list[str],
        metrics: MetricsWriter,
        *,
        progress_every_s: float = 2.0,
        on_progress: Callable[[str], None] | None = None,
        restart_budget: int = RESTART_BUDGET,
        backoff_s: float = BACKOFF_S,
        max_backoff_s: float = MAX_BACKOFF_S,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        """``on_progress(line)`` gets the run's status line every ``progress_every_s`` seconds and once
        at the end (default: a one-line ticker on stdout, rewritten in place on a terminal).
        ``restart_budget`` (0: never restart), ``backoff_s``, ``max_backoff_s``: module docstring;
        ``clock``: the monotonic time of restarts and their window."""
        self.config = config
        self.config_path = config_path
        self.overrides = overrides
        self.metrics = metrics
        self.progress_every_s = progress_every_s
        self.run_dir = Path(config.run_dir)
        self.children: list[_Child] = []
        self.restart_budget = restart_budget
        self.backoff_s = backoff_s
        self.max_backoff_s = max_backoff_s
        self.restarts: dict[str, list[float]] = {}  # child name -> monotonic times of its restarts
        self._due: dict[str, tuple[float, ChildSpec]] = {}  # child name -> (restart time, spec)
        self.clock = clock
        # child name -> (clock time, error) of its last death: "the same error twice" only within the window
        self.last_errors: dict[str, tuple[float, str | None]] = {}
        self.dropped: dict[str, str | None] = {}  # workers dropped past their budget -> the error they died of
        self._stopping = False
        self._tty = sys.stdout.isatty()
        self.on_progress = on_progress if on_progress is not None else self._show

    def _argv(self, spec: ChildSpec) -> list[str]:
        argv = [sys.executable, "-m", "prime_rl.cli", spec.role, "--name", spec.name]
        if self.config_path:
            argv += ["--config", self.config_path]
        return argv + list(self.overrides) + list(spec.extra)

    def _output_path(self, spec: ChildSpec) -> Path:
        return self.run_dir / "logs" / f"{spec.name}.out"

    def start(self, spec: ChildSpec) -> _Child:
        (self.run_dir / "logs").mkdir(parents=True, exist_ok=True)
        output = open(self._output_path(spec), "ab")  # noqa: SIM115 - closed in stop()
        offset = output.tell()
        env = dict(
            os.environ, PYTHONUNBUFFERED="1", OMP_WAIT_POLICY="PASSIVE", TOKENIZERS_PARALLELISM="false"
        )
        argv = self._argv(spec)
        process = subprocess.Popen(
            argv,
            stdout=output,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            env=env,
            start_new_session=True,
        )
        child = _Child(spec, process, output, output_offset=offset)
        self.children.append(child)
        log.info("started %s (pid %d)", spec.name, process.pid)
        self.metrics.log("child_started", child=spec.name, role=spec.role, pid=process.pid, argv=argv)
        return child

    def poll(self) -> list[_Child]:
        """Children that exited since the last poll."""
        exited = []
        for child in self.children:
            if child.exit_code is None and child.process.poll() is not None:
                child.exit_code = child.process.returncode
                exited.append(child)
                log.info("%s exited with code %d", child.spec.name, child.exit_code)
                self.metrics.log("child_exited", child=child.spec.name, code=child.exit_code)
        return exited

    def schedule_restart(self, child: _Child) -> bool:
        """Plan ``child``'s restart after its backoff; False when its restart budget is spent."""
        name, now = child.spec.name, self.clock()
        recent = [t for t in self.restarts.get(name, []) if now - t < RESTART_WINDOW_S]
        self.restarts[name] = recent
        if len(recent) >= self.restart_budget:
            log.error("%s died %d times within %.0f s: not restarting it", name, len(recent) + 1, RESTART_WINDOW_S)
            return False
        delay = min(self.max_backoff_s, self.backoff_s * 2 ** len(recent))
        self._due[name] = (now + delay, child.spec)
        log.warning("%s exited with code %s; restarting it in %.1f s", name, child.exit_code, delay)
        return True

    def restart_due(self) -> None:
        """Start the children whose backoff has passed (replacing their dead entries)."""
        now = self.clock()
        for name, (due, spec) in list(self._due.items()):
            if now < due:
                continue
            del self._due[name]
            for dead in [c for c in self.children if c.spec.name == name and c.exit_code is not None]:
                dead.output.close()
                self.children.remove(dead)
            self.restarts.setdefault(name, []).append(now)
            child = self.start(spec)
            self.metrics.log("child_restarted", child=name, pid=child.process.pid, restarts=len(self.restarts[name]))

    def handle_death(self, child: _Child) -> bool:
        """``child`` died while the run goes on and :func:`should_restart` says restart it: schedule
        its restart, or drop it (a worker past its budget, or dead of the same error twice within the
        window), or False: a trusted role past its budget fails the run (reported)."""
        name, now = child.spec.name, self.clock()
        died_of = self.error_of(child) if child.exit_code else None
        # Killed by a signal (negative code: kill -9, the OOM killer): whatever its output holds was
        # printed before the kill (a start-up warning), so it is no error to compare.
        cause = died_of if (child.exit_code or 0) > 0 else None
        previous = self.last_errors.get(name)
        repeated = (
            cause is not None
            and previous is not None
            and previous[1] == cause
            and now - previous[0] < RESTART_WINDOW_S
        )
        self.last_errors[name] = (now, cause)
        if not repeated and self.schedule_restart(child):
            if child.exit_code != 0:
                self.report_failure(child, restarting=True)
            return True
        if child.spec.role in DROPPABLE_ROLES:
            self.dropped[name] = died_of
            why = "the same error twice in a row" if repeated else "its restart budget spent"
            log.error(
                "%s dropped (%s; exit code %s: %s); the run goes on without it\n  (full output: %s)",
                name, why, child.exit_code, died_of or "it printed no error", self._output_path(child.spec),
            )  # fmt: skip
            self.metrics.log("child_dropped", child=name, code=child.exit_code, error=died_of, why=why)
            return True
        self.report_failure(child)
        return False

    def error_of(self, child: _Child) -> str | None:
        """The error ``child`` died of, read from this start's output (:func:`first_error`)."""
        try:
            with self._output_path(child.spec).open("rb") as handle:
                handle.seek(child.output_offset)
                return first_error(handle.read().decode("utf-8", errors="replace"))
        except OSError:
            return None

    def report_failure(self, child: _Child, restarting: bool = False) -> None:
        """Report ``child``'s failure with its error and log (``launch/child_reports.py``)."""
        path, error = self._output_path(child.spec), self.error_of(child)
        report_failure(self.metrics, child.spec.name, child.exit_code, error, path, restarting=restarting)

    def honest_workers_gone(self) -> bool:
        """Every honest worker this run started has exited on its own (banned: none has a batch
        limit) or was dropped, so no sample will come from this machine any more."""
        honest = [c for c in self.children if c.spec.role in DROPPABLE_ROLES and c.spec.name.startswith("worker-")]
        if honest and all(c.spec.name in self.dropped for c in honest):
            return True
        if getattr(self.config.workers, "max_batches", 0):
            return False
        return bool(honest) and all(c.exit_code == 0 or c.spec.name in self.dropped for c in honest)

    def wait_for_orchestrator(self, client: OrchestratorClient, child: _Child) -> bool:
        """Wait until the orchestrator answers; False (reported) if it exits or stays silent too long."""
        try:
            client.wait_until_up(
                self.config.orchestrator.connect_timeout_s, alive=lambda: child.process.poll() is None
            )
            return True
        except ApiError as error:
            if child.process.poll() is None:
                log.error("%s", error)
            else:
                self.poll()
                self.report_failure(child)
            return False

    def stop_all(self) -> None:
        """SIGTERM every live child's process group (newest first), SIGKILL after the grace period."""
        self._stopping = True
        names = {child.process.pid: child.spec.name for child in self.children}
        stop_groups(
            [child.process for child in reversed(self.children)],
            STOP_GRACE_S,
            on_kill=lambda process: log.warning("%s ignored SIGTERM; killing it", names[process.pid]),
        )
        for child in reversed(self.children):
            child.output.close()
        self.poll()

    def progress_line(self, client: OrchestratorClient) -> str:
        """The console's progress line; logs the bounded ``progress`` record (``launch/progress.py``)."""
        try:
            progress = orchestrator_progress(client, self.config.trainer.total_steps)
        except ApiError:
            return "waiting for the orchestrator"
        self.metrics.log("progress", **progress.record)
        return progress.line

    def _show(self, line: str) -> None:
        if self._tty:
            sys.stdout.write("\r\x1b[2K" + line[:200])
        else:
            sys.stdout.write(line + "\n")
        sys.stdout.flush()

    def run(self) -> int:
        """Start everything, supervise until the trainer is done or a child fails; the exit code."""
        specs = plan_children(self.config)
        try:  # the trusted children (orchestrator, validator, trainer) read them; workers never do
            check_bind_address(self.config.orchestrator.host, self.config.orchestrator.admin_token)
            run_secrets(self.config)
        except SecretsError as error:
            log.error("not starting the run: %s", error)
            return 2
        freed = remove_stale_copies(self.config)  # what a killed run left: caches, relays' shards
        if freed:
            log.info("removed %.2f GiB of weight copies a previous run left behind", freed / 2**30)
        problem = check_free_space(self.config)
        if problem is not None:
            log.error("not starting the run: %s", problem)
            self.metrics.log("failed", child="run", code=2, error=problem)
            return 2
        client = OrchestratorClient(self.config.orchestrator.url, timeout_s=5, retries=0)
        orchestrator = self.start(specs[0])
        # Everything starts at once: each role waits for the orchestrator itself (role.py), so its
        # imports and model loads overlap the orchestrator's start-up and each other; a child with
        # ``after`` starts once that child has exited with code 0 (the validator after calibrate-noise).
        # Validators beyond the first wait for the orchestrator's validator leases (check_validator_leases).
        extra = [spec for spec in specs if spec.role == "validator" and spec.name != validator_name(0)]
        waiting = [spec for spec in specs[1:] if spec.after and spec not in extra]
        for spec in specs[1:]:
            if not spec.after and spec not in extra:
                self.start(spec)
        if not self.wait_for_orchestrator(client, orchestrator):
            return 1
        refusal = check_validator_leases(self.config, client)
        if refusal is not None:
            log.error("not running: %s", refusal)
            self.metrics.log("failed", child="validators", code=2, error=refusal)
            return 2
        for spec in extra:
            if spec.after:
                waiting.append(spec)
            else:
                self.start(spec)
        last_progress = 0.0
        trainer_done_at: float | None = None
        while True:
            for child in self.poll():
                if child.spec.role == "trainer" and child.exit_code == 0:
                    trainer_done_at = time.monotonic()
                    log.info("trainer finished all steps")
                elif child.exit_code == CONFIG_ERROR_EXIT and trainer_done_at is None:
                    report_config_error(
                        self.metrics, child.spec.name, child.exit_code, self.error_of(child), self._output_path(child.spec)
                    )
                    return CONFIG_ERROR_EXIT
                elif trainer_done_at is None and should_restart(self.config, child.spec, child.exit_code or 0):
                    if not self.handle_death(child):  # a trusted role past its budget
                        return 1
                elif child.exit_code != 0 and trainer_done_at is not None and child.spec.role != "evaluator":
                    # Training is complete and everything is about to stop: a worker or server that
                    # dies now (killed, crashed while the run winds down) costs the run nothing.
                    log.warning("%s exited with code %s after the trainer finished", child.spec.name, child.exit_code)
                elif child.exit_code != 0:
                    self.report_failure(child)
                    return 1
                for spec in [spec for spec in waiting if spec.after == child.spec.name]:
                    waiting.remove(spec)
                    self.start(spec)
            self.restart_due()
            if trainer_done_at is None and self.honest_workers_gone():
                report_workers_gone(self.metrics, client, self.dropped)
                return 1
            if trainer_done_at is not None:
                evaluator = [c for c in self.children if c.spec.role == "evaluator" and c.exit_code is None]
                if not evaluator or time.monotonic() - trainer_done_at > EVALUATOR_GRACE_S:
                    self.on_progress(self.progress_line(client))
                    return 0
            if time.monotonic() - last_progress >= self.progress_every_s:
                last_progress = time.monotonic()
                self.on_progress(self.progress_line(client))
            time.sleep(0.25)


class _Interrupted(Exception):
    def __init__(self, signum: int) -> None:
        super().__init__(signum)
        self.signum = signum


def main(
    config: RunConfig, name: str = "run", config_path: str | None = None, overrides: list[str] | None = None
) -> int:
    """Entry point of ``prime-rl run``."""
    metrics = init_process("run", name, config.run_dir)
    supervisor = Supervisor(config, config_path, list(overrides or []), metrics)

    def interrupt(signum: int, frame: Any) -> None:
        raise _Interrupted(signum)

    previous = {s: signal.signal(s, interrupt) for s in (signal.SIGINT, signal.SIGTERM)}
    code = 1
    try:
        code = supervisor.run()
    except _Interrupted as interrupted:
        code = 128 + interrupted.signum
        log.info("interrupted; stopping every process")
    finally:
        for signum in previous:
            signal.signal(signum, signal.SIG_IGN)  # a second Ctrl-C must not abort the clean stop
        supervisor.stop_all()
        freed = remove_stale_copies(config)  # however the run ended: what any process re-creates
        log.info("removed %.2f GiB of re-creatable weight copies", freed / 2**30)
        for signum, handler in previous.items():
            signal.signal(signum, handler)
        if supervisor._tty:
            sys.stdout.write("\n")
        # why a run that trained nothing waited (launch/waits.py); honest work expired unjudged (launch/expiry.py)
        for line in (trainer_wait_summary(config.run_dir), expired_summary(config.run_dir)):
            if line is not None:
                log.info("%s", line)
        metrics.log("shutdown", code=code, children={c.spec.name: c.exit_code for c in supervisor.children})
        log.info("run finished with exit code %d (logs and metrics in %s)", code, config.run_dir)
    return code
