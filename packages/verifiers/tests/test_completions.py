"""Chat-format completions: completion_text, verify on messages, and reward_func as TRL calls it."""

from __future__ import annotations

import json
import tempfile

import pytest

from verifiers import Task, TaskFormatError, arithmetic_tasks, completion_text, reward_func, verify

ASSISTANT = {"role": "assistant", "content": "The sum is 42."}


@pytest.mark.parametrize(
    ("completion", "text"),
    [
        ("plain 42", "plain 42"),
        ([ASSISTANT], "The sum is 42."),
        (ASSISTANT, "The sum is 42."),
        ([], ""),
        # After a tool call: the assistant turns in order, the tool's output left out.
        (
            [
                {"role": "assistant", "content": None, "tool_calls": [{"name": "add"}]},
                {"role": "tool", "content": "41"},
                {"role": "assistant", "content": "So 42."},
            ],
            "So 42.",
        ),
        ([{"role": "assistant", "content": "a"}, {"role": "assistant", "content": "b"}], "a\n\nb"),
        ([{"role": "assistant", "content": [{"type": "text", "text": "4"}, {"type": "image"}, "2"]}], "42"),
    ],
)
def test_completion_text(completion, text: str) -> None:
    assert completion_text(completion) == text


@pytest.mark.parametrize("bad", [42, None, [42], [{"role": "assistant"}], [{"role": "assistant", "content": 4}]])
def test_completion_text_rejects_what_is_not_a_completion(bad) -> None:
    with pytest.raises(TypeError):
        completion_text(bad)


def test_verify_accepts_chat_messages() -> None:
    task = Task("What is 40 + 2?", "arithmetic_exact", {"answer": 42})
    assert verify(task, [ASSISTANT]).reward == 1.0  # used to raise TypeError
    assert verify(task, ASSISTANT).reward == 1.0
    assert verify(task, "The sum is 42.").reward == 1.0
    # A tool's output is not the model's answer.
    assert verify(task, [{"role": "tool", "content": "42"}, {"role": "assistant", "content": "no idea"}]).reward == 0.0
    with pytest.raises(TypeError):
        verify(task, 42)  # type: ignore[arg-type]


def trl_call(fn, prompts, completions, rows, **extra):
    """As TRL's GRPOTrainer._calculate_rewards calls a reward function."""
    columns = {key: [row[key] for row in rows] for key in rows[0] if key != "prompt"}
    return fn(prompts=prompts, completions=completions, completion_ids=[[1, 2]] * len(completions), **columns, **extra)


def test_reward_func_plain_and_chat() -> None:
    rows = [task.to_row() for task in arithmetic_tasks(2, seed=3)]
    answers = [str(json.loads(row["verification_info"])["answer"]) for row in rows]
    plain = trl_call(reward_func(), [r["prompt"] for r in rows], [answers[0], "no"], rows, trainer_state=None)
    assert plain == [1.0, 0.0]
    logged = {}
    chat = trl_call(
        reward_func(),
        [[{"role": "user", "content": r["prompt"]}] for r in rows],
        [[{"role": "assistant", "content": answers[0]}], [{"role": "assistant", "content": f"It is {answers[1]}"}]],
        rows,
        log_extra=lambda column, values: logged.update({column: values}),
        log_metric=lambda *a: None,
    )
    assert chat == [1.0, 1.0]
    assert logged == {"verifiers_failure": ["", ""]}


def test_reward_func_needs_a_task_type() -> None:
    fn = reward_func(name="math_reward")
    assert fn.__name__ == "math_reward"
    with pytest.raises(TaskFormatError, match="task_type"):
        fn(prompts=["1+1"], completions=["2"], verification_info=[{"answer": 2}])
    fixed = reward_func("arithmetic_exact")
    assert fixed(prompts=["1+1"], completions=["2"], verification_info=['{"answer": 2}']) == [1.0]


def test_a_real_trl_step_with_chat_completions(tiny_lm_dir) -> None:
    pytest.importorskip("trl")
    from datasets import Dataset
    from transformers import AutoTokenizer
    from trl import GRPOConfig, GRPOTrainer

    tokenizer = AutoTokenizer.from_pretrained(tiny_lm_dir)
    tokenizer.chat_template = "{% for m in messages %}{{ m['content'] }}{% endfor %}"
    rows = [task.to_row() for task in arithmetic_tasks(2, seed=0)]
    dataset = Dataset.from_list(
        [{**row, "prompt": [{"role": "user", "content": row["prompt"]}]} for row in rows]
    )
    seen: list = []
    score = reward_func()

    def spy(completions, **kwargs):
        seen.extend(completions)
        return score(completions=completions, **kwargs)

    trainer = GRPOTrainer(
        model=str(tiny_lm_dir),
        reward_funcs=[spy],
        args=GRPOConfig(
            output_dir=tempfile.mkdtemp(prefix="verifiers-trl-"),
            per_device_train_batch_size=4,
            num_generations=2,
            max_completion_length=6,
            max_steps=1,
            report_to="none",
            use_cpu=True,
            save_strategy="no",
        ),
        train_dataset=dataset,
        processing_class=tokenizer,
    )
    trainer.train()
    assert seen and all(isinstance(c, list) and c[0]["role"] == "assistant" for c in seen)
    assert "rewards/spy/mean" in trainer.state.log_history[0]
