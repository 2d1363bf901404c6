"""The INTELLECT-2 recipe's held-out evaluator: which versions it scores, its held-out task set,
greedy scoring against transformers' own generate, and the process following published versions."""

from __future__ import annotations

import itertools
from pathlib import Path

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

from prime_rl.config import TasksConfig, load_config
from prime_rl.evaluator import (
    EvaluatorConfig,
    EvaluatorError,
    evaluate,
    heldout_task_set,
    versions_to_evaluate,
)


def test_versions_to_evaluate_oracle():
    assert versions_to_evaluate(12, 3) == [0, 3, 6, 9, 12]
    assert versions_to_evaluate(7, 3) == [0, 3, 6, 7]  # the final version is always evaluated
    assert versions_to_evaluate(0, 5) == [0]
    with pytest.raises(ValueError):
        versions_to_evaluate(5, 0)
    with pytest.raises(ValueError):
        versions_to_evaluate(-1, 1)


@given(total=st.integers(0, 500), every=st.integers(1, 50))
def test_versions_to_evaluate_properties(total: int, every: int):
    versions = versions_to_evaluate(total, every)
    assert versions[0] == 0 and versions[-1] == total
    assert versions == sorted(set(versions))
    assert all(b - a <= every for a, b in itertools.pairwise(versions))
    assert all(v % every == 0 for v in versions[:-1])


def test_evaluator_config_defaults_and_errors():
    cfg = EvaluatorConfig()
    assert cfg.enabled and cfg.every >= 1 and cfg.num_problems >= 1
    with pytest.raises(ValueError):
        EvaluatorConfig(every=0)
    with pytest.raises(ValueError):
        EvaluatorConfig(unknown_key=1)  # type: ignore[call-arg]


TINY_TASKS = TasksConfig(
    num_tasks=200, seed=0, arithmetic_template="{expression} =", prompt_template="Q: {prompt}"
)


def test_heldout_set_is_seeded_and_disjoint_from_training():
    from prime_rl.tasks import load_tasks

    training = load_tasks(TINY_TASKS)
    first = heldout_task_set(TINY_TASKS, 32, seed=7, training=training)
    again = heldout_task_set(TINY_TASKS, 32, seed=7)
    other = heldout_task_set(TINY_TASKS, 32, seed=8, training=training)
    prompts = [first.prompt(i) for i in range(len(first))]
    assert len(prompts) == 32 == len(set(prompts))
    assert prompts == [again.prompt(i) for i in range(len(again))]
    assert prompts != [other.prompt(i) for i in range(len(other))]
    train_prompts = {training.prompt(i) for i in range(len(training))}
    assert train_prompts.isdisjoint(prompts)
    assert all(p.startswith("Q: ") and p.endswith(" =") for p in prompts)


def test_heldout_set_reports_when_training_covers_everything():
    # 1-digit addition has only 100 distinct problems; 1000 training tasks cover them all.
    tasks = TasksConfig(num_tasks=1000, digits=1, min_digits=1)
    with pytest.raises(EvaluatorError, match="disjoint"):
        heldout_task_set(tasks, 16, seed=1)


def test_evaluate_matches_reference_greedy_decoding(tiny_lm, tiny_tokenizer):
    from prime_rl.inference.backend import HFBackend
    from prime_rl.tasks import TaskSet

    prompts = ["1 + 2 =", "30 + 4 =", "7 + 7 =", "55 + 45 =", "9 + 0 =", "12 + 13 ="]
    # Reference: transformers' own greedy generate, one prompt at a time (no padding effects).
    expected = []
    for prompt in prompts:
        ids = tiny_tokenizer(prompt, return_tensors="pt").input_ids
        with torch.no_grad():
            out = tiny_lm.generate(ids, max_new_tokens=4, do_sample=False, pad_token_id=0, eos_token_id=2)
        expected.append(tiny_tokenizer.decode(out[0, ids.shape[1] :], skip_special_tokens=True))
    # Tasks whose "answer" is the reference text for even ids and something else for odd ids:
    # a correct greedy evaluator scores exactly the even half.
    tasks = [
        {"prompt": p, "answer": expected[i] if i % 2 == 0 else expected[i] + "#"}
        for i, p in enumerate(prompts)
    ]
    backend = HFBackend("", model=tiny_lm, tokenizer=tiny_tokenizer, max_batch_size=4, policy_version=3)
    result = evaluate(
        backend,
        TaskSet(tasks),
        max_new_tokens=4,
        batch_size=4,
        score=lambda task, text: float(text == task["answer"]),
    )
    assert result.policy_version == 3
    assert result.num_problems == 6 and result.num_correct == 3 and result.accuracy == 0.5
    assert 0 < result.mean_completion_tokens <= 4


def test_evaluator_process_follows_published_versions(tmp_path: Path, tiny_lm_dir: Path):
    """main() evaluates v0 (model.path) and each version published through a shardcast origin, and
    each logged accuracy equals evaluate() recomputed with that version's weights."""
    from transformers import AutoModelForCausalLM

    import shardcast
    from prime_rl import evaluator
    from prime_rl.inference.backend import HFBackend
    from prime_rl.metrics import read_metrics
    from prime_rl.weights.files import save_policy

    versions = {}
    with shardcast.Origin(tmp_path / "origin", port=0) as origin:
        for version in (1, 2):
            model = AutoModelForCausalLM.from_pretrained(tiny_lm_dir)
            torch.manual_seed(version)
            with torch.no_grad():
                for parameter in model.parameters():
                    parameter.add_(0.5 * torch.randn_like(parameter))
            path = save_policy(model.state_dict(), tmp_path / f"v{version}" / "model.safetensors")
            origin.publish(path, version=version)
            versions[version] = path
        config = load_config(
            None,
            [
                "--run_dir",
                str(tmp_path / "run"),
                "--model.path",
                str(tiny_lm_dir),
                "--tasks.num_tasks",
                "50",
                "--tasks.arithmetic_template",
                "{expression} =",
                "--sampling.max_new_tokens",
                "3",
                "--shardcast.servers",
                f'["{origin.url}"]',
                "--trainer.total_steps",
                "2",
                "--evaluator.every",
                "1",
                "--evaluator.num_problems",
                "6",
                "--evaluator.version_timeout_s",
                "60",
            ],
        )
        assert evaluator.main(config) == 0
    records = list(read_metrics(tmp_path / "run" / "metrics" / "evaluator.jsonl"))
    evals = [r for r in records if r["event"] == "eval"]
    assert [r["policy_version"] for r in evals] == [0, 1, 2]
    assert [r["policy_version"] for r in records if r["event"] == "weights_loaded"] == [1, 2]
    heldout = heldout_task_set(config.tasks, 6, config.evaluator.seed)
    backend = HFBackend(tiny_lm_dir)
    for record in evals:
        if record["policy_version"]:
            backend.load_weights(versions[record["policy_version"]], record["policy_version"])
        again = evaluate(backend, heldout, max_new_tokens=3)
        assert record["accuracy"] == again.accuracy and record["num_problems"] == 6
        assert record["mean_completion_tokens"] == again.mean_completion_tokens
        assert [tuple(pair) for pair in record["examples"]] == list(again.examples)
    # the versions really differ (so the equalities above identify the weights used)
    assert len({tuple(map(tuple, r["examples"])) for r in evals}) == 3
