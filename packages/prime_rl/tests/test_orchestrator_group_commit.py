"""Group commit (issue #44 item 3): durability without an fsync under the server's lock.

Concurrent workers talk to a real orchestrator over HTTP. No fsync runs inside a ledger call
(every ledger call runs under the server's one lock), the store commits without SQLite's own
fsync, one fsync of the write-ahead log covers several requests, and whatever was acknowledged is
on disk: a fresh store opened on the same directory holds every acknowledged batch.
"""

from __future__ import annotations

import os
import threading
from pathlib import Path
from typing import Any

import pytest

from prime_rl.api.client import OrchestratorClient
from prime_rl.orchestrator.ledger import Ledger
from prime_rl.orchestrator.store import RolloutStore

from .conftest import make_batch

LEDGER_CALLS = ("register", "authenticate", "lease", "submit", "record_verdicts", "pending", "expire_leases")


def test_no_fsync_under_the_lock_and_one_fsync_acknowledges_many(
    server_factory: Any, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    inside = threading.local()
    under_lock: list[str] = []
    fsyncs = [0]
    real_fsync = os.fsync

    def fsync(fd: int) -> None:
        fsyncs[0] += 1
        if getattr(inside, "call", None):
            under_lock.append(inside.call)
        real_fsync(fd)

    def wrap(name: str) -> Any:
        method = getattr(Ledger, name)

        def call(self: Ledger, *args: Any, **kwargs: Any) -> Any:
            inside.call = name
            try:
                return method(self, *args, **kwargs)
            finally:
                inside.call = None

        return call

    monkeypatch.setattr(os, "fsync", fsync)
    for name in LEDGER_CALLS:
        monkeypatch.setattr(Ledger, name, wrap(name))
    server = server_factory("--orchestrator.max_open_leases", "4")
    acknowledged: list[str] = []
    errors: list[BaseException] = []

    def worker(number: int) -> None:
        try:
            with OrchestratorClient(server.url, timeout_s=30, retries=2, backoff_s=0.05) as client:
                worker_id = client.register(f"w{number}").worker_id
                for _ in range(6):
                    answer = client.submit_rollouts(make_batch(client.get_tasks(worker_id)))
                    acknowledged.append(answer.batch_id)
        except BaseException as error:
            errors.append(error)

    threads = [threading.Thread(target=worker, args=(n,)) for n in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(120)
    assert not errors, errors
    assert len(acknowledged) == 48
    assert under_lock == [], f"fsync inside ledger calls (under the server's lock): {sorted(set(under_lock))}"
    db = server.ledger.store.db
    (synchronous,) = db.read("PRAGMA synchronous")[0]
    assert synchronous == 1  # NORMAL: SQLite itself takes no fsync per commit
    assert 0 < db.syncs < db.commits  # one fsync of the log covered several commits
    # Everything acknowledged is in the store, payload included.
    store = RolloutStore(server.ledger.store.root)
    for batch_id in acknowledged:
        assert store.read_batch(batch_id).num_rows == 4
    # No payload file of a refused or duplicate request is left behind.
    assert len(list(store.batches_dir.glob("*.arrow"))) == 48
