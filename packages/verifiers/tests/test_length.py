"""Length reward: INTELLECT-2's three modes, the instruction text, seeded targets."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from verifiers.length import (
    length_instruction,
    length_penalty,
    length_reward,
    sample_target_length,
    with_length_instruction,
)


def test_instruction_has_the_space():
    assert length_instruction(2000) == "Think for 2000 tokens before giving a response."
    assert length_instruction(2000, "clip") == "Think for maximally 2000 tokens before giving a response."
    assert (
        with_length_instruction("Solve x.", 10000)
        == "Solve x. Think for 10000 tokens before giving a response."
    )
    with pytest.raises(ValueError):
        length_instruction(0)


def test_exact_mode_hand_values():
    # r - 0.0003 * |L - L*|: 1000 tokens off costs 0.3; 4000 off makes the total negative
    assert length_reward(1.0, 3000, 2000, "exact") == pytest.approx(0.7, abs=1e-12)
    assert length_reward(1.0, 2000, 2000, "exact") == 1.0
    assert length_reward(0.0, 6000, 2000, "exact") == pytest.approx(-1.2, abs=1e-12)


def test_max_mode_hand_values():
    # r * clip(0.0003 * (L* - L) + 0.5, 0, 1)
    assert length_reward(1.0, 2000, 2000, "max") == 0.5
    assert length_reward(1.0, 0, 2000, "max") == 1.0  # 0.6 + 0.5 clipped to 1
    assert length_reward(1.0, 4000, 2000, "max") == 0.0  # -0.6 + 0.5 clipped to 0
    assert length_reward(1.0, 1000, 2000, "max") == pytest.approx(0.8, abs=1e-12)


def test_clip_mode():
    assert length_reward(1.0, 2000, 2000, "clip") == 1.0
    assert length_reward(1.0, 2001, 2000, "clip") == 0.0
    assert length_penalty(3000, 2000) == pytest.approx(-0.3, abs=1e-12)
    with pytest.raises(ValueError, match="mode"):
        length_reward(1.0, 1, 1, "linear")


@given(st.integers(0, 30000), st.integers(1, 30000), st.floats(0, 1))
def test_max_and_clip_stay_within_task_reward(length, target, reward):
    for mode in ("max", "clip"):
        assert 0.0 <= length_reward(reward, length, target, mode) <= reward


def test_seeded_targets_are_reproducible():
    draws = [sample_target_length(7, i) for i in range(50)]
    assert draws == [sample_target_length(7, i) for i in range(50)]
    assert set(draws) <= {500, 1000, 2000, 3000} and len(set(draws)) > 1
    ranged = sample_target_length(7, "p", targets=None, low=1000, high=24000)
    assert 1000 <= ranged <= 24000
