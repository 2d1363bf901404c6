"""Issue 13 on the orchestrator's side: secrets, trusted endpoints, keyed assignment, lease rules.

In-process and fast: the ledger with an injected clock, or the HTTP server on loopback. The
red-team run against real processes is ``test_redteam.py``.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import os
import stat
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import requests

from prime_rl.api.assignment import AssignmentError, mac64, sampling_seed, task_ids
from prime_rl.api.errors import ApiFailure
from prime_rl.api.protocol import BanRequest, ClaimRequest, Verdict, VerdictRequest
from prime_rl.api.secrets import SecretsError, check_bind_address, is_loopback, run_secrets, secrets_path
from prime_rl.config import ConfigError, load_config
from prime_rl.orchestrator.lease_rules import MACHINE_REASONS
from prime_rl.orchestrator.ledger import Ledger
from prime_rl.orchestrator.server import OrchestratorServer
from prime_rl.orchestrator.store import RolloutStore
from prime_rl.tasks import TaskSet

from .ledger_support import _accept, _batch, _ledger, _submit

TRUSTED = [
    ("GET", "/validator/pending", None),
    ("POST", "/validator/verdicts", {"batch_id": "x", "verdicts": []}),
    ("POST", "/workers/ban", {"worker_id": "w0000", "reason": "x"}),
    ("POST", "/trainer/claim", {"step": 0, "min_samples": 1}),
    ("POST", "/trainer/commit", {"step": 0, "policy_version": 1}),
]

# ---------------------------------------------------------------- secrets


def test_secrets_are_generated_once_private_and_shared_by_every_trusted_process(tmp_path: Path) -> None:
    config = load_config(None, ["--run_dir", str(tmp_path)])
    first = run_secrets(config)
    path = secrets_path(tmp_path)
    assert stat.S_IMODE(path.stat().st_mode) == 0o600 and stat.S_IMODE(path.parent.stat().st_mode) == 0o700
    assert len(first.admin_token) >= 32 and len(first.assignment_key) >= 32
    assert run_secrets(config) == first  # a second process reads the same file
    assert "admin_token" not in repr(first) and first.admin_token not in repr(first)
    configured = load_config(
        None,
        ["--run_dir", str(tmp_path), "--orchestrator.admin_token", "t" * 20, "--orchestrator.assignment_secret", "k" * 20],
    )  # fmt: skip
    both = run_secrets(configured)
    assert (both.admin_token, both.assignment_key) == ("t" * 20, b"k" * 20)


def test_unsafe_or_corrupt_secrets_files_are_refused(tmp_path: Path) -> None:
    config = load_config(None, ["--run_dir", str(tmp_path)])
    run_secrets(config)
    path = secrets_path(tmp_path)
    os.chmod(path, 0o644)
    with pytest.raises(SecretsError, match="chmod 600"):
        run_secrets(config)
    os.chmod(path, 0o600)
    path.write_text(json.dumps({"admin_token": "short", "assignment_secret": "x" * 64}))
    with pytest.raises(SecretsError, match="incomplete"):
        run_secrets(config)
    path.write_text("{not json")
    with pytest.raises(SecretsError, match="unreadable"):
        run_secrets(config)


def test_short_configured_secrets_are_config_errors() -> None:
    for key in ("admin_token", "assignment_secret"):
        with pytest.raises(ConfigError, match=key):
            load_config(None, [f"--orchestrator.{key}", "s3cret"])


@pytest.mark.parametrize(
    ("host", "loopback"),
    [("127.0.0.1", True), ("127.5.0.9", True), ("localhost", True), ("::1", True), ("[::1]", True),
     ("0.0.0.0", False), ("::", False), ("10.0.0.3", False), ("", False), ("orchestrator.example", False)],
)  # fmt: skip
def test_only_loopback_may_serve_without_a_configured_token(host: str, loopback: bool) -> None:
    assert is_loopback(host) == loopback
    if loopback:
        check_bind_address(host, "")
    else:
        with pytest.raises(SecretsError, match="admin_token must be set"):
            check_bind_address(host, "")
    check_bind_address(host, "a-token-of-16-chars")


def test_orchestrator_off_loopback_refuses_to_start_without_a_token(tmp_path: Path) -> None:
    config = load_config(None, ["--run_dir", str(tmp_path), "--orchestrator.host", "0.0.0.0", "--orchestrator.port", "0"])
    with pytest.raises(SecretsError, match=r"orchestrator\.admin_token"):
        OrchestratorServer(config, TaskSet([{"prompt": "q"}] * 8))
    command = [sys.executable, "-m", "prime_rl.cli", "orchestrator", "--run_dir", str(tmp_path),
               "--orchestrator.host", "0.0.0.0", "--orchestrator.port", "0"]  # fmt: skip
    done = subprocess.run(command, capture_output=True, text=True, timeout=120)
    assert done.returncode == 2 and "orchestrator.admin_token must be set" in done.stdout + done.stderr


def test_every_trusted_endpoint_needs_the_generated_token(server: Any) -> None:
    token = json.loads(secrets_path(server.config.run_dir).read_text())["admin_token"]
    assert token == server.admin_token
    for method, path, body in TRUSTED:
        for headers in ({}, {"Authorization": "Bearer "}, {"Authorization": f"Bearer {token[:-1]}"}):
            answer = requests.request(method, server.url + path, json=body, headers=headers, timeout=10)
            assert answer.status_code == 401 and answer.json()["error"] == "unauthorized", (path, headers)
        answer = requests.request(
            method, server.url + path, json=body, headers={"Authorization": f"Bearer {token}"}, timeout=10
        )
        assert answer.status_code != 401, (path, answer.text)


# ---------------------------------------------------------------- keyed assignment


def test_assignment_is_hmac_sha256_of_the_documented_text() -> None:
    key = b"0123456789abcdef-key"
    text = "prime-rl/task/w0007/3/5/0"
    expected = int.from_bytes(hmac.new(key, text.encode(), hashlib.sha256).digest()[:8], "big")
    assert mac64(key, "task", "w0007", 3, 5, 0) == expected
    ids = task_ids(key=key, worker_id="w0007", step=3, batch_index=5, num_tasks=1000, prompts_per_batch=4)
    assert ids[0] == expected % 1000 and len(set(ids)) == 4
    seed = sampling_seed(key=key, worker_id="w0007", step=3, batch_index=5, task_id=ids[0], group_index=2)
    assert seed == mac64(key, "sample", "w0007", 3, 5, ids[0], 2) & (2**63 - 1)
    with pytest.raises(AssignmentError, match="16 bytes"):
        task_ids(key=b"short", worker_id="w", step=0, batch_index=0, num_tasks=10, prompts_per_batch=1)


def test_a_worker_cannot_predict_its_leases(client: Any, server: Any) -> None:
    """Without the key, the formerly public function (run seed 0) predicts a lease no better than chance."""

    def public_tasks(worker_id: str, batch_index: int) -> list[int]:
        ids: list[int] = []
        for draw in range(1000):
            text = f"prime-rl/task/0/{worker_id}/0/{batch_index}/{draw}"
            t = int.from_bytes(hashlib.blake2b(text.encode(), digest_size=8).digest(), "big") % 50
            if t not in ids:
                ids.append(t)
            if len(ids) == 2:
                return ids
        raise AssertionError

    hits = 0
    for _ in range(8):
        worker_id = client.register().worker_id
        lease = client.get_tasks(worker_id)
        hits += [t.task_id for t in lease.tasks] == public_tasks(worker_id, 0)
        key = server.trusted.assignment_key
        assert [t.task_id for t in lease.tasks] == list(
            task_ids(key=key, worker_id=worker_id, step=0, batch_index=0, num_tasks=50, prompts_per_batch=2)
        )
    # With the public function every lease would be predicted (8/8); by chance each is with p = 1/(50*49),
    # so 3 or more chance hits have probability ~4e-9 (0 hits would fail by chance in 0.3% of runs).
    assert hits <= 2


# ---------------------------------------------------------------- leases: caps, abandonment, backpressure




def test_allowance_is_earned_by_answers_and_lowered_by_abandonment_then_ban(config_for: Any) -> None:
    ledger, clock = _ledger(config_for)
    worker = ledger.workers[ledger.register("abandons").worker_id]
    assert ledger.lease_allowance(worker.worker_id) == 1  # fresh: one lease, nothing to choose between
    first = ledger.lease(worker, None, None)
    with pytest.raises(ApiFailure) as fresh:
        ledger.lease(worker, None, None)
    assert fresh.value.status == 409 and "one more per answered lease" in fresh.value.message
    _submit(ledger, worker, _batch(first))
    for _ in range(2):
        _submit(ledger, worker, _batch(ledger.lease(worker, None, None)))
    assert ledger.lease_allowance(worker.worker_id) == 4  # min(max_open_leases 4, 1 + 3 answered)
    for _ in range(2):
        ledger.lease(worker, None, None)
    clock.now += 11
    assert ledger.expire_leases() == 2
    assert ledger.lease_allowance(worker.worker_id) == 2 and not worker.banned  # 4 - 2 expired; 2 of 5 issued
    ledger.lease(worker, None, None)
    ledger.lease(worker, None, None)
    with pytest.raises(ApiFailure) as refused:  # its allowance (4 - 2 expired) is used up
        ledger.lease(worker, None, None)
    assert refused.value.status == 409 and "let expire" in refused.value.message
    clock.now += 11
    ledger.expire_leases()  # 4 of 7 leases expired: >= ban_abandoned_leases (3) and >= 25 %
    assert worker.banned and "abandoned 4 of 7 leases" in worker.ban_reason
    with pytest.raises(ApiFailure) as banned:
        ledger.lease(worker, None, None)
    assert banned.value.status == 403
    # An honest worker that answers its leases keeps its full allowance and is never banned.
    honest = ledger.workers[ledger.register("answers").worker_id]
    for _ in range(10):
        _submit(ledger, honest, _batch(ledger.lease(honest, None, None)))
        clock.now += 11
        ledger.expire_leases()
    assert ledger.lease_allowance(honest.worker_id) == 4 and not honest.banned


def test_an_occasional_lost_lease_is_tolerated(config_for: Any) -> None:
    ledger, clock = _ledger(config_for)
    worker = ledger.workers[ledger.register("long-lived").worker_id]
    for index in range(20):
        lease = ledger.lease(worker, None, None)
        if index % 8 != 7:  # loses 2 of 20 leases (a restart, a network blip)
            _submit(ledger, worker, _batch(lease))
        clock.now += 11
        ledger.expire_leases()
    assert not worker.banned and ledger.leases.expired(worker.worker_id) == 2
    assert ledger.lease_allowance(worker.worker_id) == 2


def _reject(ledger: Ledger, batch_id: str, reason: str) -> None:
    """Verdicts a validator posts for a lease it rejects: ``reason`` on sample 0, the rest follow."""
    n = len(ledger.batches[batch_id].task_ids)
    verdicts = [
        Verdict(sample_index=i, accepted=False, reason=reason if i == 0 else "lease_rejected", reward=0.0, advantage=0.0)
        for i in range(n)
    ]
    ledger.record_verdicts(VerdictRequest(batch_id=batch_id, verdicts=verdicts))


@pytest.mark.parametrize("reason", ["reward_unverifiable", "tool_unverifiable", "reward_mismatch"])
def test_a_rejected_lease_costs_what_walking_away_costs(config_for: Any, reason: str) -> None:
    """Issue 34: a worker that spoils the leases it does not want trained (a lowered claim that used to
    be ``reward_unverifiable``, a program that loops past the sandbox limit, a raised claim) loses
    what a worker that walks away from them loses, step for step: allowance, its address's cap for
    fresh identities, and (issue 46.1: unless the reason may be the machine's) its standing until the
    abandonment ban; the spoiled lease's tasks go to
    another identity."""
    ledger, clock = _ledger(config_for, "--orchestrator.max_open_leases_per_address", "6")
    walker = ledger.workers[ledger.register("walks away").worker_id]
    spoiler = ledger.workers[ledger.register("spoils").worker_id]
    addresses = {walker.worker_id: "10.0.0.1", spoiler.worker_id: "10.0.0.2"}

    def lease(worker: Any) -> Any:
        return ledger.lease(worker, None, None, addresses[worker.worker_id])

    for worker in (walker, spoiler):
        for _ in range(3):
            _submit(ledger, worker, _batch(lease(worker)))  # answered, never judged: no accepted history
    assert ledger.lease_allowance(walker.worker_id) == ledger.lease_allowance(spoiler.worker_id) == 4
    spoiled_indices = []
    for round_ in range(3):
        lease(walker)
        spoiled = lease(spoiler)
        spoiled_indices.append(spoiled.batch_index)
        _reject(ledger, _submit(ledger, spoiler, _batch(spoiled)).batch_id, reason)
        clock.now += 11
        ledger.expire_leases()
        for worker in (walker, spoiler):  # the same cost, lease for lease
            assert ledger.lease_allowance(worker.worker_id) == max(1, 3 - round_), (round_, worker.name)
    assert walker.banned  # 3 of 6 leases abandoned: >= ban_abandoned_leases and >= 25 %
    if reason in MACHINE_REASONS:  # issue 46.1: the allowance and cap, but never the abandonment ban
        assert not spoiler.banned and ledger.rules.chargeable(spoiler.worker_id) == 0
        ledger.ban(BanRequest(worker_id=spoiler.worker_id, reason="test: out of the way"))
    else:
        assert spoiler.banned and "abandoned 3 of 6 leases" in spoiler.ban_reason
    # A fresh identity's spoiled lease lowers its address's cap for fresh identities as walking away does.
    fresh_walker = ledger.workers[ledger.register("fresh walker").worker_id]
    fresh_spoiler = ledger.workers[ledger.register("fresh spoiler").worker_id]
    ledger.lease(fresh_walker, None, None, "10.0.0.4")
    _reject(ledger, _submit(ledger, fresh_spoiler, _batch(ledger.lease(fresh_spoiler, None, None, "10.0.0.5"))).batch_id, reason)
    clock.now += 11
    ledger.expire_leases()
    assert ledger.rules.fresh_cap("10.0.0.4") == ledger.rules.fresh_cap("10.0.0.5") == 5
    # Every spoiled lease's tasks went to another identity (never back to the spoiler, which is banned).
    other = ledger.workers[ledger.register("other").worker_id]
    while ledger.leases.awaiting_reassignment():
        _submit(ledger, other, _batch(ledger.lease(other, None, None, "10.0.0.3")))
    assert all(ledger.leases.get(spoiler.worker_id, index).reissued for index in spoiled_indices)


def test_fresh_identities_are_capped_per_address_and_workers_with_history_are_not(config_for: Any) -> None:
    ledger, _ = _ledger(config_for, "--orchestrator.max_open_leases_per_address", "6")
    veteran = ledger.workers[ledger.register("veteran").worker_id]
    _accept(ledger, _submit(ledger, veteran, _batch(ledger.lease(veteran, None, None, "10.0.0.7"))).batch_id)
    hoarders = [ledger.workers[ledger.register(f"h{i}").worker_id] for i in range(8)]
    taken = 0
    for worker in hoarders:
        try:
            ledger.lease(worker, None, None, "10.0.0.7")
            taken += 1
        except ApiFailure as failure:
            assert failure.status == 429 and "max_open_leases_per_address" in failure.message
    assert taken == 6  # fresh identities: one lease each, six at this address together
    other = ledger.workers[ledger.register("elsewhere").worker_id]
    assert ledger.lease(other, None, None, "10.0.0.8").batch_index == 0  # another address is unaffected
    # The veteran (accepted history) is not counted with them and keeps its own allowance (1 + 1 answered).
    assert [ledger.lease(veteran, None, None, "10.0.0.7").batch_index for _ in range(2)] == [1, 2]


def test_hoarded_leases_never_stop_others_from_leasing(config_for: Any) -> None:
    """Issue 44: open leases are admitted work, so what is admitted (buffered plus leased samples)
    never exceeds max_buffered_samples; fresh identities' hoarded leases take at most
    fresh_buffered_share of it, so they never stop an established worker. Before, open leases did not
    count and 992 batches queued against a 128-sample limit."""
    ledger, _ = _ledger(config_for, "--orchestrator.max_buffered_samples", "20", "--trainer.samples_per_step", "8")
    honest = ledger.workers[ledger.register("honest").worker_id]
    _accept(ledger, _submit(ledger, honest, _batch(ledger.lease(honest, None, None))).batch_id)
    granted = 0
    for i in range(16):  # 16 hoarders would hold 64 samples of leases, far over the limit, never answered
        hoarder = ledger.workers[ledger.register(f"h{i}").worker_id]
        try:
            ledger.lease(hoarder, None, None, f"10.0.0.{i}")
            granted += 1
        except ApiFailure as refused:
            assert refused.status == 429 and refused.retry_after_s is not None
    assert granted == 4  # fresh identities fill only the room no one uses: (20 - 4 accepted) / 4
    assert ledger.rules.admitted_work() == (20, 16)
    leased = 0
    while True:
        try:
            ledger.lease(honest, None, None)
        except ApiFailure as busy:
            assert busy.status in (409, 429)
            break
        leased += 1
    # The hoarders count for it only up to their share (max(one lease, 0.25 * 20) = 5 samples):
    # 4 + 5 + 4 * 2 leases <= 20. Admitted work stays within the limit plus the hoarders' excess
    # over their share, which took only room that was unused.
    assert leased == 2
    admitted, fresh = ledger.rules.admitted_work()
    assert admitted - fresh + min(fresh, 5) <= 20 and admitted <= 20 + fresh - 5


def test_the_trainer_gets_the_validators_values_and_nothing_from_banned_workers(config_for: Any) -> None:
    ledger, _ = _ledger(config_for)
    good = ledger.workers[ledger.register("good").worker_id]
    bad = ledger.workers[ledger.register("bad").worker_id]
    good_batch = _submit(ledger, good, _batch(ledger.lease(good, None, None)))
    bad_batch = _submit(ledger, bad, _batch(ledger.lease(bad, None, None)))
    with pytest.raises(ApiFailure) as incomplete:  # accepted without the validator's log-probs: refused
        _accept(ledger, good_batch.batch_id, logprobs=[-0.25])
    assert incomplete.value.status == 400 and "log-probs" in incomplete.value.message
    _accept(ledger, bad_batch.batch_id)
    _accept(ledger, good_batch.batch_id)
    ledger.workers.ban(bad, "caught later")  # e.g. by per-worker evidence, after its samples were accepted
    claim = ledger.claim(ClaimRequest(step=0, min_samples=8, filter_zero_advantage=False))
    assert not claim.ready and claim.available_samples == 4  # only the good worker's 4 samples
    claim = ledger.claim(ClaimRequest(step=0, min_samples=4, filter_zero_advantage=False))
    assert claim.ready and {s.worker_id for s in claim.samples} == {good.worker_id}
    for sample in claim.samples:  # the worker claimed -9.0 and rewards 0/1, advantages -0.5/0.5 per group index
        assert sample.behaviour_logprobs == [-0.25, -0.75]
        index = int(sample.sample_id.rsplit("/", 1)[1])
        assert (sample.reward, sample.advantage) == (float(index % 2), float(index % 2) - 0.5)
    # A restarted orchestrator replays the same claim with the same values.
    restarted = Ledger(ledger.config, ledger.tasks, RolloutStore(ledger.config.orchestrator_data_dir))
    assert restarted.claim(ClaimRequest(step=0, min_samples=4)).samples == claim.samples
