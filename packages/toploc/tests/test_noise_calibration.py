"""Honest-noise calibration: exact zeros, the floor of a measurement, measured rates next to bounds."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from toploc import EvidenceError, NoiseProfile, Observations
from toploc.noise import DEFAULT_GRIDS, calibration_floor, rate_upper_bound, tokens_for_floor


def _zeros(tokens: int) -> Observations:
    return Observations(np.zeros(tokens), np.zeros(tokens))


def test_exact_zeros_exceed_nothing_and_give_the_floor() -> None:
    """fp32 decode vs prefill: every margin exactly 0.0. Then every threshold's p0 is the floor:
    2·(1 - 0.001^(1/1024)) = 2·(1 - exp(-6.9078/1024)) = 0.013446 at the old default of 1,024 tokens."""
    profile = NoiseProfile.calibrate([_zeros(1024)])
    margin = profile.statistic("sampling_margin")
    assert margin.exceedances == (0,) * len(DEFAULT_GRIDS["sampling_margin"]) and margin.maximum == 0.0
    assert margin.rate_bounds == pytest.approx((0.013446,) * len(margin.thresholds), abs=1e-6)
    assert margin.rates() == (0.0,) * len(margin.thresholds)
    assert calibration_floor(1024) == pytest.approx(0.013446, abs=1e-6)
    assert ">1e-06 0/1024 <= 0.013" in margin.summary()
    # enough tokens: 138,152 zeros bound the rate by 1e-4, a hundred times tighter
    enough = NoiseProfile.calibrate([_zeros(tokens_for_floor(1e-4))]).statistic("sampling_margin")
    assert max(enough.rate_bounds) == pytest.approx(1e-4, rel=1e-4)


def test_tokens_for_floor_by_hand_and_errors() -> None:
    # n = ceil(log(0.001) / log(1 - 1e-3/2)) = ceil(-6.90776 / -5.00125e-4) = 13,813
    assert tokens_for_floor(1e-3) == 13_813
    assert tokens_for_floor(1e-4) == 138_152
    for bad in (0.0, 2.0, -1.0):
        with pytest.raises(EvidenceError):
            tokens_for_floor(bad)


@given(st.floats(1e-7, 0.5))
def test_tokens_for_floor_is_the_smallest_count_reaching_it(floor: float) -> None:
    n = tokens_for_floor(floor)
    assert calibration_floor(n) <= floor * (1 + 1e-12)
    assert n == 1 or calibration_floor(n - 1) > floor


def test_measured_rates_sit_next_to_their_bounds_and_survive_json() -> None:
    margins = np.zeros(10_000)
    margins[:30] = 0.05  # 30 near ties, 5 of them larger
    margins[:5] = 0.4
    profile = NoiseProfile.calibrate([Observations(margins, np.zeros(10_000))], description={"dtype": "bfloat16"})
    margin = profile.statistic("sampling_margin")
    at = {t: i for i, t in enumerate(margin.thresholds)}
    assert margin.exceedances[at[0.03]] == 30 and margin.exceedances[at[0.3]] == 5 and margin.exceedances[at[0.5]] == 0
    assert margin.rates()[at[0.03]] == 0.003
    assert margin.rate_bounds[at[0.3]] == pytest.approx(2 * rate_upper_bound(5, 10_000, 1e-3))
    assert ">0.3 5/10000 <= " in margin.summary()
    back = NoiseProfile.from_json(profile.to_json())
    assert back == profile
    # a profile written before the counts were kept still loads (no measured rates to report)
    old = json.loads(profile.to_json())
    for statistic in old["statistics"]:
        del statistic["exceedances"]
    legacy = NoiseProfile.from_json(json.dumps(old)).statistic("sampling_margin")
    assert legacy.exceedances == () and legacy.rates() == () and ">0.3 ? <= " in legacy.summary()
    # merged profiles add their counts (bounds: the worst case)
    merged = NoiseProfile.merge(profile, NoiseProfile.calibrate([_zeros(5_000)])).statistic("sampling_margin")
    assert merged.observations == 15_000 and merged.exceedances[at[0.03]] == 30
    assert NoiseProfile.merge(profile, NoiseProfile.from_json(json.dumps(old))).statistic("sampling_margin").exceedances == ()
    bad = json.loads(profile.to_json())
    bad["statistics"][0]["exceedances"] = [20_000] * len(margin.thresholds)
    with pytest.raises(EvidenceError, match="exceedance"):
        NoiseProfile.from_json(json.dumps(bad))
    assert math.isclose(margin.rates()[0], 30 / 10_000)
