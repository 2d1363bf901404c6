"""Component import paths (``[components] reward``, ``[trainer.loss]``): checked when the config loads,
imported by the role that uses them, with an error naming the key and the problem (module, file,
attribute, type, signature); a loss given twice, differently, is an error naming both."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

import grpo
import verifiers
from prime_rl.config import ComponentError, ConfigError, load_component, load_config, with_overrides
from prime_rl.config.components import ImportPath, check_signature
from prime_rl.config.loss import load_loss
from prime_rl.reward import RunTasks, default_reward, load_reward, run_tasks
from prime_rl.tasks import TaskSet
from prime_rl.trainer.process import build_loss

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


def text_reward(task, completion, num_tokens, budget) -> str:
    return "1.0"


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
    with pytest.raises(ConfigError, match=r"trainer.loss: .*import path 'grpo.Loss' must be 'module:attribute'"):
        load_config(None, ["--trainer.loss", "grpo.Loss"])
    with pytest.raises(ConfigError, match=r"the loss is one key, \[trainer.loss\] .*--trainer.loss \"a:b\""):
        load_config(None, ["--components.loss", "a:b"])  # where the key moved
    with pytest.raises(ConfigError, match=r"unknown key 'components\.optimizer'"):
        load_config(None, ["--components.optimizer", "a:b"])
    with pytest.raises(ConfigError, match=r"components\.reward"):
        with_overrides(config, ["--components.reward", "x:"])
    assert with_overrides(config, ["--trainer.loss", "a:b"]).trainer.loss == "a:b"
    with pytest.raises(ConfigError, match=r"--trainer.loss.eps_high sets a key inside trainer.loss, which is 'a:b'"):
        with_overrides(load_config(None, ["--trainer.loss", "a:b"]), ["--trainer.loss.eps_high", "0.3"])  # not dropped


def test_module_and_file_paths_load_the_same_objects_once(package: Path):
    from_module = load_component("trainer.loss", "my_recipes.components:loss")
    from_file = load_component("trainer.loss", f"{package / 'recipe.py'}:loss")
    assert isinstance(from_module, grpo.Loss) and isinstance(from_file, grpo.Loss)
    assert from_module.config == from_file.config == grpo.RECIPES["dapo"]
    assert load_component("trainer.loss", f"{package / 'recipe.py'}:loss") is from_file  # imported once
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
    with pytest.raises(ComponentError, match=r"text_reward': is annotated to return str; a reward must return a finite"):
        load_reward("my_recipes.components:text_reward")  # issue 48: refused before it is ever called
    # A loss is callable with four arguments too: its return annotation says it is no reward
    # (an unannotated one is found out by the start-up call, as nan_reward below).
    config = load_config(
        None, ["--tasks.num_tasks", "3", "--components.reward", "my_recipes.components:loss"]
    )
    with pytest.raises(ComponentError, match=r"components\.reward = .*: is annotated to return LossOutput"):
        run_tasks(config, tiny_tokenizer)
    config = load_config(
        None, ["--tasks.num_tasks", "3", "--components.reward", "my_recipes.components:nan_reward"]
    )
    with pytest.raises(ComponentError, match="reward function 'nan_reward', task 0: returned nan"):
        run_tasks(config, tiny_tokenizer)
    assert check_signature(("a",))(print) is None  # builtins without an inspectable signature pass


def test_reward_must_return_a_finite_number(package: Path):
    tasks = TaskSet([{"prompt": "1 + 1 =", "task_type": "arithmetic_exact"}])
    book = RunTasks(tasks, tokenizer=None, reward=load_reward("my_recipes.components:nan_reward"))
    with pytest.raises(
        verifiers.RewardError,
        match=r"^environment 'single_turn', reward function 'nan_reward', task 0: returned nan \(float\); a reward must",
    ):
        book.score(0, "2", 1)
    assert RunTasks(tasks, tokenizer=None).reward is default_reward


def test_loss_must_be_a_grpo_loss_the_runtime_can_honour(package: Path):
    assert load_loss("my_recipes.components:loss", "recompute").config == grpo.RECIPES["dapo"]
    with pytest.raises(ComponentError, match=r"must be a grpo\.Loss or grpo\.LossConfig, got function"):
        load_loss("my_recipes.components:reward", "recompute")
    with pytest.raises(ComponentError, match=r"its advantage is group_center .* group z-score advantages"):
        load_loss("my_recipes.components:centred", "recompute")
    config = load_config(None, ["--trainer.loss.recipe", "grpo"])
    assert build_loss(config).config == grpo.RECIPES["grpo"]  # a table
    by_path = build_loss(load_config(None, ["--trainer.loss", "my_recipes.components:loss"]))
    assert by_path is load_component("trainer.loss", "my_recipes.components:loss")  # the recipe's object
    from_config = build_loss(load_config(None, ["--trainer.loss", "my_recipes.components:loss_config"]))
    assert isinstance(from_config, grpo.Loss) and from_config.config.eps_high == 0.3  # a LossConfig becomes a Loss
    corrected = load_config(
        None, ["--trainer.loss", "my_recipes.components:corrected", "--trainer.old_logprobs", "inference"]
    )
    with pytest.raises(ComponentError, match=r"^trainer.loss = .*: it sets is_correction, .* use old_logprobs = 'recompute'"):
        build_loss(corrected)
    with pytest.raises(ConfigError, match=r"\[trainer.loss\]: it sets is_correction, .* old_logprobs = 'recompute'"):
        load_config(None, ["--trainer.loss.is_correction", "token_mask", "--trainer.old_logprobs", "inference"])


def test_a_recipe_loss_and_a_different_trainer_loss_are_an_error_naming_both(package: Path):
    """A recipe hands its loss over by path (launch/local.py); the config's own [trainer.loss], where it
    sets one, must be that loss: a difference is an error naming both, never one silently winning."""
    path = "my_recipes.components:loss"  # grpo.Loss("dapo")
    load_config(None).trainer.check_recipe_loss(path, "defaults")  # the config sets no loss: the recipe's
    load_config(None, ["--trainer.loss.recipe", "dapo"]).trainer.check_recipe_loss(path, "x.toml")  # the same
    load_config(None, ["--trainer.loss", path]).trainer.check_recipe_loss(path, "x.toml")  # the same path
    conflicting = load_config(None, ["--trainer.loss.recipe", "dapo", "--trainer.loss.eps_high", "0.3"])
    with pytest.raises(
        ComponentError,
        match=r"^two losses: \[trainer.loss\] in x.toml \+ overrides and the recipe's loss my_recipes.components:loss "
        r"differ: eps_high 0.3 vs 0.28 \(config vs recipe\)",
    ):
        conflicting.trainer.check_recipe_loss(path, "x.toml + overrides")
    other_object = load_config(None, ["--trainer.loss", "my_recipes.components:loss_config"])
    with pytest.raises(ComponentError, match=r"^two losses: \[trainer.loss\] = 'my_recipes.components:loss_config' "
                       r"in x.toml is another object than the recipe's loss my_recipes.components:loss"):
        other_object.trainer.check_recipe_loss(path, "x.toml")
    with pytest.raises(ComponentError, match=r"^trainer.loss = 'my_recipes.components:centred': its advantage is group_center"):
        load_config(None).trainer.check_recipe_loss("my_recipes.components:centred", "defaults")  # the guard, always


@pytest.mark.parametrize("role", ["orchestrator", "trainer", "validator", "worker", "run"])
def test_a_loss_table_with_other_advantages_is_refused_when_any_role_loads_the_config(role: str, tmp_path: Path):
    """`recipe = "dr_grpo"` (advantage group_center) would train on the validator's z-scores while
    naming another estimator: the config refuses it, so no path starts with it."""
    config = tmp_path / "run.toml"
    config.write_text('[trainer.loss]\nrecipe = "dr_grpo"\n')
    with pytest.raises(ConfigError, match=r"\[trainer.loss\]: its advantage is group_center"):
        load_config(config)
    done = subprocess.run(
        [sys.executable, "-m", "prime_rl.cli", role, "--config", str(config), "--run_dir", str(tmp_path / "run")],
        capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert done.returncode == 2, done.stdout + done.stderr
    assert "[trainer.loss]: its advantage is group_center" in done.stderr
    assert not (tmp_path / "run").exists()  # nothing started


def test_a_role_exits_2_with_the_message_when_its_component_does_not_import(tmp_path: Path):
    """``prime-rl trainer`` fails at start-up, before loading any model, with the config error."""
    command = [
        sys.executable, "-m", "prime_rl.cli", "trainer", "--run_dir", str(tmp_path),
        "--trainer.loss", "surely_not_installed_xyz:loss",
    ]  # fmt: skip
    done = subprocess.run(command, capture_output=True, text=True, timeout=300)
    assert done.returncode == 2, done.stdout + done.stderr
    expected = "prime-rl trainer: trainer.loss = 'surely_not_installed_xyz:loss': module 'surely_not_installed_xyz' not found"
    assert expected in done.stderr and "Traceback" not in done.stderr, done.stderr
