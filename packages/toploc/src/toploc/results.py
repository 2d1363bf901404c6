"""Verification results and the threshold policy that turns them into a verdict."""

from __future__ import annotations

import math
from dataclasses import dataclass


@dataclass(frozen=True)
class VerificationResult:
    """How well one chunk's committed values match the verifier's recomputed ones.

    The first three attributes have the reference's names and meanings.

    Attributes:
        exp_mismatches: of the verifier's top-k positions, how many committed values
            have a different bf16 exponent ((u & 0x7F80) >> 7).
        mant_err_mean: mean |mantissa - mantissa'| (7-bit ULPs, 0..127) over the
            exponent-matched positions; ``inf`` if none matched (reference: 2^64).
        mant_err_median: the upper median (element ⌊n/2⌋ of the sorted errors, the
            reference C++ definition) over the same positions; ``inf`` if none.
        sign_mismatches: exponent-matched positions whose sign bit differs (the
            reference never compares signs, so negated activations passed; defect 2).
        index_agreement: positions whose committed value has the same sign and an
            exponent within ±1 of the verifier's: an estimate of how many of the
            verifier's top-k indices the prover also committed to. A position outside
            the prover's set evaluates to a pseudo-random 16-bit value and counts here
            with probability about 3/512.
        topk: k, the number of positions compared.
    """

    exp_mismatches: int
    mant_err_mean: float
    mant_err_median: float
    sign_mismatches: int = 0
    index_agreement: int = 0
    topk: int = 128

    def as_tuple(self) -> tuple[int, float, float]:
        """The reference's ``(exp_mismatches, mant_err_mean, mant_err_median)``."""
        return (self.exp_mismatches, self.mant_err_mean, self.mant_err_median)


@dataclass(frozen=True)
class Verdict:
    """Outcome of ``Thresholds.check``: ``passed`` and a one-line human-readable ``reason``."""

    passed: bool
    reason: str

    def __bool__(self) -> bool:
        return self.passed


@dataclass(frozen=True)
class Thresholds:
    """Acceptance policy for one chunk (defaults: toploc-experiments ``vllm_validate_poly.py``).

    The paper's rule is "≥ 90 of 128 exponents match, mantissa mean ≤ 10, median ≤ 8",
    i.e. at most 38 exponent mismatches for k = 128. Counts are given per 128 positions
    and scaled with k: allowed = ⌊per_128 · k / 128⌋ (38/128 ≈ 0.297·k).

    Attributes:
        exp_mismatches_per_128: allowed exponent mismatches per 128 positions (38).
        max_mant_err_mean: allowed mean mantissa error in 7-bit ULPs (10).
        max_mant_err_median: allowed upper-median mantissa error (8).
        sign_mismatches_per_128: allowed sign mismatches per 128 positions (8; not in
            the reference, which ignores signs; honest runs measured 0).
    Pitfall: context-labs/sglang read the paper's 90 as a mismatch cap, accepting up to
    70% mismatches; here every count is a *mismatch* budget.
    """

    exp_mismatches_per_128: float = 38.0
    max_mant_err_mean: float = 10.0
    max_mant_err_median: float = 8.0
    sign_mismatches_per_128: float = 8.0

    def max_exp_mismatches(self, topk: int) -> int:
        return math.floor(self.exp_mismatches_per_128 * topk / 128 + 1e-9)

    def max_sign_mismatches(self, topk: int) -> int:
        return math.floor(self.sign_mismatches_per_128 * topk / 128 + 1e-9)

    def check(self, result: VerificationResult) -> Verdict:
        """Pass iff every count and error is within its budget; the reason names the first violation."""
        max_exp = self.max_exp_mismatches(result.topk)
        if result.exp_mismatches > max_exp:
            return Verdict(False, f"{result.exp_mismatches}/{result.topk} exponent mismatches > {max_exp}")
        if result.mant_err_mean > self.max_mant_err_mean:
            return Verdict(
                False, f"mantissa error mean {result.mant_err_mean:.3g} > {self.max_mant_err_mean:g}"
            )
        if result.mant_err_median > self.max_mant_err_median:
            return Verdict(
                False, f"mantissa error median {result.mant_err_median:.3g} > {self.max_mant_err_median:g}"
            )
        max_sign = self.max_sign_mismatches(result.topk)
        if result.sign_mismatches > max_sign:
            return Verdict(False, f"{result.sign_mismatches}/{result.topk} sign mismatches > {max_sign}")
        return Verdict(
            True,
            f"ok: {result.exp_mismatches} exponent mismatches, mantissa mean {result.mant_err_mean:.3g}, "
            f"median {result.mant_err_median:.3g}, {result.sign_mismatches} sign mismatches",
        )

    def check_all(self, results: list[VerificationResult]) -> Verdict:
        """Pass iff every chunk passes; the reason names the first failing chunk."""
        for position, result in enumerate(results):
            verdict = self.check(result)
            if not verdict.passed:
                return Verdict(False, f"chunk {position}: {verdict.reason}")
        return Verdict(True, f"all {len(results)} chunks pass")
