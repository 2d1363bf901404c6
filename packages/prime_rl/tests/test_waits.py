"""No silent waits, no raw tracebacks: waiting for the orchestrator logs what it waits for at least
every log period and ends with one line naming the URL and the problem; a failed child's error is
printed by the supervisor."""

from __future__ import annotations

import logging
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from prime_rl.api.client import OrchestratorClient, OrchestratorUnavailable
from prime_rl.launch.supervisor import first_error


def _closed_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])  # closed again on exit: nothing listens there


def test_wait_logs_progress_and_ends_with_one_clear_line(caplog: pytest.LogCaptureFixture):
    url = f"http://127.0.0.1:{_closed_port()}"
    client = OrchestratorClient(url, timeout_s=1.0)
    caplog.set_level(logging.INFO, logger="prime_rl.api.client")
    started = time.monotonic()
    with pytest.raises(OrchestratorUnavailable) as raised:
        client.wait_until_up(timeout_s=1.5, poll_s=0.1, log_every_s=0.5)
    waited = time.monotonic() - started
    message = str(raised.value)
    assert "\n" not in message and url in message and "connection refused" in message
    assert "prime-rl orchestrator" in message and "orchestrator.public_url" in message
    lines = [r.getMessage() for r in caplog.records if "waiting for the orchestrator" in r.getMessage()]
    # one line at once, then one per log period: at least waited / 0.5 lines, never a silent stretch
    assert len(lines) >= int(waited / 0.5) and lines[0].startswith(f"waiting for the orchestrator at {url}")
    assert all("connection refused" in line for line in lines)


def test_unresolvable_host_is_named():
    client = OrchestratorClient("http://no-such-host.invalid:8700", timeout_s=2.0)
    with pytest.raises(OrchestratorUnavailable, match=r"cannot resolve host 'no-such-host\.invalid'"):
        client.wait_until_up(timeout_s=0.1, poll_s=0.05)


def test_wait_stops_when_the_awaited_process_is_gone():
    client = OrchestratorClient(f"http://127.0.0.1:{_closed_port()}", timeout_s=1.0)
    started = time.monotonic()
    with pytest.raises(OrchestratorUnavailable, match="gave up waiting"):
        client.wait_until_up(timeout_s=60, poll_s=0.05, alive=lambda: False)
    assert time.monotonic() - started < 30


def test_worker_with_a_wrong_url_says_so_in_one_line(tmp_path: Path):
    """Before: silent for 60 s, then a requests traceback. Now: a waiting line at once, then one error line."""
    port = _closed_port()
    (tmp_path / "never-loaded").mkdir()
    command = [sys.executable, "-m", "prime_rl.cli", "worker", "--run_dir", str(tmp_path),
               "--model.path", str(tmp_path / "never-loaded"),  # the URL is checked before the model loads
               "--orchestrator.public_url", f"http://127.0.0.1:{port}",
               "--orchestrator.connect_timeout_s", "2"]  # fmt: skip
    done = subprocess.run(command, capture_output=True, text=True, timeout=180)
    assert done.returncode == 1, done.stderr[-2000:]
    assert "Traceback" not in done.stderr
    assert f"waiting for the orchestrator at http://127.0.0.1:{port} (connection refused" in done.stderr
    (error,) = [line for line in done.stderr.splitlines() if "[ERROR]" in line]
    assert f"cannot reach the orchestrator at http://127.0.0.1:{port} after 2 s" in error


# ---------------------------------------------------------------- first_error oracles

CHAINED = """\
10:00:01 [INFO] [evaluator] loading model
Traceback (most recent call last):
  File "/x/hub.py", line 4, in cached_file
    raise HFValidationError("Repo id must be in the form 'repo_name'")
huggingface_hub.errors.HFValidationError: Repo id must be in the form 'repo_name': ''.

The above exception was the direct cause of the following exception:

Traceback (most recent call last):
  File "/x/cli.py", line 9, in main
    model = load(path)
OSError: Incorrect path_or_model_id: ''. Please provide either the path to a local folder
or the repo_id of a model on the Hub.
"""


def test_first_error_is_the_exception_that_ended_the_process():
    assert first_error(CHAINED) == (
        "OSError: Incorrect path_or_model_id: ''. Please provide either the path to a local folder\n"
        "or the repo_id of a model on the Hub."
    )


def test_first_error_falls_back_to_an_error_log_line_or_none():
    logged = "10:00:01 [INFO] [worker-0] start\n10:00:02 [ERROR] [worker-0] cannot reach the orchestrator\n"
    assert first_error(logged) == "10:00:02 [ERROR] [worker-0] cannot reach the orchestrator"
    assert first_error("10:00:01 [INFO] [worker-0] start\n") is None
    assert first_error("") is None


def test_first_error_stops_at_the_next_log_line():
    text = "Traceback (most recent call last):\n  File \"a\", line 1\nValueError: bad\n10:00:03 [INFO] [x] stopping\n"
    assert first_error(text) == "ValueError: bad"


def test_trainer_with_a_wrong_url_says_so_in_one_line(tmp_path: Path):
    """Before: the trainer loaded its model, then logged a warning per retry for ever. Now it asks the
    orchestrator first, like the worker and the validator, and stops with one error line."""
    port = _closed_port()
    (tmp_path / "never-loaded").mkdir()
    command = [sys.executable, "-m", "prime_rl.cli", "trainer", "--run_dir", str(tmp_path),
               "--model.path", str(tmp_path / "never-loaded"),
               "--orchestrator.public_url", f"http://127.0.0.1:{port}",
               "--orchestrator.connect_timeout_s", "2"]  # fmt: skip
    done = subprocess.run(command, capture_output=True, text=True, timeout=180)
    assert done.returncode == 1, done.stderr[-2000:]
    assert "Traceback" not in done.stderr
    (error,) = [line for line in done.stderr.splitlines() if "[ERROR]" in line]
    assert f"cannot reach the orchestrator at http://127.0.0.1:{port} after 2 s" in error
