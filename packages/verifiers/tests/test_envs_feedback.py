"""ToolEnv's feedback mode and the `replayable` declaration (issue 28: episodes a validator re-plays)."""

from __future__ import annotations

from verifiers import Task
from verifiers.envs import (
    FEEDBACK,
    CalculatorEnv,
    Environment,
    MathEnv,
    Message,
    PythonToolEnv,
    ToolEnv,
    run_episode,
)

TASK = Task("47 * 30?", "verifiable_math", {"ground_truth": "1410"})


def test_feedback_answers_a_wrong_final_answer_and_ends_on_a_right_one():
    script = iter(["\\boxed{1400}", "\\boxed{1410}", "never asked"])
    episode = run_episode(CalculatorEnv(feedback=True), TASK, lambda messages: next(script))
    assert [m.role for m in episode.messages[-3:]] == ["assistant", "user", "assistant"]
    assert episode.messages[-2] == Message("user", FEEDBACK)
    assert (episode.model_turns, episode.ended, episode.score.reward) == (2, "done", 1.0)


def test_without_feedback_a_wrong_answer_ends_the_episode():
    episode = run_episode(CalculatorEnv(), TASK, lambda messages: "\\boxed{1400}")
    assert (episode.model_turns, episode.ended, episode.score.reward) == (1, "done", 0.0)


def test_feedback_stops_at_the_turn_budget():
    episode = run_episode(CalculatorEnv(max_turns=3, feedback=True), TASK, lambda messages: "\\boxed{0}")
    assert (episode.model_turns, episode.ended) == (3, "max_turns")
    assert sum(m.role == "user" and m.content == FEEDBACK for m in episode.messages) == 3


def test_only_environments_that_declare_it_are_replayable():
    assert Environment.replayable is False  # the safe default: a validator refuses to trust its replies
    assert CalculatorEnv().replayable and PythonToolEnv().replayable and MathEnv().replayable
    clock = ToolEnv({"now": lambda arguments: "12:00"}, replayable=False)
    assert clock.replayable is False
