"""Red team with three validators (issue 45 item 6): attackers whose batches are spread across them.

One ``prime-rl run`` (orchestrator, shardcast origin and relay, trainer, ``validator.count = 3``
validators and one honest worker; fp32 tiny model), and the attacker of ``test_redteam_trust.py``
(``TrustAttacker``, reused, not copied: a client written against API.md with its own model copy)
playing, against the three validators:

==============  ===============================================================================
attack          what the attacker does
==============  ===============================================================================
spread          one identity answers ``HONEST_FIRST`` leases honestly (its record, judged by
                whichever validator takes each batch), then steers every lease inside the
                sampling tolerance until it is refused
sybil_churn     ``SYBILS`` fresh identities, each a hit and run (1 steered lease, then 2 honest)
==============  ===============================================================================

Each validator polls the orchestrator's pending batches (``POST /validator/leases``), so an identity's
batches are judged by whichever validator takes them; the validators' prefill carries a small
emulated floor (``validator.emulated_prefill_s_per_token``: benchmark emulation) so that one busy
validator leaves the next batch to another and the batches spread.

What the run left on disk decides: the ``spread`` identity's batches were judged by all three
validators; it is banned, by the run's one ledger, after the same evidence as one validator would
have seen: its evidence counts every prefilled sample of its batches, whichever validator judged
them, and its failure counts and ban (``BAN_FAILURE_RATE``; the abandonment ban is off here, so the
ban is the validators' ledger's) are what one ledger replaying its batches in the order recorded
decides (``RunEvidence``, the orchestrator's own); 0 of its steered samples (nor the Sybils') reach a
trainer claim, nor anything of an identity that never earned trust (probation); no batch was
prefilled by two validators; the honest worker has no rejected sample and no ban. About 60 s on an
idle 2-core machine, 3 minutes under load 30. The tool forgeries run with three
validators in ``test_redteam_episodes.py`` (parametrised); the full attack lists of
``test_redteam.py`` and ``test_redteam_trust.py`` run with one.
"""

from __future__ import annotations

import importlib.util
import json
import os
import signal
import subprocess
import sys
from collections import defaultdict
from pathlib import Path
from typing import Any

import pytest
from redteam_client import commits  # tests/support

from prime_rl.api.client import OrchestratorClient
from prime_rl.api.protocol import ClaimRequest
from prime_rl.config import load_config
from prime_rl.orchestrator.evidence_ledger import RunEvidence
from prime_rl.orchestrator.ledger import Ledger
from prime_rl.orchestrator.store import RolloutStore
from prime_rl.tasks import load_tasks

pytestmark = pytest.mark.slow

VALIDATORS = 3
HONEST_FIRST = 12  # the spread identity's honest leases: its record, spread over the validators
STEERED_MAX = 8
BAN_FAILURE_RATE = 0.25  # 12 honest leases (96 samples) and 4 fully rejected steered ones (32) ban it
SYBILS = 4
EMULATED_S_PER_TOKEN = 0.002  # ~0.1 s per lease of this run: a validator stays busy while the next arrives


def _trust_module() -> Any:
    """``test_redteam_trust.py`` as a module (its attacker; test modules are not importable by name)."""
    path = Path(__file__).with_name("test_redteam_trust.py")
    spec = importlib.util.spec_from_file_location("_redteam_trust", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _verdict_lines(run_dir: Path) -> list[dict[str, Any]]:
    lines = []
    for path in sorted((run_dir / "metrics").glob("validator*.jsonl")):
        for line in path.read_text().splitlines():
            record = json.loads(line)
            if record.get("event") == "verdict":
                lines.append(record)
    return lines


def test_an_attacker_spread_over_three_validators_is_banned_as_by_one(tiny_run: Any, helpers: Any, tmp_path: Path) -> None:
    trust = _trust_module()
    config_path, run_dir = tiny_run(
        tasks={"num_tasks": trust.NUM_TASKS, "digits": 1, "seed": 0},
        orchestrator={
            "async_level": 4, "task_timeout_s": trust.TASK_TIMEOUT_S, "release_after_tokens": 64,
            "register_burst": 200, "max_fresh_workers_per_network": 0, "max_buffered_samples": 32,
            "ban_abandoned_leases": 1000,  # rejected leases count as abandoned: the validators' ledger bans here
            "keep_claimed_logprobs": True,  # the checks replay every claim: compacted steps need their log-probs
        },
        trainer={"total_steps": 400, "samples_per_step": 8},
        workers={"count": 1, "hostile": []},
        validator={"count": VALIDATORS, "batches_per_poll": 1, "emulated_prefill_s_per_token": EMULATED_S_PER_TOKEN,
                   "ban_failure_rate": BAN_FAILURE_RATE},
    )  # fmt: skip
    config = load_config(config_path)
    env = dict(os.environ, OMP_WAIT_POLICY="PASSIVE", TOKENIZERS_PARALLELISM="false")
    command = [sys.executable, "-m", "prime_rl.cli", "run", "--config", str(config_path)]
    run = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env)
    try:
        OrchestratorClient(config.orchestrator.url).wait_until_up(120)
        helpers.wait_for(lambda: commits(run_dir, helpers) >= 1, 300, "the first trained step")
        attacker = trust.TrustAttacker(config, tmp_path / "attacker")
        client, spread = attacker.identity("spread")
        for index in range(HONEST_FIRST + STEERED_MAX):
            if not attacker.answer(client, spread, steer=index >= HONEST_FIRST):
                break
        for _ in range(SYBILS):
            attacker.hit_and_run("sybil_churn", honest_after=2)
        store = RolloutStore(run_dir / "orchestrator", reader=True)
        mine = lambda: {r.meta.batch_id for r in store.batch_records() if r.meta.worker_id in attacker.identities}  # noqa: E731
        helpers.wait_for(lambda: mine() <= set(store.all_verdicts()), 300, "verdicts on every attack batch")
        judged_at = commits(run_dir, helpers)
        helpers.wait_for(lambda: commits(run_dir, helpers) >= judged_at + 2, 300, "two more trained steps")
    finally:
        if run.poll() is None:
            run.send_signal(signal.SIGINT)
        try:
            output, _ = run.communicate(timeout=90)
        except subprocess.TimeoutExpired:
            run.kill()
            output, _ = run.communicate()
    assert run.returncode in (0, 128 + signal.SIGINT), output[-3000:]

    events = helpers.metrics_of(run_dir, "orchestrator")
    names = {e["worker_id"]: e["worker_name"] for e in events if e["event"] == "register"}
    honest = {w for w, n in names.items() if n.startswith("worker-")}
    store = RolloutStore(run_dir / "orchestrator")
    verdicts = store.all_verdicts()
    batches = {record.meta.batch_id: record for record in store.batch_records()}
    ledger = Ledger(config, load_tasks(config.tasks), store)
    trained = [s for claim in store.claims() for s in ledger.claim(ClaimRequest(step=claim.step, min_samples=1)).samples]
    workers = {w.worker_id: w for w in ledger.workers_view().workers}
    lines = _verdict_lines(run_dir)
    judged_by = {line["batch_id"]: line["name"] for line in lines}

    # 1. The spread identity's batches were judged by all three validators.
    spread_batches = [b for b, r in batches.items() if r.meta.worker_id == spread and b in verdicts]
    by_validator: dict[str, int] = defaultdict(int)
    for batch_id in spread_batches:
        by_validator[judged_by.get(batch_id, "?")] += 1
    report = {"spread_batches_by_validator": dict(by_validator), "steered": len(attacker.steered & set(spread_batches))}
    print(json.dumps(report))
    assert set(by_validator) == {"validator", "validator-1", "validator-2"}, report
    assert report["steered"] >= 1, report

    # No batch was prefilled by two validators (no validator was killed: every lease held to its verdict).
    prefills = [
        json.loads(line) for path in sorted((run_dir / "metrics").glob("validator*.jsonl"))
        for line in path.read_text().splitlines() if '"event":"prefill"' in line.replace(" ", "")
    ]  # fmt: skip
    prefilled_by: dict[str, set[str]] = defaultdict(set)
    for record in prefills:
        prefilled_by[record["batch_id"]].add(record["name"])
    prefilled_lines = {line["batch_id"] for line in lines if int(line["prefilled"]) > 0}
    assert prefilled_lines <= set(prefilled_by), "every prefilled batch has its prefill line"
    assert not {b: n for b, n in prefilled_by.items() if len(n) > 1}, "a batch prefilled by two validators"

    # 2. Banned by the run's one ledger, after the evidence of every validator's batches: its evidence
    # counts each prefilled sample of its batches, whoever judged them...
    assert workers[spread].banned, (workers[spread], report)
    row = dict(store.evidence_rows())
    evidence = json.loads(row[spread])
    prefilled = sum(int(line["prefilled"]) for line in lines if line["worker_id"] == spread)
    assert evidence["evidence"] is not None and evidence["evidence"]["samples"] == prefilled, (evidence, prefilled)
    # ...and its counts and ban are what one ledger decides replaying its batches in the order recorded
    # (the evidence increments are not stored: the failure counts are replayed, the evidence ban compared).
    order = [e["batch_id"] for e in store.events() if e.get("event") == "judged" and e["worker_id"] == spread]
    one = RunEvidence(ban_failure_rate=config.validator.ban_failure_rate, ban_min_samples=config.validator.ban_min_samples)
    banned_at = None
    line_of = {line["batch_id"]: line for line in lines}
    for batch_id in (b for b in order if b in line_of):  # judged by a validator (not expired)
        judgement = one.judge(spread, verdicts[batch_id], prefilled=int(line_of[batch_id]["prefilled"]) > 0, evidence=None)
        one.commit(judgement)
        if judgement.ban and banned_at is None:
            banned_at = batch_id
    alone = one.get(spread)
    assert (evidence["accepted"], evidence["rejected"]) == (alone.accepted, alone.rejected), (evidence, alone)
    if not evidence["evidence_ban"]:  # a failure ban: the same one, at the same counts, as one ledger's
        assert banned_at is not None and evidence["failure_ban"] == alone.failure_ban, (evidence, alone)
    rejected_by = {judged_by[b] for b in spread_batches if not any(v.accepted for v in verdicts[b])}
    report["rejected_batches_judged_by"] = sorted(rejected_by)
    print(json.dumps(report))

    # 3. Nothing steered trains; the Sybils' steered samples neither; the honest worker keeps its record.
    assert not [s for s in trained if s.sample_id in attacker.steered_samples], report
    trained_batches = {s.batch_id for s in trained}
    for worker_id, attack in attacker.identities.items():  # probation: nothing of an untrusted identity trains
        if not ledger.release.trusted(worker_id):
            assert not any(batches[b].meta.worker_id == worker_id for b in trained_batches), (attack, worker_id)
    for batch_id, record in batches.items():
        if record.meta.worker_id in honest:
            assert all(v.accepted or v.reason == "expired" for v in verdicts.get(batch_id, [])), batch_id
    assert not any(workers[w].banned for w in honest)
