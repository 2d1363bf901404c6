"""Threshold policy: the paper's numbers as mismatch budgets scaled with k."""

from __future__ import annotations

import math

import pytest

from toploc import Thresholds, VerificationResult


def _result(exp: int, mean: float, median: float, sign: int = 0, k: int = 128) -> VerificationResult:
    return VerificationResult(exp, mean, median, sign, k - exp, k)


@pytest.mark.parametrize(
    ("result", "passed", "reason"),
    [
        (_result(38, 10.0, 8.0), True, "ok"),  # exactly at every bound: 90 of 128 exponents match
        (_result(39, 0.0, 0.0), False, "39/128 exponent mismatches > 38"),
        (_result(0, 10.01, 0.0), False, "mantissa error mean"),
        (_result(0, 0.0, 9.0), False, "mantissa error median"),
        (_result(0, 0.0, 0.0, sign=9), False, "9/128 sign mismatches > 8"),
        (_result(128, math.inf, math.inf), False, "exponent"),
    ],
)
def test_check(result: VerificationResult, passed: bool, reason: str) -> None:
    verdict = Thresholds().check(result)
    assert verdict.passed is passed and bool(verdict) is passed
    assert reason in verdict.reason


def test_scaling_with_k() -> None:
    thresholds = Thresholds()
    # 38/128 * k, floored: k=512 -> 152, k=64 -> 19, k=4 -> 1
    assert [thresholds.max_exp_mismatches(k) for k in (128, 512, 64, 4)] == [38, 152, 19, 1]
    assert thresholds.check(_result(152, 0, 0, k=512)).passed
    assert not thresholds.check(_result(20, 0, 0, k=64)).passed


def test_check_all_names_failing_chunk() -> None:
    verdict = Thresholds().check_all([_result(0, 0, 0), _result(50, 0, 0)])
    assert not verdict.passed and verdict.reason.startswith("chunk 1:")
    assert Thresholds().check_all([]).passed
