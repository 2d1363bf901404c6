"""Docs that run (issue 48 item 6): the verifiers README's "Write your own environment" examples, a
single-turn environment with its own rubric (``reverse_env.py``) and a multi-turn tool environment
(``units_env.py``), saved as printed, loaded by the prime_rl README's TOML blocks as printed, and
trained on in real ``prime-rl run`` s started in the directory that holds them (tiny model): a step
commits and the validator accepts every sample.
"""

from __future__ import annotations

import re
import tomllib
from pathlib import Path
from typing import Any

import pytest

from prime_rl.config import load_config
from prime_rl.episodes import load_episode_env
from prime_rl.orchestrator.store import RolloutStore
from prime_rl.tasks import TaskSet
from verifiers import Task

ROOT = Path(__file__).resolve().parents[3]
VERIFIERS_README = (ROOT / "packages" / "verifiers" / "README.md").read_text()
PRIME_README = (ROOT / "packages" / "prime_rl" / "README.md").read_text()


def _block(readme: str, marker: str, language: str) -> str:
    found = re.search(rf"<!-- {marker}[:\s][^>]*-->\n```{language}\n(.*?)```", readme, re.S)
    assert found, f"no {marker} block"
    return found.group(1)


EXAMPLES = {  # file the README saves it as -> (its code, the prime_rl README's [tasks.environment])
    "units_env.py": (_block(VERIFIERS_README, "env-example", "python"), _block(PRIME_README, "env-config", "toml")),
    "reverse_env.py": (
        _block(VERIFIERS_README, "single-turn-example", "python"),
        _block(PRIME_README, "env-config-single", "toml"),
    ),
}


def _overrides(section: dict[str, Any]) -> list[str]:
    overrides = ["--tasks.environment.name", section["name"]]
    if "args" in section:
        table = ", ".join(f"{key} = {value}" for key, value in section["args"].items())
        overrides += ["--tasks.environment.args", f"{{{table}}}"]
    if "turn_template" in section:
        overrides += ["--tasks.environment.turn_template", section["turn_template"]]
    return overrides


def test_the_readme_environment_config_loads_the_verifiers_example(tmp_path, monkeypatch, tiny_tokenizer):
    code, block = EXAMPLES["units_env.py"]
    section = tomllib.loads(block)["tasks"]["environment"]
    (tmp_path / "units_env.py").write_text(code)
    monkeypatch.chdir(tmp_path)
    config = load_config(None, _overrides(section))
    tasks = TaskSet([Task("How many metres are 3 miles?", "verifiable_math", {"ground_truth": "4828.032"})])
    env = load_episode_env(config, tasks, tiny_tokenizer)  # every role's loading: checked, replayable
    assert type(env.env).__name__ == "UnitConverterEnv" and env.max_turns == 4 and env.replayable
    call = '<tool_call>{"name": "convert", "arguments": {"value": 2, "from": "km", "to": "m"}}</tool_call>'
    step = env.step(0, env.start(0), call)
    assert step.messages[-1].content == "2000.0 m" and not step.done


def test_the_single_turn_example_scores_with_its_own_rubric(tmp_path, monkeypatch, tiny_tokenizer):
    code, block = EXAMPLES["reverse_env.py"]
    (tmp_path / "reverse_env.py").write_text(code)
    monkeypatch.chdir(tmp_path)
    config = load_config(None, _overrides(tomllib.loads(block)["tasks"]["environment"]))
    env = load_episode_env(config, TaskSet([Task("Reverse: stressed", "reverse", {})]), tiny_tokenizer)
    assert env is not None and env.max_turns == 1 and env.replayable
    assert env.score(0, env.step(0, env.start(0), " desserts ", final=True).messages) == 1.0
    assert env.score(0, env.step(0, env.start(0), "stressed", final=True).messages) == 0.0


@pytest.mark.slow
@pytest.mark.parametrize("filename", sorted(EXAMPLES))
def test_the_readme_examples_train_in_a_real_run(filename: str, tiny_run: Any, helpers: Any, tmp_path: Path) -> None:
    code, block = EXAMPLES[filename]
    section = tomllib.loads(block)["tasks"]["environment"]
    workdir = tmp_path / "author"
    workdir.mkdir()
    (workdir / filename).write_text(code)  # the relative name in the README resolves from here
    config_path, run_dir = tiny_run(
        tasks={"environment": section},
        trainer={"total_steps": 1, "samples_per_step": 8},
        workers={"count": 1, "hostile": []},
    )
    run = helpers.start_run(config_path, cwd=workdir)

    def trained() -> bool:
        return any(e["event"] == "commit" for e in helpers.metrics_of(run_dir, "orchestrator"))

    output = helpers.run_until(run, trained, 300, f"a step trained on {filename}")
    assert trained(), output[-3000:]
    store = RolloutStore(run_dir / "orchestrator")
    verdicts = [v for judged in store.all_verdicts().values() for v in judged if v.reason != "expired"]
    assert verdicts and all(v.accepted for v in verdicts), {(v.reason, v.detail) for v in verdicts if not v.accepted}
    rollouts = [e for e in helpers.metrics_of(run_dir, "worker-0") if e["event"] == "rollouts"]
    assert rollouts and all(e["model_turns"] >= e["samples"] for e in rollouts)
