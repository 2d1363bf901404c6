"""The INTELLECT-2 recipe's two shipped configs and its example script.

The model source, the held-out evaluator and the report have their own files:
test_recipe_model_source.py, test_recipe_evaluator.py and test_recipe_report.py.
"""

from __future__ import annotations

from pathlib import Path

import grpo
from prime_rl.config import load_config

ROOT = Path(__file__).resolve().parents[1]


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
    assert config.sampling.group_size == 8 and config.sampling.stop == ["\n"]
    # the few-shot prompt is what the model sees: examples, then the task in the same format
    from prime_rl.tasks import load_tasks

    prompt = load_tasks(config.tasks).prompt(0)
    assert prompt.startswith("3 + 4 = 7\n12 + 5 = 17\n40 + 21 = 61\n") and prompt.endswith(" =")


def test_examples_script_is_a_short_composition():
    source = (ROOT / "examples" / "intellect2.py").read_text()
    assert len(source.splitlines()) < 200
    for name in ("prepare_model", "Supervisor", "write_report", "ProgressTracker"):
        assert name in source
