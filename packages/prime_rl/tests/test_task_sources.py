"""Bring-your-own data: column mapping for parquet/JSONL, Hugging Face datasets from local files,
the chat template applied identically by worker, validator and evaluator, and an evaluator that a
small dataset does not stop."""

from __future__ import annotations

import json
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

import verifiers
from prime_rl.config import ConfigError, TasksConfig, load_config
from prime_rl.evaluator.heldout import EvaluatorError, heldout_task_set
from prime_rl.reward import run_tasks
from prime_rl.tasks import TaskSourceError, encode_prompt, load_tasks, map_row

PROBLEMS = [{"question": f"What is {a} times 3?", "answer": str(3 * a), "level": a % 3} for a in range(12)]


def _parquet(path: Path, rows: list[dict]) -> Path:
    pq.write_table(pa.Table.from_pylist(rows), path)
    return path


def test_columns_map_a_question_answer_parquet_onto_math_tasks(tmp_path: Path):
    path = _parquet(tmp_path / "math.parquet", PROBLEMS)
    config = TasksConfig(source="parquet", path=str(path), columns={"prompt": "question", "answer": "answer"})
    tasks = load_tasks(config)
    assert len(tasks) == 12
    task = tasks.task(5)
    assert task.prompt == "What is 5 times 3?" and task.task_type == "verifiable_math"
    assert task.verification_info == {"ground_truth": "15"} and task.metadata["level"] == 2
    # the mapped task is scored by verifiers' math verifier like an INTELLECT-2 row
    assert verifiers.verify(task, "... so \\boxed{15}").reward == 1.0
    assert verifiers.verify(task, "\\boxed{16}").reward == 0.0


def test_the_mix_source_interleaves_math_and_code_tasks_with_their_own_settings():
    """source = "mix": math tasks from the arithmetic settings (scored by the math verifier) and
    tasks.code.share code tasks from [tasks.code], in a seeded order; no path needed."""
    config = TasksConfig(
        source="mix", num_tasks=40, ops=["+"], digits=1, arithmetic_template="Q: {expression}?",
        code={"share": 0.25, "ops": ["*"], "min_digits": 2, "digits": 2},
    )  # fmt: skip
    tasks = load_tasks(config)
    by_type: dict[str, list] = {}
    for i in range(len(tasks)):
        by_type.setdefault(tasks.task(i).task_type, []).append(tasks.task(i))
    assert {k: len(v) for k, v in by_type.items()} == {"verifiable_math": 30, "prime_rl_code": 10}
    assert all(t.prompt.startswith("Q: ") and " + " in t.prompt for t in by_type["verifiable_math"])
    for task in by_type["prime_rl_code"]:
        left, right = task.verification_info["expression"].split(" * ")
        assert task.prompt == f"Use Python to compute {left} * {right}." and 10 <= int(left) <= 99
    types = [tasks.task(i).task_type for i in range(len(tasks))]
    assert types != sorted(types)  # interleaved, not 30 math then 10 code
    assert [tasks.prompt(i) for i in range(40)] == [load_tasks(config).prompt(i) for i in range(40)]
    reseeded = load_tasks(config.model_copy(update={"seed": 1}))
    assert [reseeded.prompt(i) for i in range(40)] != [tasks.prompt(i) for i in range(40)]
    with pytest.raises(ValueError, match="min_digits"):
        TasksConfig(source="mix", code={"min_digits": 3, "digits": 2})


def test_each_task_family_gets_its_own_prompt_template_and_others_the_default():
    config = TasksConfig(
        source="mix", num_tasks=20, digits=1, length_reward="exact", target_lengths=[8],
        prompt_template="DEFAULT {prompt}", prompt_templates={"prime_rl_code": "CODE EXAMPLES\n{prompt}\nA:"},
    )  # fmt: skip
    tasks = load_tasks(config)
    for i in range(len(tasks)):
        task = tasks.task(i)
        with_budget = f"{task.prompt} Think for 8 tokens before giving a response."
        expected = f"CODE EXAMPLES\n{with_budget}\nA:" if task.task_type == "prime_rl_code" else f"DEFAULT {with_budget}"
        assert tasks.prompt(i) == expected
    with pytest.raises(ValueError, match=r"prompt_templates.verifiable_math must contain"):
        TasksConfig(prompt_templates={"verifiable_math": "no placeholder"})
    with pytest.raises(TaskSourceError, match=r"prompt_templates.x must contain"):
        type(tasks)([{"prompt": "q"}], prompt_templates={"x": "none"})


def test_a_task_family_with_its_own_budgets_draws_from_them_and_the_held_out_set_too():
    from prime_rl.config import RunConfig
    from prime_rl.evaluator.heldout import heldout_task_set
    from prime_rl.reward import RunTasks

    config = TasksConfig(
        source="mix", num_tasks=40, digits=1, length_reward="exact", target_lengths=[8, 9],
        target_lengths_by_type={"prime_rl_code": [30]},
    )  # fmt: skip
    tasks = load_tasks(config)
    budgets = {"prime_rl_code": set(), "verifiable_math": set()}
    for i in range(len(tasks)):
        task, budget = tasks.task(i), tasks.target_length(i)
        budgets[task.task_type].add(budget)
        assert tasks.prompt(i).endswith(f"Think for {budget} tokens before giving a response.")
    assert budgets == {"prime_rl_code": {30}, "verifiable_math": {8, 9}}
    code = next(i for i in range(len(tasks)) if tasks.task(i).task_type == "prime_rl_code")
    assert RunTasks(tasks, tokenizer=None, length_alpha=0.1).budget(code).target == 30  # the reward's budget
    heldout = heldout_task_set(config, 8, seed=5, training=tasks)
    assert {heldout.target_length(i) for i in range(len(heldout)) if heldout.task(i).task_type == "prime_rl_code"} == {30}
    assert RunConfig(tasks=config.model_dump()).tasks.target_lengths_by_type == {"prime_rl_code": [30]}
    with pytest.raises(ValueError, match=r"target_lengths_by_type.prime_rl_code must be non-empty"):
        TasksConfig(length_reward="exact", target_lengths_by_type={"prime_rl_code": []})
    with pytest.raises(TaskSourceError, match="non-empty target_lengths_by_type"):
        type(tasks)([{"prompt": "q"}], length_reward="exact", target_lengths=[8], target_lengths_by_type={"x": []})


def test_jsonl_with_intellect2_columns_needs_no_mapping_and_bad_mappings_are_named(tmp_path: Path):
    path = tmp_path / "rows.jsonl"
    rows = [{"prompt": "1+1?", "task_type": "verifiable_math", "verification_info": json.dumps({"ground_truth": "2"})}]
    path.write_text("\n".join(json.dumps(r) for r in rows) + "\n")
    assert load_tasks(TasksConfig(source="jsonl", path=str(path))).task(0).verification_info == {"ground_truth": "2"}
    with pytest.raises(TaskSourceError, match=r"tasks\.columns\.prompt = 'question'.*no column 'question'"):
        load_tasks(TasksConfig(source="jsonl", path=str(path), columns={"prompt": "question"}))
    with pytest.raises(ValueError, match="unknown task fields"):
        TasksConfig(columns={"prompt": "q", "gold": "a"})


def test_map_row_oracle():
    assert map_row({"q": "x", "a": 1, "r": 0.5}, {"prompt": "q", "answer": "a", "solve_rate": "r"}, "t") == {
        "q": "x", "a": 1, "r": 0.5, "prompt": "x", "verification_info": {"ground_truth": 1},
        "solve_rate_qwen_r1_distill_7b": 0.5, "task_type": "t",
    }  # fmt: skip
    assert map_row({"prompt": "x", "task_type": "code"}, {}, "verifiable_math")["task_type"] == "code"


def test_hugging_face_datasets_from_local_files(tmp_path: Path):
    datasets = pytest.importorskip("datasets", reason="datasets not installed (pip install 'prime-rl[datasets]')")
    columns = {"prompt": "question", "answer": "answer"}
    saved = tmp_path / "saved"
    datasets.DatasetDict({"train": datasets.Dataset.from_list(PROBLEMS[:8]),
                          "test": datasets.Dataset.from_list(PROBLEMS[8:])}).save_to_disk(str(saved))  # fmt: skip
    train = load_tasks(TasksConfig(source="datasets", path=str(saved), columns=columns))
    test = load_tasks(TasksConfig(source="datasets", path=str(saved), split="test", columns=columns))
    assert [train.task(i).prompt for i in range(len(train))] == [p["question"] for p in PROBLEMS[:8]]
    assert [test.task(i).verification_info["ground_truth"] for i in range(len(test))] == ["24", "27", "30", "33"]
    folder = tmp_path / "folder"
    folder.mkdir()
    _parquet(folder / "train.parquet", PROBLEMS)  # a folder of data files, as a hub snapshot has
    assert len(load_tasks(TasksConfig(source="datasets", path=str(folder), columns=columns))) == 12
    single = _parquet(tmp_path / "one.parquet", PROBLEMS[:3])
    assert len(load_tasks(TasksConfig(source="datasets", path=str(single), columns=columns))) == 3
    with pytest.raises(TaskSourceError, match="splits"):
        load_tasks(TasksConfig(source="datasets", path=str(saved), split="validation", columns=columns))


CHAT = (
    "{% for m in messages %}<{{ m['role'] }}>{{ m['content'] }}\n{% endfor %}"
    "{% if add_generation_prompt %}<assistant>{% endif %}"
)


def test_chat_template_is_applied_identically_everywhere(tiny_tokenizer):
    tiny_tokenizer.chat_template = CHAT
    config = load_config(None, ["--tasks.chat_template", "true", "--tasks.system_prompt", "Be brief.",
                                "--tasks.num_tasks", "20"])  # fmt: skip
    book = run_tasks(config, tiny_tokenizer)  # what the worker and the validator use
    heldout = heldout_task_set(config.tasks, 8, seed=5)  # what the evaluator uses
    for task_id in range(book.num_tasks):
        text = book.task_set.prompt(task_id)
        expected = tiny_tokenizer(f"<system>Be brief.\n<user>{text}\n<assistant>", add_special_tokens=False)["input_ids"]
        # the worker encodes the lease's prompt text; the validator recomputes from the task id
        assert book.encode(text) == list(book.prompt_tokens(task_id)) == expected
    for index in range(len(heldout)):
        text = heldout.prompt(index)
        assert heldout.encode(tiny_tokenizer, text) == book.encode(text)
    # off (the default): plain tokenisation, as before
    plain = run_tasks(load_config(None), tiny_tokenizer)
    assert list(plain.prompt_tokens(0)) == tiny_tokenizer(plain.task_set.prompt(0))["input_ids"]


def test_chat_template_without_one_in_the_tokenizer_is_a_clear_error(tiny_tokenizer):
    tiny_tokenizer.chat_template = None
    with pytest.raises(TaskSourceError, match="no chat template"):
        encode_prompt(tiny_tokenizer, "hi", chat_template=True)
    with pytest.raises(ConfigError, match=r"system_prompt needs tasks\.chat_template"):
        load_config(None, ["--tasks.system_prompt", "x"])


def test_evaluator_on_a_separate_task_set_and_on_a_small_dataset(tmp_path: Path, caplog: pytest.LogCaptureFixture):
    columns = {"prompt": "question", "answer": "answer"}
    train_path = _parquet(tmp_path / "train.parquet", PROBLEMS[:10])
    test_path = _parquet(tmp_path / "test.parquet", PROBLEMS[6:12])  # overlaps training in 6..9
    tasks = TasksConfig(source="parquet", path=str(train_path), columns=columns, num_tasks=10)
    separate = heldout_task_set(tasks, 4, seed=0, overrides={"path": str(test_path)})
    assert [separate.prompt(i) for i in range(len(separate))] == [PROBLEMS[10]["question"], PROBLEMS[11]["question"]]
    assert "only 2 held-out problems" in caplog.text  # fewer than asked: a warning, not a stop
    # the training file itself has no rows beyond the training slice: advice for files, not arithmetic
    with pytest.raises(EvaluatorError, match=r"evaluator\.tasks at a separate file") as raised:
        heldout_task_set(tasks, 4, seed=0)
    assert "digits" not in str(raised.value)
    with pytest.raises(ConfigError, match="unknown \\[tasks\\] keys"):
        load_config(None, ["--evaluator.tasks", "{pth = 'x'}"])


def test_evaluator_process_without_held_out_problems_exits_cleanly(tmp_path: Path, tiny_lm_dir: Path):
    """A dataset too small for a held-out set ends the evaluator alone (exit 0), never the run."""
    from prime_rl.evaluator.process import main
    from prime_rl.metrics import read_metrics

    path = _parquet(tmp_path / "train.parquet", PROBLEMS[:4])
    config = load_config(None, ["--run_dir", str(tmp_path / "run"), "--model.path", str(tiny_lm_dir),
                                "--tasks.source", "parquet", "--tasks.path", str(path), "--tasks.num_tasks", "4",
                                "--tasks.columns", "{prompt = 'question', answer = 'answer'}"])  # fmt: skip
    assert main(config) == 0
    events = list(read_metrics(tmp_path / "run" / "metrics" / "evaluator.jsonl"))
    (skipped,) = [e for e in events if e["event"] == "eval_skipped"]
    assert "only 0 held-out problems" in skipped["reason"]
