"""Honest noise: what a worker's claims look like next to the validator's prefill, measured.

Observations (:class:`Observations`, one sample; the validator derives them from its prefill):

* ``sampling_margin`` per token: how far the claimed token's seeded-sampler score falls short of
  the best one (:func:`toploc.sampling_margins`; 0 when the claim is the sampler's choice);
* ``logprob_gap`` per token: ``|claimed - recomputed|`` inference log-prob;
* ``proof_exp_mismatches`` and ``proof_mant_err_mean`` per 32-token proof chunk.

Honest noise (:class:`NoiseProfile`) is *measured*, never guessed: for each statistic and each
threshold of a fixed grid (:data:`DEFAULT_GRIDS`), the share of honest observations above it
(a worker's decode vs the validator's prefill on the run's model, dtype and backend), turned
into an upper confidence bound ``p0`` (Chernoff/KL bound at confidence ``1 - delta``, times a
safety factor for the correlation between tokens of one sample and for configurations the
calibration did not see). Profiles of several machines merge by taking the worst bound per
threshold. :mod:`toploc.evidence` tests a worker's observations against these bounds.

Pitfall: a profile is only as good as the runs it measured. Honest noise on CPU fp32 says
nothing about a GPU worker with TF32 matmuls; calibrate on the hardware and precision workers
actually use, and merge the profiles.
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch

from toploc.per_sample import SAMPLE_COUNTS, merged_sample_fields, monotone_bounds, sample_exceedances
from toploc.results import VerificationResult

STATISTICS = ("sampling_margin", "logprob_gap", "proof_exp_mismatches", "proof_mant_err_mean")
"""Names of the statistics, in the order :class:`Observations` stores them."""

DEFAULT_GRIDS: dict[str, tuple[float, ...]] = {
    # logit units; 1e-6 counts "non-zero" margins (fp32 drift is ~1e-5 at most)
    # 0.25 is the validator's default bf16 sampling tolerance: its honest rate is measured, not
    # bounded by 0.2's (on CPU bf16, 3 vs 34 of 61,440 tokens: benchmarks/results/steering_bf16_tiny.md)
    "sampling_margin": (1e-6, 1e-5, 1e-4, 1e-3, 3e-3, 1e-2, 3e-2, 0.1, 0.2, 0.25, 0.3, 0.5, 1.0),
    # nats; honest fp32 decode-vs-prefill gaps are ~1e-6, bf16 ones ~1e-2
    "logprob_gap": (1e-5, 3e-5, 1e-4, 3e-4, 1e-3, 3e-3, 1e-2, 3e-2, 0.1, 0.3, 1.0),
    # per 32-token chunk: more than 0, 1, 3, 7, 15 of 128 exponents differ
    "proof_exp_mismatches": (0.5, 1.5, 3.5, 7.5, 15.5),
    # per chunk: mean |mantissa difference| in bf16 ULPs
    "proof_mant_err_mean": (0.02, 0.05, 0.1, 0.2, 0.5, 1.0, 2.0),
}
"""Thresholds at which honest exceedance rates are measured and tested (fixed, so profiles merge)."""


class EvidenceError(ValueError):
    """Unusable observations or noise profile (wrong shape, unknown statistic, bad JSON)."""


def _float64(values: Any) -> np.ndarray:
    """A 1-D float64 host array from a list, numpy array or tensor on any device."""
    if isinstance(values, torch.Tensor):
        values = values.detach().to("cpu", torch.float64).numpy()
    return np.asarray(values, dtype=np.float64).reshape(-1)


def _as_vector(name: str, values: Any) -> np.ndarray:
    array = _float64(values)
    if np.isnan(array).any():
        raise EvidenceError(f"{name} contains NaN; map undefined values to +inf (maximal evidence)")
    if (array < 0).any():
        raise EvidenceError(f"{name} must be >= 0")
    return array


@dataclass(frozen=True)
class Observations:
    """The statistics of one sample, as 1-D float64 arrays (all values >= 0, ``inf`` allowed).

    ``sampling_margin`` and ``logprob_gap`` have one entry per completion token; the two proof
    statistics one per 32-token proof chunk. Build with :meth:`from_checks` or directly.
    """

    sampling_margin: np.ndarray
    logprob_gap: np.ndarray
    proof_exp_mismatches: np.ndarray = field(default_factory=lambda: np.zeros(0))
    proof_mant_err_mean: np.ndarray = field(default_factory=lambda: np.zeros(0))

    def __post_init__(self) -> None:
        for name in STATISTICS:
            object.__setattr__(self, name, _as_vector(name, getattr(self, name)))
        if self.sampling_margin.size != self.logprob_gap.size:
            raise EvidenceError(
                f"{self.sampling_margin.size} sampling margins but {self.logprob_gap.size} log-prob gaps"
            )
        if self.proof_exp_mismatches.size != self.proof_mant_err_mean.size:
            raise EvidenceError("proof statistics must have one entry per chunk each")

    @property
    def num_tokens(self) -> int:
        return int(self.sampling_margin.size)

    def values(self, name: str) -> np.ndarray:
        if name not in STATISTICS:
            raise EvidenceError(f"unknown statistic {name!r}; expected one of {STATISTICS}")
        return getattr(self, name)  # type: ignore[no-any-return]

    def prefix(self, num_tokens: int, chunk_size: int = 32) -> Observations:
        """The observations a sample cut after ``num_tokens`` tokens would give (whole chunks only)."""
        chunks = num_tokens // chunk_size
        return Observations(
            self.sampling_margin[:num_tokens],
            self.logprob_gap[:num_tokens],
            self.proof_exp_mismatches[:chunks],
            self.proof_mant_err_mean[:chunks],
        )

    @classmethod
    def from_checks(
        cls,
        margins: Any,
        claimed_logprobs: Any,
        recomputed_logprobs: Any,
        proof_results: Sequence[VerificationResult] = (),
    ) -> Observations:
        """From per-token margins, claimed and recomputed log-probs, and per-chunk proof results.

        Arrays may be lists, numpy arrays or tensors on any device. A non-finite log-prob on either
        side gives an infinite gap (maximal evidence).
        """
        claimed, recomputed = _float64(claimed_logprobs), _float64(recomputed_logprobs)
        if claimed.shape != recomputed.shape:
            raise EvidenceError(f"{claimed.size} claimed log-probs but {recomputed.size} recomputed")
        with np.errstate(invalid="ignore"):
            gap = np.abs(claimed - recomputed)
        gap[~np.isfinite(gap)] = np.inf
        margin = np.nan_to_num(_float64(margins), nan=np.inf)
        return cls(
            margin,
            gap,
            np.array([r.exp_mismatches for r in proof_results], dtype=np.float64),
            np.nan_to_num(np.array([r.mant_err_mean for r in proof_results], dtype=np.float64), nan=np.inf),
        )


def calibration_floor(observations: int, *, delta: float = 1e-3, safety: float = 2.0) -> float:
    """The smallest p0 :meth:`NoiseProfile.calibrate` can give from ``observations`` honest values
    (none above the threshold): ``safety · (1 - delta^(1/n)) ≈ safety · log(1/delta) / n``."""
    return min(1.0, safety * rate_upper_bound(0, observations, delta))


def tokens_for_floor(floor: float, *, delta: float = 1e-3, safety: float = 2.0) -> int:
    """Honest observations needed for :func:`calibration_floor` to reach ``floor`` (e.g. 1e-4:
    138,152 tokens at the defaults; the floor falls as 1/n)."""
    if not 0 < floor < safety:
        raise EvidenceError(f"floor must lie in (0, safety), got {floor}")
    return max(1, math.ceil(math.log(delta) / math.log1p(-floor / safety)))


def rate_upper_bound(exceedances: int, observations: int, delta: float) -> float:
    """Upper confidence bound on a rate from ``exceedances`` of ``observations`` Bernoulli trials.

    The Chernoff bound: the largest u >= k/n with ``n · KL(k/n || u) <= log(1/delta)``, so
    P(true rate > u) <= delta for independent trials. For k = 0 it is exactly ``1 - delta^(1/n)``.
    """
    if observations <= 0:
        return 1.0
    if not 0 <= exceedances <= observations:
        raise EvidenceError(f"exceedances {exceedances} must lie in [0, {observations}]")
    if not 0 < delta < 1:
        raise EvidenceError(f"delta must lie in (0, 1), got {delta}")
    target = math.log(1 / delta) / observations
    rate = exceedances / observations
    if exceedances == 0:
        return -math.expm1(-target)
    if exceedances == observations:
        return 1.0

    def kl(u: float) -> float:
        return rate * math.log(rate / u) + (1 - rate) * math.log((1 - rate) / (1 - u))

    low, high = rate, 1.0
    for _ in range(100):  # bisection to ~1e-30: kl is increasing in u above the observed rate
        middle = (low + high) / 2
        if middle >= 1.0 or kl(middle) > target:
            high = middle
        else:
            low = middle
    return high


@dataclass(frozen=True)
class StatisticNoise:
    """Honest noise of one statistic: upper bounds on P(x > threshold) per grid threshold.

    Attributes:
        name: one of :data:`STATISTICS`.
        thresholds: the grid, ascending.
        rate_bounds: per threshold, the upper bound p0 on the honest exceedance rate (after the
            safety factor), non-increasing along the grid.
        observations: honest observations measured (tokens or proof chunks).
        maximum: the largest honest value seen.
        exceedances: per threshold, the honest observations above it (k; the measured rate is
            k / observations); empty for profiles written before they were kept, or merged ones.
        samples: honest samples measured (the unit of the per-sample bounds; 0 in profiles
            written before they were kept).
        sample_counts: the counts m of the per-sample events "m+ values above the threshold"
            (:mod:`toploc.per_sample`); empty when the profile has none.
        sample_rate_bounds: ``[threshold][count]`` upper bounds on the share of honest samples with
            at least m values above the threshold (after the safety factor), non-increasing along
            both axes.
        sample_exceedances: ``[threshold][count]`` the honest samples measured with that many;
            empty for merged profiles of different grids.
    """

    name: str
    thresholds: tuple[float, ...]
    rate_bounds: tuple[float, ...]
    observations: int
    maximum: float
    exceedances: tuple[int, ...] = ()
    samples: int = 0
    sample_counts: tuple[int, ...] = ()
    sample_rate_bounds: tuple[tuple[float, ...], ...] = ()
    sample_exceedances: tuple[tuple[int, ...], ...] = ()

    def __post_init__(self) -> None:
        if self.name not in STATISTICS:
            raise EvidenceError(f"unknown statistic {self.name!r}; expected one of {STATISTICS}")
        if len(self.thresholds) != len(self.rate_bounds) or not self.thresholds:
            raise EvidenceError(f"{self.name}: one rate bound per threshold is required")
        if list(self.thresholds) != sorted(set(self.thresholds)):
            raise EvidenceError(f"{self.name}: thresholds must be strictly ascending")
        if not all(0 < p <= 1 for p in self.rate_bounds):
            raise EvidenceError(f"{self.name}: rate bounds must lie in (0, 1]")
        if self.exceedances and (
            len(self.exceedances) != len(self.thresholds)
            or not all(0 <= k <= self.observations for k in self.exceedances)
        ):
            raise EvidenceError(f"{self.name}: one exceedance count in [0, observations] per threshold")
        shape = (len(self.thresholds), len(self.sample_counts))
        if self.sample_counts and (
            np.shape(self.sample_rate_bounds) != shape
            or not all(0 < p <= 1 for row in self.sample_rate_bounds for p in row)
            or (self.sample_exceedances and np.shape(self.sample_exceedances) != shape)
            or not all(0 <= k <= self.samples for row in self.sample_exceedances for k in row)
        ):
            raise EvidenceError(f"{self.name}: one per-sample bound in (0, 1] per (threshold, count)")

    @property
    def per_sample(self) -> bool:
        """Whether the profile measured per-sample bounds (profiles written before them did not)."""
        return bool(self.sample_counts)

    def rates(self) -> tuple[float, ...]:
        """The measured honest rates ``k / n`` per threshold (empty when the counts were not kept)."""
        if not self.exceedances or not self.observations:
            return ()
        return tuple(k / self.observations for k in self.exceedances)

    def bound_at(self, threshold: float) -> float:
        """The bound on the honest rate of ``x > threshold``: that of the largest grid threshold
        at or below it (a higher threshold is exceeded no more often), 1 if none."""
        below = [p for t, p in zip(self.thresholds, self.rate_bounds, strict=True) if t <= threshold]
        return below[-1] if below else 1.0

    def sample_bound_at(self, threshold: float, count: int) -> float:
        """The bound on the share of honest samples with at least ``count`` values above
        ``threshold``: that of the largest grid cell at or below both (1 if none)."""
        rows = [i for i, t in enumerate(self.thresholds) if t <= threshold]
        cols = [j for j, m in enumerate(self.sample_counts) if m <= count]
        return self.sample_rate_bounds[rows[-1]][cols[-1]] if rows and cols else 1.0

    def quantile(self, rate: float) -> float:
        """A high quantile from the grid: the smallest threshold whose *measured* exceedance rate
        ``k / n`` is at most ``rate`` (e.g. 1e-4: the 99.99th percentile, rounded up to the grid).

        Unlike ``maximum`` it does not move with one outlier. Profiles without exceedance counts
        (older or merged ones) give the smallest threshold at or above ``maximum``; beyond the grid
        (or no observations), ``maximum``.
        """
        if not 0 < rate < 1:
            raise EvidenceError(f"rate must lie in (0, 1), got {rate}")
        measured = self.rates()
        for i, threshold in enumerate(self.thresholds):
            if (measured[i] <= rate) if measured else threshold >= self.maximum:
                return threshold
        return self.maximum

    def summary(self) -> str:
        """One line: per threshold ``k/n`` measured and the bound p0 the tests use, e.g.
        ``sampling_margin (32768 obs, max 0.53): >1e-06 0/32768 <= 4.2e-04, >0.1 5/32768 <= ...``."""
        parts = []
        for i, (threshold, bound) in enumerate(zip(self.thresholds, self.rate_bounds, strict=True)):
            measured = f"{self.exceedances[i]}/{self.observations}" if self.exceedances else "?"
            parts.append(f">{threshold:g} {measured} <= {bound:.2g}")
        return f"{self.name} ({self.observations} obs, max {self.maximum:.3g}): " + ", ".join(parts)


@dataclass(frozen=True)
class NoiseProfile:
    """Measured honest noise of one run configuration (model, dtype, backend, hardware).

    ``description`` says what was measured (free-form key/value strings); ``statistics`` holds
    one :class:`StatisticNoise` per statistic. Build with :meth:`calibrate`, combine with
    :meth:`merge`, store with :meth:`save` / :meth:`load` (a small JSON file).
    """

    description: tuple[tuple[str, str], ...]
    statistics: tuple[StatisticNoise, ...]

    def __post_init__(self) -> None:
        names = [s.name for s in self.statistics]
        if sorted(names) != sorted(STATISTICS):
            raise EvidenceError(f"a profile needs exactly the statistics {STATISTICS}, got {names}")

    def statistic(self, name: str) -> StatisticNoise:
        for s in self.statistics:
            if s.name == name:
                return s
        raise EvidenceError(f"unknown statistic {name!r}")

    @classmethod
    def calibrate(
        cls,
        honest: Iterable[Observations],
        *,
        description: Mapping[str, str] | None = None,
        delta: float = 1e-3,
        safety: float = 2.0,
        grids: Mapping[str, Sequence[float]] = DEFAULT_GRIDS,
    ) -> NoiseProfile:
        """Measure exceedance rates of honest observations (decode vs prefill) on the grids.

        ``p0 = min(1, safety · rate_upper_bound(k, n, delta))`` per threshold, made
        non-increasing along the grid (a higher threshold is never exceeded more often). Exact
        zeros count as zeros: fp32 decode and prefill agree exactly, so most margins are 0.0 and
        exceed no threshold, and then p0 is the floor ``safety · (1 - delta^(1/n))`` of n tokens
        (:func:`calibration_floor`; 0.013 at the old default of 1,024 tokens, whatever the noise).
        Pitfall: the floor, not the noise, then sets how fast deviations are seen; measure enough
        tokens (:func:`tokens_for_floor`) and report the measured ``k/n`` next to p0 (``summary``).

        Per sample as well (:mod:`toploc.per_sample`): for each threshold and count m, the samples
        with at least m values above it, bounded the same way over the *samples* (the unit the
        evidence tests, so that correlation between a sample's tokens is measured, not assumed away).
        """
        if safety < 1:
            raise EvidenceError(f"safety must be >= 1, got {safety}")
        samples = list(honest)
        statistics = []
        for name in STATISTICS:
            grid = tuple(float(t) for t in grids[name])
            values = (
                np.concatenate([s.values(name) for s in samples]) if samples else np.zeros(0)
            )
            counts = (values[:, None] > np.asarray(grid)[None, :]).sum(axis=0)
            bounds = [min(1.0, safety * rate_upper_bound(int(k), values.size, delta)) for k in counts]
            bounds = list(np.minimum.accumulate(bounds))
            table = sample_exceedances([s.values(name) for s in samples], grid)
            sample_bounds = monotone_bounds(
                np.array([[min(1.0, safety * rate_upper_bound(int(k), len(samples), delta)) for k in row] for row in table])
            )
            statistics.append(
                StatisticNoise(
                    name=name,
                    thresholds=grid,
                    rate_bounds=tuple(float(b) for b in bounds),
                    observations=int(values.size),
                    maximum=float(values.max()) if values.size else 0.0,
                    exceedances=tuple(int(k) for k in counts),
                    samples=len(samples),
                    sample_counts=SAMPLE_COUNTS,
                    sample_rate_bounds=tuple(tuple(float(p) for p in row) for row in sample_bounds),
                    sample_exceedances=tuple(tuple(int(k) for k in row) for row in table),
                )
            )
        return cls(tuple(sorted((description or {}).items())), tuple(statistics))

    @classmethod
    def merge(cls, *profiles: NoiseProfile) -> NoiseProfile:
        """The worst case of several profiles: max bound and max honest value per threshold;
        observations add up. Use it to cover several worker configurations.

        Grids may differ (a profile written before a grid gained a threshold): the merged grid is
        their union, and a profile without a threshold t contributes its bound at its largest
        threshold below t (1 if none), an upper bound on its rate at t. Exceedance counts are kept
        only when every grid is the same. Per-sample bounds are merged the same way (worst per
        cell, over the union grid) when every profile has them on the same count grid, and
        dropped otherwise (a profile without them bounds no per-sample event).
        """
        if not profiles:
            raise EvidenceError("merge needs at least one profile")
        statistics = []
        for name in STATISTICS:
            parts = [p.statistic(name) for p in profiles]
            same = all(p.thresholds == parts[0].thresholds for p in parts)
            grid = tuple(sorted({t for p in parts for t in p.thresholds}))
            statistics.append(
                StatisticNoise(
                    name=name,
                    thresholds=grid,
                    rate_bounds=tuple(max(p.bound_at(t) for p in parts) for t in grid),
                    observations=sum(p.observations for p in parts),
                    maximum=max(p.maximum for p in parts),
                    exceedances=(
                        tuple(sum(k) for k in zip(*(p.exceedances for p in parts), strict=True))
                        if same and all(p.exceedances for p in parts)
                        else ()
                    ),
                    **merged_sample_fields(parts, grid),
                )
            )
        description: dict[str, str] = {}
        for p in profiles:
            for key, value in p.description:
                description[key] = value if key not in description else f"{description[key]} | {value}"
        return cls(tuple(sorted(description.items())), tuple(statistics))

    def to_json(self) -> str:
        return json.dumps(
            {
                "format": "toploc-noise-profile/1",
                "description": dict(self.description),
                "statistics": [
                    {
                        "name": s.name,
                        "thresholds": list(s.thresholds),
                        "rate_bounds": list(s.rate_bounds),
                        "observations": s.observations,
                        "maximum": s.maximum,
                        "exceedances": list(s.exceedances),
                        "samples": s.samples,
                        "sample_counts": list(s.sample_counts),
                        "sample_rate_bounds": [list(row) for row in s.sample_rate_bounds],
                        "sample_exceedances": [list(row) for row in s.sample_exceedances],
                    }
                    for s in self.statistics
                ],
            },
            indent=1,
        )

    @classmethod
    def from_json(cls, text: str) -> NoiseProfile:
        try:
            data = json.loads(text)
            if data.get("format") != "toploc-noise-profile/1":
                raise EvidenceError(f"not a toploc noise profile (format {data.get('format')!r})")
            return cls(
                tuple(sorted((str(k), str(v)) for k, v in data["description"].items())),
                tuple(
                    StatisticNoise(
                        name=str(s["name"]),
                        thresholds=tuple(float(t) for t in s["thresholds"]),
                        rate_bounds=tuple(float(b) for b in s["rate_bounds"]),
                        observations=int(s["observations"]),
                        maximum=float(s["maximum"]),
                        exceedances=tuple(int(k) for k in s.get("exceedances", ())),
                        samples=int(s.get("samples", 0)),
                        sample_counts=tuple(int(m) for m in s.get("sample_counts", ())),
                        sample_rate_bounds=tuple(tuple(float(p) for p in row) for row in s.get("sample_rate_bounds", ())),
                        sample_exceedances=tuple(tuple(int(k) for k in row) for row in s.get("sample_exceedances", ())),
                    )
                    for s in data["statistics"]
                ),
            )
        except (KeyError, TypeError, AttributeError, json.JSONDecodeError) as exc:
            raise EvidenceError(f"malformed noise profile: {exc!r}") from exc

    def save(self, path: str | Path) -> None:
        Path(path).write_text(self.to_json() + "\n")

    @classmethod
    def load(cls, path: str | Path) -> NoiseProfile:
        return cls.from_json(Path(path).read_text())

    def per_sample_limit(self, name: str, *, factor: float = 3.0, floor: float = 0.0) -> float:
        """A per-sample tolerance for ``name``: ``max(floor, factor · largest honest value)``.

        Per-sample checks only need to stop gross deviations; anything below this limit is left
        to the per-worker evidence, so honest drift (bf16 margins of 0.45) is never rejected.
        """
        return max(floor, factor * self.statistic(name).maximum)
