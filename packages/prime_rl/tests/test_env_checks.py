"""Issue 48 item 1: an environment author's mistake is refused before any compute, in one message
that names the file, the attribute and the rule; ``prime-rl run`` shows it and stops (exit code 2),
it does not restart a role that refused its configuration.

The environments below are the mistakes an author makes in the first hour: a tool environment that
does not declare ``replayable``, a single-turn one that declares it False, a reward annotated to
return a string, a reward that takes the wrong arguments, a tool that takes none, a rubric set on the
wrong attribute.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from prime_rl import cli
from prime_rl.config import ComponentError, load_config
from prime_rl.episodes import load_environment
from prime_rl.launch.supervisor import ChildSpec, Supervisor, first_error
from verifiers import Task
from verifiers.envs import Environment, Message, RewardFunc, Rubric, SingleTurnEnv, ToolEnv

HERE = __file__


def lookup(arguments: dict) -> str:
    return {"cat": "a small animal"}.get(str(arguments.get("word")), "not found")


class LookupEnv(ToolEnv):
    """A dictionary-lookup tool environment that forgot ``replayable = True``."""

    def __init__(self, max_turns: int = 3):
        super().__init__({"lookup": lookup}, max_turns=max_turns)


class ReplayableLookupEnv(LookupEnv):
    replayable = True


def reversed_exactly(task: Task, messages: tuple[Message, ...]) -> float:
    return float(messages[-1].content.strip() == task.prompt[::-1])


def as_text(task: Task, messages: tuple[Message, ...]) -> str:
    return "1.0"


def no_arguments() -> float:
    return 1.0


class UnreplayableSingleTurn(SingleTurnEnv):
    replayable = False


class TextReward(SingleTurnEnv):
    def __init__(self) -> None:
        super().__init__(Rubric((RewardFunc("as_text", as_text),)))  # type: ignore[arg-type]


class WrongArity(SingleTurnEnv):
    def __init__(self) -> None:
        super().__init__(Rubric((RewardFunc("no_arguments", no_arguments),)))  # type: ignore[arg-type]


class NoArgumentTool(ReplayableLookupEnv):
    def __init__(self) -> None:
        super().__init__()
        self.tools = {"lookup": no_arguments}


class RubricOnTheWrongAttribute(Environment):
    replayable = True

    def __init__(self) -> None:
        self.rubrics = Rubric((RewardFunc("reversed", reversed_exactly),))


def _section(name: str) -> Any:
    return load_config(None, ["--tasks.environment.name", f"{HERE}:{name}"]).tasks.environment


@pytest.mark.parametrize(
    ("name", "attribute", "rule"),
    [
        ("LookupEnv", "replayable", "every environment of a run must be replayable"),
        ("UnreplayableSingleTurn", "replayable", "every environment of a run must be replayable"),
        ("TextReward", "rubric function 'as_text'", "is annotated to return str; a reward must return a finite real"),
        ("WrongArity", "rubric function 'no_arguments'", "must be callable as fn(task, messages); its signature is ()"),
        ("NoArgumentTool", "tools['lookup']", "must be callable as tool(arguments) -> str (one dict)"),
        ("RubricOnTheWrongAttribute", "rubric", "must be a verifiers.envs.Rubric, got NoneType"),
    ],
)
def test_each_mistake_is_one_message_naming_the_file_the_attribute_and_the_rule(name: str, attribute: str, rule: str) -> None:
    with pytest.raises(ComponentError) as refused:
        load_environment(_section(name))
    message = str(refused.value)
    assert message.startswith(f"tasks.environment.name = '{HERE}:{name}': {HERE}:{name}: {attribute}"), message
    assert rule in message and "\n" not in message


def test_a_replayable_environment_passes_every_check() -> None:
    assert type(load_environment(_section("ReplayableLookupEnv"))).__name__ == "ReplayableLookupEnv"
    for builtin in ("python_tool", "calculator"):
        assert load_environment(load_config(None, ["--tasks.environment.name", builtin]).tasks.environment)


@pytest.mark.parametrize("role", ["worker", "validator", "calibrate-noise"])
def test_every_role_refuses_it_before_loading_a_model(role: str, tmp_path: Path, capsys: Any) -> None:
    # a model path that does not exist: reaching the model load would report that instead
    argv = [role, "--run_dir", str(tmp_path / "run"), "--model.path", str(tmp_path / "no-model"),
            "--tasks.environment.name", f"{HERE}:LookupEnv"]  # fmt: skip
    assert cli.main(argv) == 2
    error = capsys.readouterr().err
    assert f"prime-rl {role}: tasks.environment.name = '{HERE}:LookupEnv': {HERE}:LookupEnv: replayable:" in error
    assert "no-model" not in error and not (tmp_path / "run").exists()  # nothing ran: no logs, no metrics


def test_a_tool_environment_without_replayable_stops_prime_rl_run_in_seconds(tiny_run: Any) -> None:
    config_path, run_dir = tiny_run(tasks={"environment": {"name": f"{HERE}:LookupEnv"}})
    env = dict(os.environ, OMP_WAIT_POLICY="PASSIVE", TOKENIZERS_PARALLELISM="false")
    started = time.monotonic()
    run = subprocess.run(
        [sys.executable, "-m", "prime_rl.cli", "run", "--config", str(config_path)],
        capture_output=True, text=True, env=env, timeout=120,
    )  # fmt: skip
    seconds = time.monotonic() - started
    output = run.stdout + run.stderr
    assert run.returncode == 2, output[-3000:]
    assert seconds < 10, f"refused after {seconds:.1f} s"
    assert f"{HERE}:LookupEnv: replayable: is False, but every environment of a run must be replayable" in output
    assert "it printed no error" not in output and "restarting" not in output
    # no compute: no child started, so no calibration, no model load, no lease
    assert not (run_dir / "metrics").exists() and not (run_dir / "logs").exists(), sorted(run_dir.rglob("*"))


class RefusingValidator(Supervisor):
    """A real orchestrator; a validator that refuses its configuration as ``prime-rl validator`` does
    (the CLI's one line on stderr, exit code 2); every other role sleeps until it is stopped."""

    def _argv(self, spec: ChildSpec) -> list[str]:
        if spec.role == "orchestrator":
            return super()._argv(spec)
        if spec.role == "validator":
            line = "prime-rl validator: tasks.environment.name = 'env.py:Clock': env.py:Clock: replayable: is False"
            return [sys.executable, "-c", f"import sys, time; time.sleep(1); print({line!r}, file=sys.stderr); sys.exit(2)"]
        return [sys.executable, "-c", "import time; time.sleep(120)"]


def test_the_supervisor_shows_a_configuration_error_and_stops_instead_of_restarting(tmp_path: Path) -> None:
    from stand_in_runs import (
        run_stand_in,  # tests/support (here: child processes import this file as an environment)
    )

    code, events = run_stand_in(RefusingValidator, tmp_path, backoff_s=0.1)
    assert code == 2
    assert not [e for e in events if e["event"] in ("child_restarted", "child_died")]
    (failed,) = [e for e in events if e["event"] == "failed"]
    assert failed["child"] == "validator" and failed["config_error"] is True
    assert failed["error"].endswith("env.py:Clock: replayable: is False")


def test_first_error_reads_the_cli_configuration_line() -> None:
    output = "2026-01-01 [INFO] loading\nprime-rl worker: components.reward = 'x:y': module 'x' not found\n"
    assert first_error(output) == "prime-rl worker: components.reward = 'x:y': module 'x' not found"


ENV_FILE = '''from verifiers.envs import SingleTurnEnv


class Echo(SingleTurnEnv):
    """{note}"""
'''


def _free_port() -> int:
    from prime_rl.launch.local import free_port

    return free_port()


def test_a_worker_with_another_copy_of_the_environment_is_refused_before_loading_a_model(tmp_path: Path) -> None:
    from prime_rl.config.environment import environment_digest
    from prime_rl.orchestrator.server import OrchestratorServer
    from prime_rl.tasks import load_tasks
    from prime_rl.validator.process import Validator
    from prime_rl.worker.process import Worker

    for copy, note in (("run", "the run's copy"), ("same", "the run's copy"), ("old", "an older copy")):
        (tmp_path / copy).mkdir()
        (tmp_path / copy / "echo_env.py").write_text(ENV_FILE.format(note=note))
    port = _free_port()

    def config(copy: str, model: str = "") -> Any:
        return load_config(None, [
            "--run_dir", str(tmp_path / "runs"), "--orchestrator.port", str(port), "--tasks.num_tasks", "4",
            "--tasks.environment.name", f"{tmp_path / copy / 'echo_env.py'}:Echo",
            "--model.path", model or str(tmp_path / "no-model"),
        ])  # fmt: skip

    digests = {copy: environment_digest(config(copy).tasks.environment) for copy in ("run", "same", "old")}
    assert digests["run"] == digests["same"] != digests["old"] and len(digests["run"]) == 16  # content, not path
    missing = load_config(None, ["--tasks.environment.name", f"{tmp_path / 'nowhere.py'}:Echo"]).tasks.environment
    assert environment_digest(missing) == ""  # not known here: nothing to compare
    run = config("run")
    with OrchestratorServer(run, load_tasks(run.tasks)) as server:
        assert _published_environment(server.url) == digests["run"]
        with pytest.raises(ComponentError) as refused:
            Worker(config("old"), "worker-0")  # the model path does not exist: reaching it would say so
        with pytest.raises(OSError):  # the same copy passes the check and goes on to load the model
            Worker(config("same"), "worker-0")
        with pytest.raises(ComponentError, match="this validator's environment"):  # the validator checks it too
            Validator(config("old"))
    message = str(refused.value)
    assert message.startswith(f"tasks.environment.name = '{tmp_path / 'old' / 'echo_env.py'}:Echo': this worker's environment")
    assert f"(digest {digests['old']}, source {tmp_path / 'old' / 'echo_env.py'}) differs from the run's (digest {digests['run']}" in message


def _published_environment(url: str) -> str:
    from prime_rl.api.client import OrchestratorClient

    with OrchestratorClient(url) as client:
        return client.status().environment
