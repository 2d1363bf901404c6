"""Oracle rows of shared/reference/grpo.md §4 for rewards to advantages (O10–O10d, O19, O20):
group z-score, centring and RLOO, degenerate groups, the soft overlong penalty and dynamic sampling.
Float64, rtol 0; each test carries the hand derivation.
"""

from __future__ import annotations

import math

import pytest
import torch
from grpo_oracles_lib import (  # type: ignore[import-not-found]
    F64,
    ROUNDED,
    close,
)

import grpo


def test_o10_group_zscore() -> None:
    # r = [1,0,0,0]: mean 0.25, sample std sqrt((0.5625 + 3·0.0625)/3) = 0.5 ->
    # [0.75, −0.25, −0.25, −0.25]/(0.5 + 1e-6) = [1.5, −0.5, −0.5, −0.5]·(1 − 2e-6 + …).
    adv = grpo.group_zscore(torch.tensor([1.0, 0.0, 0.0, 0.0], dtype=F64), 4, eps=1e-6)
    close(adv, torch.tensor([0.75, -0.25, -0.25, -0.25], dtype=F64) / (0.5 + 1e-6))
    close(adv, [1.5, -0.5, -0.5, -0.5], atol=4e-6)
    assert adv.requires_grad is False


def test_o10b_dr_grpo_and_rloo() -> None:
    # group_center: r − 0.25; RLOO: r_i − mean of the other three = 4/3·(r − 0.25).
    rewards = torch.tensor([1.0, 0.0, 0.0, 0.0], dtype=F64)
    close(grpo.group_center(rewards, 4), [0.75, -0.25, -0.25, -0.25])
    close(grpo.rloo(rewards, 4), [1.0, -1 / 3, -1 / 3, -1 / 3])


@pytest.mark.parametrize(
    ("eps", "expected"), [(0.0, 1 / math.sqrt(2)), (1e-4, 0.5 / (math.sqrt(0.5) + 1e-4))]
)
def test_o10c_group_of_two(eps: float, expected: float) -> None:
    # r = [0, 1]: mean 0.5, sample std sqrt(0.5) = 0.70711 -> ±0.5/0.70711 = ±0.70711 (TRL ε 1e-4: ±0.70701).
    adv = grpo.group_zscore(torch.tensor([0.0, 1.0], dtype=F64), 2, eps=eps)
    close(adv, [-expected, expected])
    close(adv[1], 0.70711 if eps == 0 else 0.70701, atol=ROUNDED)


def test_o10d_degenerate_groups() -> None:
    # All-equal group: 0/(0 + ε) = 0 exactly for every estimator; singleton group: 0 (TRL's choice).
    equal = torch.tensor([1.0, 1.0, 1.0, 1.0, 0.35, 0.35, 0.35, 0.35], dtype=F64)
    for estimator in (grpo.group_zscore, grpo.group_center, grpo.rloo):
        assert torch.equal(estimator(equal, 4), torch.zeros(8, dtype=F64))
        assert torch.equal(estimator(torch.tensor([3.0, -1.0, 0.5]), 1), torch.zeros(3))
    # Non-dyadic 0.35 in fp32 must still give an exact 0 (NeMo-RL #4161's residue).
    assert torch.equal(grpo.group_zscore(torch.full((16,), 0.35), 16), torch.zeros(16))


def test_o19_soft_overlong_penalty() -> None:
    # L_max = 100, L_cache = 20: |y| <= 80 -> 0; 90 -> (80 − 90)/20 = −0.5; 100 -> −1; 101 > L_max -> −1.
    penalty = grpo.soft_overlong_penalty(torch.tensor([80, 90, 100, 101]), max_length=100, cache_length=20)
    close(penalty, [0.0, -0.5, -1.0, -1.0])


def test_o20_dynamic_sampling() -> None:
    # Groups [1,1,1,1], [0,0,0,0], [1,0,0,0]: only the third has a reward spread.
    rewards = torch.tensor([1, 1, 1, 1, 0, 0, 0, 0, 1, 0, 0, 0], dtype=F64)
    assert grpo.informative_groups(rewards, 4).tolist() == [False, False, True]
    # Float rewards: a 1e-9 spread is noise with tol = 1e-6, not information.
    noisy = torch.tensor([0.35, 0.35 + 1e-9, 0.35, 0.35], dtype=F64)
    assert grpo.informative_groups(noisy, 4, tol=1e-6).tolist() == [False]
