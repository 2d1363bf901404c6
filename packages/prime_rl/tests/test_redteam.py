"""Red team: a worker written from API.md alone attacks a real ``prime-rl run`` (issue 13).

One run, every role a real process on loopback (orchestrator, shardcast origin and relay, trainer,
validator, two honest workers, started by ``prime-rl run``), and one attacker: this test process,
an HTTP client with its own copy of the model, that follows the policy versions through shardcast
like any worker. It never reads the run's secrets. Every attack gets fresh identities:

=================  ==========================================================================
attack             what the attacker does
=================  ==========================================================================
admin_no_token     calls every trusted endpoint without a token: reads pending batches, posts
                   "accepted" verdicts for its own made-up batch, bans one of its identities,
                   claims and commits future steps
half_lease         answers only the first prompt of each lease (a whole group for it)
truncated          drops the last token of every completion (unterminated completions)
grind              predicts its tasks and seeds with the formerly public assignment function
                   (run seed 0) and answers the predicted tasks
nudged_logprobs    honest samples whose claimed inference log-probs are shifted by +0.04
malformed_proofs   honest samples whose proofs are cut short (valid base64, wrong length)
hoarding           identities from another address (127.0.0.2) take every lease they can and
                   never answer
steering           samples honestly except where the seeded sampler's runner-up scores within
                   0.2 of its choice (inside bf16's 0.25 sampling tolerance; this fp32 run rejects
                   any swap per sample): takes the runner-up
bf16_weights       generates with its weights rounded to bf16 (an fp32 run)
noisy_weights      generates with every weight + 0.1% of its tensor's std of noise
stale_weights      generates with the previous policy version's weights, claims the current one
late_steering      answers 6 leases honestly (evidence at rest, samples released), then steers
=================  ==========================================================================

The last five (statistical) pass every per-sample check most of the time; each identity answers up
to 24 leases in a row (until banned), and only the validator's per-worker evidence, with the
orchestrator holding accepted samples until that evidence covers them (``orchestrator/release.py``;
384 later tokens here, and the default evidence limit), keeps them out of training. On the tiny model
the weight attacks are banned on their first batch; steering needs several.

What the run left on disk decides: the orchestrator's store (verdicts, claims), the metrics files,
and the claims replayed through the orchestrator's own ledger (what the trainer received).
Guarantees checked: no sample of the attacker in any trainer claim (the statistical attackers are
banned by their evidence; nudged log-probs: banned by the
validator's per-worker evidence on its first batch; a trained sample would carry the validator's
log-probs, never the claimed ones); the honest workers have no
rejected sample, are never banned, and keep getting leases while the hoarders hold theirs;
malformed proofs cost the validator no prefill.

``REDTEAM_REPORT=path`` writes the measured numbers as JSON (the issue's before/after table).
"""

from __future__ import annotations

import base64
import contextlib
import hashlib
import json
import os
import signal
import threading
import time
from collections import defaultdict
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import requests
import torch
from redteam_client import RedTeamClient, RunLeftBehind, commits, start_to_first_step  # tests/support
from steering import steering_sampler

import prime_rl.inference.backend as backend_module
from prime_rl.api.client import ApiError, ClientRequestError, OrchestratorClient
from prime_rl.api.protocol import ClaimRequest, LeaseTask, RolloutBatch, RolloutSample, TaskLease
from prime_rl.config import RunConfig
from prime_rl.inference.backend import build_proofs
from prime_rl.orchestrator.store import RolloutStore

pytestmark = pytest.mark.slow

NUDGE = 0.04
# Attack batches must be judged (not expire) and, if accepted, claimed: a deep async level keeps them
# fresh and a small buffer keeps the validator's queue short (steps take ~3 s on the tiny model).
ASYNC_LEVEL = 6
SAMPLES_PER_STEP = 32
BUFFER = 48
TASK_TIMEOUT_S = 20.0
HOARD_ADDRESS = "127.0.0.2"
HOARDERS = 6  # fresh identities: one open lease each, six of the address's cap for fresh identities (16)
PER_ADDRESS = 16
CONTENT_ATTACKS = ("half_lease", "truncated", "grind", "nudged_logprobs", "malformed_proofs")
STATISTICAL_ATTACKS = ("steering", "bf16_weights", "noisy_weights", "stale_weights", "late_steering")
STATISTICAL_LEASES = 24  # steering was banned after 8-11 of its leases in two runs
HONEST_FIRST = 6  # late_steering's honest leases
RELEASE_AFTER_TOKENS = 384  # ~12 batches of this run: steering needed 256 tokens to be banned in one run
STEER_WITHIN = 0.2
NOISE = 1e-3


def _public_hash64(*parts: object) -> int:
    """The assignment hash API.md documented before issue 13 (BLAKE2b-64 of the joined parts)."""
    text = "prime-rl/" + "/".join(str(p) for p in parts)
    return int.from_bytes(hashlib.blake2b(text.encode(), digest_size=8).digest(), "big")


def _predicted_tasks(worker_id: str, step: int, batch_index: int, num_tasks: int, count: int) -> list[int]:
    ids: list[int] = []
    for draw in range(64 * count + num_tasks):
        task_id = _public_hash64("task", 0, worker_id, step, batch_index, draw) % num_tasks
        if task_id not in ids:
            ids.append(task_id)
        if len(ids) == count:
            break
    return ids


def _predicted_seed(worker_id: str, step: int, batch_index: int, task_id: int, group_index: int) -> int:
    return _public_hash64("sample", 0, worker_id, step, batch_index, task_id, group_index) & (2**63 - 1)


_steer = steering_sampler(STEER_WITHIN)


class Attacker(RedTeamClient):
    """The untrusted client (tests/support/redteam_client.py) with this round's attacks."""

    def __init__(self, config: RunConfig, cache: Path) -> None:
        super().__init__(config, cache)
        self.submitted: dict[str, RolloutBatch] = {}  # batch_id -> batch as submitted
        self.deviating: set[str] = set()  # batch ids of the statistical attacks' deviating batches

    def submit(self, client: OrchestratorClient, batch: RolloutBatch) -> str | None:
        try:
            answer = client.submit_rollouts(batch)
        except ClientRequestError as error:
            self.events["refused_submissions"].append((batch.worker_id, error.status, error.error))
            return None
        self.submitted[answer.batch_id] = batch
        return answer.batch_id

    # ------------------------------------------------------------------ attacks

    def admin_no_token(self) -> dict[str, int]:
        """Every trusted endpoint without a token; the HTTP status of each attempt."""
        client, worker_id = self.identity("admin_no_token")
        _, victim = self.identity("admin_no_token")  # one of its own identities: honest ones stay untouched
        lease = self.lease(client, worker_id)
        samples = [
            RolloutSample(
                task_id=task.task_id, group_index=g, prompt_tokens=[5, 6, 7], completion_tokens=[8, 9],
                sampling_seed=seed, temperature=lease.temperature, reward=1.0, advantage=float(g % 2) - 0.5,
                proofs=base64.b64encode(b"\x00\x01" + b"\x00" * 256).decode(), inference_logprobs=[-0.1, -0.1],
            )
            for task in lease.tasks
            for g, seed in enumerate(task.sampling_seeds)
        ]  # fmt: skip
        batch = RolloutBatch(
            worker_id=worker_id,
            step=lease.step,
            batch_index=lease.batch_index,
            policy_version=0,
            samples=samples,
        )
        batch_id = self.submit(client, batch)
        status = OrchestratorClient(self.url).status()
        verdicts = {
            "batch_id": batch_id,
            "verdicts": [
                {"sample_index": i, "accepted": True, "reason": "ok", "reward": 1.0, "advantage": 1.0}
                for i in range(len(samples))
            ],
        }
        attempts = {
            "GET /validator/pending": ("GET", "/validator/pending", None),
            "POST /validator/verdicts": ("POST", "/validator/verdicts", verdicts),
            "POST /workers/ban": ("POST", "/workers/ban", {"worker_id": victim, "reason": "attacker"}),
            "POST /trainer/claim": ("POST", "/trainer/claim", {"step": status.step + 50, "min_samples": 1}),
            "POST /trainer/commit": (
                "POST", "/trainer/commit", {"step": status.step + 50, "policy_version": status.step + 51}
            ),
        }  # fmt: skip
        codes = {}
        for name, (method, path, body) in attempts.items():
            answer = requests.request(method, self.url + path, json=body, timeout=10)
            codes[name] = answer.status_code
        return codes

    def content_attack(self, attack: str) -> None:
        """One lease answered the way ``attack`` does (see the module docstring)."""
        client, worker_id = self.identity(attack)
        lease = self.lease(client, worker_id)
        self.follow_policy(lease.policy_version)
        if attack == "grind":
            self.submit(client, self._grind(lease))
            return
        batch = self.honest(lease)
        samples = list(batch.samples)
        if attack == "half_lease":
            samples = [s for s in samples if s.task_id == lease.tasks[0].task_id]
        elif attack == "truncated":
            samples = [self._truncate(s) for s in samples]
        elif attack == "nudged_logprobs":
            samples = [
                s.model_copy(update={"inference_logprobs": [x + NUDGE for x in s.inference_logprobs]})
                for s in samples
            ]
        elif attack == "malformed_proofs":
            samples = [
                s.model_copy(update={"proofs": s.proofs[:-2]})  # bytes in-process, base64 on the wire
                for s in samples
            ]
        self.submit(client, batch.model_copy(update={"samples": samples}))

    def statistical_attack(self, attack: str) -> None:
        """Up to STATISTICAL_LEASES leases answered the way ``attack`` deviates, until banned."""
        client, worker_id = self.identity(attack)
        honest_first = HONEST_FIRST if attack == "late_steering" else 0
        for index in range(honest_first + STATISTICAL_LEASES):
            try:
                lease = self.lease(client, worker_id)
            except ClientRequestError as error:  # 403 banned: the evidence caught it
                self.events[f"{attack}_refused"].append(error.status)
                return
            self.follow_policy(lease.policy_version)
            if index < honest_first:
                self.submit(client, self.honest(lease))
            else:
                with self._deviating(attack):
                    batch = self.honest(lease)
                self.deviating.add(self.submit(client, batch) or "")
            time.sleep(2.0)  # let the validator judge it (a worker of this speed is not unusual)

    @contextlib.contextmanager
    def _deviating(self, attack: str) -> Iterator[None]:
        """The attacker's backend deviates inside this block (and is honest again after it)."""
        model, version = self.backend.model, self.backend.policy_version
        honest = {name: tensor.clone() for name, tensor in model.state_dict().items()}
        original_sample_next = backend_module.sample_next
        with torch.no_grad():
            if attack in ("steering", "late_steering"):
                backend_module.sample_next = _steer
            elif attack == "bf16_weights":
                for tensor in model.state_dict().values():
                    if tensor.is_floating_point():
                        tensor.copy_(tensor.to(torch.bfloat16).float())
            elif attack == "noisy_weights":
                generator = torch.Generator().manual_seed(0)
                for tensor in model.state_dict().values():
                    if tensor.is_floating_point() and tensor.numel() > 1:
                        tensor.add_(torch.randn(tensor.shape, generator=generator) * NOISE * tensor.std())
            elif attack == "stale_weights":
                assert version >= 1, "the attacks start after the first trained step"
                self.backend.load_weights(self.weights.ensure(version - 1), version)
        try:
            yield
        finally:
            backend_module.sample_next = original_sample_next
            with torch.no_grad():
                for name, tensor in model.state_dict().items():
                    tensor.copy_(honest[name])

    def _truncate(self, sample: RolloutSample) -> RolloutSample:
        """The completion without its last token, with proofs and log-probs that match the prefix."""
        tokens = sample.completion_tokens[:-1]
        if not tokens:
            return sample
        prefill = self.backend.prefill([sample.prompt_tokens], [tokens])[0]
        text = self.backend.tokenizer.decode(tokens, skip_special_tokens=True)
        return sample.model_copy(
            update={
                "completion_tokens": tokens,
                "inference_logprobs": sample.inference_logprobs[:-1],
                "proofs": build_proofs(prefill.hidden),
                "reward": float(self.tasks.score(sample.task_id, text, len(tokens))),
            }
        )

    def _grind(self, lease: TaskLease) -> RolloutBatch:
        """Answer the tasks the public assignment function predicts for this lease (with its seeds)."""
        predicted = _predicted_tasks(
            lease.worker_id, lease.step, lease.batch_index, self.tasks.num_tasks, len(lease.tasks)
        )
        self.events["grind_predicted_right"].append(predicted == [t.task_id for t in lease.tasks])
        tasks = [
            {
                "task_id": task_id,
                "prompt": self.tasks.task_set.prompt(task_id),
                "sampling_seeds": [
                    _predicted_seed(lease.worker_id, lease.step, lease.batch_index, task_id, g)
                    for g in range(lease.group_size)
                ],
            }
            for task_id in predicted
        ]
        return self.honest(lease.model_copy(update={"tasks": [LeaseTask(**t) for t in tasks]}))

    def hoard(self, stop: threading.Event) -> None:
        """Identities from another address take every lease they can and never answer (until ``stop``)."""
        clients = []
        for _ in range(HOARDERS):
            try:
                clients.append(self.identity("hoarding", source=HOARD_ADDRESS, retries=0))
            except ApiError as error:
                self.events["hoard_register_refused"].append(str(error)[:100])
        while not stop.is_set():
            for client, worker_id in clients:
                try:
                    client.get_tasks(worker_id)
                    self.events["hoard_leases"].append(time.time())
                except ClientRequestError as error:
                    self.events["hoard_refusals"].append(error.status)
                except ApiError:  # 429 busy (per-address cap)
                    self.events["hoard_refusals"].append(429)
            stop.wait(1.0)


# ---------------------------------------------------------------------- the run


def test_untrusted_worker_cannot_shape_training(tiny_run: Any, helpers: Any, tmp_path: Path) -> None:
    config_path, run_dir = tiny_run(
        orchestrator={
            "async_level": ASYNC_LEVEL,
            "max_buffered_samples": BUFFER,
            "task_timeout_s": TASK_TIMEOUT_S,
            "max_open_leases_per_address": PER_ADDRESS,
            # All identities, 127.0.0.2's hoarders too, share loopback's /24: its registration bucket and its
            # cap on fresh identities (the cap is tested alone: test_orchestrator_identities.py).
            "max_fresh_workers_per_network": 0,
            "register_burst": 100,
            # The checks replay every claim through the ledger, which reads compacted steps back from the
            # run's record: without their log-probs that is 410 gone.
            "keep_claimed_logprobs": True,
            "release_after_tokens": RELEASE_AFTER_TOKENS,
        },
        trainer={"total_steps": 200, "samples_per_step": SAMPLES_PER_STEP},
        workers={"count": 2, "hostile": []},
    )
    config, run = start_to_first_step(config_path, run_dir, helpers, 240)
    results: dict[str, Any] = {}
    try:
        attacker = Attacker(config, tmp_path / "attacker")
        results["admin_no_token"] = attacker.admin_no_token()
        for attack in CONTENT_ATTACKS:
            for _ in range(2):
                attacker.content_attack(attack)
        for attack in STATISTICAL_ATTACKS:
            attacker.statistical_attack(attack)
        # Hoarding: honest lease rate in the 20 s before and while the hoarders hold their leases
        # (three lease timeouts from their first lease: a fresh identity holds one lease at a time,
        # so it passes the abandon limit, 3 expired, with the third wave; the address's cap for
        # fresh identities shrinks by one per expired lease, so about four get a third lease).
        # Registering the hoarders takes a while: the window starts at their first lease.
        baseline_start = time.time()
        time.sleep(20)
        baseline_end = time.time()
        hoard_start, hoard_end = attacker.hoard_for(3 * TASK_TIMEOUT_S + 20, helpers.wait_for, join_s=30)
        # Let the validator judge every attack batch and the trainer claim twice after that.
        store = RolloutStore(run_dir / "orchestrator", reader=True)
        helpers.wait_for(
            lambda: set(attacker.submitted) <= set(store.all_verdicts()),
            180,
            "verdicts on every attack batch",
        )
        judged_at = commits(run_dir, helpers)
        helpers.wait_for(lambda: commits(run_dir, helpers) >= judged_at + 2, 180, "two more trained steps")
    finally:
        output = helpers.interrupt_run(run)
    assert run.returncode in (0, 128 + signal.SIGINT), output[-3000:]

    # ------------------------------------------------------------------ what the run left behind
    left = RunLeftBehind.read(config, run_dir, helpers.metrics_of)  # the ledger: what the trainer received, replayed
    honest, store = left.honest, left.store
    verdicts, batches, ledger = left.verdicts, left.batches, left.ledger
    trained = {
        sample.sample_id: sample
        for claim in store.claims()
        for sample in ledger.claim(ClaimRequest(step=claim.step, min_samples=1)).samples
    }
    attack_of = {b: attacker.identities.get(r.meta.worker_id) for b, r in batches.items()}

    per_attack: dict[str, dict[str, Any]] = defaultdict(lambda: defaultdict(int))
    for batch_id, attack in attack_of.items():
        if attack is None:
            continue
        row = per_attack[attack]
        row["batches"] += 1
        for verdict in verdicts.get(batch_id, []):
            row["samples"] += 1
            row["accepted"] += verdict.accepted
            if not verdict.accepted:
                row.setdefault("reasons", defaultdict(int))[verdict.reason] += 1
        row["in_trainer_claims"] += sum(1 for s in trained.values() if s.batch_id == batch_id)
        if batch_id in attacker.deviating:
            row["deviating_in_trainer_claims"] += sum(1 for s in trained.values() if s.batch_id == batch_id)
    for row in per_attack.values():
        row["reasons"] = dict(row.get("reasons", {}))
    # Nudged log-probs: what the trainer got vs what the attacker claimed.
    nudged = [
        (s, attacker.submitted[s.batch_id].samples[int(s.sample_id.rsplit("/", 1)[1])])
        for s in trained.values()
        if attack_of.get(s.batch_id) == "nudged_logprobs"
    ]
    per_attack["nudged_logprobs"]["trainer_got_claimed_logprobs"] = sum(
        1 for got, sent in nudged if got.behaviour_logprobs == sent.inference_logprobs
    )
    # Malformed proofs: validator seconds per batch (vs honest batches of the same size).
    seconds = {e["batch_id"]: e for e in helpers.metrics_of(run_dir, "validator") if e["event"] == "verdict"}
    malformed = [seconds[b] for b, a in attack_of.items() if a == "malformed_proofs" and b in seconds]
    honest_seconds = sorted(
        seconds[b]["seconds"] for b, r in batches.items() if r.meta.worker_id in honest and b in seconds
    )
    per_attack["malformed_proofs"]["validator_seconds_max"] = max(
        (e["seconds"] for e in malformed), default=None
    )
    per_attack["malformed_proofs"]["prefilled_samples"] = sum(int(e.get("prefilled", -1)) for e in malformed)
    per_attack["malformed_proofs"]["honest_validator_seconds_median"] = (
        honest_seconds[len(honest_seconds) // 2] if honest_seconds else None
    )
    per_attack["grind"]["predicted_right"] = sum(attacker.events["grind_predicted_right"])
    per_attack["grind"]["predictions"] = len(attacker.events["grind_predicted_right"])
    # Hoarding.
    per_attack["hoarding"]["leases_taken"] = len(attacker.events["hoard_leases"])
    per_attack["hoarding"]["leases_taken_before_first_expiry"] = sum(
        1 for t in attacker.events["hoard_leases"] if t < hoard_start + TASK_TIMEOUT_S
    )
    per_attack["hoarding"]["refusals"] = dict(
        (str(code), attacker.events["hoard_refusals"].count(code))
        for code in set(attacker.events["hoard_refusals"])
    )
    per_attack["hoarding"]["honest_leases_per_min_before"] = left.honest_leases_per_minute(baseline_start, baseline_end)
    per_attack["hoarding"]["honest_leases_per_min_during"] = left.honest_leases_per_minute(hoard_start + 3, hoard_end)
    workers = {w.worker_id: w for w in ledger.workers_view().workers}
    for attack in STATISTICAL_ATTACKS:
        identities = [workers[w] for w, a in attacker.identities.items() if a == attack]
        per_attack[attack]["banned"] = sum(w.banned for w in identities)
        per_attack[attack]["ban_reasons"] = [w.ban_reason[:80] for w in identities if w.banned]
    hoarders = [workers[w] for w, a in attacker.identities.items() if a == "hoarding"]
    per_attack["hoarding"]["hoarders_banned"] = sum(w.banned for w in hoarders)
    per_attack["hoarding"]["hoarders_over_the_abandon_limit"] = sum(
        w.leases_expired >= 3 and w.leases_expired >= 0.25 * w.leases_issued for w in hoarders
    )
    honest_rejected = sum(
        1
        for b, r in batches.items()
        if r.meta.worker_id in honest
        for v in verdicts.get(b, [])
        if not v.accepted and v.reason != "expired"
    )
    results.update(
        attacks={k: dict(v) for k, v in per_attack.items()},
        honest={
            "samples_accepted": sum(workers[w].samples_accepted for w in honest),
            "samples_rejected": honest_rejected,
            "banned": sum(workers[w].banned for w in honest),
            "leases_expired": sum(workers[w].leases_expired for w in honest),
        },
        trained_steps=len(store.claims()),
    )
    report = json.dumps(results, indent=2, default=str)
    print(report)
    if os.environ.get("REDTEAM_REPORT"):
        Path(os.environ["REDTEAM_REPORT"]).write_text(report)

    # ------------------------------------------------------------------ the guarantees
    assert all(code == 401 for code in results["admin_no_token"].values()), results["admin_no_token"]
    every = ("admin_no_token", "half_lease", "truncated", "grind", "nudged_logprobs", "malformed_proofs", "hoarding")
    for attack in every:
        assert per_attack[attack]["in_trainer_claims"] == 0, (attack, dict(per_attack[attack]))
        assert per_attack[attack]["accepted"] == 0, (attack, dict(per_attack[attack]))
    for attack in STATISTICAL_ATTACKS:  # some samples may pass every per-sample check; none is trained on
        row = per_attack[attack]
        assert row["deviating_in_trainer_claims"] == 0 and row["banned"] == 1, (attack, dict(row))
        if attack != "late_steering":  # (its honest samples may be trained on)
            assert row["in_trainer_claims"] == 0, (attack, dict(row))
    # fp32 decode and prefill agree exactly: a runner-up swap fails the per-sample check itself
    # (validator/tolerances.py), and the evidence, which sees rejected samples too, bans the identity
    assert "sampling_mismatch" in per_attack["steering"]["reasons"], dict(per_attack["steering"])
    expected = {
        "half_lease": "incomplete_lease",
        "truncated": "bad_termination",
        "grind": "not_assigned",
        "malformed_proofs": "malformed_proof",
        # +0.04 on every log-prob is inside the per-sample tolerance (0.05) but ~1,000x the honest
        # gap of the validator's measured noise: the per-worker evidence bans it on its first batch
        "nudged_logprobs": "banned_worker",
    }
    for attack, reason in expected.items():  # judged by the validator for what it is (not just expired)
        assert reason in per_attack[attack]["reasons"], (attack, dict(per_attack[attack]))
    assert per_attack["grind"]["predicted_right"] == 0
    assert per_attack["nudged_logprobs"]["trainer_got_claimed_logprobs"] == 0
    for got, sent in nudged:  # none since evidence bans it; were one trained, it has the validator's log-probs
        assert torch.allclose(
            torch.tensor(got.behaviour_logprobs, dtype=torch.float64),
            torch.tensor(sent.inference_logprobs, dtype=torch.float64) - NUDGE,
            atol=1e-4,
        )
    assert malformed and all(e.get("prefilled") == 0 for e in malformed), malformed
    assert per_attack["malformed_proofs"]["reasons"].keys() <= {"malformed_proof", "lease_rejected"}
    hoarding = per_attack["hoarding"]
    assert hoarding["honest_leases_per_min_during"] >= 0.5 * hoarding["honest_leases_per_min_before"] > 0, (
        hoarding
    )
    assert hoarding["leases_taken_before_first_expiry"] <= PER_ADDRESS, hoarding
    # Banned exactly when its expired leases reach ban_abandoned_leases (3) and 25 % of its leases. How
    # many hoarders get there in the window is the machine's pace, not the rule: a fresh identity leases
    # only in its turn at the address and while backpressure has room, so the third leases split
    # unevenly (4 or more hoarders over the limit in most runs, 3 in two full-suite runs); the rule is
    # exercised as long as one is.
    assert hoarding["hoarders_banned"] == hoarding["hoarders_over_the_abandon_limit"] >= 1, hoarding
    assert results["honest"]["samples_rejected"] == 0 and results["honest"]["banned"] == 0, results["honest"]
    assert results["honest"]["leases_expired"] == 0, results["honest"]
