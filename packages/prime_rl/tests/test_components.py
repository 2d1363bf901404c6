"""``[components]``: import paths checked when the config loads, imported by the role that uses them,
with an error naming the key and the problem (module, file, attribute, type, signature)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

import grpo
from prime_rl.config import ComponentError, ConfigError, load_component, load_config, with_overrides
from prime_rl.config.components import ImportPath, check_signature
from prime_rl.inference.run_tasks import RunTasks, default_reward, load_reward, run_tasks
from prime_rl.tasks import TaskSet
from prime_rl.trainer.process import build_loss, load_loss

MODULE = """
import grpo

loss = grpo.Loss("dapo")
loss_config = grpo.LossConfig(eps_high=0.3)
centred = grpo.Loss("dr_grpo")
corrected = grpo.LossConfig(is_correction="token_truncate")


def reward(task, completion, num_tokens, budget):
    return float(len(completion))


def two_arguments(task, completion):
    return 0.0


def nan_reward(task, completion, num_tokens, budget):
    return float("nan")


class Recipe:
    reward = staticmethod(reward)
"""


@pytest.fixture
def package(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """``my_recipes.components`` on sys.path, plus the same code as a bare file ``recipe.py``."""
    (tmp_path / "my_recipes").mkdir()
    (tmp_path / "my_recipes" / "__init__.py").write_text("")
    (tmp_path / "my_recipes" / "components.py").write_text(MODULE)
    (tmp_path / "my_recipes" / "broken.py").write_text("import no_such_dependency_xyz\nreward = None\n")
    (tmp_path / "recipe.py").write_text(MODULE)
    monkeypatch.syspath_prepend(str(tmp_path))
    return tmp_path


def test_import_path_syntax():
    assert ImportPath.parse("a.b:c") == ImportPath("a.b", "c")
    assert ImportPath.parse("C:/x/recipe.py:Recipe.reward") == ImportPath("C:/x/recipe.py", "Recipe.reward")
    assert ImportPath.parse("dir/recipe.py:loss").is_file
    for bad in ("no_colon", ":attr", "module:", "a b:c", "mod:1x", "mod:class", "a..b:c"):
        with pytest.raises(ComponentError, match="import path"):
            ImportPath.parse(bad)


def test_config_checks_the_syntax_without_importing():
    config = load_config(None, ["--components.reward", "surely_not_installed_xyz:reward"])
    assert config.components.reward == "surely_not_installed_xyz:reward"  # imported by the role, not here
    assert "surely_not_installed_xyz" not in sys.modules
    with pytest.raises(ConfigError, match=r"components\.loss: .*must be 'module:attribute'"):
        load_config(None, ["--components.loss", "grpo.Loss"])
    with pytest.raises(ConfigError, match=r"unknown key 'components\.optimizer'"):
        load_config(None, ["--components.optimizer", "a:b"])
    with pytest.raises(ConfigError, match=r"components\.reward"):
        with_overrides(config, ["--components.reward", "x:"])
    assert with_overrides(config, ["--components.loss", "a:b"]).components.loss == "a:b"


def test_module_and_file_paths_load_the_same_objects_once(package: Path):
    from_module = load_component("components.loss", "my_recipes.components:loss")
    from_file = load_component("components.loss", f"{package / 'recipe.py'}:loss")
    assert isinstance(from_module, grpo.Loss) and isinstance(from_file, grpo.Loss)
    assert from_module.config == from_file.config == grpo.RECIPES["dapo"]
    assert load_component("components.loss", f"{package / 'recipe.py'}:loss") is from_file  # imported once
    nested = load_component("components.reward", "my_recipes.components:Recipe.reward")
    assert nested(None, "abc", 3, None) == 3.0  # type: ignore[operator]


@pytest.mark.parametrize(
    ("path", "message"),
    [
        ("surely_not_installed_xyz.recipes:reward", "module 'surely_not_installed_xyz.recipes' not found"),
        ("my_recipes.nope:reward", "module 'my_recipes.nope' not found"),
        (
            "my_recipes.broken:reward",
            "importing 'my_recipes.broken' failed: No module named 'no_such_dependency_xyz'",
        ),
        ("my_recipes.components:rewrd", "'my_recipes.components' has no attribute 'rewrd' .*reward"),
        ("my_recipes.components:Recipe.score", "'Recipe' has no attribute 'score'"),
        ("/no/such/dir/recipe.py:reward", "file /no/such/dir/recipe.py does not exist"),
    ],
)
def test_load_errors_name_the_key_path_and_problem(package: Path, path: str, message: str):
    with pytest.raises(ComponentError, match=rf"^components\.reward = '{path}': {message}"):
        load_component("components.reward", path)


def test_reward_must_take_task_completion_num_tokens_budget(package: Path, tiny_tokenizer):
    reward = load_reward("my_recipes.components:reward")
    assert reward(None, "abcd", 4, None) == 4.0
    with pytest.raises(
        ComponentError,
        match=r"must be callable as \(task, completion, num_tokens, budget\); its signature is \(task, completion\)",
    ):
        load_reward("my_recipes.components:two_arguments")
    with pytest.raises(ComponentError, match=r"must be callable .* got a LossConfig"):
        load_reward("my_recipes.components:loss_config")
    # A loss is callable with four arguments too: the start-up call finds out it is no reward.
    config = load_config(
        None, ["--tasks.num_tasks", "3", "--components.reward", "my_recipes.components:loss"]
    )
    with pytest.raises(
        ComponentError,
        match=r"components\.reward = .*: calling it for task 0 with an empty completion failed",
    ):
        run_tasks(config, tiny_tokenizer)
    config = load_config(
        None, ["--tasks.num_tasks", "3", "--components.reward", "my_recipes.components:nan_reward"]
    )
    with pytest.raises(ComponentError, match="returned nan for task 0"):
        run_tasks(config, tiny_tokenizer)
    assert check_signature(("a",))(print) is None  # builtins without an inspectable signature pass


def test_reward_must_return_a_finite_number(package: Path):
    tasks = TaskSet([{"prompt": "1 + 1 =", "task_type": "arithmetic_exact"}])
    book = RunTasks(tasks, tokenizer=None, reward=load_reward("my_recipes.components:nan_reward"))
    with pytest.raises(ComponentError, match="returned nan for task 0; a reward must be a finite number"):
        book.score(0, "2", 1)
    assert RunTasks(tasks, tokenizer=None).reward is default_reward


def test_loss_must_be_a_grpo_loss_the_runtime_can_honour(package: Path):
    assert load_loss("my_recipes.components:loss").config == grpo.RECIPES["dapo"]
    from_config = load_loss("my_recipes.components:loss_config")  # a LossConfig becomes a Loss
    assert isinstance(from_config, grpo.Loss) and from_config.config.eps_high == 0.3
    with pytest.raises(ComponentError, match=r"must be a grpo\.Loss or grpo\.LossConfig, got function"):
        load_loss("my_recipes.components:reward")
    with pytest.raises(ComponentError, match=r"its advantage is group_center .* group z-score advantages"):
        load_loss("my_recipes.components:centred")
    config = load_config(None, ["--trainer.loss.recipe", "grpo"])
    assert build_loss(config).config == grpo.RECIPES["grpo"]  # no component: [trainer.loss]


def test_a_loss_component_replaces_the_trainer_loss_table_and_says_so(package: Path, caplog):
    base = ["--components.loss", "my_recipes.components:loss"]
    with caplog.at_level("WARNING", logger="prime_rl.trainer.process"):
        agreeing = build_loss(load_config(None, [*base, "--trainer.loss.recipe", "dapo"]))
        assert agreeing.config == grpo.RECIPES["dapo"] and not caplog.records  # nothing to say
        loss = build_loss(load_config(None, [*base, "--trainer.loss.recipe", "grpo"]))
    assert loss.config == grpo.RECIPES["dapo"]
    (record,) = caplog.records
    assert "the loss is my_recipes.components:loss" in record.getMessage()
    assert "replaces [trainer.loss]" in record.getMessage()
    corrected = load_config(
        None, ["--components.loss", "my_recipes.components:corrected", "--trainer.old_logprobs", "inference"]
    )
    with pytest.raises(ComponentError, match=r"sets is_correction, .* use 'recompute' with it"):
        build_loss(corrected)


def test_a_role_exits_2_with_the_message_when_its_component_does_not_import(tmp_path: Path):
    """``prime-rl trainer`` fails at start-up, before loading any model, with the config error."""
    command = [
        sys.executable, "-m", "prime_rl.cli", "trainer", "--run_dir", str(tmp_path),
        "--components.loss", "surely_not_installed_xyz:loss",
    ]  # fmt: skip
    done = subprocess.run(command, capture_output=True, text=True, timeout=300)
    assert done.returncode == 2, done.stdout + done.stderr
    expected = "prime-rl trainer: components.loss = 'surely_not_installed_xyz:loss': module 'surely_not_installed_xyz' not found"
    assert expected in done.stderr and "Traceback" not in done.stderr, done.stderr
