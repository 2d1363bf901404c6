"""The INTELLECT-2 recipe's two shipped configs and what ``examples/intellect2.py`` builds.

The model source, the held-out evaluator and the report have their own files:
test_recipe_model_source.py, test_recipe_evaluator.py and test_recipe_report.py.
"""

from __future__ import annotations

import itertools
import json
from pathlib import Path

import pytest

import grpo
import verifiers
from prime_rl.config import ComponentsConfig, ConfigError, load_component, load_config
from prime_rl.launch.local import COMPONENT_KEYS
from prime_rl.reward import LengthBudget, default_reward, load_reward, run_tasks
from prime_rl.trainer.process import build_loss

ROOT = Path(__file__).resolve().parents[1]
RECIPE = ROOT / "examples" / "intellect2.py"


def recipe(name: str) -> object:
    """An object of the recipe, imported the way every process of a run imports it."""
    return load_component(f"components.{name}", f"{RECIPE}:{name}")


def test_intellect2_config_has_the_published_settings():
    """configs/intellect2.toml validates against RunConfig and carries INTELLECT-2's settings
    (PrimeIntellect-ai/prime-rl@4bb0ff01f configs/training/qwq.toml, configs/inference/Qwen32B/qwq.toml)."""
    config = load_config(ROOT / "configs" / "intellect2.toml")
    assert config.model.path == "Qwen/QwQ-32B" and config.model.dtype == "bfloat16"
    assert (config.sampling.group_size, config.sampling.temperature) == (16, 0.6)
    assert config.orchestrator.max_tokens_per_sample == 16000  # max_model_len: prompt + completion
    assert config.sampling.max_new_tokens <= 16000
    trainer = config.trainer
    assert (trainer.lr, trainer.warmup_steps, trainer.max_grad_norm) == (3e-7, 25, 0.1)
    assert tuple(trainer.betas) == (0.9, 0.99) and trainer.weight_decay == 0.01
    loss = trainer.loss  # a grpo.LossConfig
    assert (loss.eps_low, loss.eps_high, loss.delta) == (0.2, 0.2, 4.0)
    assert loss.entropy_coef == 1e-3 and not loss.kl_coef
    assert trainer.optimizer_steps_per_version == 8
    assert trainer.samples_per_step == 512 * 8  # 512 samples per optimizer step
    assert trainer.filter_zero_advantage and loss == grpo.RECIPES["intellect2"]
    assert config.orchestrator.async_level == 2
    tasks = config.tasks
    assert (tasks.length_reward, tasks.length_alpha) == ("exact", 3e-4)
    assert list(tasks.target_lengths) == [2000, 4000, 6000, 8000, 10000]
    assert tasks.difficulty_key == "solve_rate_qwen_r1_distill_7b"
    assert (tasks.min_pass_rate, tasks.max_pass_rate) == (0.1, 0.8)


def test_tiny_cpu_config_is_the_demo():
    config = load_config(ROOT / "configs" / "tiny-cpu.toml")
    assert config.model.path == "" and config.model.dtype == "float32"  # filled in by model_source
    assert config.workers.count == 2 and len(config.workers.hostile) == 1
    assert config.evaluator.enabled and config.trainer.total_steps % config.evaluator.every == 0
    assert config.sampling.group_size == 8 and config.sampling.stop == ["\n\n"]
    # INTELLECT-2's task families and length budget: math and sandboxed code, each prompt with a budget
    from prime_rl.tasks import load_tasks

    tasks = load_tasks(config.tasks)
    assert {tasks.task(i).task_type for i in range(len(tasks))} == {"verifiable_math", "prime_rl_code"}
    assert config.tasks.length_reward != "none" and min(config.tasks.target_lengths) >= 32  # a full toploc chunk
    # the few-shot prompt is what the model sees: examples, then the task with its budget
    prompt = tasks.prompt(0)
    assert prompt.startswith("Question: What is 6 + 7? Think for 40 tokens before giving a response.\n")
    assert prompt.endswith(f"Think for {tasks.target_length(0)} tokens before giving a response.\nAnswer:")


def test_recipe_hands_every_component_by_a_path_the_roles_accept():
    """Each part the recipe composes is importable by the path a child process gets, is the same object
    there, and passes the check of the role that uses it; every component key is composed."""
    components = recipe("COMPONENTS")
    assert isinstance(components, dict) and set(components) == set(COMPONENT_KEYS)
    assert {key for key in COMPONENT_KEYS.values() if key.startswith("components.")} == {
        f"components.{name}" for name in ComponentsConfig.model_fields
    }
    for name, value in components.items():
        assert recipe(name) is value
    assert load_reward(f"{RECIPE}:reward") is components["reward"]
    assert build_loss(load_config(None, ["--trainer.loss", f"{RECIPE}:loss"])) is components["loss"]


@pytest.mark.parametrize("config_name", ["tiny-cpu.toml", "intellect2.toml"])
def test_recipe_loss_is_the_loss_each_config_names(config_name: str):
    """Run through the recipe or through `prime-rl run` with either config: the same loss. Each config's
    [trainer.loss] table is live: the recipe starts only while its loss line agrees with it."""
    config = load_config(ROOT / "configs" / config_name)
    assert "loss" in config.trainer.model_fields_set
    config.trainer.check_recipe_loss(f"{RECIPE}:loss", config_name)  # raises ComponentError on a difference
    loss = recipe("loss")
    assert isinstance(loss, grpo.Loss)
    assert loss.config == build_loss(config).config == config.trainer.loss == grpo.RECIPES["intellect2"]
    assert (loss.config.delta, loss.config.entropy_coef, loss.config.aggregation) == (4.0, 1e-3, "constant")


MATH = verifiers.Task("What is 1/2 + 1/4?", "verifiable_math", {"ground_truth": "3/4"})
CODE = verifiers.Task(
    "inc", "prime_rl_code", {"test_cases": json.dumps({"inputs": ["1\n", "2\n"], "outputs": ["2\n", "3\n"]})}
)


def test_recipe_reward_oracles():
    """verifiers' verdict, then INTELLECT-2's length term (alpha per token of distance from the budget)."""
    reward = recipe("reward")
    right, wrong = "so the answer is $\\boxed{0.75}$", "$\\boxed{0.7}$"
    assert reward(MATH, right, 10, None) == 1.0 and reward(MATH, wrong, 10, None) == 0.0
    assert reward(CODE, "```python\nprint(int(input()) + 1)\n```", 12, None) == 1.0
    assert reward(CODE, "```python\nprint(2)\n```", 7, None) == 0.0
    # exact: 1 - 3e-4 * |150 - 100| = 0.985; max: 1 * clip(3e-4 * (100 - 150) + 0.5, 0, 1) = 0.485;
    # clip: 150 > 100 tokens -> 0; within the budget -> the verdict unchanged.
    assert reward(MATH, right, 150, LengthBudget(100, "exact", 3e-4)) == pytest.approx(0.985, abs=1e-12)
    assert reward(MATH, right, 150, LengthBudget(100, "max", 3e-4)) == pytest.approx(0.485, abs=1e-12)
    assert reward(MATH, right, 150, LengthBudget(100, "clip", 3e-4)) == 0.0
    assert reward(MATH, right, 90, LengthBudget(100, "clip", 3e-4)) == 1.0
    # a wrong answer 20 tokens off its budget: 0 - 3e-4 * 20
    assert reward(MATH, wrong, 80, LengthBudget(100, "exact", 3e-4)) == pytest.approx(-0.006, abs=1e-12)


def test_recipe_reward_equals_the_runtime_default():
    """The recipe spells out the reward `prime-rl run` uses without a [components] reward."""
    reward = recipe("reward")
    tasks = [MATH, *verifiers.arithmetic_tasks(3, seed=1, template="{expression} =")]
    completions = ["$\\boxed{0.75}$", " 42\n", "no answer", ""]
    budgets = [
        None,
        *(
            LengthBudget(t, m, a)
            for t, m, a in itertools.product((5, 300), ("exact", "max", "clip"), (3e-4, 0.01))
        ),
    ]
    for task, completion, num_tokens, budget in itertools.product(tasks, completions, (0, 7, 400), budgets):
        assert reward(task, completion, num_tokens, budget) == default_reward(
            task, completion, num_tokens, budget
        )


def test_the_run_scores_with_the_recipes_reward_and_each_tasks_budget(tiny_tokenizer):
    """Workers and the validator score through run_tasks: the recipe's reward, with the budget [tasks]
    gives each task (seeded target, mode, alpha)."""
    config = load_config(
        None,
        [
            "--tasks.num_tasks", "12", "--tasks.length_reward", "max", "--tasks.length_alpha", "0.02",
            "--tasks.target_lengths", "[4, 9]", "--components.reward", f"{RECIPE}:reward",
        ],
    )  # fmt: skip
    book = run_tasks(config, tiny_tokenizer)
    assert book.reward is recipe("reward")
    for task_id in range(12):
        target = verifiers.sample_target_length(0, task_id, targets=(4, 9))
        assert book.budget(task_id) == LengthBudget(target, "max", 0.02)
        answer = f" {book.task_set.task(task_id).verification_info['answer']}\n"
        # right answer, 6 tokens: 1 * clip(0.02 * (T - 6) + 0.5, 0, 1)
        assert book.score(task_id, answer, 6) == pytest.approx(min(1.0, max(0.0, 0.02 * (target - 6) + 0.5)))
        assert book.score(task_id, " x\n", 6) == 0.0


def test_recipe_main_reports_a_bad_config_without_starting_anything(tmp_path: Path, capsys):
    main = recipe("main")
    assert main(["--config", str(tmp_path / "missing.toml")]) == 2  # type: ignore[operator]
    assert "config file not found" in capsys.readouterr().err
    assert main(["--config", str(ROOT / "configs" / "tiny-cpu.toml"), "--trainer.nope", "1"]) == 2  # type: ignore[operator]
    assert "unknown key 'trainer.nope'" in capsys.readouterr().err
    assert not list(tmp_path.iterdir())


def test_run_local_refuses_a_bad_component_before_starting_anything(tmp_path: Path):
    from prime_rl.launch.local import run_local

    config = load_config(None, ["--run_dir", str(tmp_path / "run")])
    with pytest.raises(ConfigError, match=r"components\.reward"):
        run_local(config, None, [], components={"reward": "not an import path"})
    with pytest.raises(ConfigError, match=r"unknown key 'components\.judge'"):
        run_local(config, None, [], components={"judge": f"{RECIPE}:reward"})
    assert not list(tmp_path.iterdir())


def test_step_printer_prints_each_committed_step_once(tmp_path: Path, capsys: pytest.CaptureFixture[str]):
    """What the recipe gives ``Supervisor(on_progress=...)``: one line per committed policy step."""
    from prime_rl.launch.local import StepPrinter
    from prime_rl.metrics import MetricsWriter

    printer = StepPrinter(load_config(None, ["--run_dir", str(tmp_path), "--trainer.total_steps", "2"]))
    trainer = MetricsWriter(tmp_path / "metrics" / "trainer.jsonl", role="trainer", name="trainer")
    printer("status line")
    assert capsys.readouterr().out == ""  # not a terminal: no ticker, and no step committed yet
    trainer.log("train", step=0, reward_mean=0.5)
    trainer.log("commit", step=0, policy_version=1)
    printer("status line")
    printer("status line")
    trainer.close()
    out = capsys.readouterr().out
    assert out.count("\n") == 1 and out.startswith("step 1/2 | reward 0.50 |"), out


def test_run_local_finishes_its_clean_stop_through_a_second_sigterm(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
):
    """`timeout make run` sends SIGTERM to the recipe twice (to the process group, and forwarded by
    make): the second one must not cut the clean stop short (children left running, no report)."""
    import os
    import signal
    import time

    from prime_rl.launch import local

    stopped = []

    copies: list[Path] = []

    def run(self: local.Supervisor) -> int:
        copies.append(Path(self.config.run_dir) / "worker-0" / "policies" / "v1" / "model.safetensors")
        copies[0].parent.mkdir(parents=True)
        copies[0].write_bytes(b"weights")  # a worker's copy of a policy, left by the interrupted run
        os.kill(os.getpid(), signal.SIGTERM)  # the first SIGTERM ends the run ...
        time.sleep(30)
        raise AssertionError("SIGTERM did not stop the run")

    def stop_all(self: object) -> None:
        os.kill(os.getpid(), signal.SIGTERM)  # ... and a second one arrives while the children stop
        stopped.append(True)

    monkeypatch.setattr(local.Supervisor, "run", run)
    monkeypatch.setattr(local.Supervisor, "stop_all", stop_all)
    before = signal.getsignal(signal.SIGTERM)
    config = load_config(None, ["--run_dir", str(tmp_path / "run"), "--model.path", str(tmp_path)])
    assert local.run_local(config, None, [], components={}, keep_ports=True) == 143
    assert stopped == [True]
    assert signal.getsignal(signal.SIGTERM) is before
    (run_dir,) = tmp_path.glob("run-*")
    assert (run_dir / "summary.txt").is_file() and (run_dir / "report.png").is_file()
    out = capsys.readouterr().out
    assert "(exit code 143)" in out
    # an interrupted run's weight copies are deleted too (killed demo runs once filled the disk)
    assert not copies[0].exists() and "removed 0.0 GiB of per-process weight copies" in out
