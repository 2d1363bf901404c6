"""Issue 44, item 5: the trusted roles' own listener (``orchestrator.trusted_port``, ``server.py``).

The validator's and trainer's requests are read and answered on an event loop of their own, so a
main loop kept busy by the swarm (at 1,024 identities its lag reached half a second) does not delay
them; their ledger calls, durability and the training record stay the server's. Real servers on
loopback; the main loop is held on purpose, and the assertions are about which answers arrive while
it is held, not about speed.
"""

from __future__ import annotations

import asyncio
import threading
from pathlib import Path
from typing import Any

import pytest

from prime_rl.api.client import ClientRequestError, OrchestratorClient, OrchestratorUnavailable
from prime_rl.api.protocol import Verdict, VerdictRequest
from prime_rl.api.secrets import SecretsError
from prime_rl.config import load_config
from prime_rl.orchestrator.group_commit import GroupCommit
from prime_rl.orchestrator.server import OrchestratorServer
from prime_rl.statedb import StateDB

from .conftest import make_batch, make_config, task_set


def _hold_main_loop(server: OrchestratorServer) -> threading.Event:
    """Block the server's main event loop (as a swarm's flood of requests keeps it busy) until the
    returned event is set; returns once it is held."""
    loop, held, release = server._loop, threading.Event(), threading.Event()
    assert loop is not None

    def hold() -> None:
        held.set()
        release.wait(30)

    loop.call_soon_threadsafe(hold)
    assert held.wait(10)
    return release


def test_the_trusted_roles_are_served_while_the_main_loop_is_held(server_factory: Any) -> None:
    """A batch is stored; then the main loop is held: through the trusted listener the validator
    lists it, takes it, posts its verdicts, and the trainer claims and commits, all while a worker's
    request to the main port gets no answer. With one port they all waited for the main loop."""
    server = server_factory("--orchestrator.trusted_port", "0", "--trainer.samples_per_step", "2")
    assert server.trusted_url != server.url
    with OrchestratorClient(server.url, timeout_s=10, retries=0) as worker:
        worker_id = worker.register("w").worker_id
        lease = worker.get_tasks(worker_id)
        batch = make_batch(lease)
        batch_id = worker.submit_rollouts(batch).batch_id
    release = _hold_main_loop(server)
    try:
        with OrchestratorClient(server.trusted_url, timeout_s=10, retries=0, admin_token=server.admin_token) as trusted:
            assert trusted.status().step == 0
            assert [b.batch_id for b in trusted.pending().batches] == [batch_id]
            assert [b.batch_id for b in trusted.take_batches("v").batches] == [batch_id]
            verdicts = [Verdict(sample_index=i, accepted=True, reason="ok", reward=s.reward, advantage=s.advantage,
                                logprobs=[-0.1] * len(s.completion_tokens))
                        for i, s in enumerate(batch.samples)]  # fmt: skip
            trusted.post_verdicts(VerdictRequest(batch_id=batch_id, verdicts=verdicts, validator_id="v"))
            assert trusted.claim(0, 2).ready
            trusted.commit(0, 1)
            assert trusted.status().step == 1
        with OrchestratorClient(server.url, timeout_s=0.5, retries=0) as late, pytest.raises(OrchestratorUnavailable):
            late.status()  # the main loop is still held: the main port answers nothing
        assert not release.is_set()
    finally:
        release.set()
    with OrchestratorClient(server.url, timeout_s=10, retries=0) as worker:
        assert worker.status().step == 1  # one ledger: what the trusted listener did, the main port serves


def test_the_trusted_listener_serves_only_the_trusted_routes(server_factory: Any) -> None:
    """A worker's endpoints are not on the trusted port (404), and its endpoints still need the admin
    token (401): the listener is a second door to the same rules, not a way around them."""
    server = server_factory("--orchestrator.trusted_port", "0")
    with OrchestratorClient(server.trusted_url, timeout_s=10, retries=0) as anonymous:
        with pytest.raises(ClientRequestError) as refused:
            anonymous.register("w")
        assert refused.value.status == 404
        with pytest.raises(ClientRequestError) as unauthorized:
            anonymous.pending()
        assert unauthorized.value.status == 401
        assert anonymous.status().step == 0
    with OrchestratorClient(server.url, timeout_s=10, retries=0) as worker:
        worker_id = worker.register("w").worker_id
        with pytest.raises(ClientRequestError) as refused:
            OrchestratorClient(server.trusted_url, timeout_s=10, retries=0).get_tasks(worker_id)
        assert refused.value.status == 404


def test_the_listener_stops_with_the_server_and_its_port_is_free_again(tmp_path: Path) -> None:
    server = OrchestratorServer(make_config(tmp_path, "--orchestrator.trusted_port", "0"), task_set()).start()
    port = int(server.trusted_url.rsplit(":", 1)[1])
    threads = {t.name for t in threading.enumerate()}
    assert "orchestrator-trusted" in threads
    server.stop()
    assert "orchestrator-trusted" not in {t.name for t in threading.enumerate()}
    again = OrchestratorServer(make_config(tmp_path / "again", "--orchestrator.trusted_port", str(port)), task_set())
    try:
        assert again.start().trusted_url.endswith(f":{port}")
    finally:
        again.stop()


def test_a_trusted_port_in_use_is_a_clear_error_at_start(tmp_path: Path) -> None:
    first = OrchestratorServer(make_config(tmp_path, "--orchestrator.trusted_port", "0"), task_set()).start()
    try:
        port = first.trusted_url.rsplit(":", 1)[1]
        with pytest.raises(OSError):
            OrchestratorServer(make_config(tmp_path / "second", "--orchestrator.trusted_port", port), task_set()).start()
    finally:
        first.stop()


def test_the_trusted_url_and_the_config_rules(tmp_path: Path) -> None:
    def orchestrator(*overrides: str) -> Any:
        return load_config(None, ["--run_dir", str(tmp_path), *overrides]).orchestrator

    assert orchestrator("--orchestrator.port", "8700").trusted_url == "http://127.0.0.1:8700"  # none: the main port
    assert orchestrator("--orchestrator.trusted_port", "8705").trusted_url == "http://127.0.0.1:8705"
    assert orchestrator("--orchestrator.host", "0.0.0.0", "--orchestrator.trusted_host", "10.0.0.2",
                        "--orchestrator.trusted_port", "8705").trusted_url == "http://10.0.0.2:8705"  # fmt: skip
    assert orchestrator("--orchestrator.trusted_port", "8705", "--orchestrator.trusted_public_url",
                        "https://v.example/").trusted_url == "https://v.example"  # fmt: skip
    with pytest.raises(ValueError, match="trusted_port"):
        orchestrator("--orchestrator.port", "8700", "--orchestrator.trusted_port", "8700")
    # reachable from other machines: refused without a configured admin token, like the main port
    with pytest.raises(SecretsError):
        OrchestratorServer(make_config(tmp_path, "--orchestrator.trusted_port", "0", "--orchestrator.trusted_host",
                                       "0.0.0.0"), task_set())  # fmt: skip


def test_durability_is_awaited_on_two_event_loops_at_once(tmp_path: Path) -> None:
    """The server's loop and the trusted listener's wait for the same group commit: each waiter
    returns once an fsync that began after its commit has finished, whichever loop started it."""
    db = StateDB(tmp_path / "state.sqlite", [lambda c: c.execute("CREATE TABLE t (x INTEGER)")], "test store")
    commit = GroupCommit(db)
    try:
        start, errors = threading.Barrier(2), []

        def waiter(value: int) -> None:
            try:
                db.write("INSERT INTO t VALUES (?)", [(value,)])
                start.wait(10)
                asyncio.run(commit.durable())
                assert commit.synced >= 2
            except BaseException as error:
                errors.append(error)

        threads = [threading.Thread(target=waiter, args=(n,)) for n in range(2)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(30)
        assert not errors, errors
        assert commit.synced == db.commits
    finally:
        commit.close()
        db.close()
