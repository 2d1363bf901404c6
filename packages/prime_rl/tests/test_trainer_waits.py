"""Issue 48 item 3: nothing stalls in silence. The trainer says why it waits, with the counts, at a
bounded interval; a reward that cannot vary is warned about early; the run's summary names it.

Before: a run whose reward was constant waited forever on "0 fresh accepted samples available",
with no word that every group had zero advantage and was filtered out.
"""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import pytest

from prime_rl.launch.waits import trainer_wait_summary
from prime_rl.metrics import MetricsWriter
from prime_rl.trainer.waiting import CONSTANT_GROUPS, ConstantRewardWatch, explain_wait
from verifiers import Task
from verifiers.envs import Message, RewardFunc, Rubric, SingleTurnEnv


def always_one(task: Task, messages: tuple[Message, ...]) -> float:
    return 1.0


class ConstantEnv(SingleTurnEnv):
    """A single-turn environment whose reward cannot vary: every group has zero advantage."""

    def __init__(self) -> None:
        super().__init__(Rubric((RewardFunc("always_one", always_one),)))


def _claim(available=0, zero=0, held=0, pending_batches=0, pending_samples=0, stale=0) -> Any:
    return SimpleNamespace(
        available_samples=available, zero_advantage_samples=zero, held_samples=held,
        pending_batches=pending_batches, pending_samples=pending_samples, stale_samples=stale,
    )  # fmt: skip


def test_the_cause_is_the_first_that_explains_the_missing_samples() -> None:
    # 16 needed, 4 available: 12 missing; 12 in zero-advantage groups would have filled the step
    why = explain_wait(_claim(available=4, zero=12, held=8, pending_batches=1, pending_samples=8), 16, filter_zero_advantage=True)
    assert why.cause == "zero_advantage" and why.line.startswith("every group's rewards are equal")
    assert "(4/16 fresh informative samples; 12 in zero-advantage groups; 8 held for evidence; 1 batches (8 samples)" in why.line
    # 11 zero-advantage samples cannot fill 12 missing ones: the held samples are the cause
    assert explain_wait(_claim(available=4, zero=11, held=8), 16, filter_zero_advantage=True).cause == "held"
    assert explain_wait(_claim(zero=64), 16, filter_zero_advantage=False).cause == "generation"  # not filtered
    assert explain_wait(_claim(pending_batches=2), 16, filter_zero_advantage=True).cause == "validation"
    assert explain_wait(_claim(stale=3), 16, filter_zero_advantage=True).cause == "stale"
    assert explain_wait(_claim(), 16, filter_zero_advantage=True).cause == "generation"


def test_a_constant_reward_is_warned_about_once_after_the_groups() -> None:
    watch = ConstantRewardWatch(group_size=4)
    assert watch.check(_claim(zero=4 * CONSTANT_GROUPS - 1), filter_zero_advantage=True) is None
    assert watch.check(_claim(available=2, zero=4 * CONSTANT_GROUPS), filter_zero_advantage=True) is None
    warning = watch.check(_claim(zero=4 * CONSTANT_GROUPS), filter_zero_advantage=True)
    assert warning is not None and warning.startswith("the reward has not varied within any of the 32 accepted samples")
    assert watch.check(_claim(zero=400), filter_zero_advantage=True) is None  # once


def test_the_summary_names_the_longest_wait_and_its_cause(tmp_path: Any) -> None:
    assert trainer_wait_summary(tmp_path) is None
    metrics = MetricsWriter(tmp_path / "metrics" / "trainer.jsonl", role="trainer", name="trainer")
    metrics.log("wait", step=0, cause="generation", waited_s=3.0, available=0, zero_advantage=0)
    metrics.log("wait", step=1, cause="zero_advantage", waited_s=41.6, available=0, zero_advantage=48)
    metrics.log("constant_reward", step=1, zero_advantage=48)
    summary = trainer_wait_summary(tmp_path)
    assert summary is not None and summary.startswith("trainer waited for data: longest 42 s at step 1 (zero_advantage)")
    assert "48 in zero-advantage groups" in summary and "constant_reward" in summary


@pytest.mark.slow
def test_a_constant_reward_run_prints_why_the_trainer_waits(tiny_run: Any, helpers: Any) -> None:
    config_path, run_dir = tiny_run(
        tasks={"environment": {"name": f"{__file__}:ConstantEnv"}},
        trainer={"total_steps": 2, "samples_per_step": 8, "filter_zero_advantage": True, "wait_log_every_s": 1.0},
        workers={"count": 1, "hostile": []},
    )
    run = helpers.start_run(config_path)
    trainer_log = run_dir / "logs" / "trainer.out"

    def said(text: str) -> bool:
        return trainer_log.exists() and text in trainer_log.read_text()

    try:
        helpers.wait_for(lambda: run.poll() is not None or said("every group's rewards are equal"), 240, "the wait line")
        helpers.wait_for(lambda: run.poll() is not None or said("the reward has not varied"), 240, "the warning")
    finally:
        output = helpers.interrupt_run(run)
    log = trainer_log.read_text()
    assert "step 0: waiting for data for " in log, log[-3000:]
    assert "so the groups have zero advantage and are filtered out (trainer.filter_zero_advantage)" in log
    assert "in zero-advantage groups" in log
    # the run's own output names it when it stops, and nothing was trained
    assert "trainer waited for data: longest" in output and "(zero_advantage)" in output, output[-3000:]
    assert not [e for e in helpers.metrics_of(run_dir, "orchestrator") if e["event"] == "commit"]
