"""Issue 34, item 5: ``GET /workers`` is anonymous, so it must cost the same whatever the table's
size and never wait for (or hold) the ledger's lock. The latency under load is measured by
``benchmarks/anonymous_reads.py``."""

from __future__ import annotations

import gc
import json
import threading
import time
from pathlib import Path
from typing import Any

import requests

from prime_rl.api.client import OrchestratorClient
from prime_rl.api.protocol import BanRequest
from prime_rl.config import load_config
from prime_rl.launch.progress import TOP_WORKERS
from prime_rl.launch.supervisor import Supervisor
from prime_rl.metrics import MetricsWriter
from prime_rl.orchestrator.server import OrchestratorServer
from prime_rl.orchestrator.workers_view import PAGE_MAX, build_snapshot

from .conftest import make_config, task_set


def test_anonymous_reads_are_answered_while_the_ledger_lock_is_held(server_factory: Any) -> None:
    # Before: GET /workers and GET /status ran under the ledger's lock, so they waited for whatever
    # held it (and /workers, at 10k workers, held it 0.31 s itself).
    server = server_factory()
    release, entered = threading.Event(), threading.Event()
    pending = server.ledger.pending_unread  # what GET /validator/pending runs on the ledger's thread

    def slow_pending(limit: int) -> Any:  # holds the ledger's lock until released
        entered.set()
        release.wait(10)
        return pending(limit)

    server.ledger.pending_unread = slow_pending  # type: ignore[method-assign]
    headers = {"Authorization": f"Bearer {server.admin_token}"}
    blocked = threading.Thread(
        target=lambda: requests.get(server.url + "/validator/pending", headers=headers, timeout=15)
    )
    blocked.start()
    try:
        assert entered.wait(5)
        for path in ("/workers", "/status", "/health"):
            started = time.monotonic()
            answer = requests.get(server.url + path, timeout=3)
            assert answer.status_code == 200 and time.monotonic() - started < 2.0, path
    finally:
        release.set()
        blocked.join(15)


def test_workers_answers_are_bounded_pages_with_totals(server_factory: Any) -> None:
    server = server_factory("--orchestrator.max_fresh_workers_per_network", "0")
    ids = [server.ledger.register(f"w{i}").worker_id for i in range(700)]  # server idle: no request in flight
    for worker_id in ids[:3]:
        server.ledger.ban(BanRequest(worker_id=worker_id, reason="test"))
    with OrchestratorClient(server.url, retries=0) as client:
        first = client.workers()
        assert [w.worker_id for w in first.workers] == ids[:100] and first.total == 700
        assert first.totals is not None and (first.totals.registered, first.totals.banned) == (700, 3)
        assert first.totals.active == 697
        last = client.workers(offset=600, limit=PAGE_MAX)
        assert [w.worker_id for w in last.workers] == ids[600:] and last.offset == 600
        assert [w.worker_id for w in client.workers(banned_only=True).workers] == ids[:3]
        assert len(client.workers(order="accepted", limit=5).workers) == 5
    raw = requests.get(server.url + "/workers", params={"limit": PAGE_MAX}, timeout=10)
    assert len(raw.content) < PAGE_MAX * 1024  # one page, whatever the table holds
    for bad in ({"limit": PAGE_MAX + 1}, {"offset": -1}, {"order": "name"}, {"limit": "x"}, {"banned": "1"}):
        answer = requests.get(server.url + "/workers", params=bad, timeout=10)
        assert answer.status_code == 400 and answer.json()["error"] == "bad_request"


def test_full_collections_walk_neither_the_loaded_ledger_nor_the_snapshot_rows(server_factory: Any) -> None:
    # Before: every full collection walked every object of the process (77,000 at 10,000 workers)
    # and every snapshot row, holding the GIL for 45-52 ms of CPU each, three times per 10 s under
    # 4 anonymous readers (benchmarks/results/anonymous_reads_gc.md).
    server = server_factory()
    assert gc.get_freeze_count() > 0  # what the ledger loaded is out of the collector's walks
    assert not any(tracked is server.ledger for tracked in gc.get_objects())
    for i in range(50):
        server.ledger.register(f"w{i}")
    snapshot = build_snapshot(server.ledger)
    gc.collect()
    assert not any(gc.is_tracked(row) for row in snapshot.rows)  # strings, numbers and tuples of them only
    server.stop()
    assert gc.get_freeze_count() == 0  # an embedded server gives the frozen objects back when it stops


def test_the_young_generations_threshold_is_raised_while_servers_serve_and_given_back(tmp_path: Path) -> None:
    # Before: the interpreter's 700 held while serving. A claim or a validator's listing builds hundreds
    # of samples at once, each with its token lists, so a closed loop of 256 identities collected about
    # 30 times a second, and moved requests still in flight into the older generations (closed_loop.md,
    # run 16).
    def start(name: str, threshold: int) -> OrchestratorServer:
        config = make_config(tmp_path / name, "--orchestrator.gc_young_threshold", str(threshold))
        return OrchestratorServer(config, task_set()).start()

    before, servers = gc.get_threshold(), []
    try:
        gc.set_threshold(700, 13, 17)
        servers.append(first := start("first", 20000))
        assert gc.get_threshold() == (20000, 13, 17)
        servers.append(second := start("second", 30000))  # one process, two servers
        assert gc.get_threshold() == (30000, 13, 17)  # the largest asked for, while any serves
        second.stop()
        assert gc.get_threshold() == (20000, 13, 17)
        servers.append(unset := start("unset", 0))  # 0: left as it is
        first.stop()
        assert gc.get_threshold() == (700, 13, 17)  # the interpreter's own, once the last has stopped
        unset.stop()
        assert gc.get_threshold() == (700, 13, 17)
    finally:
        for server in servers:
            server.stop()
        gc.set_threshold(*before)


def test_workers_snapshot_is_shared_until_it_is_older_than_its_max_age(server_factory: Any) -> None:
    server = server_factory("--orchestrator.workers_view_max_age_s", "0.5")
    server.ledger.register("first")
    with OrchestratorClient(server.url, retries=0) as client:
        assert client.workers().total == 1
        server.ledger.register("second")
        assert client.workers().total == 1  # the cached snapshot, not a rebuild per read
        time.sleep(0.6)
        assert client.workers().total == 2


def test_the_supervisors_progress_record_is_bounded_whatever_the_number_of_workers(
    server_factory: Any, tmp_path: Path
) -> None:
    # Before: every 2 s the whole worker table went into run.jsonl (70 kB/s at 1,620 identities).
    server = server_factory("--orchestrator.max_fresh_workers_per_network", "0")
    ids = [server.ledger.register(f"sybil {i}").worker_id for i in range(300)]
    server.ledger.ban(BanRequest(worker_id=ids[7], reason="test"))
    config = load_config(None, ["--run_dir", str(tmp_path / "run")])
    metrics = MetricsWriter(tmp_path / "run" / "metrics" / "run.jsonl", role="run", name="run")
    supervisor = Supervisor(config, None, [], metrics, on_progress=lambda line: None)
    with OrchestratorClient(server.url, retries=0) as client:
        line = supervisor.progress_line(client)
    record = json.loads((tmp_path / "run" / "metrics" / "run.jsonl").read_text().splitlines()[-1])
    assert record["event"] == "progress" and len(record["workers"]) <= 2 * TOP_WORKERS
    assert record["workers"][ids[7]]["banned"]  # banned workers are among those named
    assert record["worker_totals"]["registered"] == 300 and record["worker_totals"]["banned"] == 1
    assert "300 workers" in line and len(line) < 2_000
