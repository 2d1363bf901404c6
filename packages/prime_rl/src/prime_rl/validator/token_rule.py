"""The per-sample rules on a per-token statistic (sampling margins, log-prob gaps): a count per threshold.

:class:`TokenRule` is the rule; :func:`sampling_problem` (fp32's sampling rule: a fraction of tokens
beyond one tolerance) and :func:`logprob_problem` (the log-prob rule, with no token beyond
``[validator].logprob_atol`` where the precision sets no :class:`TokenRule`) are what
``checks.judge_prefill`` applies to every sample.

A bf16 worker's decode and the validator's prefill disagree a little on every token, so a sample
cannot be held to "no token beyond the tolerance"; it is held to "no more tokens beyond each
threshold than honest noise puts there". For a statistic x_1..x_n of one n-token sample,
:class:`TokenRule` rejects iff

* some ``x_i > hard_limit`` (NaN too), or
* for some checked threshold t (the tolerance, then every profile threshold between it and the
  hard limit, each with its honest rate bound p_t), ``#{i: x_i > t} > allowed(n, above=t)``, the
  smallest k with ``P(Binomial(n, p_t) > k) <= false_reject_rate`` (:func:`binomial_allowance`).

Why one count per threshold and not one at the tolerance (the rule before issue #34): with a single
count the allowance is set by the rate *at the tolerance*, and a token beyond it may lie anywhere up
to the hard limit. A lower tolerance has a higher honest rate, so it allowed more tokens, each as
far out as before (0.25: 16 of 1,024 tokens; 0.001: 158; 0: 588): the operator's stricter setting
handed a steering worker more free swaps. Here every threshold keeps its own allowance whatever the
tolerance, so :meth:`TokenRule.allowed` is monotone: a lower tolerance only adds checks, it never
widens a count (``tests/test_token_rule.py`` checks it as a property).

Pitfall: each checked threshold spends ``false_reject_rate`` (a union bound: an honest sample is
rejected with probability <= ``false_reject_rate`` times the checked thresholds, 13 at most on the
default grid). ``tolerances.for_precision`` splits its per-sample budget accordingly.
"""

from __future__ import annotations

import functools
import itertools
import math
from collections.abc import Sequence
from dataclasses import dataclass

import torch


@functools.lru_cache(maxsize=4096)
def binomial_allowance(tokens: int, rate: float, false_reject_rate: float) -> int:
    """The smallest k with ``P(Binomial(tokens, rate) > k) <= false_reject_rate`` (0 when rate is 0).

    Exact: the tail is summed from the probability mass ``C(n,j) p^j (1-p)^(n-j)`` (log-gamma).
    """
    if tokens < 0 or not 0 <= rate < 1 or not 0 < false_reject_rate < 1:
        raise ValueError(f"need tokens >= 0, rate in [0, 1), false_reject_rate in (0, 1); got {tokens}, {rate}, {false_reject_rate}")
    if rate == 0 or tokens == 0:
        return 0
    log_p, log_q = math.log(rate), math.log1p(-rate)
    head = math.lgamma(tokens + 1)
    tail = 1.0  # P(X > k) for k = -1
    for k in range(tokens + 1):
        tail -= math.exp(head - math.lgamma(k + 1) - math.lgamma(tokens - k + 1) + k * log_p + (tokens - k) * log_q)
        if tail <= false_reject_rate:
            return k
    return tokens


@dataclass(frozen=True)
class TokenRule:
    """The per-sample rule on one per-token statistic (module docstring).

    Attributes:
        tolerance: the lowest checked threshold; values at or below it are never counted.
        rate: p0 at the tolerance, the bound on the honest per-token rate of ``x > tolerance``
            (0: no token may exceed it).
        hard_limit: value no token may exceed (>= tolerance).
        bands: ``(threshold, p0)`` of the further checked thresholds, ascending, each strictly
            between ``tolerance`` and ``hard_limit``, p0 non-increasing and <= ``rate``.
        false_reject_rate: bound on P(an honest sample fails one checked threshold).
        statistic: what the values are, for messages ("margin", "log-prob gap").
    """

    tolerance: float
    rate: float
    hard_limit: float
    bands: tuple[tuple[float, float], ...] = ()
    false_reject_rate: float = 1e-6
    statistic: str = "margin"

    def __post_init__(self) -> None:
        if not 0 <= self.tolerance <= self.hard_limit or not 0 <= self.rate < 1:
            raise ValueError(f"need 0 <= tolerance <= hard_limit and rate in [0, 1): {self}")
        thresholds = [t for t, _ in self.bands]
        rates = [self.rate] + [p for _, p in self.bands]
        if thresholds != sorted(set(thresholds)) or any(not self.tolerance < t < self.hard_limit for t in thresholds):
            raise ValueError(f"band thresholds must ascend strictly between tolerance and hard_limit: {self}")
        if any(later > earlier for earlier, later in itertools.pairwise(rates)):
            raise ValueError(f"band rates must not grow with the threshold: {self}")

    @property
    def checked(self) -> tuple[tuple[float, float], ...]:
        """Every counted ``(threshold, p0)``: the tolerance's, then the bands'."""
        return ((self.tolerance, self.rate), *self.bands)

    def allowed(self, tokens: int, above: float | None = None) -> int:
        """Tokens of an n-token sample allowed beyond ``above`` (default: the tolerance).

        ``tokens`` for ``above`` below the tolerance (nothing counts there), 0 at or beyond the hard
        limit, else the smallest allowance of a checked threshold <= ``above`` (a token beyond
        ``above`` is beyond each of them). Non-increasing in ``above``.
        """
        above = self.tolerance if above is None else above
        if above >= self.hard_limit:
            return 0
        counts = [binomial_allowance(tokens, p, self.false_reject_rate) for t, p in self.checked if t <= above]
        return min(counts) if counts else tokens

    def problem(self, values: torch.Tensor) -> str | None:
        """None if ``values [n]`` pass, else why not."""
        tokens = values.numel()
        if tokens == 0:
            return None
        worst = float(values.max())
        if not worst <= self.hard_limit:  # NaN fails here too (margins of NaN logits are inf)
            first = int(torch.nonzero(~(values <= self.hard_limit)).flatten()[0])
            return f"token {first}: {self.statistic} {worst:.3g} beyond the limit {self.hard_limit:.3g}"
        for threshold, rate in self.checked:
            over = int((values > threshold).sum())
            allowed = binomial_allowance(tokens, rate, self.false_reject_rate)
            if over > allowed:
                return (
                    f"{over}/{tokens} tokens have a {self.statistic} beyond {threshold:.3g}; honest noise "
                    f"allows {allowed} at rate {rate:.2g} (largest {worst:.3g})"
                )
        return None


def sampling_problem(margins: torch.Tensor, *, tolerance: float, max_mismatch_fraction: float) -> str | None:
    """The per-sample sampling rule on ``margins``: None if at most ``max_mismatch_fraction`` of the
    tokens fall short by more than ``tolerance``, else why not (same rule as ``toploc.check_sampling``)."""
    bad = torch.nonzero(margins > tolerance).flatten()
    if bad.numel() <= int(max_mismatch_fraction * margins.numel()):
        return None
    return (
        f"{bad.numel()}/{margins.numel()} tokens are not what the seeded sampler draws "
        f"(first at ({int(bad[0])},), max margin {float(margins.max()):.3g})"
    )


def logprob_problem(
    recomputed: torch.Tensor, claimed: Sequence[float], *, rule: TokenRule | None, atol: float
) -> str | None:
    """The per-token log-prob rule: None if every claimed inference log-prob is close enough to the
    prefill's, else why not.

    Per token, not a mean: a mean over n tokens hides a few large lies among many honest tokens
    (one token off by 1 nat in 1,024 moves the mean by 0.001). ``rule`` where the precision sets one
    (bf16 with a noise profile), else no token beyond ``atol``. A NaN claim fails.
    """
    gaps = (recomputed.double() - torch.tensor(claimed, dtype=torch.float64)).abs()
    rule = rule or TokenRule(tolerance=atol, rate=0.0, hard_limit=atol, statistic="|log-prob error|")
    return rule.problem(gaps)
