"""The supervisor restarts dead children: kill -9 roles of a real `prime-rl run`, and it still finishes."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
from stand_in_runs import run_stand_in  # tests/support
from stepped_clock import SteppedClock  # tests/support

from prime_rl.config import load_config
from prime_rl.launch.supervisor import ChildSpec, Supervisor, should_restart
from prime_rl.metrics import MetricsWriter
from prime_rl.orchestrator.store import RolloutStore


class _Dead:
    """What ``schedule_restart`` reads of a dead child."""

    def __init__(self, name: str, role: str, exit_code: int, uptime_s: float) -> None:
        self.spec = ChildSpec(name, role)
        self.exit_code = exit_code
        self.started_at = time.time() - uptime_s


def test_restart_policy_and_backoff_budget(config_for: Any) -> None:
    config = config_for()
    assert should_restart(config, ChildSpec("orchestrator", "orchestrator"), 0)
    assert should_restart(config, ChildSpec("shardcast-relay-0", "relay"), -9)
    assert should_restart(config, ChildSpec("validator", "validator"), 0)  # a stray SIGTERM: exits 0
    assert should_restart(config, ChildSpec("trainer", "trainer"), -9)
    assert not should_restart(config, ChildSpec("trainer", "trainer"), 0)  # finished
    assert not should_restart(config, ChildSpec("worker-0", "worker"), 0)  # banned or done
    assert should_restart(config, ChildSpec("worker-0", "worker"), 1)
    assert not should_restart(config, ChildSpec("evaluator", "evaluator"), 1)
    with_limit = config_for("--validator.max_batches", "3")
    assert not should_restart(with_limit, ChildSpec("validator", "validator"), 0)  # did its batches
    assert should_restart(with_limit, ChildSpec("validator", "validator"), -9)

    supervisor = Supervisor(config, None, [], MetricsWriter(None, role="run", name="run"), restart_budget=2,
                            backoff_s=1.0, max_backoff_s=1.5)  # fmt: skip
    dead = _Dead("validator", "validator", -9, 600.0)
    started = time.monotonic()
    assert supervisor.schedule_restart(dead)  # type: ignore[arg-type]
    first = supervisor._due["validator"][0] - started
    supervisor.restarts["validator"] = [time.monotonic()]  # as restart_due records it
    assert supervisor.schedule_restart(dead)  # type: ignore[arg-type]
    second = supervisor._due["validator"][0] - started
    supervisor.restarts["validator"].append(time.monotonic())
    assert 0.9 < first < 1.1 and 1.4 < second < 1.6  # 1 s, then doubled but capped at 1.5 s
    assert not supervisor.schedule_restart(dead)  # type: ignore[arg-type]  # budget of 2 spent


class StandInSupervisor(Supervisor):
    """A real orchestrator; stand-ins for the rest: the validator exits 0 at its first start (a stray
    SIGTERM) and sleeps at its second; the trainer, once the validator is back, dies of the same
    error at every start (a wrong configuration); every other role sleeps until it is stopped."""

    def _argv(self, spec: ChildSpec) -> list[str]:
        if spec.role == "orchestrator":
            return super()._argv(spec)
        first, second = str(self.run_dir / "validator-1"), str(self.run_dir / "validator-2")
        if spec.role == "validator":
            code = (f"import pathlib, time\nif not pathlib.Path({first!r}).exists():\n"
                    f"    pathlib.Path({first!r}).write_text('')\nelse:\n"
                    f"    pathlib.Path({second!r}).write_text(''); time.sleep(120)")  # fmt: skip
        elif spec.role == "trainer":
            code = (f"import pathlib, time\nwhile not pathlib.Path({second!r}).exists(): time.sleep(0.1)\n"
                    "raise ValueError('no model here')")  # fmt: skip
        else:
            code = "import time; time.sleep(120)"
        return [sys.executable, "-c", code]


def test_a_validator_exiting_0_is_restarted_and_a_repeated_error_fails_the_run(tmp_path: Path) -> None:
    code, events = run_stand_in(StandInSupervisor, tmp_path, backoff_s=0.1)
    assert code == 1
    assert [e["child"] for e in events if e["event"] == "child_restarted"] == ["validator", "trainer"]
    assert [e["child"] for e in events if e["event"] == "child_died"] == ["trainer"]
    (failed,) = [e for e in events if e["event"] == "failed"]
    assert failed["child"] == "trainer" and failed["error"] == "ValueError: no model here"


def _started(helpers: Any, run_dir: Path, name: str) -> list[dict[str, Any]]:
    return [e for e in helpers.metrics_of(run_dir, "run") if e["event"] == "child_started" and e["child"] == name]


def _kill_when_started(helpers: Any, run_dir: Path, name: str) -> int:
    (event,) = helpers.wait_for(lambda: _started(helpers, run_dir, name), 120, f"{name} to start")[-1:]
    os.kill(event["pid"], signal.SIGKILL)
    return int(event["pid"])


@pytest.mark.slow
def test_kill_9_of_orchestrator_validator_and_worker_the_run_still_finishes(tiny_run: Any, helpers: Any) -> None:
    """A small real run; once work flows, kill -9 the orchestrator, then the validator, then the worker.
    The supervisor restarts each, the run finishes with exit code 0, every batch the orchestrator
    acknowledged is in its store, no sample is claimed twice, and the worker kept its identity."""
    # Enough steps that training is still going when the third kill lands (3 steps finished within
    # 17 s on an idle machine, before the worker's restart could be seen).
    # The default validator lease (120 s): the restarted validator comes back under its predecessor's
    # id and takes back at once a batch the killed one held (before, such a kill stalled the run 2 minutes).
    config_path, run_dir = tiny_run(workers={"count": 1, "hostile": []}, trainer={"total_steps": 20})
    env = dict(os.environ, OMP_WAIT_POLICY="PASSIVE", TOKENIZERS_PARALLELISM="false")
    run = subprocess.Popen(
        [sys.executable, "-m", "prime_rl.cli", "run", "--config", str(config_path)],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env,
    )  # fmt: skip
    try:

        def stored() -> list[dict[str, Any]]:
            return [e for e in helpers.metrics_of(run_dir, "orchestrator") if e["event"] == "batch_stored"]

        helpers.wait_for(lambda: len(stored()) >= 1, 300, "a first stored batch")
        killed = {"orchestrator": _kill_when_started(helpers, run_dir, "orchestrator")}
        helpers.wait_for(lambda: len(_started(helpers, run_dir, "orchestrator")) == 2, 60, "the orchestrator's restart")
        before = len(stored())
        helpers.wait_for(lambda: len(stored()) > before, 300, "a batch stored by the restarted orchestrator")
        killed["validator"] = _kill_when_started(helpers, run_dir, "validator")
        helpers.wait_for(lambda: len(_started(helpers, run_dir, "validator")) == 2, 60, "the validator's restart")
        killed["worker-0"] = _kill_when_started(helpers, run_dir, "worker-0")
        output, _ = run.communicate(timeout=900)
    finally:
        if run.poll() is None:
            run.send_signal(signal.SIGTERM)
            run.communicate(timeout=60)
    assert run.returncode == 0, output[-4000:]
    restarted = [e["child"] for e in helpers.metrics_of(run_dir, "run") if e["event"] == "child_restarted"]
    assert sorted(restarted) == ["orchestrator", "validator", "worker-0"], restarted
    # every acknowledged batch is stored, and every claim takes each sample once
    store = RolloutStore(run_dir / "orchestrator")
    acknowledged = {e["batch_id"] for e in helpers.metrics_of(run_dir, "orchestrator") if e["event"] == "batch_stored"}
    assert acknowledged <= {record.meta.batch_id for record in store.batch_records()}
    claims = store.claims()
    config = load_config(config_path)
    assert [claim.step for claim in claims] == list(range(config.trainer.total_steps))
    samples = [sample for claim in claims for sample in claim.sample_ids]
    assert len(samples) == len(set(samples))
    # one identity for the worker, across its own restart and the orchestrator's
    registered = [e for e in helpers.metrics_of(run_dir, "orchestrator") if e["event"] == "register"]
    assert [e["worker_name"] for e in registered] == ["worker-0"], registered
    assert any(e["event"] == "resumed" for e in helpers.metrics_of(run_dir, "worker-0"))
    # the validator kept its id across its restart: its leases were its successor's
    leased = {e["validator_id"] for e in helpers.metrics_of(run_dir, "orchestrator") if e["event"] == "validator_lease"}
    assert len(leased) == 1, leased


class _ErrorSupervisor(Supervisor):
    """``error_of`` reads a set error instead of a log file."""

    error: str | None = None

    def error_of(self, child: Any) -> str | None:
        return self.error


def test_the_same_error_days_apart_is_restarted_and_twice_within_the_window_is_not(config_for: Any) -> None:
    clock = SteppedClock(1000.0)
    metrics = MetricsWriter(None, role="run", name="run")
    supervisor = _ErrorSupervisor(config_for(), None, [], metrics, clock=clock)
    supervisor.error = "OSError: [Errno 104] Connection reset by peer"
    validator = _Dead("validator", "validator", 1, 3600.0)
    assert supervisor.handle_death(validator)  # type: ignore[arg-type]
    supervisor.restarts.setdefault("validator", []).append(clock.now)  # as restart_due records it
    clock.now += 2 * 86400.0  # two days later the same transient error: restarted again
    assert supervisor.handle_death(validator)  # type: ignore[arg-type]
    clock.now += 5.0  # and again within the window: a wrong configuration does not heal, the run fails
    assert not supervisor.handle_death(validator)  # type: ignore[arg-type]


def test_kills_are_no_error_even_when_the_output_before_them_is_the_same(config_for: Any) -> None:
    # A trainer killed twice (kill -9) within the window, whose last start-up line both times is the
    # same warning: a kill is not "the same error twice", so it restarts both times.
    clock = SteppedClock(1000.0)
    supervisor = _ErrorSupervisor(config_for(), None, [], MetricsWriter(None, role="run", name="run"), clock=clock)
    supervisor.error = "[ERROR] trainer: float32 deltas double the bytes per update"
    trainer = _Dead("trainer", "trainer", -9, 3600.0)
    assert supervisor.handle_death(trainer)  # type: ignore[arg-type]
    supervisor.restarts.setdefault("trainer", []).append(clock.now)
    clock.now += 5.0
    assert supervisor.handle_death(trainer)  # type: ignore[arg-type]
    supervisor.restarts.setdefault("trainer", []).append(clock.now)
    clock.now += 5.0
    dead = _Dead("trainer", "trainer", 1, 3600.0)  # the same line twice as a real exit code: it is an error
    assert supervisor.handle_death(dead)  # type: ignore[arg-type]
    clock.now += 5.0
    assert not supervisor.handle_death(dead)  # type: ignore[arg-type]


def test_a_worker_past_its_budget_is_dropped_and_a_trusted_role_fails_the_run(config_for: Any) -> None:
    clock = SteppedClock(1000.0)
    supervisor = _ErrorSupervisor(config_for(), None, [], MetricsWriter(None, role="run", name="run"),
                                  clock=clock, restart_budget=2)  # fmt: skip
    for name, role in (("worker-1", "worker"), ("trainer", "trainer")):
        for attempt in range(3):
            supervisor.error = f"RuntimeError: flaky {attempt}"  # a different error each time
            dead = _Dead(name, role, 1, 1.0)
            kept = supervisor.handle_death(dead)  # type: ignore[arg-type]
            if attempt < 2:
                assert kept and name in supervisor._due
                supervisor.restarts.setdefault(name, []).append(clock.now)  # as restart_due records it
                del supervisor._due[name]
            clock.now += 1.0
        assert kept == (role == "worker")
    assert supervisor.dropped == {"worker-1": "RuntimeError: flaky 2"}


class DropSupervisor(Supervisor):
    """A real orchestrator; worker-1 dies of the same error at every start, worker-0 sleeps; the
    trainer finishes (exit 0) once the run's metrics say worker-1 was dropped, or after 60 s."""

    def _argv(self, spec: ChildSpec) -> list[str]:
        if spec.role == "orchestrator":
            return super()._argv(spec)
        run_log = str(self.run_dir / "run.jsonl")
        if spec.name == "worker-1":
            code = "raise ConnectionError('the orchestrator went away')"
        elif spec.role == "trainer":
            code = (f"import json, pathlib, time\nfor _ in range(600):\n    p = pathlib.Path({run_log!r})\n"
                    "    events = [json.loads(l)['event'] for l in p.read_text().splitlines()] if p.exists() else []\n"
                    "    if 'child_dropped' in events: break\n    time.sleep(0.1)")  # fmt: skip
        else:
            code = "import time; time.sleep(120)"
        return [sys.executable, "-c", code]


def test_a_worker_dying_of_the_same_error_is_dropped_and_the_run_finishes(tmp_path: Path) -> None:
    code, events = run_stand_in(DropSupervisor, tmp_path, "--workers.count", "2", backoff_s=0.1)
    assert code == 0
    (dropped,) = [e for e in events if e["event"] == "child_dropped"]
    assert dropped["child"] == "worker-1" and dropped["error"] == "ConnectionError: the orchestrator went away"
    assert not [e for e in events if e["event"] == "failed"]
