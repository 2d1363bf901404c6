"""Per-claim staleness metrics (issue 38 item 3; docs/inflight.md section 6): token staleness per span
version, rollout staleness from the oldest span, spans per sample, stale drops per reason; in the
orchestrator's ``claim`` event and in the run summary."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from prime_rl.api.protocol import (
    ClaimRequest,
    CommitRequest,
    RolloutBatch,
    TrainSample,
    Verdict,
    VerdictRequest,
)
from prime_rl.api.segments import Segment
from prime_rl.api.spans import VersionSpan
from prime_rl.api.staleness import claim_staleness, histogram_mean, histogram_quantile
from prime_rl.launch.report import render_summary, summarize_run
from prime_rl.metrics import MetricsWriter, read_metrics

from .conftest import INFLIGHT
from .ledger_support import _accept, _batch, _ledger, _submit


def _sample(version: int, tokens: int, spans: list[tuple[int, int]] | None = None, segments: Any = None) -> TrainSample:
    return TrainSample(
        sample_id="b/0", batch_id="b", worker_id="w", task_id=0, group_index=0, policy_version=version,
        prompt_tokens=[1], completion_tokens=[2] * tokens, behaviour_logprobs=[-1.0] * tokens,
        segments=segments,
        spans=None if spans is None else [VersionSpan(policy_version=v, first_token=b) for v, b in spans],
        temperature=1.0, reward=1.0, advantage=0.5,
    )  # fmt: skip


def test_claim_staleness_by_hand() -> None:
    """Step 3. A: v1, 100 tokens, no spans -> 100 tokens 2 behind. B: spans v1 [0,32), v2 [32,64),
    v3 [64,80) -> 32 tokens 2 behind, 32 one behind, 16 current. C: a v2 episode, model 10 + env 5 +
    model 7 -> 17 model tokens 1 behind (env tokens were not sampled). Tokens {0: 16, 1: 49, 2: 132}
    (197); mean (49 + 264) / 197; p50: cumulative 16, 65, 197 >= 98.5 at 2. Rollouts (oldest span):
    A and B 2 behind, C 1. Spans: A and C one, B three."""
    episode = [Segment(kind="model", length=10, turn=0), Segment(kind="env", length=5, turn=0),
               Segment(kind="model", length=7, turn=1)]  # fmt: skip
    samples = [_sample(1, 100), _sample(1, 80, [(1, 0), (2, 32), (3, 64)]), _sample(2, 22, segments=episode)]
    got = claim_staleness(samples, 3)
    assert got.token_staleness == {0: 16, 1: 49, 2: 132}
    assert got.rollout_staleness == {1: 1, 2: 2}
    assert got.spans_per_sample == {1: 2, 3: 1}
    metrics = got.metrics()
    assert metrics["token_staleness"] == {"0": 16, "1": 49, "2": 132}
    assert metrics["token_staleness_mean"] == (49 + 264) / 197
    assert metrics["token_staleness_p50"] == 2 and metrics["token_staleness_max"] == 2
    assert metrics["rollout_staleness_max"] == 2
    # Without spans (between-lease), B's 80 tokens would all count 2 behind: the spans are what lowers it.
    assert claim_staleness([_sample(1, 80)], 3).token_staleness == {2: 80}


@settings(max_examples=200, deadline=None)
@given(st.lists(st.tuples(st.integers(0, 5), st.integers(1, 200), st.lists(st.integers(1, 3), max_size=3)), min_size=1, max_size=6))
def test_claim_staleness_counts_every_token_once_and_never_above_its_rollout(draw: list[Any]) -> None:
    step = 9
    samples = []
    for version, tokens, steps_up in draw:
        spans, v = [(version, 0)], version
        for k, up in enumerate(steps_up, start=1):
            if 32 * k >= tokens:
                break
            v += up
            spans.append((v, 32 * k))
        samples.append(_sample(version, tokens, spans if len(spans) > 1 else None))
    got = claim_staleness(samples, step)
    assert sum(got.token_staleness.values()) == sum(tokens for _, tokens, _ in draw)
    assert max(got.token_staleness) <= max(got.rollout_staleness) == step - min(v for v, _, _ in draw)
    assert sum(got.rollout_staleness.values()) == sum(got.spans_per_sample.values()) == len(samples)


def test_histogram_quantile_and_mean() -> None:
    assert histogram_quantile({0: 1, 1: 1, 2: 2}, 0.5) == 1  # cumulative 1, 2 >= 2
    assert histogram_quantile({0: 1, 1: 1, 2: 2}, 0.9) == 2
    assert histogram_quantile({}, 0.5) == 0 and histogram_mean({}) == 0.0
    assert histogram_mean({1: 3, 4: 1}) == 7 / 4


def _spanned(batch: RolloutBatch, tokens: int, spans: list[tuple[int, int]]) -> RolloutBatch:
    samples = [
        s.model_copy(update={
            "completion_tokens": [2] * tokens, "inference_logprobs": [-1.0] * tokens,
            "spans": [VersionSpan(policy_version=v, first_token=b) for v, b in spans],
        })
        for s in batch.samples
    ]  # fmt: skip
    return batch.model_copy(update={"samples": samples})


def _stale_policy(ledger: Any, batch_id: str) -> None:
    n = len(ledger.batches[batch_id].task_ids)
    verdicts = [Verdict(sample_index=i, accepted=False, reason="stale_policy", reward=0.0, advantage=0.0) for i in range(n)]
    ledger.record_verdicts(VerdictRequest(batch_id=batch_id, verdicts=verdicts))


def test_claim_event_carries_staleness_and_stale_drops_per_reason(config_for: Any, tmp_path: Path) -> None:
    """async_level 1 (max_off_policy_steps = 1). Five v0 leases at step 0 (4 samples each): 1 trains at
    step 0, 2 at step 1; at step 2 (bound: v1) 3 is accepted but past the bound, 4 was never validated
    (expired at the claim), 5 the validator rejected as stale_policy. Step 2 trains a v1 lease whose
    samples switched to v2 at token 32 of 64: 32 tokens 1 behind, 32 current; rollouts 1 behind."""
    ledger, _ = _ledger(config_for, *INFLIGHT)  # the lease below switches once
    path = tmp_path / "metrics" / "orchestrator.jsonl"
    ledger.metrics = MetricsWriter(path, role="orchestrator", name="orchestrator")
    worker = ledger.workers[ledger.register("w").worker_id]
    ids = [_submit(ledger, worker, _batch(ledger.lease(worker, None, None))).batch_id for _ in range(5)]
    size = len(ledger.batches[ids[0]].task_ids)
    for batch_id in ids[:2]:
        _accept(ledger, batch_id)
    _stale_policy(ledger, ids[4])
    for step in (0, 1):
        assert ledger.claim(ClaimRequest(step=step, min_samples=size)).ready
        if step == 1:
            lease = ledger.lease(worker, None, None)  # fixes v1; v2 is committed while it decodes
        ledger.commit(CommitRequest(step=step, policy_version=step + 1))
    _accept(ledger, ids[2])
    fresh = _submit(ledger, worker, _spanned(_batch(lease, version=1), 64, [(1, 0), (2, 32)])).batch_id
    _accept(ledger, fresh, logprobs=[-0.5] * 64)
    claim = ledger.claim(ClaimRequest(step=2, min_samples=size))
    assert claim.ready and {s.batch_id for s in claim.samples} == {fresh}
    events = [r for r in read_metrics(path) if r["event"] == "claim"]
    assert [e["step"] for e in events] == [0, 1, 2]
    last = events[-1]
    assert last["stale_drops"] == {"past_bound": size, "expired": size, "stale_policy": size}
    assert last["token_staleness"] == {"0": 32 * size, "1": 32 * size}
    assert last["rollout_staleness"] == {"1": size} and last["spans_per_sample"] == {"2": size}
    assert events[0]["token_staleness"] == {"0": 2 * size} and events[1]["token_staleness"] == {"1": 2 * size}


def test_run_summary_sums_staleness_and_reports_drops(tmp_path: Path) -> None:
    metrics = tmp_path / "metrics"
    metrics.mkdir()
    trainer = [
        {"event": "batch", "step": 1, "waited_s": 1.0, "token_staleness": {"0": 30, "1": 10},
         "rollout_staleness": {"1": 2}, "spans_per_sample": {"1": 1, "2": 1}},
        {"event": "batch", "step": 2, "waited_s": 1.0, "token_staleness": {"1": 40, "2": 20, "x": 5},
         "rollout_staleness": {"2": 2}, "spans_per_sample": {"1": 2}},
    ]  # fmt: skip
    (metrics / "trainer.jsonl").write_text("".join(json.dumps(r) + "\n" for r in trainer))
    claims = [{"event": "claim", "stale_drops": {"past_bound": 1, "expired": 0, "stale_policy": 0}},
              {"event": "claim", "stale_drops": {"past_bound": 4, "expired": 8, "stale_policy": 0}}]  # fmt: skip
    (metrics / "orchestrator.jsonl").write_text("".join(json.dumps(r) + "\n" for r in claims))
    summary = summarize_run(tmp_path)
    assert summary.token_staleness == {0: 30, 1: 50, 2: 20}  # the odd key "x" is skipped
    assert summary.rollout_staleness == {1: 2, 2: 2} and summary.spans_per_sample == {1: 3, 2: 1}
    assert summary.stale_drops == {"past_bound": 4, "expired": 8, "stale_policy": 0}  # the last claim's
    text = render_summary(summary)
    # mean (50 + 40) / 100 = 0.90; p50: cumulative 30, 80 >= 50 at 1; p90: 100 >= 90 at 2
    assert "token staleness of trained tokens (versions): mean 0.90, p50 1, p90 2, max 2" in text
    assert "samples with 2+ versions: 1 of 4" in text
    assert "samples dropped as stale: past_bound 4, expired 8, stale_policy 0" in text
