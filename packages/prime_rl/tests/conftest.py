"""Fixtures of prime_rl's control-plane tests: an in-process orchestrator on a free port."""

from __future__ import annotations

import base64
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from prime_rl.client import OrchestratorClient
from prime_rl.config import RunConfig, load_config
from prime_rl.orchestrator import OrchestratorServer
from prime_rl.protocol import RolloutBatch, RolloutSample, TaskLease
from prime_rl.tasks import TaskSet

PROMPTS = [f"Question: {a} + {b} =\nAnswer:" for a in range(10) for b in range(5)]


def make_config(tmp_path: Path, *overrides: str) -> RunConfig:
    """A small run config with its data in ``tmp_path`` and the orchestrator on a free port."""
    base = [
        "--run_dir", str(tmp_path),
        "--orchestrator.port", "0",
        "--orchestrator.prompts_per_batch", "2",
        "--orchestrator.async_level", "1",
        "--sampling.group_size", "2",
    ]  # fmt: skip
    return load_config(None, [*base, *overrides])


def task_set() -> TaskSet:
    return TaskSet([{"prompt": p, "task_type": "arithmetic"} for p in PROMPTS], "{prompt}")


def make_batch(
    lease: TaskLease, policy_version: int = 0, *, advantages: list[float] | None = None
) -> RolloutBatch:
    """A structurally valid batch answering ``lease`` (contents are not a real model's)."""
    samples = []
    k = 0
    for task in lease.tasks:
        for group_index, seed in enumerate(task.sampling_seeds):
            advantage = advantages[k] if advantages is not None else (1.0 if group_index == 0 else -1.0)
            k += 1
            samples.append(
                RolloutSample(
                    task_id=task.task_id,
                    group_index=group_index,
                    prompt_tokens=[1, 2, 3],
                    completion_tokens=[4, 5],
                    sampling_seed=seed,
                    temperature=lease.temperature,
                    reward=float(group_index == 0),
                    advantage=advantage,
                    proofs=base64.b64encode(b"\x00" * 258).decode(),
                    inference_logprobs=[-0.5, -0.25],
                )
            )
    return RolloutBatch(
        worker_id=lease.worker_id,
        step=lease.step,
        batch_index=lease.batch_index,
        policy_version=policy_version,
        samples=samples,
    )


@pytest.fixture
def server_factory(tmp_path: Path) -> Iterator[Any]:
    """``start(*overrides) -> OrchestratorServer``; every server started is stopped at the end."""
    servers: list[OrchestratorServer] = []

    def start(*overrides: str) -> OrchestratorServer:
        server = OrchestratorServer(make_config(tmp_path, *overrides), task_set()).start()
        servers.append(server)
        return server

    yield start
    for server in servers:
        server.stop()


@pytest.fixture
def server(server_factory: Any) -> OrchestratorServer:
    return server_factory()


@pytest.fixture
def client(server: OrchestratorServer) -> Iterator[OrchestratorClient]:
    with OrchestratorClient(server.url, timeout_s=10, retries=1, backoff_s=0.05) as http:
        yield http


@pytest.fixture
def batch_for() -> Any:
    """The ``make_batch(lease, policy_version=0, *, advantages=None)`` helper as a fixture."""
    return make_batch


@pytest.fixture
def config_for(tmp_path: Path) -> Any:
    """``config_for(*overrides) -> RunConfig`` rooted in this test's tmp_path."""
    return lambda *overrides: make_config(tmp_path, *overrides)
