"""Every request costs the same at any history length (issue #44 item 2).

A request's *work* is counted, not timed: the Python function calls it makes (``cProfile``'s call
count: a walk over stored batches shows up as calls per batch) plus the SQLite virtual-machine
steps it runs (a progress handler every ``VM_STEP`` instructions: a table scan shows up there).
Each request type is measured on a ledger with 10^3 and with 10^5 settled batches behind it, with
backpressure on (and, for the lease, off too), and the counts must stay within ``TOLERANCE``.

History, built cheaply (``_settled_history``, a documented direct fill, since 10^5 real cycles
take many minutes on a shared machine): batches judged accepted and claimed, of 64 workers.

  - This code keeps settled batches on disk only: the fill inserts their store rows (batch index
    row closed, verdicts, the workers' running counters) in one transaction, then the ledger is
    reopened, as after a restart.
  - Code that keeps every batch in memory (``main`` before issue #44) is filled the way its own
    ``load`` fills it: one ``StoredBatch`` per batch in the batch book's dict.
"""

from __future__ import annotations

import cProfile
import functools
import hashlib
import json
import pstats
from collections import Counter
from pathlib import Path
from typing import Any

import pytest

from prime_rl.api.protocol import ClaimRequest, CommitRequest, DoneRequest, Verdict, VerdictRequest
from prime_rl.api.spans import lease_digest
from prime_rl.orchestrator.batches import StoredBatch
from prime_rl.orchestrator.ledger import Ledger
from prime_rl.orchestrator.store import BatchMeta, RolloutStore
from prime_rl.orchestrator.workers_view import build_snapshot

from .conftest import make_batch, make_config, task_set

SMALL, LARGE = 1_000, 100_000
TOLERANCE = 1.25
"""Work at LARGE history may exceed the work at SMALL by this factor (plus ``SLACK``): noise from
dict resizes and SQLite b-tree depth (log n), never a factor of 100."""
SLACK = 200
VM_STEP = 100
WORKERS = 64


def _verdicts(n: int) -> list[Verdict]:
    return [
        Verdict(sample_index=i, accepted=True, reason="ok", reward=float(i % 2), advantage=0.5 - i % 2, logprobs=[-0.5, -0.25])
        for i in range(n)
    ]


def _settled_history(ledger: Ledger, store: RolloutStore, count: int) -> Ledger:
    """Add ``count`` settled batches (module docstring); returns the ledger to measure."""
    workers = [f"hist{i:03d}" for i in range(WORKERS)]
    verdicts = _verdicts(4)
    if not hasattr(ledger.batches, "live"):  # today's code: every batch in the batch book's memory
        book: dict[str, StoredBatch] = ledger.batches._batches  # type: ignore[attr-defined]
        for seq in range(count):
            worker = workers[seq % WORKERS]
            meta = BatchMeta(f"{worker}-s0-b{seq}", worker, 0, seq, 0, 1.0, "0" * 64, seq + len(book), None)
            book[meta.batch_id] = StoredBatch(meta, (0, 0, 1, 1), list(verdicts), claimed={0, 1, 2, 3})
        return ledger
    text = json.dumps([v.model_dump() for v in verdicts], separators=(",", ":"))
    start = len(ledger.batches)
    batches, verdict_rows, counts = [], [], Counter[tuple[str, str]]()
    for seq in range(start, start + count):
        worker = workers[seq % WORKERS]
        meta = BatchMeta(f"{worker}-s0-b{seq}", worker, 0, seq, 0, 1.0, "0" * 64, seq, None)
        batches.append((meta.batch_id, seq, worker, meta.to_json().decode(), "[0,0,1,1]", "[0,1,2,3]", 0))
        verdict_rows.append((meta.batch_id, text))
        counts.update({(worker, "batches"): 1, (worker, "samples"): 4, (worker, "accepted"): 4})
    with store.db.transaction() as connection:
        connection.executemany("INSERT INTO batches VALUES (?, ?, ?, ?, ?, ?, ?, NULL)", batches)
        connection.executemany("INSERT INTO verdicts VALUES (?, ?)", verdict_rows)
        connection.executemany(
            "INSERT INTO counters VALUES ('worker', ?, ?, ?) ON CONFLICT (scope, key, name) DO UPDATE SET n = n + excluded.n",
            [(worker, name, n) for (worker, name), n in counts.items()],
        )
    return Ledger(ledger.config, ledger.tasks, store, clock=ledger.clock)


class _Work:
    """Function calls and SQLite VM steps of the measured blocks."""

    def __init__(self, store: RolloutStore) -> None:
        self.vm_steps = 0
        store.db.connection.set_progress_handler(self._step, VM_STEP)

    def _step(self) -> int:
        self.vm_steps += 1
        return 0

    def measure(self, call: Any) -> tuple[int, Any]:
        steps = self.vm_steps
        profiler = cProfile.Profile()
        profiler.enable()
        try:
            result = call()
        finally:
            profiler.disable()
        calls = pstats.Stats(profiler).total_calls  # type: ignore[attr-defined]
        return calls + (self.vm_steps - steps), result


def _work_per_request(tmp_path: Path, history: int, backpressure: bool) -> dict[str, int]:
    overrides = ["--trainer.samples_per_step", "8", "--orchestrator.probation_tokens", "0"]
    if backpressure:
        overrides += ["--orchestrator.max_buffered_samples", "10000"]
    config = make_config(tmp_path, *overrides)
    store = RolloutStore(tmp_path / "orch")
    now = [1000.0]
    ledger = Ledger(config, task_set(), store, clock=lambda: now[0])
    ledger = _settled_history(ledger, store, history)
    work = _Work(store)
    measured: dict[str, int] = {}

    def count(name: str, call: Any) -> Any:
        cost, result = work.measure(call)
        measured[name] = max(measured.get(name, 0), cost)
        return result

    reg = ledger.register("warm")  # warms caches and imports: not measured
    worker = ledger.workers[reg.worker_id]
    lease = ledger.lease(worker, None, None)
    batch = make_batch(lease)
    digest = lease_digest(batch.samples)
    ledger.done(worker, DoneRequest(worker_id=worker.worker_id, step=0, batch_index=0, digest=digest))
    answer = ledger.submit(worker, batch, hashlib.sha256(batch.model_dump_json().encode()).hexdigest())
    ledger.pending(8)
    ledger.record_verdicts(VerdictRequest(batch_id=answer.batch_id, verdicts=_verdicts(len(batch.samples))))
    ledger.status()
    build_snapshot(ledger)
    for tag in ("a", "b"):  # the larger of two rounds counts
        _round(ledger, count, tag)
    return measured


def _round(ledger: Ledger, count: Any, tag: str) -> None:
    """One of every request, each counted under its name."""
    reg = count("register", lambda: ledger.register(f"x{tag}"))
    worker = ledger.workers[reg.worker_id]
    lease = count("lease", lambda: ledger.lease(worker, None, None))
    batch = make_batch(lease, lease.step)
    body = batch.model_dump_json().encode()
    digest = lease_digest(batch.samples)
    done = DoneRequest(worker_id=worker.worker_id, step=lease.step, batch_index=lease.batch_index, digest=digest)
    count("done", lambda: ledger.done(worker, done))
    answer = count("submit", lambda: ledger.submit(worker, batch, hashlib.sha256(body).hexdigest()))
    count("pending", lambda: ledger.pending(8))
    request = VerdictRequest(batch_id=answer.batch_id, verdicts=_verdicts(len(batch.samples)))
    count("verdicts", lambda: ledger.record_verdicts(request))
    count("own_verdicts", lambda: ledger.batch_verdicts(worker, answer.batch_id))
    count("claim_waiting", lambda: ledger.claim(ClaimRequest(step=ledger.step, min_samples=1 << 20)))
    claim = count("claim", lambda: ledger.claim(ClaimRequest(step=ledger.step, min_samples=2)))
    assert claim.ready
    count("commit", lambda: ledger.commit(CommitRequest(step=ledger.step, policy_version=ledger.step + 1)))
    count("status", ledger.status)
    count("workers", lambda: build_snapshot(ledger))


@pytest.mark.parametrize("backpressure", [True, False], ids=["backpressure", "no_backpressure"])
def test_request_work_does_not_grow_with_history(tmp_path: Path, backpressure: bool) -> None:
    small = _work_per_request(tmp_path / "small", SMALL, backpressure)
    large = _work_per_request(tmp_path / "large", LARGE, backpressure)
    grown = {
        name: (small[name], large[name])
        for name in small
        if large[name] > TOLERANCE * small[name] + SLACK
    }
    assert not grown, f"work per request (calls + SQLite steps) at {SMALL} -> {LARGE} settled batches: {grown}"


def test_a_restart_reads_open_state_only_and_answers_the_same(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """After real cycles (with release snapshots every 8 judgements), a restart opens no batch file,
    replays only the judgements after the last snapshot, and answers every read like the ledger
    that stopped."""
    import pyarrow.ipc as ipc
    import pyarrow.parquet as pq

    import prime_rl.orchestrator.ledger as ledger_module

    monkeypatch.setattr(ledger_module, "SNAPSHOT_EVERY", 8)
    config = make_config(tmp_path, "--trainer.samples_per_step", "8", "--orchestrator.max_buffered_samples", "64")
    ledger = Ledger(config, task_set(), RolloutStore(tmp_path / "orch"), clock=lambda: 1000.0)
    workers = [ledger.workers[ledger.register(f"w{i}").worker_id] for i in range(4)]
    for number in range(60):
        worker = workers[number % len(workers)]
        lease = ledger.lease(worker, None, None)
        batch = make_batch(lease, lease.step)
        answer = ledger.submit(worker, batch, hashlib.sha256(batch.model_dump_json().encode()).hexdigest())
        verdicts = _verdicts(len(batch.samples))
        if number % 7 == 3:  # some rejected
            verdicts = [v.model_copy(update={"accepted": False, "reason": "bad_proof", "logprobs": []}) for v in verdicts]
        ledger.record_verdicts(VerdictRequest(batch_id=answer.batch_id, verdicts=verdicts))
        if number % 6 == 5 and ledger.claim(ClaimRequest(step=ledger.step, min_samples=8)).ready:
            ledger.commit(CommitRequest(step=ledger.step, policy_version=ledger.step + 1))
    assert ledger.step >= 3
    assert len(ledger.batches.live()) < len(ledger.batches) // 2  # settled batches left memory

    opened: list[str] = []
    judged: list[dict[str, Any]] = []
    monkeypatch.setattr(pq, "ParquetFile", lambda *a, **k: opened.append(str(a[0])))
    monkeypatch.setattr(pq, "read_table", lambda *a, **k: opened.append(str(a[0])))
    monkeypatch.setattr(ipc, "open_file", lambda *a, **k: opened.append(str(a[0])))  # payload files
    replay = RolloutStore.replay_events

    def counted(self: RolloutStore, kinds: Any, judged_after: int) -> Any:
        for event in replay(self, kinds, judged_after):
            judged.extend([event] if event.get("event") == "judged" else [])
            yield event

    monkeypatch.setattr(RolloutStore, "replay_events", counted)
    again = Ledger(config, task_set(), RolloutStore(tmp_path / "orch"), clock=lambda: 1000.0)
    assert opened == [] and len(judged) < 8
    monkeypatch.undo()
    assert again.step == ledger.step and len(again.batches) == len(ledger.batches)
    ledger._settle()  # (a restart settles what became stale since the last claim; the next claim would;
    # the stopped ledger's store is still open only for this)
    assert [b.batch_id for b in again.batches.live()] == [b.batch_id for b in ledger.batches.live()]
    assert again.buffered_samples() == ledger.buffered_samples()
    assert again.workers_view() == ledger.workers_view()
    assert again.batches.sample_counts() == ledger.batches.sample_counts()
    for batch in ledger.batches.live():
        assert again.release.released(batch.batch_id, batch.worker_id) == ledger.release.released(batch.batch_id, batch.worker_id)
    for worker in workers:
        assert again.leases.rejected(worker.worker_id) == ledger.leases.rejected(worker.worker_id)
        assert again.release.worker_tokens(worker.worker_id) == ledger.release.worker_tokens(worker.worker_id)
    request = ClaimRequest(step=again.step, min_samples=1 << 20)
    assert again.claim(request) == ledger.claim(request)


def _work_with_identities(tmp_path: Path, identities: int) -> dict[str, int]:
    """Work (``_Work``) of a registration, a lease with backpressure on and the expiry tick, on a
    ledger where ``identities`` idle identities registered first, one in ten of them banned since."""
    config = make_config(
        tmp_path, "--trainer.samples_per_step", "8", "--orchestrator.max_buffered_samples", "10000",
        "--orchestrator.max_workers", str(identities + 8),
    )  # fmt: skip
    store = RolloutStore(tmp_path / "orch")
    ledger = Ledger(config, task_set(), store, clock=lambda: 1000.0)
    for number in range(identities):
        worker_id = ledger.register(f"idle{number}").worker_id
        if number % 10 == 0:
            ledger.workers.ban(ledger.workers[worker_id], "test")
    work = _Work(store)
    askers = [ledger.workers[ledger.register(f"asker{n}").worker_id] for n in range(3)]
    ledger.lease(askers[0], None, None)  # warms caches: not measured
    return {
        "register": max(work.measure(lambda: ledger.register("late"))[0] for _ in range(2)),
        "lease": max(work.measure(functools.partial(ledger.lease, worker, None, None))[0] for worker in askers[1:]),
        "expiry tick": max(work.measure(ledger.expire_leases)[0] for _ in range(2)),
    }


def test_request_work_does_not_grow_with_registered_identities(tmp_path: Path) -> None:
    """Backpressure asks for the banned identities on every lease: it must not walk every identity
    ever registered (at 1,024 identities registering at once, that walk was most of a lease's time).
    Nor may a registration or the expiry tick."""
    few, many = (_work_with_identities(tmp_path / str(n), n) for n in (20, 4_000))
    grown = {name: (few[name], many[name]) for name in few if many[name] > TOLERANCE * few[name] + SLACK}
    assert not grown, f"work with 20 -> 4,000 registered identities: {grown}"
