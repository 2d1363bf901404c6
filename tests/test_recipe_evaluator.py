"""The INTELLECT-2 recipe's held-out evaluator: which versions it scores, its held-out task set,
greedy scoring against transformers' own generate, and the process following published versions."""

from __future__ import annotations

import itertools
import json
from pathlib import Path

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

from prime_rl.config import TasksConfig, load_config
from prime_rl.evaluator.heldout import (
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


def test_heldout_set_carries_the_training_length_budgets():
    """With a length reward, held-out prompts end with the budget sentence exactly as training
    prompts do, and target_length(i) is the budget drawn with the held-out seed."""
    import verifiers
    from prime_rl.tasks import load_tasks

    budgeted = TINY_TASKS.model_copy(update={"length_reward": "exact", "target_lengths": [64, 128, 256]})
    training = load_tasks(budgeted)
    heldout = heldout_task_set(budgeted, 32, seed=7, training=training)
    plain = heldout_task_set(TINY_TASKS, 32, seed=7)
    targets = [heldout.target_length(i) for i in range(len(heldout))]
    assert targets == [verifiers.sample_target_length(7, i, targets=[64, 128, 256]) for i in range(32)]
    assert set(targets) == {64, 128, 256}  # 32 draws from 3 budgets: all appear (seeded, so stable)
    for i, target in enumerate(targets):
        # the same problems as without budgets, each followed by its budget (INTELLECT-2's placement)
        assert heldout.prompt(i) == f"{plain.prompt(i)} Think for {target} tokens before giving a response."
    assert training.prompt(0).endswith(f"Think for {training.target_length(0)} tokens before giving a response.")
    assert plain.target_length(0) is None and "Think for" not in plain.prompt(0)


def test_the_mix_source_is_reseeded_and_keeps_both_task_types():
    """tasks.source = "mix" (a seeded generator) is re-seeded with the evaluator seed, like arithmetic,
    instead of sliced like a file: both task types, budgets on, no training prompt."""
    from prime_rl.config import GENERATED_SOURCES
    from prime_rl.tasks import load_tasks

    assert "mix" in GENERATED_SOURCES
    mix = TasksConfig(source="mix", num_tasks=200, length_reward="exact", target_lengths=[40, 48])
    training = load_tasks(mix)
    heldout = heldout_task_set(mix, 40, seed=7, training=training)
    seen = {training.task(i).prompt for i in range(len(training))}
    held = [heldout.task(i) for i in range(len(heldout))]
    assert len(held) == 40 and not seen & {t.prompt for t in held}
    assert {t.task_type for t in held} == {"verifiable_math", "prime_rl_code"}
    assert {heldout.target_length(i) for i in range(40)} == {40, 48}
    again = heldout_task_set(mix, 40, seed=7, training=training)
    assert [again.prompt(i) for i in range(40)] == [heldout.prompt(i) for i in range(40)]
    other = heldout_task_set(mix, 40, seed=8, training=training)
    assert [other.prompt(i) for i in range(40)] != [heldout.prompt(i) for i in range(40)]


def test_the_heldout_set_balances_task_families_and_keeps_their_prompt_templates():
    """The demo's mix: 1-digit sums have only 100 distinct prompts, 53 of them in training (29 are
    test problems that never train); split "all" still gets half of its problems from each family
    (round-robin), every one unseen in training and rendered with its family's own few-shot template."""
    from prime_rl.tasks import load_tasks

    config = load_config(Path(__file__).parents[1] / "configs" / "tiny-cpu.toml")
    training = load_tasks(config.tasks)
    heldout = heldout_task_set(config.tasks, 64, config.evaluator.seed, training=training)
    families = [heldout.task(i).task_type for i in range(len(heldout))]
    assert len(heldout) == 64
    assert families.count("verifiable_math") == families.count("prime_rl_code") == 32
    seen = {training.task(i).prompt for i in range(len(training))}
    assert not seen & {heldout.task(i).prompt for i in range(len(heldout))}
    for i in range(len(heldout)):
        template = config.tasks.prompt_templates[families[i]]
        assert heldout.prompt(i).startswith(template[: template.index("{prompt}")])


def test_a_small_family_gives_what_it_has_and_the_others_fill_the_rest(tmp_path: Path):
    rows = [{"prompt": f"a{i}", "answer": "1", "task_type": "a"} for i in range(10)]
    rows.insert(4, {"prompt": "b0", "answer": "1", "task_type": "b"})
    path = tmp_path / "tasks.jsonl"
    path.write_text("".join(json.dumps(row) + "\n" for row in rows))
    config = TasksConfig(source="jsonl", path=str(path), num_tasks=1)  # trains on a0; held out: the next 4 rows
    heldout = heldout_task_set(config, 4, seed=0)
    assert [heldout.task(i).prompt for i in range(len(heldout))] == ["a1", "b0", "a2", "a3"]


class _TextTokenizer:
    """One token per character (the fake backend reads the prompt back)."""

    def __call__(self, text: str) -> dict[str, list[int]]:
        return {"input_ids": [ord(c) for c in text]}


class _BudgetBackend:
    """Answers each prompt with (its budget + offset) tokens, the offsets in prompt order."""

    policy_version = 5
    tokenizer = _TextTokenizer()

    def __init__(self, offsets: list[int]) -> None:
        self.offsets = list(offsets)

    def generate(self, prompts, seeds, params):  # type: ignore[no-untyped-def]
        import re

        from prime_rl.inference.backend import Completion

        out = []
        for ids in prompts:
            budget = re.search(r"Think for (\d+) tokens", "".join(map(chr, ids)))
            length = (int(budget.group(1)) if budget else 20) + self.offsets.pop(0)
            out.append(Completion(tuple(ids), (1,) * length, (0.0,) * length, b"", 0, "length", "x"))
        return out


def test_evaluate_reports_accuracy_per_task_type_and_distance_to_the_budget():
    from types import SimpleNamespace

    from prime_rl.tasks import TaskSet

    # (task_type, reward): a task without task_type counts as "task"; 0.5 is partial credit
    spec = [("verifiable_math", 1.0), ("verifiable_math", 0.0), ("prime_rl_code", 1.0),
            ("verifiable_math", 1.0), ("prime_rl_code", 0.5), (None, 0.0)]  # fmt: skip
    problems = [
        SimpleNamespace(prompt=f"problem {i}", reward=reward, **({"task_type": kind} if kind else {}))
        for i, (kind, reward) in enumerate(spec)
    ]
    offsets = [-3, 0, 5, -10, 2, 4]  # |offsets| sum to 24 -> mean distance 24 / 6 = 4.0
    budgeted = TaskSet(problems, length_reward="exact", target_lengths=[8, 16, 32], seed=3)
    result = evaluate(
        _BudgetBackend(offsets), budgeted, max_new_tokens=64, batch_size=4, score=lambda task, _: task.reward
    )
    assert result.policy_version == 5
    assert (result.num_correct, result.num_problems) == (3, 6)
    assert result.accuracy == pytest.approx(3.5 / 6)  # 1 + 0 + 1 + 1 + 0.5 + 0
    assert result.by_type == {
        "verifiable_math": {"num_correct": 2, "num_problems": 3, "accuracy": pytest.approx(2 / 3)},
        "prime_rl_code": {"num_correct": 1, "num_problems": 2, "accuracy": 0.75},
        "task": {"num_correct": 0, "num_problems": 1, "accuracy": 0.0},
    }
    assert result.mean_length_distance == pytest.approx(4.0)
    targets = [t for i in range(6) if (t := budgeted.target_length(i)) is not None]
    assert len(targets) == 6 and result.mean_target_length == pytest.approx(sum(targets) / 6)
    assert result.mean_completion_tokens == pytest.approx((sum(targets) + sum(offsets)) / 6)
    unbudgeted = evaluate(
        _BudgetBackend(offsets), TaskSet(problems), max_new_tokens=64, score=lambda task, _: task.reward
    )
    assert unbudgeted.mean_length_distance is None and unbudgeted.mean_target_length is None
    assert unbudgeted.by_type == result.by_type


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
    from prime_rl.evaluator import process as evaluator
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
        assert record["by_type"] == again.by_type == {
            "arithmetic_exact": {"num_correct": again.num_correct, "num_problems": 6, "accuracy": again.accuracy}
        }
        assert record["mean_length_distance"] is None and record["mean_target_length"] is None  # no budgets
    # the versions really differ (so the equalities above identify the weights used)
    assert len({tuple(map(tuple, r["examples"])) for r in evals}) == 3
