"""Issue 25 on the orchestrator's side, against the real HTTP server with a hand-stepped clock:
walking away, starving neighbours, hit and run, diluted steering and Sybil churn.

Every client here reaches the server from 127.0.0.1, so all identities share one client address,
the worst case for per-address rules. The validator and trainer are played by this test (admin
client): it posts verdicts with the ``worker_evidence`` a validator would report and claims
everything released. Most tests script that evidence on either side of a rule's bound, which
tests the rule; the last one computes it from steered tokens with the validator's own evidence
code, which tests that a real attack reaches the bound. Counts, not wall-clock time: leases granted per simulated round.
"""

from __future__ import annotations

from collections import Counter
from pathlib import Path
from typing import Any

import pytest

from prime_rl.api.client import ClientRequestError, OrchestratorBusy, OrchestratorClient
from prime_rl.api.protocol import TaskLease, TrainSample, Verdict, VerdictRequest
from prime_rl.orchestrator.lease_rules import MACHINE_REASONS
from prime_rl.orchestrator.server import OrchestratorServer
from prime_rl.tasks import TaskSet

TIMEOUT_S = 10.0
TOKENS_PER_SAMPLE = 2  # make_batch's completions; the verdicts below carry 2 log-probs each


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


class Sim:
    """One orchestrator over HTTP; this object plays workers, the validator and the trainer."""

    def __init__(self, run_dir: Path, config_for: Any, make_batch: Any, *overrides: str) -> None:
        self.clock = Clock()
        self.make_batch = make_batch
        config = config_for(
            "--run_dir", str(run_dir), "--orchestrator.task_timeout_s", str(TIMEOUT_S),
            "--orchestrator.register_rate_per_minute", "0", *overrides,
        )  # fmt: skip
        self.config = config
        self.tasks = TaskSet([{"prompt": f"task {i}"} for i in range(50)])
        self.server = self._start()
        self.http = OrchestratorClient(self.server.url, retries=0, admin_token=self.server.admin_token)
        self.tokens: dict[str, str] = {}
        self.step = 0
        self.trained: list[TrainSample] = []
        self.fresh_tasks: Counter[int] = Counter()  # tasks of every fresh (not reassigned) lease issued
        self.spoiled = 0  # leases answered with a batch the validator rejects (``spoil``)

    def _start(self) -> OrchestratorServer:
        return OrchestratorServer(self.config, self.tasks, clock=self.clock, registration_clock=self.clock).start()

    def restart(self) -> None:
        """Stop the orchestrator and start a new one on the same store (state rebuilt from disk)."""
        self.server.stop()
        self.http.close()
        self.server = self._start()
        self.http = OrchestratorClient(self.server.url, retries=0, admin_token=self.server.admin_token)

    def close(self) -> None:
        self.http.close()
        self.server.stop()

    def register(self) -> str:
        worker_id = self.http.register().worker_id
        self.tokens[worker_id] = self.http.worker_token or ""
        return worker_id

    def lease(self, worker_id: str) -> TaskLease | None:
        """A lease, or None when refused (409 allowance, 429 busy, 403 banned)."""
        self.http.worker_token = self.tokens[worker_id]
        try:
            lease = self.http.get_tasks(worker_id)
        except OrchestratorBusy:  # 429
            return None
        except ClientRequestError as refused:
            assert refused.status in (403, 409), refused
            return None
        if lease.reassigned_from is None:
            self.fresh_tasks.update(task.task_id for task in lease.tasks)
        return lease

    def answer(self, lease: TaskLease, *, evidence: float | None = 0.0) -> str:
        """Submit ``lease`` and judge it: every sample accepted, the worker's evidence ``evidence``."""
        self.http.worker_token = self.tokens[lease.worker_id]
        batch_id = self.http.submit_rollouts(self.make_batch(lease, self.step)).batch_id
        samples = len(lease.tasks) * lease.group_size
        verdicts = [
            Verdict(sample_index=i, accepted=True, reason="ok", reward=float(i % 2), advantage=float(i % 2) - 0.5,
                    logprobs=[-0.5] * TOKENS_PER_SAMPLE)
            for i in range(samples)
        ]  # fmt: skip
        self.http.post_verdicts(VerdictRequest(batch_id=batch_id, verdicts=verdicts, worker_evidence=evidence))
        return batch_id

    def spoil(self, lease: TaskLease, reason: str) -> str:
        """Submit ``lease`` and reject it as a validator does when one sample fails with ``reason``."""
        self.http.worker_token = self.tokens[lease.worker_id]
        batch_id = self.http.submit_rollouts(self.make_batch(lease, self.step)).batch_id
        samples = len(lease.tasks) * lease.group_size
        verdicts = [
            Verdict(sample_index=i, accepted=False, reason=reason if i == 0 else "lease_rejected", reward=0.0,
                    advantage=0.0)
            for i in range(samples)
        ]  # fmt: skip
        self.http.post_verdicts(VerdictRequest(batch_id=batch_id, verdicts=verdicts, worker_evidence=0.0))
        self.spoiled += 1
        return batch_id

    def submit_unjudged(self, lease: TaskLease) -> str:
        """Submit ``lease`` with its own version, for a validator that has not judged it yet."""
        self.http.worker_token = self.tokens[lease.worker_id]
        return self.http.submit_rollouts(self.make_batch(lease, lease.policy_version)).batch_id

    def train(self) -> list[TrainSample]:
        """Claim every released sample for the current step and commit it (a trainer that takes all)."""
        available = self.http.claim(self.step, 1 << 20, filter_zero_advantage=False).available_samples
        if not available:
            return []
        claim = self.http.claim(self.step, available, filter_zero_advantage=False)
        assert claim.ready
        self.http.commit(self.step, self.step + 1)
        self.step += 1
        self.trained.extend(claim.samples)
        return claim.samples

    def tick(self, seconds: float) -> None:
        self.clock.now += seconds
        self.server.ledger.expire_leases()  # the server's own loop does this every second; here at once


@pytest.fixture
def sim_factory(tmp_path: Path, config_for: Any, batch_for: Any) -> Any:
    sims: list[Sim] = []

    def make(name: str, *overrides: str) -> Sim:
        sim = Sim(tmp_path / name, config_for, batch_for, *overrides)
        sims.append(sim)
        return sim

    yield make
    for sim in sims:
        sim.close()


def trained_tasks(sim: Sim, group_size: int = 2) -> Counter[int]:
    counts = Counter(sample.task_id for sample in sim.trained)
    assert all(n % group_size == 0 for n in counts.values())
    return Counter({task: n // group_size for task, n in counts.items()})


# ---------------------------------------------------------------- walking away


def _walking_away(sim: Sim, *, attacker: bool, rounds: int = 60, spoil: str | None = None) -> None:
    """Two honest workers and (``attacker``) one that keeps only the leases whose tasks are all < 25:
    it walks away from the others, or (``spoil``) answers them with a batch the validator rejects
    for that reason (a lowered claim, a sandbox timeout it caused, a raised claim), or (``spoil``
    "late") answers them once a step was trained since, too late to train on (run it with
    async_level 0)."""
    honest = [sim.register(), sim.register()]
    abandoner = sim.register() if attacker else ""
    kept_own: list[str] = []
    held: list[TaskLease] = []
    for round_ in range(rounds):
        for worker_id in honest:
            lease = sim.lease(worker_id)
            assert lease is not None, f"honest {worker_id} refused in round {round_}"
            sim.answer(lease)
        if attacker:
            for late in held:  # a step was trained since it was leased: too old to train on now
                sim.submit_unjudged(late)
            held.clear()
            lease = sim.lease(abandoner)
            if lease is None and sim.server.ledger.workers[abandoner].banned:
                abandoner = sim.register()  # banned for walking away: a fresh identity
                lease = sim.lease(abandoner)
            if lease is not None:
                if lease.reassigned_from is not None and lease.reassigned_from.worker_id == abandoner:
                    kept_own.append(abandoner)
                if all(task.task_id < 25 for task in lease.tasks):  # keeps only the "easy" half's leases
                    sim.answer(lease)
                elif spoil == "late":
                    held.append(lease)
                elif spoil is not None:
                    sim.spoil(lease, spoil)
        sim.train()
        sim.tick(TIMEOUT_S / 3)
    sim.tick(2 * TIMEOUT_S)  # every abandoned lease expires
    while sim.server.ledger.leases.awaiting_reassignment():  # honest workers answer what was left
        sim.answer(sim.lease(honest[0]) or pytest.fail("honest worker refused"))
    sim.train()
    assert not kept_own  # an abandoned lease never goes back to the identity that abandoned it


@pytest.mark.parametrize("spoil", [None, "reward_unverifiable", "tool_unverifiable", "reward_mismatch", "late"])
def test_walking_away_changes_nothing_that_is_trained(sim_factory: Any, spoil: str | None) -> None:
    """Issues 25 and 34: an attacker that walks away from the leases it does not want trained,
    answers them with a batch it makes the validator reject (a veto), or answers them too late to
    train on, changes nothing that is trained; walking away and vetoes cost it, up to the
    abandonment ban (a veto for reasons the machine may explain costs the allowance but no ban, issue
    46; a late answer costs nothing: a slow validator looks the same)."""
    overrides = ("--orchestrator.async_level", "0") if spoil == "late" else ()
    attacked = sim_factory("attacked", *overrides)
    _walking_away(attacked, attacker=True, spoil=spoil)
    baseline = sim_factory("baseline", *overrides)
    _walking_away(baseline, attacker=False)
    # Oracle: what is trained is exactly what the keyed assignment drew (every fresh lease's tasks,
    # once each), whichever leases the attacker kept; a dropped or duplicated abandoned task fails it.
    assert trained_tasks(attacked) == attacked.fresh_tasks
    assert trained_tasks(baseline) == baseline.fresh_tasks
    stats = {w.worker_id: w for w in attacked.http.workers().workers}
    abandoned = sum(w.leases_expired for w in stats.values()) + attacked.spoiled
    if spoil == "late":
        assert sum(w.samples_expired for w in stats.values()) >= 8 * 4  # answered late was tried
    elif spoil in MACHINE_REASONS:  # issue 46: costs the allowance, never the abandonment ban
        assert abandoned >= 8
    else:
        assert abandoned >= 8 and sum(w.banned for w in stats.values()) >= 2  # walking away was tried, and cost
    # The attacker kept only leases of tasks < 25; the trained share of those stays what the draws give,
    # as without it: two-proportion z-test, |z| < 4 (chance failure ~6e-5).
    shares = []
    for sim in (attacked, baseline):
        tasks = trained_tasks(sim)
        easy, total = sum(n for t, n in tasks.items() if t < 25), sum(tasks.values())
        shares.append((easy, total))
    (e1, n1), (e2, n2) = shares
    pooled = (e1 + e2) / (n1 + n2)
    z = (e1 / n1 - e2 / n2) / (pooled * (1 - pooled) * (1 / n1 + 1 / n2)) ** 0.5
    assert abs(z) < 4, (shares, z)


# ---------------------------------------------------------------- starvation by neighbours


def _honest_leases(sim: Sim, *, hoarders: int, rounds: int = 40) -> tuple[int, int]:
    """(leases granted to the honest worker, most open hoarder leases at once) over ``rounds``."""
    honest = sim.register()
    for _ in range(3):  # accepted history before the hoarders arrive
        sim.answer(sim.lease(honest) or pytest.fail("refused"))
    hoarding = [sim.register() for _ in range(hoarders)]
    granted, most_open = 0, 0
    for _ in range(rounds):
        for i, worker_id in enumerate(hoarding):
            if sim.server.ledger.workers[worker_id].banned:
                hoarding[i] = worker_id = sim.register()  # banned for abandoning: a fresh one takes its place
            while sim.lease(worker_id) is not None:  # take all it can, answer nothing
                pass
        most_open = max(most_open, sum(sim.server.ledger.leases.open_count(w) for w in hoarding))
        lease = sim.lease(honest)
        if lease is not None:
            granted += 1
            sim.answer(lease)
        sim.train()
        sim.tick(TIMEOUT_S / 4)
    return granted, most_open


def test_hoarding_identities_on_the_same_address_do_not_starve_an_honest_worker(sim_factory: Any) -> None:
    alone, _ = _honest_leases(sim_factory("alone"), hoarders=0)
    crowded, most_open = _honest_leases(sim_factory("crowded"), hoarders=16)
    assert most_open == 16  # the hoarders did fill the per-address cap (max_open_leases_per_address 16)
    assert crowded == alone == 40  # every round's lease granted: within 20% (in fact equal)


# ---------------------------------------------------------------- steering inside the tolerances


def _claimed_batches(sim: Sim) -> set[str]:
    return {sample.sample_id.rsplit("/", 1)[0] for sample in sim.trained}


def test_hit_and_run_never_trains_its_steered_batch(sim_factory: Any) -> None:
    """A fresh identity steers its first lease (the evidence rises to 0.15 of the ban threshold),
    then answers honestly while a CUSUM-like evidence falls back to 0: the steered batch stays held
    for good, both during probation (bound 0.1 never met) and for a trusted identity (bound 0.25)."""
    sim = sim_factory("hit", "--orchestrator.probation_tokens", "16", "--orchestrator.probation_release_share", "1")
    honest = sim.register()
    runner = sim.register()
    steered = sim.answer(sim.lease(runner) or pytest.fail("refused"), evidence=0.15)
    for _ in range(10):
        sim.answer(sim.lease(honest) or pytest.fail("refused"))
        sim.answer(sim.lease(runner) or pytest.fail("refused"), evidence=0.0)
        sim.train()
    assert steered not in _claimed_batches(sim)
    assert {s.worker_id for s in sim.trained} == {honest}  # never trusted: nothing of the runner's trains
    # A trusted identity doing the same: the batches judged up to the steered one (0.3) and the one
    # after it (0.26) stay held; the one judged at 0.2 and later honest ones are released.
    trusted = sim.register()
    before = [sim.answer(sim.lease(trusted) or pytest.fail("refused"), evidence=0.0) for _ in range(3)]
    steered = sim.answer(sim.lease(trusted) or pytest.fail("refused"), evidence=0.3)
    also_held = sim.answer(sim.lease(trusted) or pytest.fail("refused"), evidence=0.26)
    after = [sim.answer(sim.lease(trusted) or pytest.fail("refused"), evidence=e) for e in [0.2] + [0.0] * 20]
    for _ in range(10):
        sim.answer(sim.lease(honest) or pytest.fail("refused"))
        sim.train()
    claimed = _claimed_batches(sim)
    assert not {*before, steered, also_held} & claimed and set(after) <= claimed


def test_diluted_steering_below_the_release_bound_never_passes_probation(sim_factory: Any) -> None:
    """One batch in ten steered, evidence peaking at 0.18 of the ban threshold (under the release
    bound 0.25, as measured in issue 25) and falling back in between: on probation that is over the
    stricter 0.1, so nothing the identity sends is ever trained on."""
    sim = sim_factory("diluted", "--orchestrator.probation_tokens", "64", "--orchestrator.probation_release_share", "1")
    honest, steerer = sim.register(), sim.register()
    for i in range(60):
        sim.answer(sim.lease(honest) or pytest.fail("refused"))
        sim.answer(sim.lease(steerer) or pytest.fail("refused"), evidence=0.18 if i % 10 == 0 else 0.02)
        sim.train()
    assert sim.trained and {s.worker_id for s in sim.trained} == {honest}
    assert not sim.server.ledger.release.trusted(steerer) and sim.server.ledger.release.trusted(honest)


def test_sybil_churn_is_bounded_by_the_probation_budget(sim_factory: Any) -> None:
    """Ten fresh identities each steer their first batch weakly (evidence 0.05, under every bound)
    and then pass probation honestly. Their probation batches share one run-wide budget: released
    probation tokens stay within probation_release_share (0.1) of the trusted tokens, so the ten
    steered batches together reach training no faster than one identity's would."""
    sim = sim_factory(
        "sybil", "--orchestrator.probation_tokens", "16", "--orchestrator.probation_release_share", "0.1",
        "--orchestrator.async_level", "1000",  # a trainer that takes everything, however late it is released
    )  # fmt: skip
    honest = sim.register()
    for _ in range(3):
        sim.answer(sim.lease(honest) or pytest.fail("refused"))
    steered: list[str] = []
    for _ in range(10):
        sybil = sim.register()
        steered.append(sim.answer(sim.lease(sybil) or pytest.fail("refused"), evidence=0.05))
        sim.answer(sim.lease(sybil) or pytest.fail("refused"), evidence=0.0)  # 8 + 8 accepted tokens: trusted
        assert sim.server.ledger.release.trusted(sybil)
    for round_ in range(40):
        sim.answer(sim.lease(honest) or pytest.fail("refused"))
        sim.train()
        release = sim.server.ledger.release
        assert release.granted_tokens <= 0.1 * release.trusted_tokens
        trained_steered = len(set(steered) & _claimed_batches(sim))
        # A batch is 4 samples x 2 tokens = 8 tokens: at most one steered batch per 80 trusted tokens.
        assert trained_steered * 8 <= 0.1 * release.trusted_tokens, round_
    assert 0 < len(set(steered) & _claimed_batches(sim)) < 10  # the budget releases them slowly, in order


def test_a_restart_forgives_nothing(sim_factory: Any) -> None:
    """Leases, abandonment, evidence, probation and the budget are rebuilt from the store exactly:
    every batch's release, every identity's allowance and trust are the same after a restart."""
    sim = sim_factory("restart", "--orchestrator.probation_tokens", "16", "--orchestrator.probation_release_share", "0.5")
    honest, steerer, walker = sim.register(), sim.register(), sim.register()
    batches = []
    for i in range(12):
        batches.append(sim.answer(sim.lease(honest) or pytest.fail("refused")))
        batches.append(sim.answer(sim.lease(steerer) or pytest.fail("refused"), evidence=0.3 if i == 4 else 0.0))
        sim.lease(walker)  # never answered
        sim.tick(TIMEOUT_S / 2)
        if i % 4 == 3:
            sim.train()
    ledger = sim.server.ledger

    def state() -> Any:
        release = sim.server.ledger.release
        workers = (honest, steerer, walker)
        return (
            [release.released(b, b.split("-")[0]) for b in batches],
            [sim.server.ledger.lease_allowance(w) for w in workers],
            [release.trusted(w) for w in workers],
            [sim.server.ledger.workers[w].banned for w in workers],
            (release.trusted_tokens, release.granted_tokens),
            sim.server.ledger.rules.fresh_cap("127.0.0.1"),
        )

    before = state()
    assert before[0].count(False) >= 4 and before[3] == [False, False, True]  # something is held; walker banned
    sim.restart()
    assert sim.server.ledger is not ledger and state() == before


# ---------------------------------------------------------------- steering, with the evidence computed


class ComputedEvidence:
    """What the validator reports as ``worker_evidence``, computed instead of scripted: toploc's
    seeded sampler draws each token of a sample (fp32: the worker's logits are the validator's, so
    honest margins are exactly 0), a steering worker takes the runner-up wherever it lies within
    the per-sample tolerance on a share of positions, ``sampling_margins`` recomputes every
    token's shortfall as the validator does, and the validator's own ``EvidenceLedger``, under a
    profile calibrated on honest samples of the same generator, gives the fraction it reports."""

    LENGTH, VOCAB, TOLERANCE = 128, 32, 0.25

    def __init__(self, seed: int = 0) -> None:
        import torch

        from prime_rl.validator.evidence import EvidenceLedger
        from toploc import EvidenceTests, NoiseProfile

        self.torch = torch
        self.generator = torch.Generator().manual_seed(seed)
        self.sequence = 0
        # 1,024 honest calibration samples: the evidence's unit is the sample, and its honest rate
        # bounds fall as 1 / samples (64 samples bound no event below one sample in five)
        honest = [self.observations(steer=0.0) for _ in range(1024)]
        self.ledger = EvidenceLedger(EvidenceTests.from_profile(NoiseProfile.calibrate(honest)))

    def observations(self, steer: float) -> Any:
        from toploc import Observations, gumbel_noise, sampling_margins

        torch = self.torch
        self.sequence += 1
        logits = torch.randn(self.LENGTH, self.VOCAB, generator=self.generator, dtype=torch.float64) * 2
        positions = torch.arange(self.LENGTH)
        # The seeded sampler's scores (what sample_tokens takes the argmax of) and their two best;
        # a steered position takes the runner-up if it scores within the tolerance, as
        # tests/support/steering.py's sampler does.
        noise = gumbel_noise(2024, torch.full((self.LENGTH,), self.sequence), positions, self.VOCAB)
        top = (logits + noise).topk(2, dim=-1)
        swap = (torch.rand(self.LENGTH, generator=self.generator) < steer) & (
            top.values[:, 0] - top.values[:, 1] <= self.TOLERANCE
        )
        tokens = torch.where(swap, top.indices[:, 1], top.indices[:, 0])
        margins = sampling_margins(logits, tokens, 2024, self.sequence, positions)
        assert float(margins.max()) <= self.TOLERANCE  # inside the per-sample check: accepted
        return Observations(margins.numpy(), torch.zeros(self.LENGTH, dtype=torch.float64).numpy())

    def report(self, worker_id: str, steer: float = 0.0) -> float:
        self.ledger.record(worker_id, f"{worker_id}-{self.sequence}", [self.observations(steer)])
        return self.ledger.fraction(worker_id)


def test_diluted_steering_with_computed_evidence_never_trains(sim_factory: Any) -> None:
    """One sample in ten steered on 10% of its positions, every token inside the per-sample
    tolerance (so every sample is accepted), the evidence computed from the tokens: the steering
    identity never leaves probation and nothing it sends is trained on, while an honest identity's
    computed evidence keeps it released."""
    sim = sim_factory("computed", "--orchestrator.probation_tokens", "64", "--orchestrator.probation_release_share", "1")
    evidence = ComputedEvidence()
    honest, steerer = sim.register(), sim.register()
    reported = {honest: [], steerer: []}
    for i in range(40):
        reported[honest].append(evidence.report(honest))
        sim.answer(sim.lease(honest) or pytest.fail("refused"), evidence=reported[honest][-1])
        reported[steerer].append(evidence.report(steerer, steer=0.1 if i % 10 == 0 else 0.0))
        sim.answer(sim.lease(steerer) or pytest.fail("refused"), evidence=reported[steerer][-1])
        sim.train()
    assert max(reported[honest]) < 0.1 < max(reported[steerer])  # what the validator computed, not a script
    assert sim.trained and {s.worker_id for s in sim.trained} == {honest}
    assert not sim.server.ledger.release.trusted(steerer) and sim.server.ledger.release.trusted(honest)
