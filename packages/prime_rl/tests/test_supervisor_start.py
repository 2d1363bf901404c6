"""The supervisor starts every child at once, not after the orchestrator answers: the roles wait
for it themselves, so their start-up overlaps the orchestrator's (prime_rl.launch.supervisor)."""

from __future__ import annotations

import json
import sys
from pathlib import Path

from prime_rl.config import load_config
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
