"""``run_role``: the one scaffold of the worker, validator and trainer mains (exit codes, SIGTERM, close)."""

from __future__ import annotations

import os
import signal
import socket
from pathlib import Path

import pytest

from prime_rl.config import load_config
from prime_rl.orchestrator.server import OrchestratorServer
from prime_rl.role import run_role
from prime_rl.tasks import load_tasks


class Role:
    """A role object that records what the scaffold did with it."""

    def __init__(self, events: list[str]) -> None:
        self.events = events

    def close(self) -> None:
        self.events.append("close")


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


@pytest.fixture(scope="module")
def config(tmp_path_factory: pytest.TempPathFactory):
    run_dir = tmp_path_factory.mktemp("role")
    config = load_config(None, ["--run_dir", str(run_dir), "--orchestrator.port", str(free_port())])
    with OrchestratorServer(config, load_tasks(config.tasks)):
        yield config


def run(config, loop, events: list[str], **kwargs) -> int:
    return run_role(
        "worker", "w", config, num_threads=1, start=lambda: Role(events), loop=loop,
        after=lambda finished: events.append(f"after finished={finished}"), **kwargs,
    )  # fmt: skip


def test_the_loop_code_then_close_then_after(config):
    events: list[str] = []
    assert run(config, lambda role: 3, events) == 3
    assert events == ["close", "after finished=True"]
    assert run(config, lambda role: None, []) == 0


def test_sigterm_stops_the_loop_and_still_closes(config):
    events: list[str] = []
    previous = signal.getsignal(signal.SIGTERM)

    def loop(role: Role) -> int:
        os.kill(os.getpid(), signal.SIGTERM)  # delivered here, in the main thread: SystemExit
        role.events.append("not reached")
        return 5

    assert run(config, loop, events) == 0
    assert events == ["close", "after finished=False"]
    assert signal.getsignal(signal.SIGTERM) is previous  # the handler is the caller's again


def test_refused_errors_exit_2_at_start_or_in_the_loop(config):
    def refuse(role: Role) -> int:
        raise PermissionError("wrong admin token")

    events: list[str] = []
    assert run(config, refuse, events, refuse=(PermissionError,)) == 2
    assert events == ["close", "after finished=False"]
    with pytest.raises(PermissionError):  # not refused: a bug propagates (after close)
        run(config, refuse, events)

    def cannot_start() -> Role:
        raise PermissionError("no secrets")

    assert run_role("validator", "v", config, num_threads=1, start=cannot_start, loop=lambda r: 0,
                    refuse=(PermissionError,)) == 2  # fmt: skip


def test_an_unreachable_orchestrator_exits_1_before_start(tmp_path: Path):
    config = load_config(
        None, ["--run_dir", str(tmp_path), "--orchestrator.port", str(free_port()), "--orchestrator.connect_timeout_s", "0.5"]
    )
    events: list[str] = []
    assert run(config, lambda role: 0, events) == 1
    assert events == ["after finished=False"]  # nothing was built, so nothing to close
