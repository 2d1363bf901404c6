"""The prime_rl README's environment config loads the verifiers README's "Write your own environment"
example as printed (docs must not drift from code): the TOML block, parsed with this config, names
the example saved as ``units_env.py`` in the directory the run starts in."""

from __future__ import annotations

import re
import tomllib
from pathlib import Path

from prime_rl.config import load_config
from prime_rl.episodes import load_episode_env
from prime_rl.tasks import TaskSet
from verifiers import Task

ROOT = Path(__file__).resolve().parents[3]


def test_the_readme_environment_config_loads_the_verifiers_example(tmp_path, monkeypatch, tiny_tokenizer):
    verifiers_readme = (ROOT / "packages" / "verifiers" / "README.md").read_text()
    example = re.search(r"<!-- env-example[^>]*-->\n```python\n(.*?)```", verifiers_readme, re.S).group(1)
    prime_readme = (ROOT / "packages" / "prime_rl" / "README.md").read_text()
    block = re.search(r"<!-- env-config[^>]*-->\n```toml\n(.*?)```", prime_readme, re.S).group(1)
    section = tomllib.loads(block)["tasks"]["environment"]
    (tmp_path / "units_env.py").write_text(example)
    monkeypatch.chdir(tmp_path)
    table = ", ".join(f"{key} = {value}" for key, value in section["args"].items())
    config = load_config(
        None,
        ["--tasks.environment.name", section["name"], "--tasks.environment.args", f"{{{table}}}",
         "--tasks.environment.turn_template", section["turn_template"]],
    )  # fmt: skip
    tasks = TaskSet([Task("How many metres are 3 miles?", "verifiable_math", {"ground_truth": "4828.032"})])
    env = load_episode_env(config, tasks, tiny_tokenizer)  # every role's loading: checked, replayable
    assert type(env.env).__name__ == "UnitConverterEnv" and env.max_turns == 4 and env.replayable
    call = '<tool_call>{"name": "convert", "arguments": {"value": 2, "from": "km", "to": "m"}}</tool_call>'
    step = env.step(0, env.start(0), call)
    assert step.messages[-1].content == "2000.0 m" and not step.done
