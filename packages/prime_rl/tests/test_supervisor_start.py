"""The supervisor starts every child at once, not after the orchestrator answers: the roles wait
for it themselves, so their start-up overlaps the orchestrator's (prime_rl.launch.supervisor)."""

from __future__ import annotations

import json
import sys
from pathlib import Path

from prime_rl.config import load_config
from prime_rl.launch.local import free_port
from prime_rl.launch.supervisor import ChildSpec, Supervisor, plan_children
from prime_rl.metrics import MetricsWriter


class QuietSupervisor(Supervisor):
    """The real supervisor, whose children run stand-in commands: an orchestrator that exits
    without ever answering, and roles that only sleep until they are stopped."""

    def _argv(self, spec: ChildSpec) -> list[str]:
        if spec.role == "orchestrator":
            return [sys.executable, "-c", "raise SystemExit('no orchestrator here')"]
        return [sys.executable, "-c", "import time; time.sleep(120)"]


def test_every_child_starts_before_the_orchestrator_answers(tmp_path: Path) -> None:
    config = load_config(None, ["--run_dir", str(tmp_path), "--orchestrator.port", "1"])
    metrics = MetricsWriter(tmp_path / "run.jsonl", role="run", name="run")
    supervisor = QuietSupervisor(config, None, [], metrics, on_progress=lambda line: None)
    try:
        assert supervisor.run() == 1  # the orchestrator died without answering
    finally:
        supervisor.stop_all()
    events = [json.loads(line) for line in (tmp_path / "run.jsonl").read_text().splitlines()]
    started = [e["child"] for e in events if e["event"] == "child_started"]
    assert started == [spec.name for spec in plan_children(config)]
    assert len(started) > 3
    assert [e["child"] for e in events if e["event"] == "failed"] == ["orchestrator"]
    assert all(child.exit_code is not None for child in supervisor.children)  # all stopped again


class PreparedSupervisor(Supervisor):
    """A real orchestrator; stand-ins for the rest: calibrate-noise writes the profile file and
    exits 0, the validator records whether that file existed when it started, the trainer exits 0
    (the run is then done) and every other role sleeps until it is stopped."""

    def _argv(self, spec: ChildSpec) -> list[str]:
        if spec.role == "orchestrator":
            return super()._argv(spec)
        profile = str(self.run_dir / "validator" / "noise-profile.json")
        seen = str(self.run_dir / "validator-saw-profile")
        if spec.role == "calibrate-noise":
            code = f"import pathlib; p = pathlib.Path({profile!r}); p.parent.mkdir(parents=True, exist_ok=True); p.write_text('{{}}')"
        elif spec.role == "validator":
            code = f"import pathlib, time; pathlib.Path({seen!r}).write_text(str(pathlib.Path({profile!r}).exists())); time.sleep(120)"
        elif spec.role == "trainer":  # done once the validator has started (so the run stops after it)
            code = f"import pathlib, time\nwhile not pathlib.Path({seen!r}).exists(): time.sleep(0.1)"
        else:
            code = "import time; time.sleep(120)"
        return [sys.executable, "-c", code]


def test_the_validator_starts_after_the_noise_calibration_of_vllm_workers(tmp_path: Path) -> None:
    overrides = [
        "--run_dir", str(tmp_path), "--orchestrator.port", str(free_port()), "--workers.backend", "vllm",
        "--evaluator.enabled", "false", "--orchestrator.connect_timeout_s", "60",
    ]  # fmt: skip
    config = load_config(None, overrides)
    names = [spec.name for spec in plan_children(config)]
    assert names.index("calibrate-noise") < names.index("validator")
    metrics = MetricsWriter(tmp_path / "run.jsonl", role="run", name="run")
    supervisor = PreparedSupervisor(config, None, overrides, metrics, on_progress=lambda line: None)
    try:
        assert supervisor.run() == 0
    finally:
        supervisor.stop_all()
    assert (tmp_path / "validator-saw-profile").read_text() == "True"
    events = [json.loads(line) for line in (tmp_path / "run.jsonl").read_text().splitlines()]
    started = [e["child"] for e in events if e["event"] == "child_started"]
    assert started.index("validator") > started.index("worker-0")  # the others did not wait for it
    assert {e["child"]: e["code"] for e in events if e["event"] == "child_exited"}["calibrate-noise"] == 0
