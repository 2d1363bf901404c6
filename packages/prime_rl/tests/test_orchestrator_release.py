"""Release (orchestrator/release.py) over real HTTP: accepted samples reach a claim only once the
validator has accepted ``release_after_tokens`` more tokens of the same worker and that worker's
evidence is below ``release_max_evidence``; held samples never block leases; all of it survives a
restart, including a crash between a batch's verdicts and its ``judged`` event."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from prime_rl.api.client import OrchestratorClient
from prime_rl.api.protocol import Verdict, VerdictRequest
from prime_rl.orchestrator.release import ReleaseBook
from prime_rl.orchestrator.store import RolloutStore

SAMPLES = 4  # prompts_per_batch 2 x group_size 2
TOKENS = 2 * SAMPLES  # the validator's log-probs: 2 per accepted sample


def _verdicts(accept: bool = True) -> list[Verdict]:
    """One verdict per sample of a batch; accepted ones carry 2 recomputed log-probs (2 tokens)."""
    return [
        Verdict(
            sample_index=i,
            accepted=accept,
            reason="ok" if accept else "toploc_mismatch",
            reward=float(i % 2 == 0),
            advantage=1.0 if i % 2 == 0 else -1.0,
            logprobs=[-0.25, -0.5] if accept else [],
        )
        for i in range(SAMPLES)
    ]


def _judge(
    client: OrchestratorClient, batch_id: str, *, accept: bool = True, evidence: float | None = None
) -> None:
    client.post_verdicts(VerdictRequest(batch_id=batch_id, verdicts=_verdicts(accept), worker_evidence=evidence))


class Run:
    """One orchestrator and an admin client that also acts for several workers."""

    def __init__(self, server: Any, batch_for: Any) -> None:
        self.server = server
        self.client = OrchestratorClient(server.url, retries=0, admin_token=server.admin_token)
        self.batch_for = batch_for
        self.tokens: dict[str, str] = {}

    def register(self) -> str:
        worker_id = self.client.register().worker_id
        self.tokens[worker_id] = self.client.worker_token or ""
        return worker_id

    def submit(self, worker_id: str) -> str:
        self.client.worker_token = self.tokens[worker_id]
        lease = self.client.get_tasks(worker_id)
        return self.client.submit_rollouts(self.batch_for(lease)).batch_id


@pytest.fixture
def run_of(server_factory: Any, batch_for: Any) -> Any:
    """``run_of(*overrides) -> Run``: a new orchestrator whose trainer takes 2 samples a step, then
    ``overrides``."""
    return lambda *overrides: Run(server_factory("--trainer.samples_per_step", "2", *overrides), batch_for)


def test_a_batch_waits_for_later_accepted_tokens_of_its_own_worker(run_of: Any) -> None:
    run = run_of("--orchestrator.release_after_tokens", str(TOKENS + 2), "--orchestrator.probation_tokens", "0")
    a, b = run.register(), run.register()
    a1 = run.submit(a)
    _judge(run.client, a1)
    waiting = run.client.claim(0, 2)
    assert not waiting.ready and waiting.available_samples == 0 and waiting.held_samples == SAMPLES
    assert "held until their workers' evidence covers them" in waiting.reason
    _judge(run.client, run.submit(b))  # another worker's tokens release nothing of a's
    _judge(run.client, run.submit(a), accept=False)  # nor do rejected tokens (maybe never prefilled)
    _judge(run.client, run.submit(a))  # TOKENS after a1: short of TOKENS + 2
    waiting = run.client.claim(0, 2)
    assert (waiting.available_samples, waiting.held_samples) == (0, 3 * SAMPLES)
    _judge(run.client, run.submit(a))  # 2 * TOKENS after a1: a1 released, nothing else
    claim = run.client.claim(0, SAMPLES)
    assert claim.ready and {s.batch_id for s in claim.samples} == {a1}
    assert claim.held_samples == 0  # (counted only when not ready)


def test_a_batch_judged_while_evidence_was_high_is_never_released(run_of: Any) -> None:
    """Release looks at the largest evidence reported with the batch or after it, not the latest:
    honest batches that bring the evidence back down release themselves, never the earlier ones."""
    run = run_of("--orchestrator.release_after_tokens", "0", "--orchestrator.release_max_evidence", "0.25")
    a = run.register()
    a0 = run.submit(a)
    _judge(run.client, a0, evidence=0.05)
    assert run.client.claim(0, SAMPLES).ready  # a0 claimed: below the bound when judged and since
    run.client.commit(0, 1)
    a1 = run.submit(a)
    _judge(run.client, a1, evidence=0.3)
    assert run.client.claim(1, 2).held_samples == SAMPLES
    a2 = run.submit(a)
    _judge(run.client, a2, evidence=0.25)  # at the limit: still held
    assert run.client.claim(1, 2).held_samples == 2 * SAMPLES
    a3 = run.submit(a)
    _judge(run.client, a3, evidence=0.05)  # an honest level again: only a3 is released
    for _ in range(3):
        _judge(run.client, run.submit(a), evidence=0.0)  # honest tokens wash nothing out
    waiting = run.client.claim(1, 5 * SAMPLES)
    assert (waiting.available_samples, waiting.held_samples) == (4 * SAMPLES, 2 * SAMPLES)
    claim = run.client.claim(1, 4 * SAMPLES)
    assert claim.ready and a3 in {s.batch_id for s in claim.samples}
    assert not {a1, a2} & {s.batch_id for s in claim.samples}


def test_held_samples_never_block_leases(run_of: Any) -> None:
    run = run_of("--orchestrator.release_after_tokens", "1000", "--orchestrator.max_buffered_samples", "6")
    a = run.register()
    for _ in range(6):  # 24 accepted samples, all held: backpressure (6) would refuse were they counted
        _judge(run.client, run.submit(a))
    assert run.client.claim(0, 2).held_samples == 6 * SAMPLES


def test_release_survives_a_restart_and_a_crash_between_verdicts_and_judged(
    run_of: Any, server_factory: Any, tmp_path: Any
) -> None:
    flags = (
        "--orchestrator.release_after_tokens", str(TOKENS), "--orchestrator.probation_tokens", "0",
        "--trainer.samples_per_step", "2",
    )  # fmt: skip
    run = run_of(*flags)
    a = run.register()
    a1, a2, a3 = run.submit(a), run.submit(a), run.submit(a)
    _judge(run.client, a1)
    _judge(run.client, a2)
    before = run.client.claim(0, 1 << 20)
    assert (before.available_samples, before.held_samples) == (SAMPLES, SAMPLES)  # a1 released, a2 held
    run.server.stop()
    # a3's verdicts reach the store but the orchestrator dies before its ``judged`` event.
    store = RolloutStore(tmp_path / "orchestrator")
    store.write_verdicts(a3, _verdicts())
    assert a3 not in {e.get("batch_id") for e in store.events() if e.get("event") in ReleaseBook.EVENTS}
    restarted = server_factory(*flags)
    client = OrchestratorClient(restarted.url, retries=0, admin_token=restarted.admin_token)
    after = client.claim(0, 1 << 20)
    assert (after.available_samples, after.held_samples) == (2 * SAMPLES, SAMPLES)  # a3 counted: a2 released
    claim = client.claim(0, 2 * SAMPLES)
    assert {s.batch_id for s in claim.samples} == {a1, a2}


class _NoStore:
    def append_event(self, event: dict[str, Any]) -> None:
        pass


@settings(max_examples=200, deadline=None)
@given(
    st.lists(
        st.tuples(st.integers(0, 3), st.one_of(st.none(), st.sampled_from([0.0, 0.1, 0.2, 0.25, 0.3]))),
        min_size=1,
        max_size=30,
    ),
    st.integers(0, 12),
)
def test_release_equals_the_whole_history_reference(judgements: list[tuple[int, float | None]], after: int) -> None:
    """``released`` (suffix maxima) equals the definition evaluated on the whole history: batch k is
    released iff the worker's accepted tokens reach its own cumulative count + ``after`` and every
    evidence reported with judgement k or later is below 0.25."""
    book = ReleaseBook(_NoStore(), after_tokens=after, max_evidence=0.25)  # type: ignore[arg-type]
    for k, (samples, evidence) in enumerate(judgements):
        verdicts = [Verdict(sample_index=i, accepted=True, reason="ok", reward=0.0, advantage=0.0, logprobs=[-1.0])
                    for i in range(samples)] or _verdicts(accept=False)  # fmt: skip
        book.judged(f"b{k}", "w", verdicts, evidence)
    cumulative = [sum(samples for samples, _ in judgements[: k + 1]) for k in range(len(judgements))]
    for k in range(len(judgements)):
        later = [e for _, e in judgements[k:] if e is not None]
        expected = cumulative[-1] >= cumulative[k] + after and all(e < 0.25 for e in later)
        assert book.released(f"b{k}", "w") == expected, k


def _beyond(count: int) -> list[Verdict]:
    """``_verdicts()`` with ``count`` tokens beyond the sampling tolerance in the last sample."""
    verdicts = _verdicts()
    verdicts[-1] = verdicts[-1].model_copy(update={"beyond_tolerance": count})
    return verdicts


def test_a_batch_with_a_token_beyond_the_sampling_tolerance_is_never_released() -> None:
    """Issue #34 item 9: the allowance beyond the tolerance can be spent on chosen tokens, and one to
    five of them lift the evidence less than the release bound. Such a batch is withheld for good,
    whatever the evidence; its tokens still count towards releasing the worker's later batches, not
    towards the probation budget, and replaying the events gives the same book."""
    events: list[dict[str, Any]] = []

    class Store:
        def append_event(self, event: dict[str, Any]) -> None:
            events.append(event)

    def book(store: Any) -> ReleaseBook:
        return ReleaseBook(store, after_tokens=TOKENS, max_evidence=0.25, probation_tokens=TOKENS,
                           probation_release_share=1.0)  # fmt: skip

    live = book(Store())
    live.judged("p0", "w", _verdicts(), 0.0)  # probation (trusted from here)
    live.judged("p1", "w", _beyond(1), 0.0)  # trusted work, withheld: funds no probation budget
    for k in range(2, 5):
        live.judged(f"p{k}", "w", _verdicts(), 0.0)
    live.judged("h", "honest", _verdicts(), 0.0)
    live.judged("q0", "fresh", _beyond(2), 0.0)  # a probation batch withheld: never granted
    live.judged("q1", "fresh", _verdicts(), 0.0)
    assert not live.released("p1", "w") and not live.released("q0", "fresh")
    assert live.released("p2", "w") and live.released("p3", "w") and not live.released("p4", "w")
    assert live.worker_tokens("w") == 5 * TOKENS  # p1 prefilled and fed the evidence: its tokens count
    assert live.trusted_tokens == 3 * TOKENS + TOKENS  # p2..p4 and q1, not p1
    assert [e.get("withheld", False) for e in events] == [False, True, False, False, False, False, True, False]
    replayed = book(_NoStore())
    for event in events:
        replayed.replay(event)
    for batch_id, worker in [("p0", "w"), ("p1", "w"), ("p2", "w"), ("p3", "w"), ("q0", "fresh"), ("q1", "fresh")]:
        assert replayed.released(batch_id, worker) == live.released(batch_id, worker), batch_id


def test_a_withheld_batch_is_never_claimed_over_http(run_of: Any) -> None:
    run = run_of("--orchestrator.release_after_tokens", "0", "--orchestrator.probation_tokens", "0")
    a = run.register()
    a0, a1 = run.submit(a), run.submit(a)
    run.client.post_verdicts(VerdictRequest(batch_id=a0, verdicts=_beyond(1), worker_evidence=0.0))
    _judge(run.client, a1, evidence=0.0)
    waiting = run.client.claim(0, 2 * SAMPLES)
    assert (waiting.available_samples, waiting.held_samples) == (SAMPLES, SAMPLES)
    claim = run.client.claim(0, SAMPLES)
    assert claim.ready and {s.batch_id for s in claim.samples} == {a1}


def test_a_withheld_batchs_tasks_go_to_another_identity(run_of: Any) -> None:
    """One token beyond the tolerance keeps a batch out of training, so it must not keep its tasks out
    too (issue #34 item 2, the free veto): they are leased again to another identity, without charge
    (honest noise puts such tokens there too), as an expired lease's are."""
    run = run_of("--orchestrator.probation_tokens", "0")
    a, b = run.register(), run.register()
    run.client.worker_token = run.tokens[a]
    lease = run.client.get_tasks(a)
    batch_id = run.client.submit_rollouts(run.batch_for(lease)).batch_id
    run.client.post_verdicts(VerdictRequest(batch_id=batch_id, verdicts=_beyond(1), worker_evidence=0.0))
    run.client.worker_token = run.tokens[b]
    again = run.client.get_tasks(b)
    assert again.reassigned_from is not None and again.reassigned_from.worker_id == a
    assert [t.task_id for t in again.tasks] == [t.task_id for t in lease.tasks]
    stats = {w.worker_id: w for w in run.client.workers().workers}
    assert stats[a].leases_expired == 0  # no charge
