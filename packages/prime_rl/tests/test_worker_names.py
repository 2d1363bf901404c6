"""Worker names are printable (checked at registration) and escaped wherever they are printed (issue #34
item 8): a name cannot clear the operator's console or forge a line of it."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import requests

from prime_rl.api.client import OrchestratorClient
from prime_rl.api.fields import printable
from prime_rl.config import load_config
from prime_rl.launch.progress import ProgressTracker
from prime_rl.launch.report import render_summary, summarize_run
from prime_rl.launch.supervisor import Supervisor
from prime_rl.metrics import MetricsWriter

FORGED = "\x1b[2J\n[run] run finished with exit code 0"
"""Clears the screen (ESC [2J), then starts a new line that looks like the supervisor's last one."""


def _safe(text: str) -> None:
    assert "\x1b" not in text and "\n" not in text and "\r" not in text, repr(text)
    assert "\\x1b[2J\\n[run] run finished with exit code 0" in text, repr(text)


def test_printable_escapes_control_and_format_characters_only() -> None:
    assert printable("worker-7 (GPU 0)") == "worker-7 (GPU 0)"
    assert printable("été") == "été"
    assert printable(FORGED) == "\\x1b[2J\\n[run] run finished with exit code 0"
    assert printable("a\u202eb\tc\x00") == "a\\u202eb\\tc\\x00"  # right-to-left override, tab, NUL


def test_registration_refuses_a_name_with_control_characters(client: OrchestratorClient, server: Any) -> None:
    with pytest.raises(ValueError, match="worker name must be printable"):
        client.register(FORGED)  # our client checks before sending
    for name in (FORGED, "ok\u202e"):  # a hand-made request meets the same check on the server
        raw = requests.post(f"{server.url}/workers/register", json={"name": name}, timeout=10)
        assert raw.status_code == 400 and "worker name must be printable" in raw.text, raw.text
    assert client.register("honest worker #1").worker_id  # printable names still register
    assert [w.name for w in client.workers().workers] == ["honest worker #1"]


def test_a_stored_name_with_escape_codes_is_escaped_in_the_supervisors_console_line(
    client: OrchestratorClient, server: Any, tmp_path: Path
) -> None:
    """A name already in the table (registered before names were checked, as a journal restores it)
    reaches the supervisor's progress line, its ban report and the run report escaped."""
    worker, _ = server.ledger.workers.register(FORGED)
    config = load_config(None, ["--run_dir", str(tmp_path / "run")])
    metrics = MetricsWriter(tmp_path / "run" / "metrics" / "run.jsonl", role="run", name="run")
    supervisor = Supervisor(config, None, [], metrics, on_progress=lambda line: None)
    line = supervisor.progress_line(client)
    _safe(line)
    record = json.loads((tmp_path / "run" / "metrics" / "run.jsonl").read_text().splitlines()[-1])
    assert record["workers"][worker.worker_id]["name"] == FORGED  # the metrics keep the raw name, JSON-escaped
    tracker = ProgressTracker(tmp_path / "run")
    assert all("\x1b" not in part for part in tracker.lines({FORGED: (1, 0)}))
    summary = summarize_run(tmp_path / "run")
    _safe("".join(line for line in render_summary(summary).splitlines() if "finished with exit" in line))
