"""Red team on multi-turn episodes (issue 28), with real processes.

One ``prime-rl run`` of the tiny random model in a multi-turn environment (the exact calculator,
3 model turns, "try again" feedback after a wrong answer: the random model never answers right, so
nearly every episode has 3 model turns and 2 environment replies), every role a real process on loopback:
orchestrator, shardcast origin and relay, trainer, one validator or three (``validator.count``,
parametrised: the attacker's batches then spread over three validators and one run ledger), one honest worker and one hostile
worker ``mixed``, which answers lease ``i`` with attack ``(EPISODE_CYCLE + MIXED_CYCLE)[i]``: first
the episode tamperings (forged tool output, dropped turn, reordered turns, truncated episode,
model tokens labelled as env tokens and the reverse), then the single-turn attack classes played
on episodes (other weights, changed prompt, fabricated completions, inflated rewards, unassigned
tasks, garbage proofs, stale policy).

What the run left on disk decides: no attacker sample in any trainer claim, no honest episode
rejected, and each episode attack judged rejected with its own reason (``hostile.ATTACKS``); the
validator bans a fresh identity at its first lease rejected for anything but per-token noise
(issue 34: the first attack, a forged tool output, already bans), so the attacks after it count only
as far as they were submitted before the ban.
"""

from __future__ import annotations

import signal
from collections import defaultdict
from pathlib import Path
from typing import Any

import pytest

from prime_rl.orchestrator.store import RolloutStore
from prime_rl.redteam.attacks import ATTACKS, EPISODE_CYCLE, MIXED_CYCLE

pytestmark = pytest.mark.slow

FOLLOWERS = {"group_rejected", "lease_rejected", "expired"}
# Made-up single-turn-shaped samples in a multi-turn run fail the prefill's sampling check (which comes
# before any tool runs), or, ended early, the model-free check of an episode's end.
EXPECTED = {name: set(attack.expected) for name, attack in ATTACKS.items()} | {
    "fabricated_completion": {"sampling_mismatch", "episode_truncated"}
}
MUST_JUDGE = {*EPISODE_CYCLE, *MIXED_CYCLE[:3]}  # every episode attack, and the first old ones
STEPS = 2


def _judged_attacks(run_dir: Path, helpers: Any) -> dict[str, str]:
    """batch id -> attack, for the hostile worker's batches a validator (any of ``validator.count``) has judged."""
    names = [path.stem for path in (run_dir / "metrics").glob("validator*.jsonl")]
    judged = {e["batch_id"] for name in names for e in helpers.metrics_of(run_dir, name) if e["event"] == "verdict"}
    return {
        e["batch_id"]: e["behaviour"]
        for e in helpers.metrics_of(run_dir, "hostile-0")
        if e["event"] == "rollouts" and e["batch_id"] in judged
    }


def _done(run_dir: Path, helpers: Any) -> bool:
    commits = sum(1 for e in helpers.metrics_of(run_dir, "orchestrator") if e["event"] == "commit")
    banned = any(e["event"] == "banned" for e in helpers.metrics_of(run_dir, "hostile-0"))
    seen = set(_judged_attacks(run_dir, helpers).values())
    return commits >= STEPS and (seen >= MUST_JUDGE or banned)


@pytest.mark.parametrize("validators", [1, 3])  # 3: the attacker's batches spread over three validators (issue 45)
def test_untrusted_worker_cannot_shape_training_with_multi_turn_episodes(tiny_run: Any, helpers: Any, validators: int) -> None:
    config_path, run_dir = tiny_run(
        tasks={"environment": {"name": "calculator", "max_turns": 3, "feedback": True}},
        # Judge whole cycles of attacks before an abandonment ban (a rejected lease now counts as
        # abandoned, issue 34): the test is about each attack's own reason, not about how fast it bans.
        orchestrator={"max_buffered_samples": 64, "ban_abandoned_leases": 1000},
        trainer={"total_steps": 12},
        workers={"count": 1, "hostile": ["mixed"]},
        validator={"ban_min_samples": 400, "count": validators},  # judge whole cycles of attacks before a failure-rate ban
    )
    run = helpers.start_run(config_path)
    output = helpers.run_until(run, lambda: _done(run_dir, helpers), 480, "the attacks to be judged")  # ~100 s idle
    assert run.returncode in (0, 128 + signal.SIGINT, -signal.SIGINT), output[-3000:]

    names = {
        e["worker_id"]: e["worker_name"]
        for e in helpers.metrics_of(run_dir, "orchestrator")
        if e["event"] == "register"
    }
    assert sorted(names.values()) == ["hostile-0", "worker-0"], names
    store = RolloutStore(run_dir / "orchestrator")
    verdicts = store.all_verdicts()
    batches = {record.meta.batch_id: record for record in store.batch_records()}
    attacks = _judged_attacks(run_dir, helpers)

    # 1. Honest episodes: multi-turn (an episode ends early only when the random model's answer
    # happens to be right), none rejected.
    honest = [e for e in helpers.metrics_of(run_dir, "worker-0") if e["event"] == "rollouts"]
    assert honest and all(e["samples"] <= e["model_turns"] <= 3 * e["samples"] for e in honest)
    assert all(e["env_turns"] == e["model_turns"] - e["samples"] for e in honest)
    assert sum(e["env_turns"] for e in honest) > sum(e["samples"] for e in honest)  # mostly 3-turn episodes
    tally: dict[str, dict[str, set[str]]] = defaultdict(lambda: defaultdict(set))
    accepted_honest = 0
    for batch_id, record in batches.items():
        name = names[record.meta.worker_id]
        for v in verdicts.get(batch_id, []):
            if name == "worker-0":
                assert v.accepted or v.reason == "expired", (batch_id, v.reason, v.detail)
                accepted_honest += v.accepted
            else:
                assert not v.accepted, (batch_id, v)
                tally[attacks.get(batch_id, "?")][batch_id].add(str(v.reason))
    assert accepted_honest > 0

    # 2. Every attack rejected with its own reason; each episode attack with exactly its own.
    for attack, by_batch in tally.items():
        for batch_id, reasons in by_batch.items():
            own = reasons - FOLLOWERS
            if attack in EPISODE_CYCLE and own:
                assert own == EXPECTED[attack], (attack, batch_id, reasons)
            assert own <= EXPECTED.get(attack, set()), (attack, batch_id, reasons)
    judged = {a for a, by_batch in tally.items() if any(r - FOLLOWERS for r in by_batch.values())}
    # The validator bans a fresh identity at its first lease rejected for anything but per-token
    # noise (issue 34): the cycle's first attack, a forged tool output, passes the proofs and fails
    # the tool replay, so it bans. The attacks after it are judged only as far as they were submitted
    # before the ban landed (1 to 5 of them in runs so far, depending on the machine's load); each
    # one's own reason without a ban: test_episodes.py. Always: the first attack, and the ban.
    assert EPISODE_CYCLE[0] == "forged_tool_output" and EPISODE_CYCLE[0] in judged, judged
    banned = [e for e in helpers.metrics_of(run_dir, "hostile-0") if e["event"] == "banned"]
    assert banned or set(EPISODE_CYCLE) <= judged, judged

    # 3. No attacker sample in any trainer claim; the trainer trained on honest episodes.
    claims = store.claims()
    claimed = [s for claim in claims for s in claim.sample_ids]
    assert claimed and all(names[batches[s.batch_id].meta.worker_id] == "worker-0" for s in claimed)
    commits = [e for e in helpers.metrics_of(run_dir, "orchestrator") if e["event"] == "commit"]
    assert len(commits) >= STEPS
