"""Honest noise per sample: how many of a sample's values exceed each threshold, measured over samples.

Tokens of one sample are not independent: a near-tied stretch (a list of numbers, a run of code)
puts several honest margins above a threshold in a row. A per-token rate bound is then no bound on
how those exceedances cluster, and a per-token likelihood-ratio test bans honest workers whose
samples happen to hold such stretches (``tests/test_evidence_correlated.py``). Samples are what
*is* independent: each has its own prompt and sampling seed. So besides the per-token rates,
:meth:`toploc.NoiseProfile.calibrate` counts, per sample, the values above each threshold ``t``,
and for each count ``m`` of :data:`SAMPLE_COUNTS` measures how many samples have at least ``m``
(the per-sample event "``m``+ values above ``t``"), turned into an upper confidence bound over the
calibration's *samples* (the same Chernoff bound and safety factor as the per-token rates). Whatever
the correlation inside a sample, the sample's event is one Bernoulli trial, so these bounds hold
with within-sample correlation included; :mod:`toploc.evidence` tests them sample by sample.

Pitfall: a sample's count grows with its length. Calibrate on the run's own prompts and completion
length (``max_new_tokens``): a run whose honest completions grow much longer than the calibration's
should be measured again.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

SAMPLE_COUNTS: tuple[int, ...] = tuple(2**i for i in range(13))
"""Per-sample counts ``m`` at which "at least ``m`` values above the threshold" is measured (1 to 4,096)."""


def counts_above(values: np.ndarray, thresholds: Sequence[float] | np.ndarray) -> np.ndarray:
    """``[T]`` int64: how many of one sample's ``values`` lie strictly above each threshold."""
    return np.asarray(
        (values[:, None] > np.asarray(thresholds, dtype=np.float64)[None, :]).sum(axis=0), dtype=np.int64
    )


def sample_exceedances(
    per_sample: Sequence[np.ndarray], thresholds: Sequence[float], counts: Sequence[int] = SAMPLE_COUNTS
) -> np.ndarray:
    """``[T, M]`` int64: per threshold and count ``m``, the samples with at least ``m`` values above it
    (``per_sample``: one value array per sample)."""
    table = np.zeros((len(thresholds), len(counts)), dtype=np.int64)
    grid = np.asarray(counts, dtype=np.int64)
    for values in per_sample:
        above = counts_above(values, thresholds)
        table += above[:, None] >= grid[None, :]
    return table


def monotone_bounds(bounds: np.ndarray) -> np.ndarray:
    """``bounds`` made non-increasing along both axes (a higher threshold or a larger count is an
    event contained in the lower one, so it is never more likely)."""
    out = np.minimum.accumulate(np.asarray(bounds, dtype=np.float64), axis=0)
    return np.minimum.accumulate(out, axis=1)


def useful_cells(bounds: np.ndarray) -> list[tuple[int, int]]:
    """The (threshold, count) cells worth a test: those whose bound is below every cell whose event
    contains theirs (a lower threshold or a smaller count). A cell with the same bound as such a
    cell is dominated: its event is rarer under any deviation and no rarer under honest noise."""
    cells = []
    rows, cols = bounds.shape
    for i in range(rows):
        for j in range(cols):
            if (i and bounds[i - 1, j] <= bounds[i, j]) or (j and bounds[i, j - 1] <= bounds[i, j]):
                continue
            cells.append((i, j))
    return cells


def sample_label(name: str, count: int) -> str:
    """The name of the per-sample statistic "samples with ``count``+ values of ``name``" (what the
    evidence tests and their descriptions call it; distinct from every per-token statistic)."""
    return f"samples with {count}+ {name}"


def parse_label(label: str) -> tuple[str, int]:
    """``(statistic, count)`` of a :func:`sample_label`; ``(label, 0)`` for a per-token statistic."""
    if label.startswith("samples with ") and "+ " in label:
        count, _, name = label[len("samples with ") :].partition("+ ")
        if count.isdigit():
            return name, int(count)
    return label, 0


def merged_sample_fields(parts: Sequence[Any], grid: tuple[float, ...]) -> dict[str, Any]:
    """The per-sample fields of ``NoiseProfile.merge``'s statistic over the union ``grid`` (``parts``: each
    profile's ``StatisticNoise``, typed Any since ``toploc.noise`` imports this module): the worst
    bound per (threshold, count) cell when every part has per-sample bounds on the same count grid
    (else none: a part without them bounds no per-sample event); sample counts summed only when
    every part has them on the same threshold grid."""
    counts = parts[0].sample_counts
    if not all(p.per_sample and p.sample_counts == counts for p in parts):
        return {"samples": sum(p.samples for p in parts)}
    same = all(p.thresholds == grid and p.sample_exceedances for p in parts)
    return {
        "samples": sum(p.samples for p in parts),
        "sample_counts": counts,
        "sample_rate_bounds": tuple(tuple(max(p.sample_bound_at(t, m) for p in parts) for m in counts) for t in grid),
        "sample_exceedances": tuple(
            tuple(sum(p.sample_exceedances[i][j] for p in parts) for j in range(len(counts))) for i in range(len(grid))
        )
        if same
        else (),
    }
