"""Config loader: TOML + CLI overrides, unknown keys and wrong types are clear errors."""

from __future__ import annotations

from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st
from pydantic import BaseModel

from prime_rl.config import (
    ConfigError,
    OrchestratorConfig,
    RunConfig,
    Section,
    ShardcastConfig,
    TasksConfig,
    load_config,
    parse_overrides,
)


def _write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "run.toml"
    path.write_text(text)
    return path


def test_toml_and_overrides_compose(tmp_path: Path) -> None:
    path = _write(
        tmp_path,
        'run_dir = "runs/x"\n[orchestrator]\nport = 9100\nasync_level = 1\n[sampling]\nstop = ["\\n"]\n',
    )
    config = load_config(
        path, ["--orchestrator.port", "9200", "--model.path=/tmp/m", "--tasks.ops", '["+", "-"]']
    )
    assert isinstance(config, RunConfig)
    assert config.run_dir == "runs/x"
    assert config.orchestrator.port == 9200  # the override wins
    assert config.orchestrator.async_level == 1  # the file value stays
    assert config.model.path == "/tmp/m"  # an unparsable TOML literal falls back to the bare string
    assert config.tasks.ops == ["+", "-"]
    assert config.sampling.stop == ["\n"]
    assert config.orchestrator_data_dir == Path("runs/x/orchestrator")


def test_defaults_load_without_a_file() -> None:
    config = load_config(None)
    assert config == RunConfig()
    assert config.orchestrator.url == "http://127.0.0.1:8700"


@pytest.mark.parametrize(
    ("text", "overrides", "needle"),
    [
        ("[orchestrator]\nportt = 1\n", [], "unknown key 'orchestrator.portt'"),
        ("", ["--nosuch.key", "1"], "unknown key 'nosuch'"),
        ("", ["--orchestrator.port", "x"], "orchestrator.port"),
        ("", ["--orchestrator.async_level", "-1"], "orchestrator.async_level"),
        ("", ["--tasks.prompt_template", "no placeholder"], "{prompt}"),
        ("", ["--tasks.source", "jsonl"], "tasks.path is required"),
        ("[model\n", [], "not valid TOML"),
        ("", ["--sampling.temperature"], "has no value"),
        ("", ["orchestrator.port", "1"], "expected an override"),
        ("", ["--model.dtype", "float64"], "model.dtype"),
    ],
)
def test_bad_configs_name_the_key(tmp_path: Path, text: str, overrides: list[str], needle: str) -> None:
    with pytest.raises(ConfigError) as error:
        load_config(_write(tmp_path, text), overrides)
    assert needle in str(error.value)


def test_missing_file_is_a_config_error(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="not found"):
        load_config(tmp_path / "missing.toml")


def test_role_sections_are_composed() -> None:
    """Every section of RunConfig is a frozen Section (role sections resolved from their modules)."""
    config = RunConfig()
    for name in RunConfig.model_fields:
        value = getattr(config, name)
        if isinstance(value, BaseModel):
            assert isinstance(value, Section), name
            assert value.model_config.get("extra") == "forbid", name


def test_every_field_has_a_description() -> None:
    models: list[type[BaseModel]] = [
        RunConfig,
        *[type(v) for v in RunConfig().__dict__.values() if isinstance(v, BaseModel)],
    ]
    for model in models:
        for name, info in model.model_fields.items():
            assert info.description, f"{model.__name__}.{name} has no description"


def test_shardcast_servers_default_to_relays_then_origin() -> None:
    config = ShardcastConfig(origin_port=9001, relay_ports=[9002, 9003])
    assert config.client_servers == [
        "http://127.0.0.1:9002",
        "http://127.0.0.1:9003",
        "http://127.0.0.1:9001",
    ]
    assert ShardcastConfig(servers=["http://a:1"]).client_servers == ["http://a:1"]
    assert OrchestratorConfig(host="0.0.0.0", port=1).url == "http://127.0.0.1:1"


def test_sections_are_immutable() -> None:
    config = TasksConfig()
    with pytest.raises(ValueError):
        config.num_tasks = 3  # type: ignore[misc]


_keys = st.from_regex(r"[a-z][a-z_]{0,8}(\.[a-z][a-z_]{0,8}){0,2}", fullmatch=True)
_values = st.integers() | st.booleans() | st.text(alphabet="abcxyz/._-", min_size=1, max_size=12)


@given(st.dictionaries(_keys, _values, max_size=5))
def test_overrides_round_trip_scalars(pairs: dict[str, object]) -> None:
    """parse_overrides(--k v) recovers v for ints, bools and bare strings (no key prefixes another)."""
    keys = sorted(pairs)
    if any(b.startswith(a + ".") for a in keys for b in keys if a != b):
        return
    tokens: list[str] = []
    for key in keys:
        value = pairs[key]
        tokens += [f"--{key}", str(value).lower() if isinstance(value, bool) else str(value)]
    parsed = parse_overrides(tokens)
    for key in keys:
        node: object = parsed
        for part in key.split("."):
            assert isinstance(node, dict)
            node = node[part]
        value = pairs[key]
        if (isinstance(value, str) and value in ("true", "false", "inf", "nan")) or (
            isinstance(value, str) and value.lstrip("-").replace("_", "").isdigit()
        ):
            continue  # bare strings that are TOML literals parse as those literals, by design
        assert node == value


def test_tasks_come_from_verifiers_and_apply_the_template(tmp_path: Path) -> None:
    import verifiers
    from prime_rl.tasks import TaskSet, TaskSourceError, load_tasks

    config = TasksConfig(num_tasks=7, seed=3, prompt_template="Few-shot.\n{prompt}")
    tasks = load_tasks(config)
    expected = verifiers.arithmetic_tasks(7, seed=3, ops=("+",), digits=(1, 2))
    assert len(tasks) == 7
    assert [tasks.task(i) for i in range(7)] == expected
    assert tasks.prompt(2) == "Few-shot.\n" + expected[2].prompt
    path = tmp_path / "tasks.jsonl"
    verifiers.save_tasks(expected, path)
    from_file = load_tasks(TasksConfig(source="jsonl", path=str(path), num_tasks=5))
    assert len(from_file) == 5 and from_file.prompt(4) == expected[4].prompt
    with pytest.raises(TaskSourceError):
        load_tasks(TasksConfig(source="jsonl", path=str(tmp_path / "missing.jsonl")))
    with pytest.raises(IndexError):
        tasks.task(7)
    with pytest.raises(TaskSourceError):
        TaskSet([])


def test_cli_prints_config_and_rejects_bad_keys(capsys: pytest.CaptureFixture[str]) -> None:
    import json

    from prime_rl.cli import main

    assert main(["orchestrator", "--print-config", "--orchestrator.port", "9123"]) == 0
    assert json.loads(capsys.readouterr().out)["orchestrator"]["port"] == 9123
    assert main(["orchestrator", "--orchestrator.nope", "1"]) == 2
    assert "unknown key 'orchestrator.nope'" in capsys.readouterr().err


def test_run_plans_every_process() -> None:
    from prime_rl.launch.supervisor import plan_children

    config = load_config(None, ["--shardcast.relay_ports", "[9002, 9003]"])
    names = [spec.name for spec in plan_children(config)]
    assert names[:5] == [
        "orchestrator",
        "shardcast-origin",
        "shardcast-relay-0",
        "shardcast-relay-1",
        "trainer",
    ]
    assert "validator" in names
    # each validator child keeps one id across its restarts, and no two share one
    several = load_config(None, ["--validator.count", "3"])
    ids = [spec.extra for spec in plan_children(several) if spec.role == "validator"]
    assert ids == [spec.extra for spec in plan_children(several) if spec.role == "validator"]
    assert [extra[0] for extra in ids] == ["--validator.validator_id"] * 3 and len({extra[1] for extra in ids}) == 3
    assert all(extra[1].endswith(f"-{name}") for extra, name in zip(ids, ["validator", "validator-1", "validator-2"], strict=True))
    named = load_config(None, ["--validator.validator_id", "judge"])  # a configured id: kept for a lone validator
    assert [spec.extra for spec in plan_children(named) if spec.role == "validator"] == [()]
    named_two = load_config(None, ["--validator.validator_id", "judge", "--validator.count", "2"])
    assert [spec.extra[-1] for spec in plan_children(named_two) if spec.role == "validator"] == [
        "judge-validator",
        "judge-validator-1",
    ]
    assert config.workers.count == 2 and config.workers.hostile == []  # the shipped defaults
    assert sum(name.startswith("worker-") for name in names) == 2
    assert not any(name.startswith("hostile-") for name in names)
    # hostile workers are the red team's role; with a hostile workers.behaviour every worker is
    hostile = load_config(None, ["--workers.hostile", '["garbage", "mixed"]', "--workers.count", "1"])
    roles = {spec.name: (spec.role, spec.extra) for spec in plan_children(hostile)}
    assert roles["worker-0"] == ("worker", ())
    assert roles["hostile-0"] == ("redteam", ("--workers.behaviour", "garbage"))
    assert roles["hostile-1"] == ("redteam", ("--workers.behaviour", "mixed"))
    cheating = load_config(None, ["--workers.behaviour", "garbage", "--workers.count", "1"])
    assert {spec.name: spec.role for spec in plan_children(cheating)}["worker-0"] == "redteam"


def test_difficulty_filter_and_length_budgets(tmp_path: Path) -> None:
    import verifiers
    from prime_rl.tasks import load_tasks

    rows = [
        verifiers.Task(
            prompt=f"q{i}",
            task_type="verifiable_math",
            verification_info={"ground_truth": "1"},
            solve_rate=rate,
        )
        for i, rate in enumerate([0.0, 0.1, 0.5, 0.8, 0.9, None])
    ]
    path = tmp_path / "tasks.jsonl"
    verifiers.save_tasks(rows, path)
    config = TasksConfig(
        source="jsonl", path=str(path), difficulty_key="solve_rate_qwen_r1_distill_7b",
        min_pass_rate=0.1, max_pass_rate=0.8, length_reward="exact", target_lengths=[2000, 4000],
    )  # fmt: skip
    tasks = load_tasks(config)
    assert [tasks.task(i).prompt for i in range(len(tasks))] == ["q1", "q2", "q3", "q5"]
    for task_id in range(len(tasks)):
        target = tasks.target_length(task_id)
        assert target in (2000, 4000)
        assert tasks.prompt(task_id).endswith(f" Think for {target} tokens before giving a response.")
        assert target == load_tasks(config).target_length(task_id)  # seeded: every process agrees
    assert load_tasks(TasksConfig(source="jsonl", path=str(path))).target_length(0) is None
