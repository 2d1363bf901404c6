"""Run the real supervisor (``prime_rl.launch.supervisor.Supervisor``) with stand-in children.

The supervisor tests subclass ``Supervisor`` and override ``_argv`` so each role runs a tiny
stand-in command; :func:`run_stand_in` builds the run's config (a free port, no evaluator, the
orchestrator waited for up to 60 s), runs the subclass to its end, always stops every child, and
returns the exit code with the ``run.jsonl`` events it wrote.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from prime_rl.config import load_config
from prime_rl.launch.local import free_port
from prime_rl.metrics import MetricsWriter


def run_stand_in(supervisor_class: type, run_dir: Path, *overrides: str, **kwargs: Any) -> tuple[int, list[dict[str, Any]]]:
    """(exit code, ``run.jsonl`` events) of ``supervisor_class`` run over ``run_dir``
    with ``overrides`` after the defaults above; ``kwargs`` go to the supervisor (``backoff_s``)."""
    argv = ["--run_dir", str(run_dir), "--orchestrator.port", str(free_port()), "--evaluator.enabled", "false",
            "--orchestrator.connect_timeout_s", "60", *overrides]  # fmt: skip
    config = load_config(None, argv)
    metrics = MetricsWriter(run_dir / "run.jsonl", role="run", name="run")
    supervisor = supervisor_class(config, None, argv, metrics, on_progress=lambda line: None, **kwargs)
    try:
        code = supervisor.run()
    finally:
        supervisor.stop_all()
    events = [json.loads(line) for line in (run_dir / "run.jsonl").read_text().splitlines()]
    return code, events
