"""The fused C draw (native/toploc_sampling.c) equals the torch reference and an integer oracle.

``sample_tokens`` takes the C path for CPU float32/bf16/fp16 logits; ``_best_and_claimed`` is
the torch reference that ``check_sampling`` (the validator) uses; the oracle below recomputes
the documented formula in Python integers and ``math.log``, sharing no code with either.
"""

from __future__ import annotations

import math

import pytest
import torch
from splitmix_oracle import position_key, uniform_at

from toploc import check_sampling, gumbel_noise, native, sample_tokens
from toploc.sampling import _best_and_claimed

pytestmark = pytest.mark.skipif(not native.available(), reason="no C compiler: the torch path is used")

def _oracle_token(row: list[float], seed: int, seq: int, pos: int, temperature: float) -> int:
    key = position_key(seed, seq, pos)
    best, best_v = -math.inf, 0
    for v, x in enumerate(row):
        u = uniform_at(key, v)
        score = x + temperature * -math.log(-math.log(u)) if temperature else x
        if score > best:
            best, best_v = score, v
    return best_v


def _reference(
    logits: torch.Tensor, seed: int, seq: torch.Tensor, pos: torch.Tensor, t: float
) -> torch.Tensor:
    return _best_and_claimed(logits, seed, seq, pos, t)[0]


@pytest.mark.parametrize("temperature", [0.0, 0.3, 1.0, 2.5])
@pytest.mark.parametrize("scale", [0.1, 3.0, 40.0])
def test_native_draw_equals_reference(temperature: float, scale: float) -> None:
    generator = torch.Generator().manual_seed(int(scale * 10) + int(temperature * 100))
    logits = torch.randn(24, 3001, generator=generator) * scale
    seq = torch.arange(24) * 977 + 2**40
    for seed in (0, 2**63 + 11):
        for pos in (0, 5, 10**9):
            positions = torch.full((24,), pos) + torch.arange(24)
            drawn = sample_tokens(logits, seed, seq, positions, temperature)
            assert torch.equal(drawn, _reference(logits, seed, seq, positions, temperature))


def test_native_draw_equals_integer_oracle() -> None:
    logits = torch.randn(6, 257, generator=torch.Generator().manual_seed(3)) * 2
    for temperature in (0.0, 0.7, 1.0):
        drawn = sample_tokens(logits, 99, torch.arange(6), torch.arange(6) * 3, temperature)
        expected = [_oracle_token(logits[b].tolist(), 99, b, 3 * b, temperature) for b in range(6)]
        assert drawn.tolist() == expected


def test_native_draw_low_precision_inputs_and_masks() -> None:
    logits = torch.randn(8, 1000, generator=torch.Generator().manual_seed(4)) * 4
    logits[:, ::3] = -math.inf  # masked entries are never drawn
    for dtype in (torch.bfloat16, torch.float16):
        low = logits.to(dtype)
        drawn = sample_tokens(low, 5, torch.arange(8), torch.arange(8), 1.0)
        assert torch.equal(drawn, _reference(low, 5, torch.arange(8), torch.arange(8), 1.0))
        assert (drawn % 3 != 0).all()


def test_ties_and_non_finite_rows_fall_back_to_the_reference() -> None:
    """Exact ties (greedy), NaN, +inf and all -inf rows: the C pass flags them and the reference decides."""
    logits = torch.zeros(5, 64)
    logits[0, [7, 30]] = 2.0  # greedy tie: first index
    logits[1, 9] = math.nan
    logits[2, 11] = math.inf
    logits[3] = -math.inf
    seq, pos = torch.arange(5), torch.arange(5)
    for temperature in (0.0, 1.0):
        _tokens, ambiguous = native.gumbel_argmax(
            logits.numpy(), 1, seq.numpy(), pos.numpy(), temperature, 1e-9
        )
        assert ambiguous[1] and ambiguous[2] and ambiguous[3]
        assert torch.equal(
            sample_tokens(logits, 1, seq, pos, temperature), _reference(logits, 1, seq, pos, temperature)
        )
    assert native.gumbel_argmax(logits[:1].numpy(), 1, seq[:1].numpy(), pos[:1].numpy(), 0.0, 1e-9)[1][0]
    assert sample_tokens(logits[:1], 1, seq[:1], pos[:1], 0.0).item() == 7


def test_near_ties_are_flagged() -> None:
    """A row whose top two scores differ by less than the margin is ambiguous, so C's log never decides it."""
    logits = torch.randn(1, 500, generator=torch.Generator().manual_seed(8)).double()
    seq, pos = torch.tensor([3]), torch.tensor([4])
    best = int(_reference(logits, 2, seq, pos, 1.0))
    scores = logits[0] + gumbel_noise(2, seq, pos, 500)[0]
    runner = int(torch.topk(scores, 2).indices[1])
    near = logits.clone()
    near[0, runner] += float(scores[best] - scores[runner]) - 1e-6  # now ~1e-6 short of the best (float32)
    flagged = native.gumbel_argmax(near.float().numpy(), 2, seq.numpy(), pos.numpy(), 1.0, 1e-3)[1]
    assert flagged[0]


def test_validator_accepts_native_draws_and_disabling_native_changes_nothing(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    logits = torch.randn(40, 2000, generator=torch.Generator().manual_seed(9)) * 3
    positions = torch.arange(40)
    drawn = sample_tokens(logits, 77, torch.full((40,), 6), positions, 1.0)
    check = check_sampling(logits, drawn, 77, 6, positions, 1.0, tolerance=0.0)
    assert check.passed and check.exact_matches == 40 and check.max_margin == 0.0
    monkeypatch.setattr(native, "library", lambda: None)
    assert torch.equal(sample_tokens(logits, 77, torch.full((40,), 6), positions, 1.0), drawn)
