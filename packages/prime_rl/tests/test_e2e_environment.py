"""Issue 35 item 1: an environment defined here, outside the packages, loaded by import path
(``[tasks.environment] name = "<this file>:CountingEnv"`` with ``args``) in a real ``prime-rl run``:
orchestrator, shardcast, trainer, validator and one honest worker, each importing it by itself.

The environment answers every model turn but the last with a ``tool`` message that counts the
turn's characters (a pure function of the transcript, so replayable), and scores an episode by
whether the model's last turn is shorter than its first. The tiny random model makes every episode
``max_turns`` turns long; the validator re-derives every reply and must accept every episode.
"""

from __future__ import annotations

import json
import signal
from pathlib import Path
from typing import Any

import pytest

from prime_rl.config import ComponentError, load_config
from prime_rl.episodes import load_environment, load_episode_env
from prime_rl.orchestrator.store import RolloutStore
from prime_rl.tasks import TaskSet
from verifiers import Task
from verifiers.envs import Environment, EnvTurn, Message, RewardFunc, Rubric, last_assistant


def _shorter(task: Task, messages: tuple[Message, ...]) -> float:
    turns = [m.content for m in messages if m.role == "assistant"]
    return float(len(turns) > 1 and len(turns[-1]) < len(turns[0]))


class CountingEnv(Environment):
    """Replies "<label>: <n> characters" to each model turn; ``max_turns`` turns per episode."""

    replayable = True  # the reply is a function of the last model turn only

    def __init__(self, label: str = "count", max_turns: int = 2) -> None:
        self.label = label
        self.max_turns = max_turns
        self.rubric = Rubric((RewardFunc("shorter", _shorter, 1.0),))

    def respond(self, task: Task, messages: tuple[Message, ...]) -> EnvTurn:
        return EnvTurn((Message("tool", f"{self.label}: {len(last_assistant(messages))} characters"),), done=False)


class ClockEnv(CountingEnv):
    replayable = False  # as a tool that reads the clock must declare


def _config(name: str, args: dict[str, Any] | None = None):
    overrides = ["--tasks.environment.name", name]
    if args:
        table = ", ".join(f"{key} = {json.dumps(value)}" for key, value in args.items())
        overrides += ["--tasks.environment.args", f"{{{table}}}"]  # a TOML inline table
    return load_config(None, overrides)


def test_an_environment_loads_by_file_path_module_path_and_entry_point(tmp_path, monkeypatch):
    env = load_environment(_config(f"{__file__}:CountingEnv", {"label": "n", "max_turns": 3}).tasks.environment)
    assert type(env).__name__ == "CountingEnv" and (env.label, env.max_turns) == ("n", 3)
    # an installed package's entry point (a dist-info on sys.path, as pip would leave it)
    package = tmp_path / "site"
    (package / "counting_envs").mkdir(parents=True)
    (package / "counting_envs" / "__init__.py").write_text(f"from {__name__} import CountingEnv\n")
    info = package / "counting_envs-0.1.dist-info"
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: counting-envs\nVersion: 0.1\n")
    (info / "entry_points.txt").write_text("[verifiers.environments]\ncounting = counting_envs:CountingEnv\n")
    monkeypatch.syspath_prepend(str(package))
    monkeypatch.syspath_prepend(str(Path(__file__).parent))
    env = load_environment(_config("counting", {"label": "ep"}).tasks.environment)
    assert type(env).__name__ == "CountingEnv" and env.label == "ep"
    with pytest.raises(ComponentError, match=r"registered: .*counting"):
        load_environment(_config("not-installed").tasks.environment)
    with pytest.raises(ComponentError, match="does not take args"):
        load_environment(_config(f"{__file__}:CountingEnv", {"colour": "red"}).tasks.environment)
    with pytest.raises(ComponentError, match=r"not a verifiers\.envs\.Environment"):
        load_environment(_config(f"{__file__}:_shorter", {"task": 1, "messages": ()}).tasks.environment)
    with pytest.raises(ValueError, match="args is for your own environments"):
        _config("calculator", {"max_turns": 2})


def test_every_role_refuses_an_environment_that_is_not_replayable(tiny_tokenizer):
    tasks = TaskSet([Task("1+1=", "verifiable_math", {"ground_truth": "2"})])
    config = _config(f"{__file__}:ClockEnv")
    # workers and the validator load it the same way: none of its episodes could be accepted (issue 48)
    with pytest.raises(ComponentError, match="ClockEnv: replayable: is False, but every environment of a run"):
        load_episode_env(config, tasks, tiny_tokenizer)


@pytest.mark.slow
def test_a_run_trains_on_an_environment_loaded_by_import_path(tiny_run: Any, helpers: Any) -> None:
    config_path, run_dir = tiny_run(
        tasks={"environment": {"name": f"{__file__}:CountingEnv", "args": {"label": "chars", "max_turns": 2}}},
        trainer={"total_steps": 2, "samples_per_step": 8},
        workers={"count": 1, "hostile": []},
    )
    run = helpers.start_run(config_path)

    def trained() -> bool:
        return any(e["event"] == "commit" for e in helpers.metrics_of(run_dir, "orchestrator"))

    output = helpers.run_until(run, trained, 300, "a step trained on the episodes")
    assert run.returncode in (0, 128 + signal.SIGINT, -signal.SIGINT), output[-3000:]
    assert trained(), output[-3000:]

    rollouts = [e for e in helpers.metrics_of(run_dir, "worker-0") if e["event"] == "rollouts"]
    assert rollouts and all(e["model_turns"] == 2 * e["samples"] and e["env_turns"] == e["samples"] for e in rollouts)
    store = RolloutStore(run_dir / "orchestrator")
    verdicts = [v for judged in store.all_verdicts().values() for v in judged if v.reason != "expired"]
    assert verdicts and all(v.accepted for v in verdicts), {(v.reason, v.detail) for v in verdicts if not v.accepted}
    batches = {record.meta.batch_id for record in store.batch_records()}
    claimed = [s for claim in store.claims() for s in claim.sample_ids]
    assert claimed and {s.batch_id for s in claimed} <= batches
    judged = [e for e in helpers.metrics_of(run_dir, "validator") if e["event"] == "verdict"]
    # the environment's replays ran (after each batch's prefill), and the validator reports their time
    assert judged and all(e["batch_tool_seconds"] > 0 for e in judged if e["accepted"])
    assert judged[-1]["tool_seconds"] >= sum(e["batch_tool_seconds"] for e in judged) - 1e-3 * len(judged)
