"""The demo's dev and test splits: the test problems never train (whatever tasks.seed), never
overlap the dev problems, stay the same across run seeds, and `--seed` is what changes the run."""

from __future__ import annotations

import importlib.util
from pathlib import Path
from typing import Any

import pytest

from prime_rl.config import TasksConfig, load_config
from prime_rl.evaluator.heldout import EvaluatorError, heldout_task_set
from prime_rl.tasks import in_test_split, load_tasks

ROOT = Path(__file__).resolve().parents[1]
DEMO = load_config(ROOT / "configs" / "tiny-cpu.toml")


def _problems(task_set: Any) -> list[str]:
    return [task_set.task(i).prompt for i in range(len(task_set))]


def test_in_test_split_is_a_fixed_share_of_the_problem_space():
    prompts = [f"What is {a} + {b}?" for a in range(60) for b in range(60)]  # 3,600 problems
    kept = [p for p in prompts if in_test_split(p, 0.25)]
    assert 0.23 < len(kept) / len(prompts) < 0.27  # a hash: 900 expected, sd 26
    assert not any(in_test_split(p, 0.0) for p in prompts)
    # nested: a larger share keeps every problem a smaller one keeps
    assert set(kept) <= {p for p in prompts if in_test_split(p, 0.5)}
    assert in_test_split("What is 6 + 7?", 0.25) == in_test_split("What is 6 + 7?", 0.25)


@pytest.mark.parametrize("tasks_seed", [0, 1, 2])
def test_demo_test_split_is_disjoint_from_training_and_dev_and_fixed(tasks_seed: int):
    """For each run seed of the README table: no test problem trains or is a dev problem, both
    families are in the test split, and the test split is the same problems whatever tasks.seed."""
    assert DEMO.evaluator.split == "test" and DEMO.tasks.test_share > 0
    tasks = DEMO.tasks.model_copy(update={"seed": tasks_seed})
    training = load_tasks(tasks)
    evaluator = DEMO.evaluator
    test = heldout_task_set(tasks, evaluator.num_problems, evaluator.test_seed, training=training, split="test")
    dev = heldout_task_set(tasks, evaluator.num_problems, evaluator.seed, training=training, split="dev")
    trained, tested, developed = set(_problems(training)), _problems(test), _problems(dev)
    assert len(training) == tasks.num_tasks  # the kept-out share is replaced, not lost
    assert len(tested) == len(set(tested)) == evaluator.num_problems
    assert trained.isdisjoint(tested) and trained.isdisjoint(developed) and set(tested).isdisjoint(developed)
    assert all(in_test_split(p, tasks.test_share) for p in tested)
    assert not any(in_test_split(p, tasks.test_share) for p in trained | set(developed))
    families = [test.task(i).task_type for i in range(len(test))]
    assert families.count("verifiable_math") >= 20 and families.count("prime_rl_code") >= 20
    reference = DEMO.tasks.model_copy(update={"seed": 0})
    fixed = heldout_task_set(reference, evaluator.num_problems, evaluator.test_seed, split="test")
    assert tested == _problems(fixed)


def test_without_a_test_share_training_is_unchanged_and_the_splits_refuse():
    """test_share drops the test problems from the generator's sequence and draws on: the training
    set is the first num_tasks of the others, in the generator's order."""
    tasks = TasksConfig(source="arithmetic", num_tasks=50)
    longer = _problems(load_tasks(tasks.model_copy(update={"num_tasks": 200})))
    reduced = _problems(load_tasks(tasks.model_copy(update={"test_share": 0.25})))
    assert _problems(load_tasks(tasks)) == longer[:50]
    assert reduced == [p for p in longer if not in_test_split(p, 0.25)][:50]
    assert reduced != longer[:50]
    with pytest.raises(EvaluatorError, match="test_share"):
        heldout_task_set(tasks, 16, seed=1, split="test")
    with pytest.raises(ValueError, match="test_share"):
        TasksConfig(source="jsonl", path="tasks.jsonl", test_share=0.25)


def test_seed_flag_sets_the_task_seed_and_nothing_else(monkeypatch: pytest.MonkeyPatch):
    spec = importlib.util.spec_from_file_location("intellect2_recipe", ROOT / "examples" / "intellect2.py")
    assert spec is not None and spec.loader is not None
    recipe = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(recipe)
    seen: dict[str, Any] = {}

    def fake_run_local(config: Any, *args: Any, **kwargs: Any) -> int:
        seen["config"] = config
        return 0

    monkeypatch.setattr(recipe, "run_local", fake_run_local)
    assert recipe.main(["--config", str(ROOT / "configs" / "tiny-cpu.toml"), "--seed", "7"]) == 0
    config = seen["config"]
    assert config.tasks.seed == 7
    assert (config.evaluator.seed, config.evaluator.test_seed) == (DEMO.evaluator.seed, DEMO.evaluator.test_seed)
    assert config.model_dump() == DEMO.model_copy(update={"tasks": DEMO.tasks.model_copy(update={"seed": 7})}).model_dump()
