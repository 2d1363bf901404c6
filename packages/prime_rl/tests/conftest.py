"""Fixtures of prime_rl's control-plane tests: an in-process orchestrator on a free port."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from stepped_clock import SteppedClock  # tests/support
from synthetic_batches import synthetic_batch  # tests/support

from prime_rl.api.client import OrchestratorClient
from prime_rl.api.protocol import RolloutBatch, TaskLease, TrainSample
from prime_rl.config import RunConfig, load_config
from prime_rl.launch.groups import stop_groups
from prime_rl.orchestrator.server import OrchestratorServer
from prime_rl.tasks import TaskSet

PROMPTS = [f"Question: {a} + {b} =\nAnswer:" for a in range(10) for b in range(5)]


INFLIGHT = (
    "--orchestrator.max_versions_per_sample", "2", "--orchestrator.switch_deadline_s", "3600",
    "--orchestrator.max_decode_tokens_per_s", "1e9",
)  # fmt: skip
"""In-flight switches on, as the config allows them only: with the mandatory switch and a speed cap
(here so wide that neither binds unless a test overrides it after these)."""


def make_config(tmp_path: Path, *overrides: str) -> RunConfig:
    """A small run config with its data in ``tmp_path`` and the orchestrator on a free port."""
    base = [
        "--run_dir", str(tmp_path),
        "--orchestrator.port", "0",
        "--orchestrator.prompts_per_batch", "2",
        "--orchestrator.async_level", "1",
        "--sampling.group_size", "2",
        "--orchestrator.release_after_tokens", "0",  # claimable once accepted (test_orchestrator_release)
        "--orchestrator.workers_view_max_age_s", "0",  # tests read GET /workers right after acting
        # These unit tests drive one rule at a time, with trainers driven by hand and exact lease counts;
        # the judgeable budget (on by default) is tested alone in test_lease_judgeable.py and runs in
        # the end-to-end and red-team runs, which use the default config.
        "--orchestrator.lease_judgeable", "false",
    ]  # fmt: skip
    return load_config(None, [*base, *overrides])


def task_set() -> TaskSet:
    return TaskSet([{"prompt": p, "task_type": "arithmetic"} for p in PROMPTS], "{prompt}")


def make_batch(
    lease: TaskLease, policy_version: int = 0, *, advantages: list[float] | None = None
) -> RolloutBatch:
    """A structurally valid batch answering ``lease`` (contents are not a real model's)."""
    return synthetic_batch(lease, policy_version, advantages=advantages, logprobs=[-0.5, -0.25])


def each_stopped(make: Callable[..., Any], stop: Callable[[Any], None]) -> Iterator[Callable[..., Any]]:
    """A factory fixture's body: yields ``make``, remembering all it makes, then ``stop``s each of them
    (``yield from each_stopped(...)``)."""
    made: list[Any] = []

    def tracked(*args: Any) -> Any:
        made.append(item := make(*args))
        return item

    yield tracked
    for item in made:
        stop(item)


@pytest.fixture
def server_factory(tmp_path: Path) -> Iterator[Any]:
    """``start(*overrides) -> OrchestratorServer``; every server started is stopped at the end."""
    yield from each_stopped(
        lambda *overrides: OrchestratorServer(make_config(tmp_path, *overrides), task_set()).start(),
        OrchestratorServer.stop,
    )


@pytest.fixture
def clocked_server_for(tmp_path: Path) -> Iterator[Any]:
    """``start(*overrides) -> (OrchestratorServer, SteppedClock)``: the server runs on a clock the test
    moves by hand (``clock.now += seconds``); every server started is stopped at the end."""

    def start(*overrides: str) -> tuple[OrchestratorServer, SteppedClock]:
        clock = SteppedClock()
        return OrchestratorServer(make_config(tmp_path, *overrides), task_set(), clock=clock).start(), clock

    yield from each_stopped(start, lambda made: made[0].stop())


@pytest.fixture
def server(server_factory: Any) -> OrchestratorServer:
    return server_factory()


@pytest.fixture
def client(server: OrchestratorServer) -> Iterator[OrchestratorClient]:
    with OrchestratorClient(
        server.url, timeout_s=10, retries=1, backoff_s=0.05, admin_token=server.admin_token
    ) as http:
        yield http


@pytest.fixture
def batch_for() -> Any:
    """The ``make_batch(lease, policy_version=0, *, advantages=None)`` helper as a fixture."""
    return make_batch


@pytest.fixture
def config_for(tmp_path: Path) -> Any:
    """``config_for(*overrides) -> RunConfig`` rooted in this test's tmp_path."""
    return lambda *overrides: make_config(tmp_path, *overrides)


# ---------------------------------------------------------------- real-process harness (e2e, failures)


def free_ports(count: int) -> list[int]:
    """``count`` distinct free TCP ports on 127.0.0.1 (bound then released)."""
    import socket

    sockets, ports = [], []
    for _ in range(count):
        sock = socket.socket()
        sock.bind(("127.0.0.1", 0))
        sockets.append(sock)
        ports.append(sock.getsockname()[1])
    for sock in sockets:
        sock.close()
    return ports


def _toml_value(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, str):
        return json.dumps(value)  # a JSON string is a valid TOML basic string
    if isinstance(value, list):
        return "[" + ", ".join(_toml_value(v) for v in value) + "]"
    if isinstance(value, dict):  # a sub-section such as [tasks.environment], as an inline table
        return "{" + ", ".join(f"{k} = {_toml_value(v)}" for k, v in value.items()) + "}"
    return repr(value)


def write_toml(path: Path, sections: dict[str, Any]) -> Path:
    lines = [
        f"{key} = {_toml_value(value)}" for key, value in sections.items() if not isinstance(value, dict)
    ]
    for name, section in sections.items():
        if isinstance(section, dict):
            lines.append(f"\n[{name}]")
            lines += [f"{key} = {_toml_value(value)}" for key, value in section.items()]
    path.write_text("\n".join(lines) + "\n")
    return path


class ProcessHarness:
    """Start ``prime-rl`` role processes of one run and always clean them up."""

    def __init__(self, root: Path, config_path: Path) -> None:
        self.root = root
        self.config_path = config_path
        self.processes: dict[str, subprocess.Popen[bytes]] = {}
        (root / "out").mkdir(exist_ok=True)

    def start(self, role: str, name: str, *extra: str) -> subprocess.Popen[bytes]:
        output = open(self.root / "out" / f"{name}.out", "ab")  # noqa: SIM115 - owned by the child
        env = dict(
            os.environ, PYTHONUNBUFFERED="1", OMP_WAIT_POLICY="PASSIVE", TOKENIZERS_PARALLELISM="false"
        )
        argv = [
            sys.executable,
            "-m",
            "prime_rl.cli",
            role,
            "--name",
            name,
            "--config",
            str(self.config_path),
            *extra,
        ]
        process = subprocess.Popen(
            argv, stdout=output, stderr=subprocess.STDOUT, env=env, start_new_session=True
        )
        output.close()
        self.processes[name] = process
        return process

    def kill(self, name: str, sig: int = signal.SIGKILL, wait_s: float = 10.0) -> None:
        """Send ``sig`` to the process group of ``name`` and reap it (SIGKILL if it outlives ``wait_s``)."""
        process = self.processes[name]
        if process.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(process.pid, sig)
            try:
                process.wait(wait_s)
            except subprocess.TimeoutExpired:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(process.pid, signal.SIGKILL)
                process.wait(30)

    def output(self, name: str) -> str:
        return (self.root / "out" / f"{name}.out").read_text(errors="replace")

    def stop_all(self) -> None:
        """SIGTERM every live process at once, then reap them all (SIGKILL whatever outlives 10 s)."""
        stop_groups(self.processes.values(), 10.0, reap_s=30.0)


def wait_for(predicate: Any, timeout_s: float, what: str, poll_s: float = 0.25) -> Any:
    """Poll ``predicate()`` until truthy (returned) or fail the test after ``timeout_s``."""
    deadline = time.monotonic() + timeout_s
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            pytest.fail(f"timed out after {timeout_s:.0f} s waiting for {what}")
        time.sleep(poll_s)


def start_run(config_path: Path, cwd: Path | None = None) -> subprocess.Popen[str]:
    """``prime-rl run --config FILE`` as a child process (quiet threads), its output (stderr too) piped as text."""
    env = dict(os.environ, OMP_WAIT_POLICY="PASSIVE", TOKENIZERS_PARALLELISM="false")
    return subprocess.Popen(
        [sys.executable, "-m", "prime_rl.cli", "run", "--config", str(config_path)],
        cwd=cwd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env,
    )  # fmt: skip


def interrupt_run(run: subprocess.Popen[str], timeout_s: float = 90.0) -> str:
    """Ctrl-C a run that is still going (the supervisor stops its children), killed if it has not
    exited ``timeout_s`` later; the run's whole output."""
    if run.poll() is None:
        run.send_signal(signal.SIGINT)
    try:
        output, _ = run.communicate(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        run.kill()
        output, _ = run.communicate()
    return output


def run_until(run: subprocess.Popen[str], done: Any, timeout_s: float, what: str) -> str:
    """Wait until ``done()`` or the run exits (the test fails after ``timeout_s``), then interrupt
    the run, whatever happened; its output."""
    try:
        wait_for(lambda: run.poll() is not None or done(), timeout_s, what)
    finally:
        output = interrupt_run(run)
    return output


def metrics_of(run_dir: Path, name: str) -> list[dict[str, Any]]:
    from prime_rl.metrics import read_metrics

    path = run_dir / "metrics" / f"{name}.jsonl"
    return list(read_metrics(path)) if path.exists() else []


@pytest.fixture
def tiny_run(tmp_path: Path) -> Any:
    """``make(**section_overrides) -> (config_path, run_dir)``: a tiny-model run config with free ports."""
    sys.path.insert(0, str(Path(__file__).resolve().parents[3] / "tests" / "support"))
    from tiny_lm import save_tiny_lm

    model_dir = save_tiny_lm(tmp_path / "model")

    def make(**sections: dict[str, Any]) -> tuple[Path, Path]:
        orchestrator_port, origin_port, relay_port = free_ports(3)
        run_dir = tmp_path / "run"
        config: dict[str, Any] = {
            "run_dir": str(run_dir),
            "model": {"path": str(model_dir), "dtype": "float32"},
            "tasks": {"num_tasks": 64, "digits": 1, "seed": 0},
            "sampling": {"group_size": 4, "temperature": 1.0, "max_new_tokens": 4},
            "orchestrator": {
                "port": orchestrator_port,
                "async_level": 1,
                "prompts_per_batch": 2,
                "task_timeout_s": 60.0,
                "release_after_tokens": 16,  # a batch (8 samples of <= 4 tokens) waits for about its worker's next
            },
            "shardcast": {"origin_port": origin_port, "relay_ports": [relay_port], "keep_versions": 5},
            "trainer": {"total_steps": 3, "samples_per_step": 16, "filter_zero_advantage": False},
            "workers": {"count": 2, "hostile": []},
            "evaluator": {"enabled": False},
        }
        for name, values in sections.items():
            config[name] = {**config.get(name, {}), **values}
        return write_toml(tmp_path / "run.toml", config), run_dir

    return make


@pytest.fixture
def harness_for(tmp_path: Path) -> Iterator[Any]:
    """``harness_for(config_path) -> ProcessHarness``; every process is stopped at teardown."""
    yield from each_stopped(lambda config_path: ProcessHarness(tmp_path, config_path), ProcessHarness.stop_all)


@pytest.fixture
def helpers() -> Any:
    """The module-level helpers above (importlib mode cannot import conftest from test modules)."""
    import types

    return types.SimpleNamespace(
        wait_for=wait_for, metrics_of=metrics_of, free_ports=free_ports, write_toml=write_toml,
        start_run=start_run, interrupt_run=interrupt_run, run_until=run_until,
    )  # fmt: skip


def _random_samples(count: int, group_size: int = 4, seed: int = 0) -> list[TrainSample]:
    import torch  # here: the control-plane tests never need it

    g = torch.Generator().manual_seed(seed)
    out = []
    for i in range(count):
        prompt = torch.randint(3, 100, (int(torch.randint(2, 9, (1,), generator=g)),), generator=g).tolist()
        completion = torch.randint(
            3, 100, (int(torch.randint(1, 7, (1,), generator=g)),), generator=g
        ).tolist()
        out.append(
            TrainSample(
                sample_id=f"b/{i}", batch_id="b", worker_id="w", task_id=i // group_size,
                group_index=i % group_size, policy_version=0, prompt_tokens=prompt, completion_tokens=completion,
                behaviour_logprobs=[-1.0] * len(completion), temperature=1.0, reward=float(i % 2),
                advantage=float((-1) ** i) * (1 + i / 10),
            )
        )  # fmt: skip
    return out


@pytest.fixture
def random_samples() -> Any:
    """``make(count, group_size=4, seed=0) -> list[TrainSample]``: short random prompts and completions."""
    return _random_samples
