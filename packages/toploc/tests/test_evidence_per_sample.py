"""Per-sample noise bounds and tests: what calibration counts, how it merges and loads, what a test sees."""

from __future__ import annotations

import json

import numpy as np
import pytest

from toploc import EvidenceError, EvidencePolicy, EvidenceTests, NoiseProfile, Observations, WorkerEvidence
from toploc.noise import rate_upper_bound
from toploc.per_sample import SAMPLE_COUNTS, parse_label, sample_label, useful_cells


def _obs(margins: list[float]) -> Observations:
    return Observations(np.array(margins), np.zeros(len(margins)))


def _honest(count: int = 200) -> list[Observations]:
    # one sample in 10 holds a stretch of 8 margins at 0.05; the others none
    return [_obs([0.05] * 8 + [0.0] * 56 if i % 10 == 0 else [0.0] * 64) for i in range(count)]


def test_calibration_counts_samples_per_threshold_and_count() -> None:
    margin = NoiseProfile.calibrate(_honest()).statistic("sampling_margin")
    assert margin.samples == 200 and margin.sample_counts == SAMPLE_COUNTS
    row = margin.thresholds.index(3e-2)
    # 20 of 200 samples have 1..8 margins above 0.03, none has 16; none has any above 0.1
    assert margin.sample_exceedances[row][:5] == (20, 20, 20, 20, 0)
    assert margin.sample_rate_bounds[row][0] == pytest.approx(2 * rate_upper_bound(20, 200, 1e-3))
    assert margin.sample_rate_bounds[row][4] == pytest.approx(2 * rate_upper_bound(0, 200, 1e-3))
    assert margin.sample_exceedances[margin.thresholds.index(0.1)][0] == 0
    assert margin.sample_bound_at(0.04, 3) == margin.sample_rate_bounds[row][1]  # cell (0.03, 2)


def test_tests_are_one_trial_per_sample_and_skip_dominated_cells() -> None:
    tests = EvidenceTests.from_profile(NoiseProfile.calibrate(_honest()), EvidencePolicy(alternatives=(3.0,)))
    assert tests.per_sample
    labels = {(parse_label(s), float(t)) for s, t in zip(tests.statistics, tests.thresholds, strict=True)}
    # the stretch's cell at the lowest threshold (0.03's is the same event here) and the floor
    # cells that contain no other floor cell
    assert (("sampling_margin", 1), 1e-6) in labels and (("sampling_margin", 1), 3e-2) not in labels
    assert (("sampling_margin", 16), 1e-6) in labels
    assert (("sampling_margin", 1), 0.1) in labels and (("sampling_margin", 2), 0.1) not in labels
    seen, exceeded = tests.counts(_obs([0.05] * 8 + [0.2] + [0.0] * 55))
    assert seen.tolist() == [1] * len(tests)  # one trial per test, however many tokens
    for j, label in enumerate(tests.statistics):
        name, m = parse_label(label)
        if name == "sampling_margin":
            expected = sum(v > tests.thresholds[j] for v in [0.05] * 8 + [0.2]) >= m
            assert exceeded[j] == expected, tests.describe(j)


def test_labels_round_trip_and_unknown_statistics_are_refused() -> None:
    assert parse_label(sample_label("logprob_gap", 8)) == ("logprob_gap", 8)
    assert parse_label("logprob_gap") == ("logprob_gap", 0)
    bounds = np.array([[0.3, 0.2], [0.3, 0.1]])
    assert useful_cells(bounds) == [(0, 0), (0, 1), (1, 1)]  # (1, 0) has (0, 0)'s bound
    tests = EvidenceTests.from_profile(NoiseProfile.calibrate(_honest()))
    bad = EvidenceTests(("samples with 2+ margin",), np.ones(1), np.full(1, 0.1), np.full(1, 0.3), 1.0, 1.0)
    with pytest.raises(EvidenceError, match="unknown statistic"):
        bad.counts(_obs([0.0]))
    assert WorkerEvidence(tests).update(_obs([0.0] * 64)).samples == 1


def test_per_sample_bounds_survive_json_and_merge_and_old_profiles_need_recalibration() -> None:
    profile = NoiseProfile.calibrate(_honest())
    assert NoiseProfile.from_json(profile.to_json()) == profile
    other = NoiseProfile.calibrate(_honest(50))
    merged = NoiseProfile.merge(profile, other).statistic("sampling_margin")
    assert merged.samples == 250
    assert merged.sample_rate_bounds[3][0] == max(
        profile.statistic("sampling_margin").sample_rate_bounds[3][0],
        other.statistic("sampling_margin").sample_rate_bounds[3][0],
    )
    old = json.loads(profile.to_json())
    for statistic in old["statistics"]:
        for key in ("samples", "sample_counts", "sample_rate_bounds", "sample_exceedances"):
            del statistic[key]
    legacy = NoiseProfile.from_json(json.dumps(old))
    with pytest.raises(EvidenceError, match="calibrate it again"):
        EvidenceTests.from_profile(legacy)
    assert not EvidenceTests.from_profile(legacy, EvidencePolicy(unit="token")).per_sample
    assert not NoiseProfile.merge(profile, legacy).statistic("sampling_margin").per_sample
    with pytest.raises(EvidenceError, match="unit"):
        EvidencePolicy(unit="tokens")
    bad = json.loads(profile.to_json())
    bad["statistics"][0]["sample_rate_bounds"] = [[0.5]]
    with pytest.raises(EvidenceError, match="per-sample bound"):
        NoiseProfile.from_json(json.dumps(bad))
