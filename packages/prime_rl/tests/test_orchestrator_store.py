"""The orchestrator's control-plane state in SQLite: torn journals, imports, folded leases, bounded replay."""

from __future__ import annotations

import base64
import hashlib
import json
import sqlite3
from pathlib import Path
from typing import Any

import pytest
from synthetic_batches import synthetic_batch  # tests/support

import prime_rl.orchestrator.leases as leases_module
from prime_rl.api.protocol import (
    BanRequest,
    ClaimRequest,
    CommitRequest,
    TaskLease,
    Verdict,
    VerdictRequest,
)
from prime_rl.orchestrator.ledger import Ledger
from prime_rl.orchestrator.store import RolloutStore
from prime_rl.orchestrator.store_schema import verdict_rows, verdicts_json
from prime_rl.statedb import StateDB, StateDBError
from prime_rl.tasks import TaskSet

TASKS = TaskSet([{"prompt": f"q{i}"} for i in range(8)])


def _open(config: Any, now: list[float]) -> Ledger:
    return Ledger(config, TASKS, RolloutStore(config.orchestrator_data_dir), clock=lambda: now[0])


def _register_event(number: int) -> dict[str, Any]:
    return {
        "event": "register", "worker_id": f"w{number:04d}", "name": f"n{number}", "number": number,
        "token_sha256": "0" * 64, "time": 1.0,
    }  # fmt: skip


def _answer(ledger: Ledger, lease: TaskLease, *, judge: bool = True) -> None:
    """Submit ``lease``'s batch and accept every sample (advantage 1, one completion token each);
    ``judge=False`` leaves it awaiting verdicts."""
    batch = synthetic_batch(
        lease, lease.policy_version, prompt_tokens=[1], completion=[2], reward=lambda g: 1.0, advantage=lambda g: 1.0,
        logprobs=[-1.0], proofs=base64.b64encode(b"p").decode(), temperature=1.0,
    )  # fmt: skip
    samples = batch.samples
    worker = ledger.workers[lease.worker_id]
    answer = ledger.submit(worker, batch, hashlib.sha256(batch.model_dump_json().encode()).hexdigest())
    if not judge:
        return
    verdicts = [
        Verdict(sample_index=i, accepted=True, reason="ok", reward=1.0, advantage=1.0, logprobs=[-1.0])
        for i in range(len(samples))
    ]
    ledger.record_verdicts(VerdictRequest(batch_id=answer.batch_id, verdicts=verdicts))


@pytest.mark.parametrize("torn", ['{"event":"lease","lease":{"worker_id":"w00', '{"event":"ban","worker_id":"w0'])
def test_a_torn_last_journal_line_costs_only_itself(config_for: Any, torn: str) -> None:
    """A crash left a torn last line in the (JSON-lines) journal of a run dir. The next registration
    must survive a restart and keep the id sequence: the JSON-lines store glued the append onto the
    torn line, replay skipped both, and the lost id was handed out again."""
    config, now = config_for(), [10.0]
    data = Path(config.orchestrator_data_dir)
    data.mkdir(parents=True)
    (data / "journal.jsonl").write_text("".join(json.dumps(_register_event(n)) + "\n" for n in range(2)) + torn)
    ledger = _open(config, now)
    assert sorted(ledger.workers) == ["w0000", "w0001"]
    added = ledger.register("after-the-crash").worker_id
    ledger.ban(BanRequest(worker_id="w0000", reason="cheated"))
    ledger = _open(config, now)
    assert added == "w0002" and ledger.workers[added].name == "after-the-crash"
    assert ledger.workers["w0000"].banned and ledger.workers["w0000"].ban_reason == "cheated"
    assert ledger.register("next").worker_id == "w0003"


def test_an_append_glued_onto_a_torn_line_is_recovered_on_import(config_for: Any) -> None:
    """A journal the JSON-lines store already damaged (a commit glued onto a torn lease line): the
    import keeps the commit, so the step does not go back."""
    config, now = config_for(), [10.0]
    data = Path(config.orchestrator_data_dir)
    data.mkdir(parents=True)
    commit = {"event": "commit", "step": 3, "policy_version": 4, "time": 2.0}
    (data / "journal.jsonl").write_text(
        json.dumps(_register_event(0)) + "\n" + '{"event":"lease","lease":{"worker_id":"w0' + json.dumps(commit) + "\n"
    )
    ledger = _open(config, now)
    assert ledger.step == 4 and list(ledger.workers) == ["w0000"]
    assert not (data / "journal.jsonl").exists() and (data / "journal.jsonl.imported").exists()
    assert _open(config, now).step == 4  # imported once; the renamed journal is never read again


def test_answered_leases_fold_into_totals_and_a_restart_answers_the_same(config_for: Any, monkeypatch: Any) -> None:
    """Answered leases are folded (their events deleted, their counts kept): the store holds the
    open and expired leases only, and a rebuilt ledger counts, allows and refuses exactly like the
    one that never stopped."""
    monkeypatch.setattr(leases_module, "FOLD_EVERY", 3)
    config = config_for("--orchestrator.prompts_per_batch", "2", "--sampling.group_size", "2",
                        "--orchestrator.task_timeout_s", "30", "--trainer.samples_per_step", "4")  # fmt: skip
    now = [100.0]
    ledger = _open(config, now)
    honest = ledger.workers[ledger.register("honest").worker_id]
    flaky = ledger.workers[ledger.register("flaky").worker_id]
    for _ in range(7):
        _answer(ledger, ledger.lease(honest, None, None))
    abandoned = ledger.lease(flaky, None, None)
    now[0] += 31
    assert ledger.expire_leases() == 1
    still_open = ledger.lease(honest, None, None)  # takes over the abandoned tasks
    assert still_open.reassigned_from is not None and still_open.reassigned_from.batch_index == abandoned.batch_index
    assert ledger.claim(ClaimRequest(step=0, min_samples=4)).ready
    ledger.commit(CommitRequest(step=0, policy_version=1))

    def snapshot(ledger: Ledger) -> Any:
        books = ledger.leases
        per_worker = {
            w: (books.issued(w), books.answered(w), books.expired(w), books.open_count(w), books.next_index(w),
                ledger.lease_allowance(w))
            for w in ledger.workers
        }  # fmt: skip
        return (per_worker, books.expired_at(""), books.answered_at(""), books.open_at(""),
                books.awaiting_reassignment(), ledger.status().model_dump(exclude={"time"}), ledger.workers_view())  # fmt: skip

    before = snapshot(ledger)
    assert before[0][honest.worker_id][:5] == (8, 7, 0, 1, 8) and before[0][flaky.worker_id][:5] == (1, 0, 1, 0, 1)
    rebuilt = _open(config, now)
    assert snapshot(rebuilt) == before
    with sqlite3.connect(Path(config.orchestrator_data_dir) / "state.sqlite") as db:
        kept = sorted(db.execute("SELECT worker_id, batch_index FROM events WHERE kind = 'lease'"))
        totals = list(db.execute("SELECT worker_id, issued, answered, expired, next_index FROM lease_totals"))
    # every answered lease is folded; the open one and the abandoned one stay one by one
    assert kept == sorted([(honest.worker_id, still_open.batch_index), (flaky.worker_id, abandoned.batch_index)])
    assert totals == [(honest.worker_id, 7, 7, 0, 7)]
    _answer(rebuilt, still_open)  # the lease kept one by one is still answerable after the fold
    assert rebuilt.leases.answered(honest.worker_id) == 8 and rebuilt.leases.open_count(honest.worker_id) == 0
    # answered, but it took over an abandoned lease's tasks: the log keeps it (who answered whose tasks)
    _open(config, now)
    reissues = [e for e in RolloutStore(config.orchestrator_data_dir).events() if e["event"] == "lease" and e["reissues"]]
    assert [(e["lease"]["worker_id"], e["lease"]["batch_index"], tuple(e["reissues"])) for e in reissues] == [
        (honest.worker_id, still_open.batch_index, (flaky.worker_id, abandoned.batch_index))
    ]


def test_a_store_with_a_newer_schema_refuses_to_open(tmp_path: Path) -> None:
    path = tmp_path / "state.sqlite"
    StateDB(path, [lambda c: None, lambda c: None], "test store").close()
    with pytest.raises(StateDBError, match="newer"):
        StateDB(path, [lambda c: None], "test store")


def test_a_failed_migration_leaves_the_old_version(tmp_path: Path) -> None:
    """Each migration commits with its version bump, so one that fails is re-run on the next open."""
    path = tmp_path / "state.sqlite"

    def create(connection: sqlite3.Connection) -> None:
        connection.execute("CREATE TABLE t (x INTEGER)")

    def broken(connection: sqlite3.Connection) -> None:
        connection.execute("INSERT INTO t VALUES (1)")
        raise RuntimeError("crash mid-migration")

    with pytest.raises(RuntimeError):
        StateDB(path, [create, broken], "test store")
    db = StateDB(path, [create, lambda c: c.execute("INSERT INTO t VALUES (2)")], "test store")
    assert db.version == 2 and db.read("SELECT x FROM t") == [(2,)]


def test_an_answered_lease_folds_only_once_its_batch_is_accepted_and_a_late_batchs_tasks_go_on(
    config_for: Any, monkeypatch: Any
) -> None:
    """A lease whose batch awaits verdicts is kept one by one (a rejection would still hand its tasks
    on). Once the batch expires unjudged (no step can use it: answered too late) its tasks go to
    another identity, as a rejected or abandoned lease's do (issue 34: answering late is no veto),
    without a charge (a slow validator may be the cause), also after a restart, and only once."""
    monkeypatch.setattr(leases_module, "FOLD_EVERY", 1)
    config = config_for("--orchestrator.prompts_per_batch", "2", "--sampling.group_size", "2",
                        "--orchestrator.async_level", "1")  # fmt: skip
    ledger = _open(config, [100.0])
    worker = ledger.workers[ledger.register("slow").worker_id]
    lease = ledger.lease(worker, None, None)
    _answer(ledger, lease, judge=False)
    ledger.pending(8)
    assert ledger.leases.get(worker.worker_id, lease.batch_index) is not None  # answered, not judged: kept
    ledger.step = 5  # (as if five steps were committed meanwhile: policy v0 is now useless)
    ledger.pending(8)
    assert ledger.leases.awaiting_reassignment() == 1
    assert ledger.leases.answered(worker.worker_id) == 1 and ledger.lease_allowance(worker.worker_id) == 2
    ledger = _open(config, [100.0])  # a restart rebuilds the return from the stored expiry
    other = ledger.workers[ledger.register("other").worker_id]
    taken = ledger.lease(other, None, None)
    assert taken.reassigned_from is not None and taken.reassigned_from.worker_id == worker.worker_id
    assert [t.task_id for t in taken.tasks] == [t.task_id for t in lease.tasks]
    newcomer = ledger.workers[ledger.register("newcomer").worker_id]
    assert ledger.lease(newcomer, None, None).reassigned_from is None  # only once


def test_verdict_rows_read_what_json_loads_reads() -> None:
    """The record reads verdict rows with pydantic's reader: the same values as ``json.loads``, for
    rows written now (``verdicts_json``) and for rows ``json.dumps`` wrote before, whose log-probs
    may hold ``NaN`` and ``-Infinity`` (a validator may post them)."""
    verdicts = [
        Verdict(sample_index=i, accepted=i % 2 == 0, reason="ok" if i % 2 == 0 else "logprob_mismatch",
                reward=0.5 * i, advantage=-0.25, logprobs=[-0.1 * k - 1e-7 * i for k in range(64)])
        for i in range(4)
    ]  # fmt: skip
    written = verdicts_json(verdicts)
    assert verdict_rows(written) == json.loads(written)
    old = json.dumps([{"sample_index": 0, "accepted": True, "reason": "ok", "reward": 1.0, "advantage": 0.0,
                       "logprobs": [-0.5, float("-inf")], "detail": "x"}, {"sample_index": 1, "logprobs": [float("nan")]}])  # fmt: skip
    read, expected = verdict_rows(old), json.loads(old)
    assert read[0] == expected[0] and read[0]["logprobs"][1] == float("-inf")
    assert read[1]["logprobs"][0] != read[1]["logprobs"][0]  # NaN, as json.loads gives
