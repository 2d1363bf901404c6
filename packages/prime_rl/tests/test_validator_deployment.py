"""Deployment of validators (issue #45.4): ``prime-rl run`` starts ``validator.count`` of them and
refuses more than one until the orchestrator leases pending batches; ``prime-rl validator`` on another
machine joins a running orchestrator with its URL, the admin token and the assignment secret."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import types
from pathlib import Path
from typing import Any

import pytest

from prime_rl.api.client import OrchestratorClient
from prime_rl.api.secrets import run_secrets
from prime_rl.config import load_config
from prime_rl.launch import supervisor as supervisor_module
from prime_rl.launch.local import free_port
from prime_rl.launch.supervisor import ChildSpec, Supervisor, plan_children
from prime_rl.metrics import MetricsWriter
from prime_rl.orchestrator.server import OrchestratorServer
from prime_rl.tasks import load_tasks


def test_plan_children_starts_validator_count_validators(tmp_path: Path) -> None:
    def names(*overrides: str) -> list[str]:
        config = load_config(None, ["--run_dir", str(tmp_path), *overrides])
        return [s.name for s in plan_children(config) if s.role in ("validator", "calibrate-noise")]

    assert names() == ["validator"]
    assert names("--validator.count", "3") == ["validator", "validator-1", "validator-2"]
    assert names("--validator.count", "0") == []
    assert names("--validator.count", "0", "--workers.backend", "vllm") == []  # no calibration for nobody
    assert names("--validator.count", "2", "--workers.backend", "vllm") == [
        "calibrate-noise", "validator", "validator-1",
    ]  # fmt: skip


class StandInSupervisor(Supervisor):
    """A real orchestrator; every other role sleeps until it is stopped, except the trainer and the
    evaluator, which exit 0 at once when ``finish`` is set (the run is then done: the supervisor would
    otherwise give a still-running evaluator its grace period to finish a last evaluation)."""

    finish = False

    def _argv(self, spec: ChildSpec) -> list[str]:
        if spec.role == "orchestrator":
            return super()._argv(spec)
        if spec.role in ("trainer", "evaluator") and self.finish:
            return [sys.executable, "-c", "import time; time.sleep(3)"]
        return [sys.executable, "-c", "import time; time.sleep(120)"]


def run_with(tmp_path: Path, *overrides: str, finish: bool = False) -> tuple[int, list[dict[str, Any]]]:
    argv = ["--run_dir", str(tmp_path), "--orchestrator.port", str(free_port()), "--workers.count", "0", *overrides]
    config = load_config(None, argv)
    metrics = MetricsWriter(tmp_path / "run.jsonl", role="run", name="run")
    supervisor = StandInSupervisor(config, None, argv, metrics, on_progress=lambda line: None)
    supervisor.finish = finish
    try:
        code = supervisor.run()
    finally:
        supervisor.stop_all()
    return code, [json.loads(line) for line in (tmp_path / "run.jsonl").read_text().splitlines()]


def test_more_than_one_validator_is_refused_by_an_orchestrator_without_validator_leases(tmp_path: Path) -> None:
    """An orchestrator that does not lease pending batches to one validator each (an older one: no
    'validator_leases' in GET /status) would let two validators judge the same batches: the run
    refuses validator.count > 1 with the reason."""

    class OlderOrchestrator:
        def status(self) -> Any:
            return types.SimpleNamespace(capabilities=["noise_profile"])

    config = load_config(None, ["--run_dir", str(tmp_path), "--validator.count", "2"])
    why = supervisor_module.check_validator_leases(config, OlderOrchestrator())  # type: ignore[arg-type]
    assert why is not None and "validator.count = 2" in why and "'validator_leases'" in why
    single = load_config(None, ["--run_dir", str(tmp_path), "--validator.count", "1"])
    assert supervisor_module.check_validator_leases(single, OlderOrchestrator()) is None  # type: ignore[arg-type]


def test_this_orchestrator_leases_pending_batches_so_every_validator_starts(tmp_path: Path) -> None:
    """The real orchestrator announces 'validator_leases' (orchestrator/validator_leases): a run with
    validator.count = 2 starts both and finishes."""
    code, events = run_with(tmp_path, "--validator.count", "2", finish=True)
    assert code == 0
    started = [e["child"] for e in events if e["event"] == "child_started"]
    assert {"validator", "validator-1"} <= set(started)
    assert not [e for e in events if e["event"] == "failed"]


def test_with_validator_leases_every_validator_starts(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """An orchestrator that announces 'validator_leases' (stood in for by the check) gets them all."""
    monkeypatch.setattr(supervisor_module, "check_validator_leases", lambda config, client: None)
    code, events = run_with(tmp_path, "--validator.count", "3", finish=True)
    assert code == 0
    started = [e["child"] for e in events if e["event"] == "child_started"]
    assert {"validator", "validator-1", "validator-2"} <= set(started)


def validator_process(run_dir: Path, url: str, model: Path, *overrides: str) -> subprocess.CompletedProcess[str]:
    """``prime-rl validator`` as another machine would start it: its own run directory, the
    orchestrator's URL; the run's secrets only by configuration."""
    env = dict(os.environ, OMP_WAIT_POLICY="PASSIVE", TOKENIZERS_PARALLELISM="false")
    argv = [
        sys.executable, "-m", "prime_rl.cli", "validator", "--run_dir", str(run_dir), "--orchestrator.public_url", url,
        "--model.path", str(model), "--tasks.num_tasks", "20", "--sampling.max_new_tokens", "8",
        "--orchestrator.prompts_per_batch", "2", "--sampling.group_size", "2",
        "--validator.calibration_tokens", "64", "--validator.max_batches", "1",
        "--orchestrator.connect_timeout_s", "30", *overrides,
    ]  # fmt: skip
    return subprocess.run(argv, env=env, capture_output=True, text=True, timeout=300, check=False)


def test_a_validator_on_another_machine_joins_with_the_admin_token(
    tmp_path: Path, tiny_lm_dir: Path, batch_for: Any
) -> None:
    """A validator process with its own run directory joins a running orchestrator by URL and the
    configured secrets: it publishes the run's noise profile, judges the pending batch (a worker's
    made-up batch: rejected) and stops after ``validator.max_batches``. With a wrong admin token it
    exits 2 at once, naming the token."""
    config = load_config(
        None,
        [
            "--run_dir", str(tmp_path / "run"), "--model.path", str(tiny_lm_dir), "--tasks.num_tasks", "20",
            "--orchestrator.port", str(free_port()), "--orchestrator.prompts_per_batch", "2",
            "--sampling.group_size", "2", "--sampling.max_new_tokens", "8",
        ],
    )  # fmt: skip
    secrets = run_secrets(config)
    with OrchestratorServer(config, load_tasks(config.tasks)) as server:
        with OrchestratorClient(server.url) as worker:
            worker_id = worker.register("w").worker_id
            lease = worker.get_tasks(worker_id)
            batch_id = worker.submit_rollouts(batch_for(lease)).batch_id
        wrong = validator_process(
            tmp_path / "remote", server.url, tiny_lm_dir,
            "--orchestrator.admin_token", "x" * 32, "--orchestrator.assignment_secret", secrets.assignment_key.decode(),
        )  # fmt: skip
        assert wrong.returncode == 2, wrong.stdout[-2000:] + wrong.stderr[-2000:]
        assert "admin token" in wrong.stdout + wrong.stderr
        joined = validator_process(
            tmp_path / "remote", server.url, tiny_lm_dir,
            "--orchestrator.admin_token", secrets.admin_token,
            "--orchestrator.assignment_secret", secrets.assignment_key.decode(),
        )  # fmt: skip
        assert joined.returncode == 0, joined.stdout[-3000:] + joined.stderr[-3000:]
        with OrchestratorClient(server.url, admin_token=secrets.admin_token) as client:
            record = client.noise_profile()
            pending = client.pending()
    assert record is not None and record.published_by.startswith("validator@")
    assert batch_id not in {b.batch_id for b in pending.batches}  # judged
    assert (tmp_path / "remote" / "validator" / "noise-profile.json").exists()
    assert not (tmp_path / "run" / "validator").exists()  # nothing of it on the orchestrator's side
