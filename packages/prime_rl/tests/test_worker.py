"""Worker: registers, follows policy versions through shardcast, answers leases; the validator accepts it."""

from __future__ import annotations

import logging
import socket
import threading
import time
from unittest.mock import patch

import pytest
import torch
from tiny_lm import make_tiny_lm

import shardcast
from prime_rl.api.client import OrchestratorClient
from prime_rl.config import load_config
from prime_rl.orchestrator.server import OrchestratorServer
from prime_rl.redteam import attacks as hostile
from prime_rl.redteam.attacks import (
    ATTACKS,
    BEHAVIOURS,
    EXPECTED_REASONS,
    MIXED_CYCLE,
    Attack,
    HostileWorker,
    attack_table,
)
from prime_rl.redteam.process import HostileProcess
from prime_rl.tasks import load_tasks
from prime_rl.validator.checks import Checks, Reason
from prime_rl.validator.verdicts import validate_batch
from prime_rl.weights.files import save_policy
from prime_rl.weights.store import PolicyUnavailable
from prime_rl.worker import process as worker_process
from prime_rl.worker.process import Worker


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def test_worker_follows_shardcast_versions_and_is_accepted(tmp_path, tiny_lm_dir, caplog):
    port, origin_port = free_port(), free_port()
    config = load_config(
        None,
        [
            "--run_dir", str(tmp_path / "run"), "--model.path", str(tiny_lm_dir),
            "--tasks.num_tasks", "20", "--orchestrator.port", str(port),
            "--orchestrator.prompts_per_batch", "2", "--orchestrator.async_level", "1",
            "--sampling.group_size", "3", "--sampling.max_new_tokens", "5",
            "--shardcast.origin_port", str(origin_port), "--shardcast.relay_ports", "[]",
            "--workers.max_batches", "2", "--workers.weights_poll_s", "0.1",
            "--orchestrator.registration_token", "s3cret",  # the worker must present it to register
        ],
    )  # fmt: skip
    tasks = load_tasks(config.tasks)
    new_weights = make_tiny_lm(seed=5)
    policy = save_policy(new_weights.state_dict(), tmp_path / "v1" / "model.safetensors")
    with (
        OrchestratorServer(config, tasks) as server,
        shardcast.Origin(tmp_path / "origin", port=origin_port) as origin,
        OrchestratorClient(server.url, admin_token=server.admin_token) as admin,
    ):
        worker = Worker(config, "worker-0")
        parameters = list(worker.backend.model.parameters())
        origin.publish(policy, version=1)  # published while the worker is starting: picked up by the follower
        runner = threading.Thread(target=worker.run_loop)
        runner.start()
        runner.join(timeout=200)
        assert not runner.is_alive()
        deadline = time.monotonic() + 60
        while worker.follower.newest_local < 1 and time.monotonic() < deadline:
            time.sleep(0.1)
        # Waiting for a version nobody publishes: a progress line per log period, never silence.
        worker.wait_log_every_s = 0.3
        caplog.set_level(logging.INFO, logger="prime_rl.worker.process")
        waiting = threading.Thread(target=worker.wait_for_version, args=(2,))
        started = time.monotonic()
        waiting.start()
        time.sleep(1.5)
        worker.stop_event.set()
        waiting.join(timeout=30)
        waited = time.monotonic() - started
        lines = [r.getMessage() for r in caplog.records if "still waiting for policy v2" in r.getMessage()]
        assert 3 <= len(lines) <= waited / 0.3, lines
        assert all(origin.url in line and "holding v" in line for line in lines)
        worker.close()
        assert worker.submitted == 2
        # Hot reload happened in place (same parameter objects now hold v1's values), via shardcast.
        assert worker.follower.newest_local == 1
        with pytest.raises(PolicyUnavailable) as missing:
            worker.store.ensure(7)  # never published: a permanent failure (the validator says unknown_policy)
        assert missing.value.permanent
        worker.reload_newest(limit=0)  # not committed by the orchestrator yet: stays on v0
        assert worker.backend.policy_version == 0
        worker.reload_newest(limit=1)
        assert worker.backend.policy_version == 1
        assert list(worker.backend.model.parameters()) == parameters
        for name, value in new_weights.state_dict().items():
            assert torch.equal(worker.backend.model.state_dict()[name], value)
        # Every submitted sample passes the validator's checks with the claimed version's weights.
        pending = admin.pending(8).batches
        assert len(pending) == 2
        versions = {0: tiny_lm_dir, 1: policy}
        hidden = worker.backend.model.config.hidden_size
        checks = Checks.from_config(
            config, vocab_size=100, eos_token_ids=worker.backend.eos_token_ids,
            assignment_key=server.trusted.assignment_key, hidden_size=hidden,
        )  # fmt: skip
        for batch in pending:
            backend = worker.backend
            if batch.policy_version == 0:
                backend.load_weights(worker.store.path(0), 0)
            else:
                backend.load_weights(versions[1], 1)
            verdicts = validate_batch(
                batch, tasks=worker.tasks, backend_for=lambda v, b=backend: b if v == b.policy_version else None,
                decode=lambda t: worker.backend.tokenizer.decode(list(t), skip_special_tokens=True), checks=checks,
            )  # fmt: skip
            assert {v.reason for v in verdicts} == {Reason.ACCEPTED}, [(v.reason, v.detail) for v in verdicts]
            assert len(batch.samples) == 2 * 3


@pytest.mark.parametrize("behaviour", ["honest", "garbage", "stale_policy"])
def test_the_loop_meets_a_behaviour_only_through_its_hooks(tmp_path, tiny_lm_dir, caplog, monkeypatch, behaviour):
    """One loop for every worker: an honest and a garbage worker each submit and log their batch once (no
    expected verdict in the metrics); garbage first posts its bytes through the client (answered 400);
    stale_policy takes no lease while no version can be stale yet."""
    config = load_config(
        None,
        [
            "--run_dir", str(tmp_path / "run"), "--model.path", str(tiny_lm_dir), "--tasks.num_tasks", "20",
            "--orchestrator.port", str(free_port()), "--orchestrator.prompts_per_batch", "2",
            "--sampling.group_size", "3", "--sampling.max_new_tokens", "5", "--workers.behaviour", behaviour,
            "--workers.poll_interval_s", "0.05",
        ],
    )  # fmt: skip
    events: list[tuple[str, dict]] = []

    class Recorder:
        def log(self, event: str, **fields: object) -> None:
            events.append((event, fields))

    monkeypatch.setattr(worker_process, "get_metrics", Recorder)
    caplog.set_level(logging.INFO, logger="prime_rl.redteam.attacks")
    with (
        OrchestratorServer(config, load_tasks(config.tasks)) as server,
        OrchestratorClient(server.url, admin_token=server.admin_token) as admin,
    ):
        # hostile behaviours run in the red team's process (prime-rl redteam), the honest loop's subclass
        worker = (Worker if behaviour == "honest" else HostileProcess)(config, "w")
        worker.worker_id = worker.client.register("w").worker_id
        submitted = worker.one_batch()
        worker.close()
        pending = admin.pending(8).batches
    if behaviour == "stale_policy":
        assert not submitted and pending == [] and events == []
        return
    (batch,) = pending
    assert submitted and [event for event, _ in events] == ["rollouts"]
    fields = events[0][1]
    assert (fields["behaviour"], fields["batch_id"]) == (behaviour, batch.batch_id) and "expected_reason" not in fields
    refused = [r.getMessage() for r in caplog.records if r.getMessage().startswith("garbage body refused")]
    assert refused == ([] if behaviour == "honest" else [refused[0]]) and (behaviour == "honest" or "HTTP 400" in refused[0])


def test_the_attack_table_is_the_one_list_of_attacks():
    """hostile.ATTACKS renders the module's docstring table, names the behaviours a worker takes, and
    each entry has the method that builds its batch (a new attack: one entry plus one method)."""
    assert attack_table() in hostile.__doc__
    for name, attack in ATTACKS.items():
        assert f"``{name}``" in hostile.__doc__ and attack.does.split()[0] in hostile.__doc__
        assert callable(getattr(HostileWorker, f"_{name}"))
    assert ("honest", *ATTACKS, "mixed") == BEHAVIOURS
    assert MIXED_CYCLE == (  # the red team's order, unchanged
        "other_weights", "changed_prompt", "fabricated_completion", "inflated_rewards", "unassigned_tasks",
        "garbage", "stale_policy",
    )  # fmt: skip
    with (
        patch.dict(ATTACKS, {"new_attack": Attack("does something new", ("malformed",))}),
        pytest.raises(TypeError, match=r"without a HostileWorker._<name> method: \['new_attack'\]"),
    ):
        HostileWorker("other_weights", list, lambda *a: 0.0, list, 1)


def test_mixed_cycle_behaviours_have_expected_reasons():
    assert set(MIXED_CYCLE) <= set(EXPECTED_REASONS)
    assert EXPECTED_REASONS["honest"] == ("ok",)
    assert all(all(r in {x.value for x in Reason} for r in reasons) for reasons in EXPECTED_REASONS.values())


def test_the_honest_worker_plays_no_hostile_behaviour(tmp_path):
    """``prime-rl worker`` is honest only: a hostile ``workers.behaviour`` is refused before anything
    starts (no model, no orchestrator), with the role that plays it; the red team's process takes it."""
    config = load_config(None, ["--run_dir", str(tmp_path), "--workers.behaviour", "garbage"])
    with pytest.raises(ValueError, match="prime-rl redteam"):
        Worker(config, "w")
    assert Worker.behaviours == ("honest",) and HostileProcess.behaviours == BEHAVIOURS
