"""The INTELLECT-2 recipe's end-of-run report and live progress lines, read from the metrics
files every process writes (including a torn last line of a killed process)."""

from __future__ import annotations

from pathlib import Path

import pytest


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
        evaluator.log(
            "eval", policy_version=version, accuracy=accuracy, num_correct=round(accuracy * 64), num_problems=64
        )
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
    from prime_rl.launch.report import summarize_run, wilson_interval

    _write_synthetic_run(tmp_path)
    summary = summarize_run(tmp_path)
    assert summary.steps_done == 3
    assert summary.reward_by_step == {0: pytest.approx(0.30), 1: 0.5, 2: 0.75}  # (0.25 + 0.35) / 2
    assert summary.accuracy_by_version == {0: 0.125, 3: 0.5}
    assert summary.accuracy_interval_by_version == {0: wilson_interval(8, 64), 3: wilson_interval(32, 64)}
    assert summary.trainer_wait_s == 6.0 and summary.worker_wait_s == 1.5
    assert summary.tokens_per_s == 20.0  # 400 tokens / 20 s of generation
    assert summary.sampled_reward_by_version == {0: 0.25, 2: 0.5}  # the hostile claim is left out
    assert [(w.name, w.accepted, w.rejected, w.banned) for w in summary.workers] == [
        ("hostile-0", 0, 32, True),
        ("worker-0", 96, 0, False),
    ]


def _write_task_mix_metrics(run_dir: Path) -> None:
    """Evaluator records of a math + code held-out set with length budgets, and two validators'
    cumulative sandbox counts (one of them with a record from before the count existed)."""
    from prime_rl.metrics import MetricsWriter

    evaluator = MetricsWriter(run_dir / "metrics" / "evaluator.jsonl", role="evaluator", name="evaluator")
    for version, (math_ok, code_ok, distance) in {0: (15, 2, 41.2), 4: (22, 5, 20.0), 8: (30, 7, 12.5)}.items():
        evaluator.log(
            "eval", policy_version=version, accuracy=(math_ok + code_ok) / 64, num_correct=math_ok + code_ok,
            num_problems=64, mean_length_distance=distance, mean_target_length=384.0,
            by_type={"verifiable_math": {"num_correct": math_ok, "num_problems": 48, "accuracy": math_ok / 48},
                     "prime_rl_code": {"num_correct": code_ok, "num_problems": 16, "accuracy": code_ok / 16}},
        )  # fmt: skip
    first = MetricsWriter(run_dir / "metrics" / "validator.jsonl", role="validator", name="validator")
    first.log("verdict", accepted=8, rejected=0)  # an older validator: no count
    first.log("verdict", accepted=8, rejected=0, sandbox_runs={"bwrap": 3})
    first.log("verdict", accepted=8, rejected=0, sandbox_runs={"bwrap": 7})
    second = MetricsWriter(run_dir / "metrics" / "validator-1.jsonl", role="validator", name="validator-1")
    second.log("verdict", accepted=8, rejected=0, sandbox_runs={"bwrap": 2})
    for writer in (evaluator, first, second):
        writer.close()


def test_summary_reads_accuracy_per_task_type_length_distance_and_sandbox_runs(tmp_path: Path):
    from prime_rl.launch.report import render_summary, summarize_run, wilson_interval

    _write_task_mix_metrics(tmp_path)
    summary = summarize_run(tmp_path)
    assert summary.accuracy_by_type == {
        "prime_rl_code": {0: 2 / 16, 4: 5 / 16, 8: 7 / 16},
        "verifiable_math": {0: 15 / 48, 4: 22 / 48, 8: 30 / 48},
    }
    assert summary.accuracy_interval_by_type["prime_rl_code"] == {
        0: wilson_interval(2, 16), 4: wilson_interval(5, 16), 8: wilson_interval(7, 16)
    }
    assert summary.problems_by_type == {"prime_rl_code": 16, "verifiable_math": 48}
    assert summary.length_distance_by_version == {0: 41.2, 4: 20.0, 8: 12.5}
    assert summary.sandbox_runs == {"bwrap": 9}  # the last cumulative count of each validator: 7 + 2
    text = render_summary(summary)
    # Wilson, 15/48: centre (0.3125 + 1.96²/96) / (1 + 1.96²/48) = 0.3264, half-width 0.1269 -> [0.20, 0.45];
    # 30/48 -> [0.48, 0.75]; 12.5 / 41.2 = 30%
    assert "  verifiable_math (48 problems): v0 0.312 [0.20, 0.45] -> v8 0.625 [0.48, 0.75]" in text
    assert "  prime_rl_code (16 problems): v0 0.125 [0.03, 0.36] -> v8 0.438 [0.23, 0.67]" in text
    assert "distance to length budget (held-out, greedy): v0 41.2 -> v8 12.5 tokens (30% of v0)" in text
    assert "code samples run in the sandbox by the validator: 9 (bwrap)" in text


def test_sandbox_runs_of_several_kinds_and_of_validators_that_ran_none(tmp_path: Path):
    from prime_rl.launch.report import render_summary, summarize_run
    from prime_rl.metrics import MetricsWriter

    writer = MetricsWriter(tmp_path / "metrics" / "validator.jsonl", role="validator", name="validator")
    writer.log("verdict", sandbox_runs={})
    writer.close()
    assert summarize_run(tmp_path).sandbox_runs == {}  # counted, none run: the line says 0
    assert "code samples run in the sandbox by the validator: 0\n" in render_summary(summarize_run(tmp_path)) + "\n"
    writer = MetricsWriter(tmp_path / "metrics" / "validator-1.jsonl", role="validator", name="validator-1")
    writer.log("verdict", sandbox_runs={"rlimit": 1, "bwrap": 4})
    writer.close()
    text = render_summary(summarize_run(tmp_path))
    assert "code samples run in the sandbox by the validator: 5 (bwrap 4, rlimit 1)" in text


def _png_width(path: Path) -> int:
    return int.from_bytes(path.read_bytes()[16:20], "big")  # IHDR width, right after the signature


def test_plot_adds_the_length_panel_and_a_line_per_task_type(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    from prime_rl.launch import report, report_plot

    drawn: list[tuple[str, ...]] = []
    real = report_plot._plot_accuracy_by_type

    def spy(axis: object, summary: report.RunSummary) -> None:
        drawn.append(tuple(summary.accuracy_by_type))
        real(axis, summary)

    monkeypatch.setattr(report_plot, "_plot_accuracy_by_type", spy)
    _write_task_mix_metrics(tmp_path / "mix")
    report.write_report(tmp_path / "mix")
    assert _png_width(tmp_path / "mix" / "report.png") == 2000  # 4 panels of 5 inches at 100 dpi
    assert drawn == [("prime_rl_code", "verifiable_math")]
    _write_synthetic_run(tmp_path / "old")  # records from before by_type and the length distance
    report.write_report(tmp_path / "old")
    assert _png_width(tmp_path / "old" / "report.png") == 1500 and len(drawn) == 1


def test_write_report_makes_png_and_summary(tmp_path: Path):
    from prime_rl.launch.report import write_report

    _write_synthetic_run(tmp_path)
    summary, text = write_report(tmp_path)
    png = (tmp_path / "report.png").read_bytes()
    assert png[:8] == b"\x89PNG\r\n\x1a\n" and len(png) > 10_000
    assert (tmp_path / "summary.txt").read_text().strip() == text
    assert "0.125 at v0 -> 0.500 at v3 (+0.375)" in text
    assert "per version (95% interval): v0: 0.125 [0.06, 0.23]  v3: 0.500 [0.38, 0.62]" in text
    assert "rollout reward of honest workers by policy version: v0: 0.250  v2: 0.500" in text
    assert "hostile-0: 0 accepted, 32 rejected (toploc_mismatch: 32) BANNED" in text
    assert str(tmp_path / "report.png") in text
    assert summary.files["plot"] == tmp_path / "report.png"
    # metrics from before the task mix: no per-type, length or sandbox lines
    assert summary.accuracy_by_type == {} and summary.length_distance_by_version == {}
    assert summary.sandbox_runs is None
    assert "problems):" not in text and "length budget" not in text and "sandbox" not in text


def test_report_without_matplotlib_writes_the_summary_and_says_why_there_is_no_plot(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
):
    """Before: write_report raised ModuleNotFoundError before summary.txt existed, and the recipe's
    weight clean-up after it never ran. Now: the summary is written and names the extra."""
    import sys

    from prime_rl.launch.report import write_report

    _write_synthetic_run(tmp_path)
    monkeypatch.setitem(sys.modules, "matplotlib", None)  # import matplotlib -> ImportError
    summary, text = write_report(tmp_path)
    assert not (tmp_path / "report.png").exists() and "plot" not in summary.files
    assert (tmp_path / "summary.txt").read_text().strip() == text
    assert "0.125 at v0 -> 0.500 at v3 (+0.375)" in text
    assert text.endswith("no plot: matplotlib is not installed (pip install 'intellect2-prime-rl[plot]')")


def test_report_of_an_empty_run_does_not_crash(tmp_path: Path):
    from prime_rl.launch.report import render_summary, summarize_run, write_report

    (tmp_path / "metrics").mkdir()
    summary = summarize_run(tmp_path)
    assert summary.steps_done == 0 and summary.accuracy_by_version == {} and summary.workers == ()
    assert "0 policy steps" in render_summary(summary)
    write_report(tmp_path)
    assert (tmp_path / "report.png").stat().st_size > 0


def test_progress_tracker_emits_one_line_per_committed_step(tmp_path: Path):
    from prime_rl.launch.progress import ProgressTracker
    from prime_rl.metrics import MetricsWriter

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


def test_wilson_interval_oracles():
    """Textbook values of the 95% Wilson score interval, and its edges."""
    from prime_rl.launch.report import wilson_interval

    for (k, n), (lo, hi) in {(5, 10): (0.2366, 0.7634), (0, 10): (0.0, 0.2775), (10, 10): (0.7225, 1.0),
                             (21, 64): (0.2257, 0.4500)}.items():  # fmt: skip  (21/64: the demo's v0 accuracy)
        assert wilson_interval(k, n) == (pytest.approx(lo, abs=1e-4), pytest.approx(hi, abs=1e-4)), (k, n)
    assert wilson_interval(0, 0) == (0.0, 1.0)
