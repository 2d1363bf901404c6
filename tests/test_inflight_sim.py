"""benchmarks/inflight_sim.py: behavioural properties of the scheduling simulation.

Each property is checked on the simulation as written and, to show the check can fail, on a
deliberately broken variant (a monkeypatched rule) where it must not hold.
"""

from __future__ import annotations

import sys
from dataclasses import asdict, replace
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))

import inflight_sim
from inflight_sim import SimParams, simulate

# Small and fast (a run takes a fraction of a second): 16 workers, 128 samples per step, 12 steps.
SMALL = SimParams(workers=16, samples_per_step=128, steps=12, warmup_steps=3)


def test_sync_trains_only_on_policy_tokens(monkeypatch: pytest.MonkeyPatch) -> None:
    result = simulate(replace(SMALL, mode="sync", bound=0))
    assert set(result.staleness_hist) == {0} and result.dropped_samples == 0
    # Broken: sync that lets a lease start one version behind the step.
    monkeypatch.setattr(inflight_sim, "required_version", lambda params, step: max(0, step - 1))
    broken = simulate(replace(SMALL, mode="sync", bound=0))
    assert broken.staleness_max >= 1


def _instant_equal_lengths(kv: str = "keep", prefill_tok_s: float = 20000.0) -> tuple[float, float]:
    base = replace(SMALL, lengths="uniform", broadcast_s=0.0, swap_pause_s=0.0, bound=1, kv=kv, prefill_tok_s=prefill_tok_s)
    between = simulate(replace(base, mode="between_lease"))
    inflight = simulate(replace(base, mode="inflight"))
    return between.trained_tokens_per_s, inflight.trained_tokens_per_s


def test_keep_kv_inflight_costs_nothing_with_equal_lengths_and_instant_broadcasts() -> None:
    # Same drop rule (oldest span = lease start version), same leases, no pause: the same claims,
    # so the same throughput; only the tokens' versions differ.
    between, inflight = _instant_equal_lengths()
    assert inflight == pytest.approx(between, rel=0.01)
    # Broken (for this property): switches that re-prefill every live sequence on a slow prefill.
    between, recompute = _instant_equal_lengths(kv="recompute", prefill_tok_s=500.0)
    assert recompute < 0.97 * between


@pytest.mark.parametrize("bound", [1, 2])
def test_inflight_trained_rollouts_respect_max_off_policy_steps(bound: int, monkeypatch: pytest.MonkeyPatch) -> None:
    result = simulate(replace(SMALL, mode="inflight", bound=bound, workers=32))
    assert result.switches > 0
    assert result.rollout_staleness_max <= bound and result.staleness_max <= bound
    # In-flight tokens are fresher than their rollout's first span: some trained tokens were switched.
    assert result.switched_token_share > 0
    # Broken: staleness counted from the NEWEST span lets rollouts with older spans through.
    monkeypatch.setattr(inflight_sim, "rollout_version", lambda lease: lease.spans[-1][0])
    broken = simulate(replace(SMALL, mode="inflight", bound=bound, workers=32))
    assert broken.rollout_staleness_max > bound


def test_deterministic_per_seed(monkeypatch: pytest.MonkeyPatch) -> None:
    params = replace(SMALL, mode="inflight")
    assert asdict(simulate(params)) == asdict(simulate(params))
    assert simulate(params).claims != simulate(replace(params, seed=1)).claims
    # Broken: draws that ignore the seed make every seed the same run.
    original = inflight_sim._rng
    monkeypatch.setattr(inflight_sim, "_rng", lambda seed, *key: original(0, *key))
    assert simulate(params).claims == simulate(replace(params, seed=1)).claims


def test_long_tail_lengths_have_a_tail_ten_times_the_median() -> None:
    lengths = sorted(n for lease in range(200) for n in inflight_sim.draw_lengths(SMALL, lease))
    median = lengths[len(lengths) // 2]
    long_share = sum(n >= 5 * median for n in lengths) / len(lengths)
    assert 0.01 < long_share < 0.06 and max(lengths) >= 10 * median


def test_rejects_unknown_mode() -> None:
    with pytest.raises(ValueError, match="mode must be one of"):
        simulate(replace(SMALL, mode="pipelined"))


def test_group_submission_with_equal_lengths_is_lease_submission(monkeypatch: pytest.MonkeyPatch) -> None:
    # Every group ends with the lease when all completions are equally long, pauses of in-flight
    # switches included, so submitting per group changes nothing.
    base = replace(SMALL, mode="inflight", lengths="uniform", swap_pause_s=3.0)
    by_lease = simulate(base)
    assert by_lease.switches > 0
    assert simulate(replace(base, submit="group")).claims == by_lease.claims
    # Broken: a group's end time that forgets the switch pauses submits groups before they exist.
    monkeypatch.setattr(inflight_sim._Lease, "time_at", lambda lease, tokens: lease.start + tokens / lease.rate)
    assert simulate(replace(base, submit="group")).claims != by_lease.claims


# ---------------------------------------------------------------- the continuous-batching what-if

CONTINUOUS = replace(SMALL, engine="continuous", submit="group")


@pytest.mark.parametrize("bound", [1, 2])
def test_continuous_inflight_respects_the_bound_and_counts_every_token(bound: int, monkeypatch: pytest.MonkeyPatch) -> None:
    result = simulate(replace(CONTINUOUS, mode="inflight", bound=bound))
    assert result.switches > 0 and result.switched_token_share > 0
    assert result.rollout_staleness_max <= bound and result.staleness_max <= bound
    trained = sum(c["tokens"] for c in result.claims if SMALL.warmup_steps <= c["step"] < SMALL.steps)
    assert sum(result.staleness_hist.values()) == trained
    # Broken: a claim that drops groups by their newest member's first version lets older tokens through.
    import inflight_sim_continuous

    original = inflight_sim_continuous.ContinuousSim.trainer_try

    def newest_first(self: inflight_sim_continuous.ContinuousSim, t: float) -> None:
        self.buffer = [[(max(v for v, _, _ in group), b, n) for _, b, n in group] for group in self.buffer]
        original(self, t)

    monkeypatch.setattr(inflight_sim_continuous.ContinuousSim, "trainer_try", newest_first)
    assert simulate(replace(CONTINUOUS, mode="inflight", bound=bound)).staleness_max > bound


@pytest.mark.parametrize("drain", ["eager", "lazy"])
def test_continuous_between_lease_never_mixes_versions_in_a_sample(drain: str) -> None:
    result = simulate(replace(CONTINUOUS, mode="between_lease", bound=2, drain=drain))
    assert result.switched_token_share == 0 and result.switches == 0
    assert result.rollout_staleness_max <= 2


def test_refilling_slots_beats_lock_step_with_the_long_tail(monkeypatch: pytest.MonkeyPatch) -> None:
    lock_step = simulate(replace(SMALL, mode="inflight", bound=1, submit="group"))
    continuous = simulate(replace(CONTINUOUS, mode="inflight", bound=1))
    assert continuous.trained_tokens_per_s > 1.2 * lock_step.trained_tokens_per_s
    # Broken: an engine that refills only once every slot is empty is lock step again.
    import inflight_sim_continuous

    original = inflight_sim_continuous.ContinuousSim.fill

    def fill_when_empty(self: inflight_sim_continuous.ContinuousSim, wi: int, t: float) -> None:
        if not any(self.workers[wi].slots):
            original(self, wi, t)

    monkeypatch.setattr(inflight_sim_continuous.ContinuousSim, "fill", fill_when_empty)
    broken = simulate(replace(CONTINUOUS, mode="inflight", bound=1))
    assert broken.trained_tokens_per_s < 1.1 * lock_step.trained_tokens_per_s
