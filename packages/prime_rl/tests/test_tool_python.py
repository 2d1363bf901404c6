"""One Python tool interpreter per run (issue 46, item 2).

The Python tool runs each machine's own interpreter, and the packages accept any Python >= 3.11;
tracebacks (and library behaviour) differ between minor versions, so an honest worker on 3.12 got
``tool_output_mismatch`` from a validator on 3.11. The run now pins one version: the orchestrator
states it in ``GET /status`` (``tool_python``), and a worker or validator whose tool runs another
refuses to start (exit code 2) with a message that says which to use.

This machine has a second interpreter (pyenv 3.12) for the first test; as root without a working
bubblewrap the sandbox itself always starts the system python3 (3.11 here,
``verifiers.code.privileges.fallback_python``), so a 3.12 tool run is played outside the sandbox
and the refusals are tested with the pinned version set to the one this machine does not run.
"""

from __future__ import annotations

import glob
import os
import shutil
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from prime_rl.api.client import OrchestratorClient
from prime_rl.config import RunConfig
from prime_rl.orchestrator.server import OrchestratorServer
from verifiers.envs import ToolPythonMismatch, tool_python, tool_python_problem
from verifiers.envs.tools import _SCRIPT, TOOL_ENVIRONMENT

from .conftest import make_config, task_set


def interpreter(minor: int) -> str | None:
    """A working python3.<minor> on this machine (pyenv's builds first: its shims may not run), or None."""
    candidates = sorted(glob.glob(os.path.expanduser(f"~/.pyenv/versions/3.{minor}.*/bin/python3.{minor}")))
    candidates += [found] if (found := shutil.which(f"python3.{minor}")) else []
    for candidate in candidates:
        probe = subprocess.run([candidate, "-c", "import sys; print(sys.version_info[1])"], capture_output=True, text=True)
        if probe.returncode == 0 and probe.stdout.strip() == str(minor):
            return candidate
    return None


def run_tool_program(python: str, code: str) -> str:
    """The Python tool's program (``verifiers.envs.tools``: random seeded, run as ``<code>``) under ``python``."""
    done = subprocess.run(
        [python, "-s", "-S", "-c", _SCRIPT.format(code=code)], env=TOOL_ENVIRONMENT, capture_output=True, text=True,
        timeout=60,
    )  # fmt: skip
    return done.stdout + done.stderr


@pytest.mark.skipif(interpreter(11) is None or interpreter(12) is None, reason="needs python3.11 and python3.12")
def test_the_same_tool_call_prints_differently_on_311_and_312():
    """Why a run pins the interpreter: an honest tool output on 3.12 is not 3.11's, and no
    normalisation of tracebacks makes behaviour equal (a function new in 3.12 raises on 3.11)."""
    py311, py312 = interpreter(11), interpreter(12)
    assert py311 is not None and py312 is not None
    unimported = "print(sys.maxsize > 0)"
    assert run_tool_program(py311, unimported) != run_tool_program(py312, unimported)
    assert "Did you forget to import 'sys'" in run_tool_program(py312, unimported)
    batched = "import itertools\nprint(list(itertools.batched('abcd', 2)))"
    assert run_tool_program(py312, batched).strip() == "[('a', 'b'), ('c', 'd')]"
    assert "AttributeError" in run_tool_program(py311, batched)


def test_tool_python_is_the_sandbox_interpreters_version():
    from verifiers.code.privileges import fallback_python
    from verifiers.code.sandbox import bwrap_available

    own = tool_python()
    expected = sys.executable if (bwrap_available() or os.getuid() != 0) else fallback_python().path
    assert expected is not None
    version = subprocess.run([expected, "-c", "import sys; print('%d.%d' % sys.version_info[:2])"], capture_output=True, text=True)
    assert own == version.stdout.strip()


def test_a_machine_on_another_tool_interpreter_is_told_which_to_use():
    own = tool_python()
    other = "3.12" if own != "3.12" else "3.13"
    assert tool_python_problem(None) is None and tool_python_problem("") is None
    assert tool_python_problem(own) is None
    why = tool_python_problem(other)
    assert why is not None and f"pins the Python tool interpreter to {other}" in why and f"runs {own}" in why


def status_of(tmp_path, *overrides: str):
    with (
        OrchestratorServer(make_config(tmp_path, *overrides), task_set()) as server,
        OrchestratorClient(server.url, retries=0) as client,
    ):
        return client.status()


def test_status_states_the_runs_tool_interpreter(tmp_path):
    assert status_of(tmp_path / "single").tool_python is None  # single-turn: no tools
    calculator = ("--tasks.environment.name", "calculator")
    assert status_of(tmp_path / "probed", *calculator).tool_python == tool_python()  # the orchestrator's own
    pinned = status_of(tmp_path / "pinned", *calculator, "--tasks.environment.tool_python", '"3.13"')
    assert pinned.tool_python == "3.13"
    with pytest.raises(ValueError, match="tool_python"):
        make_config(tmp_path, "--tasks.environment.tool_python", "python3")


def pinned_to_the_other_python(tmp_path: Path, tiny_lm_dir: Path, *overrides: str) -> tuple[str, RunConfig]:
    """(the version, a calculator run on the tiny model pinned to it): 3.12 unless this machine's tool
    runs 3.12, then 3.13; the orchestrator on a free loopback port, then ``overrides``."""
    other = "3.12" if tool_python() != "3.12" else "3.13"
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    config = make_config(
        tmp_path, "--orchestrator.port", str(port), "--model.path", str(tiny_lm_dir), "--tasks.environment.name",
        "calculator", "--tasks.environment.tool_python", f'"{other}"', *overrides,
    )  # fmt: skip
    return other, config


def test_a_worker_whose_tool_runs_another_interpreter_refuses_to_start(tmp_path, tiny_lm_dir, caplog):
    """A real worker process main against a real orchestrator pinned to another version: exit code 2,
    and the log says which interpreter to use (it never takes a lease)."""
    from prime_rl.worker.process import main

    other, config = pinned_to_the_other_python(tmp_path, tiny_lm_dir, "--workers.max_batches", "1")
    with OrchestratorServer(config, task_set()) as server:
        assert main(config, "worker-312") == 2
        with OrchestratorClient(server.url, retries=0, admin_token=server.admin_token) as client:
            assert client.pending().batches == []
    assert any(f"pins the Python tool interpreter to {other}" in r.getMessage() for r in caplog.records)
    assert issubclass(ToolPythonMismatch, RuntimeError)


def test_a_validator_whose_tool_runs_another_interpreter_refuses_to_judge(tmp_path, tiny_lm_dir, caplog):
    """Its replays would reject honest tool outputs: exit code 2 before judging anything."""
    from prime_rl.validator.process import main

    other, config = pinned_to_the_other_python(tmp_path, tiny_lm_dir, "--validator.max_batches", "1")
    with OrchestratorServer(config, task_set()):
        assert main(config) == 2
    assert any(f"pins the Python tool interpreter to {other}" in r.getMessage() for r in caplog.records)
