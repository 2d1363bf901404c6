"""The run's training record (issue #44 item 3, ``orchestrator/record.py``).

Real ledgers on real files: workers lease, submit and are judged (some rejected), the trainer
claims and commits; at each commit the steps at least ``checkpoint_every * keep_checkpoints`` old
are compacted into ``record/step_<S>.parquet`` and their rows and payload files leave the store.
Checked: what the record holds (tokens, verdicts, claim steps; log-probs only when kept), that the
audit reads (``batch_records``, ``all_verdicts``, ``read_batch``) answer as before compaction, that a
``kill -9`` at either side of the compaction's commit loses nothing and a restart finishes the job,
and that an old claim, a resubmission and a validator's retry get clear answers.
"""

from __future__ import annotations

import hashlib
import json
import os
import signal
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from prime_rl.api.errors import ApiFailure
from prime_rl.api.protocol import ClaimRequest, CommitRequest, RolloutBatch, Verdict, VerdictRequest
from prime_rl.orchestrator.ledger import Ledger
from prime_rl.orchestrator.store import RolloutStore

from .conftest import make_batch, make_config, task_set

CYCLES = 48
RECORD_DIR = "record"  # (record.RECORD_DIR; a literal, so that on code without the record these tests fail by behaviour)


def _ledger(tmp_path: Path, *overrides: str) -> Ledger:
    config = make_config(
        tmp_path, "--trainer.samples_per_step", "8", "--orchestrator.max_buffered_samples", "64", *overrides
    )
    return Ledger(config, task_set(), RolloutStore(tmp_path / "orch"), clock=lambda: 1000.0)


def _verdicts(batch: RolloutBatch, number: int) -> list[Verdict]:
    if number % 7 == 3:  # some batches rejected whole
        return [
            Verdict(sample_index=i, accepted=False, reason="toploc_mismatch", detail=f"n{number}", reward=0.0, advantage=0.0)
            for i in range(len(batch.samples))
        ]
    return [
        Verdict(sample_index=i, accepted=True, reason="ok", reward=s.reward, advantage=s.advantage, logprobs=[-0.1 * number, -0.2])
        for i, s in enumerate(batch.samples)
    ]  # fmt: skip


def _cycles(ledger: Ledger, start: int, count: int, seen: dict[str, Any]) -> None:
    """``count`` real cycles; ``seen[batch_id]`` = (payload table, verdicts) as stored before compaction."""
    workers = [w for w in ledger.workers.values()]
    if not workers:
        workers = [ledger.workers[ledger.register(f"w{i}").worker_id] for i in range(4)]
    for number in range(start, start + count):
        worker = workers[number % len(workers)]
        lease = ledger.lease(worker, None, None)
        batch = make_batch(lease, lease.step)
        batch = batch.model_copy(update={"samples": [
            s.model_copy(update={"prompt_tokens": [number, i, 7]}) for i, s in enumerate(batch.samples)
        ]})  # fmt: skip
        body = batch.model_dump_json().encode()
        answer = ledger.submit(worker, batch, hashlib.sha256(body).hexdigest())
        verdicts = _verdicts(batch, number)
        ledger.record_verdicts(VerdictRequest(batch_id=answer.batch_id, verdicts=verdicts, validator_id="val-1"))
        seen[answer.batch_id] = (ledger.store.read_batch(answer.batch_id), ledger.store.batch(answer.batch_id), body)
        if number % 3 == 2 and ledger.claim(ClaimRequest(step=ledger.step, min_samples=8)).ready:
            ledger.commit(CommitRequest(step=ledger.step, policy_version=ledger.step + 1))


def _record(tmp_path: Path) -> pa.Table:
    return pa.concat_tables([pq.read_table(path) for path in sorted((tmp_path / "orch" / RECORD_DIR).glob("*.parquet"))])


def test_settled_steps_become_per_step_record_files_and_leave_the_store(tmp_path: Path) -> None:
    ledger = _ledger(tmp_path)
    seen: dict[str, Any] = {}
    _cycles(ledger, 0, CYCLES, seen)
    store = ledger.store
    assert ledger.step >= 6
    steps = [row[0] for row in store.db.read("SELECT step FROM records ORDER BY step")]
    assert steps and max(steps) <= ledger.step - 1 - 2  # checkpoint_every 1 x keep_checkpoints 2
    assert all((tmp_path / "orch" / RECORD_DIR / f"step_{s:08d}.parquet").exists() for s in steps)
    record = _record(tmp_path)
    compacted = set(record.column("batch_id").to_pylist())
    assert len(compacted) > CYCLES // 2
    # Their rows and payload files are gone; what is left in the store is the uncompacted rest.
    (rows,) = store.db.read("SELECT count(*) FROM batches")
    assert rows[0] == len(seen) - len(compacted)
    assert not store.db.read(f"SELECT 1 FROM verdicts WHERE batch_id IN ({', '.join('?' * len(compacted))})", sorted(compacted))
    assert len(list(store.batches_dir.glob("*.arrow"))) == len(seen) - len(compacted)
    # What the record holds: the tokens as submitted, the verdicts, who judged, when each sample trained.
    claim_of = {(s.batch_id, s.index): step for step in ledger.claims for s in ledger.claims[step]}
    for row in record.to_pylist():
        payload, stored, _ = seen[row["batch_id"]]
        meta, task_ids, _, verdicts, _ = stored
        index = row["sample_index"]
        assert row["prompt_tokens"] == payload.column("prompt_tokens")[index].as_py()
        assert row["completion_length"] == len(payload.column("completion_tokens")[index].as_py())
        assert (row["worker_id"], row["policy_version"], row["task_id"]) == (meta.worker_id, meta.policy_version, task_ids[index])
        assert (row["accepted"], row["reason"], row["validator"]) == (verdicts[index].accepted, verdicts[index].reason, "val-1")
        assert row["claim_step"] == claim_of.get((row["batch_id"], index))
        trained = row["claim_step"] is not None
        # Default: per-token data of trained samples dropped; untrained samples keep theirs.
        assert (row["logprobs"] is None, row["inference_logprobs"] is None, row["proofs"] is None) == (trained,) * 3
    assert any(r["claim_step"] is not None for r in record.to_pylist()) and not all(record.column("accepted").to_pylist())
    # Audit reads answer from the record: every acknowledged batch, its verdicts, its payload.
    assert [r.meta.batch_id for r in store.batch_records()] == list(seen)
    verdicts_now = store.all_verdicts()
    for batch_id, (payload, stored, _) in seen.items():
        trained = {index for (batch, index) in claim_of if batch == batch_id}
        expect = [v.model_copy(update={"logprobs": []}) if batch_id in compacted and v.sample_index in trained else v for v in stored[3]]
        assert verdicts_now[batch_id] == expect
        again = store.read_batch(batch_id)
        assert again.column("prompt_tokens").to_pylist() == payload.column("prompt_tokens").to_pylist()
        assert again.column("segments").to_pylist() == payload.column("segments").to_pylist()


def test_a_steps_record_is_its_batches_rows_one_after_another(tmp_path: Path, monkeypatch: Any) -> None:
    """Each column of a step's record is made once for the whole step (``record._step_table``): the
    table equals the batches' own tables one after another (each batch's rows stay its own)."""
    import prime_rl.orchestrator.record as record

    made: list[tuple[list[dict[str, Any]], pa.Table]] = []
    step_table = record._step_table

    def noting(batches: list[dict[str, Any]]) -> pa.Table:
        made.append((batches, step_table(batches)))
        return made[-1][1]

    monkeypatch.setattr(record, "_step_table", noting)
    _cycles(_ledger(tmp_path), 0, CYCLES, {})
    assert made and max(len(batches) for batches, _ in made) > 1
    for batches, table in made:
        one_by_one = pa.concat_tables([step_table([batch]) for batch in batches])
        assert table.schema == record.RECORD_SCHEMA and table.equals(one_by_one)
    assert step_table([]).equals(record.RECORD_SCHEMA.empty_table())


def test_open_payloads_written_as_parquet_before_arrow_files_are_read_recorded_and_cleaned(tmp_path: Path) -> None:
    """A store whose open batches' payloads are ``<batch_id>.<random>.parquet`` (written before the
    payloads became Arrow files) goes on: its batches are read back as stored, compacted into the
    record, and their payload files deleted, also when a crash left them behind (``finish``)."""
    ledger = _ledger(tmp_path)
    seen: dict[str, Any] = {}
    _cycles(ledger, 0, 6, seen)
    store = ledger.store
    old_files = {}
    for (batch_id, file) in store.db.read("SELECT batch_id, file FROM batches"):
        arrow = store.batches_dir / file
        parquet = arrow.with_suffix(".parquet")
        pq.write_table(store.read_batch(batch_id), parquet, compression="zstd")
        with store.db.transaction() as connection:
            connection.execute("UPDATE batches SET file = ? WHERE batch_id = ?", (parquet.name, batch_id))
        arrow.unlink()
        old_files[batch_id] = parquet
    assert old_files and not list(store.batches_dir.glob("*.arrow"))
    for batch_id in old_files:
        assert store.read_batch(batch_id).equals(seen[batch_id][0])
    _cycles(ledger, 6, CYCLES, seen)
    compacted = set(_record(tmp_path).column("batch_id").to_pylist())
    assert set(old_files) <= compacted
    assert not any(path.exists() for path in old_files.values())
    # a crash after the record's transaction and before the payload files went: the next open deletes
    # them, in either format
    leftovers = [store.batches_dir / f"{b}.{'0' * 12}{suffix}" for b, suffix in zip(sorted(compacted)[:2], (".parquet", ".arrow"), strict=True)]
    for path in leftovers:
        path.write_bytes(b"x")
    store.close()
    RolloutStore(tmp_path / "orch").close()
    assert not any(path.exists() for path in leftovers)


def test_kept_logprobs_make_the_record_a_faithful_copy(tmp_path: Path) -> None:
    ledger = _ledger(tmp_path, "--orchestrator.keep_claimed_logprobs", "true")
    seen: dict[str, Any] = {}
    _cycles(ledger, 0, CYCLES, seen)
    record = _record(tmp_path)
    compacted = set(record.column("batch_id").to_pylist())
    assert compacted and record.column("logprobs").null_count == 0 and record.column("proofs").null_count == 0
    verdicts_now = ledger.store.all_verdicts()
    for batch_id in compacted:
        payload, stored, _ = seen[batch_id]
        again = ledger.store.read_batch(batch_id)
        assert again.to_pylist() == payload.to_pylist() and again.schema.metadata == payload.schema.metadata
        assert verdicts_now[batch_id] == stored[3]
        claimed = {s.index for step in ledger.claims for s in ledger.claims[step] if s.batch_id == batch_id}
        assert ledger.store.batch(batch_id) == (*stored[:2], claimed, stored[3], False)
    # A trainer restarting from a checkpoint older than the window gets its old claim back, the same.
    first = min(ledger.claims)
    assert all(s.batch_id in compacted for s in ledger.claims[first])
    answer = ledger.claim(ClaimRequest(step=first, min_samples=8))
    assert [s.sample_id for s in answer.samples] == [str(s) for s in ledger.claims[first]]
    assert all(s.behaviour_logprobs for s in answer.samples)


def test_an_old_claim_resubmission_and_verdict_retry_after_compaction(tmp_path: Path) -> None:
    ledger = _ledger(tmp_path)
    seen: dict[str, Any] = {}
    _cycles(ledger, 0, CYCLES, seen)
    record = _record(tmp_path)
    compacted = set(record.column("batch_id").to_pylist())
    first = min(ledger.claims)
    with pytest.raises(ApiFailure) as gone:  # its log-probs were dropped: never trained on without them
        ledger.claim(ClaimRequest(step=first, min_samples=8))
    assert gone.value.status == 410 and "keep_claimed_logprobs" in str(gone.value)
    batch_id = next(b for b in seen if b in compacted and seen[b][1][3][0].accepted)
    _, stored, body = seen[batch_id]
    worker = ledger.workers[stored[0].worker_id]
    batch = RolloutBatch.model_validate_json(body)
    assert ledger.submit(worker, batch, hashlib.sha256(body).hexdigest()).duplicate  # still a duplicate
    with pytest.raises(ApiFailure) as conflict:
        ledger.submit(worker, batch, "0" * 64)
    assert conflict.value.status == 409
    retry = VerdictRequest(batch_id=batch_id, verdicts=stored[3], validator_id="val-1")
    assert ledger.record_verdicts(retry).accepted == len(stored[3])  # the validator's identical retry: 200
    flipped = [v.model_copy(update={"reward": 9.0}) for v in stored[3]]
    with pytest.raises(ApiFailure) as final:
        ledger.record_verdicts(VerdictRequest(batch_id=batch_id, verdicts=flipped, validator_id="val-1"))
    assert final.value.status == 409


_CHILD = textwrap.dedent(
    """
    import hashlib, json, os, signal, sys
    from contextlib import contextmanager
    from pathlib import Path
    import prime_rl.orchestrator.record as record
    from prime_rl.orchestrator.ledger import Ledger
    from prime_rl.orchestrator.store import RolloutStore
    # The tests folder is no package (pytest imports it in importlib mode): this file's helpers by source.
    tests = Path(os.environ["TESTS_DIR"])
    sys.path.insert(0, str(tests))
    sys.path.insert(0, str(tests.resolve().parents[2] / "tests" / "support"))  # what the root conftest adds
    from conftest import make_config, task_set
    helpers = {"__name__": "record_tests"}
    source = (tests / "test_orchestrator_record.py").read_text().replace("from .conftest import", "from conftest import")
    exec(compile(source, "test_orchestrator_record.py", "exec"), helpers)
    _cycles = helpers["_cycles"]

    tmp, point = Path(sys.argv[1]), sys.argv[2]
    config = make_config(tmp, "--trainer.samples_per_step", "8", "--orchestrator.max_buffered_samples", "64")
    ledger = Ledger(config, task_set(), RolloutStore(tmp / "orch"), clock=lambda: 1000.0)
    acked = open(tmp / "acked.jsonl", "a")
    original_submit = ledger.submit
    def submit(*args):
        answer = original_submit(*args)
        acked.write(json.dumps(answer.batch_id) + "\\n"); acked.flush()
        return answer
    ledger.submit = submit
    write = record.atomic_path
    @contextmanager
    def killed_after_write(path):
        with write(path) as temporary:
            yield temporary
        os.kill(os.getpid(), signal.SIGKILL)  # the record file is in place; the store not yet changed
    if point == "written":
        record.atomic_path = killed_after_write
    else:  # the compaction's transaction committed; its payload files not deleted yet
        ledger.store.db.sync = lambda: os.kill(os.getpid(), signal.SIGKILL)
    _cycles(ledger, 0, 200, {})
    sys.exit(3)  # never reached: the first compaction kills it
    """
)


@pytest.mark.parametrize("point", ["written", "committed"])
def test_a_kill_during_compaction_loses_nothing_and_a_restart_finishes_it(tmp_path: Path, point: str) -> None:
    env = {**os.environ, "TESTS_DIR": str(Path(__file__).parent)}
    child = subprocess.run([sys.executable, "-c", _CHILD, str(tmp_path), point], env=env, timeout=300, capture_output=True)
    assert child.returncode == -signal.SIGKILL, child.stderr.decode()[-2000:]
    acked = [json.loads(line) for line in (tmp_path / "acked.jsonl").read_text().splitlines()]
    record_dir = tmp_path / "orch" / RECORD_DIR
    assert list(record_dir.glob("step_*.parquet"))  # the kill came after the file was in place
    ledger = _ledger(tmp_path)  # the restart
    store = ledger.store
    compacted = {b for (b,) in store.db.read("SELECT batch_id FROM compacted")}
    assert bool(compacted) == (point == "committed")
    # Nothing acknowledged is lost: every batch with its verdicts, from its row or from the record.
    assert [r.meta.batch_id for r in store.batch_records()] == acked
    assert set(store.all_verdicts()) == set(acked)
    # The restart deleted the payload files the compaction had replaced, and only those.
    files = {p.name.split(".")[0] for p in store.batches_dir.glob("*.arrow")}
    assert files == set(acked) - compacted
    # Going on redoes (or goes on with) the compaction: the same state as a run never killed.
    seen: dict[str, Any] = {}
    _cycles(ledger, len(acked), 24, seen)
    record = _record(tmp_path)
    assert len(record.column("batch_id").unique()) == store.db.read("SELECT count(*) FROM compacted")[0][0]
    assert [r.meta.batch_id for r in store.batch_records()] == acked + list(seen)
    ledger.store.close()
    reader = RolloutStore(tmp_path / "orch", reader=True)  # the read-only opener reads version 4
    assert len(reader.batch_records()) == len(acked) + len(seen)


def test_prune_deletes_old_record_files_and_keeps_duplicates_known(tmp_path: Path, capsys: Any) -> None:
    from prime_rl.orchestrator.record import prune
    from prime_rl.orchestrator.record_cli import main

    ledger = _ledger(tmp_path)
    seen: dict[str, Any] = {}
    _cycles(ledger, 0, CYCLES, seen)
    store = ledger.store
    steps = sorted({row[0] for row in store.db.read("SELECT step FROM records")})
    before = steps[-1]
    deleted = prune(store, before)
    assert deleted and all(not (tmp_path / "orch" / RECORD_DIR / f).exists() for f in deleted)
    left = {row[0] for row in store.db.read("SELECT step FROM records")}
    assert min(left) >= before or all(f"step_{s:08d}.parquet" not in deleted for s in left if s < before)
    pruned = next(b for b, in store.db.read("SELECT batch_id FROM compacted WHERE file = ?", (deleted[0],)))
    assert pruned in ledger.batches and store.batch_sha256(pruned) == seen[pruned][1][0].sha256
    store.close()
    assert main(["list", str(tmp_path / "orch")]) == 0
    assert f"step {steps[-1]}" in capsys.readouterr().out


def test_a_version_3_store_queues_its_settled_batches_and_a_lost_payload_is_recorded_without_it(tmp_path: Path) -> None:
    """A store written before the record (schema version 3): its settled batches are queued at their
    lease step by the migration and compacted at the next commits; a batch whose payload file was
    lost before is recorded from its rows instead of blocking every later compaction."""
    from prime_rl.orchestrator.records import batch_rows
    from prime_rl.orchestrator.store_schema import (
        BATCH_META_KEY,
        BATCH_SCHEMA,
        BatchMeta,
        schema_v1,
        schema_v2,
        schema_v3,
    )
    from prime_rl.statedb import StateDB

    root = tmp_path / "orch"
    (root / "batches").mkdir(parents=True)
    db = StateDB(root / "state.sqlite", [schema_v1(root), schema_v2(root), schema_v3], "orchestrator store")
    ledger = _ledger(tmp_path / "lease-source")  # only to make a valid lease and batch
    worker = ledger.workers[ledger.register("w").worker_id]
    batch = make_batch(ledger.lease(worker, None, None), 0)
    verdicts = []
    with db.transaction() as connection:
        for seq in range(3):
            meta = BatchMeta(f"old-s0-b{seq}", "old", 0, seq, 0, 1.0, f"{seq:064d}", seq, None)
            rows = batch_rows(batch)
            if seq != 1:  # batch 1's payload file was lost
                schema = BATCH_SCHEMA.with_metadata({BATCH_META_KEY: json.dumps({"batch_id": meta.batch_id, "sha256": meta.sha256})})
                pq.write_table(pa.Table.from_pydict(dict(rows), schema=schema), root / "batches" / f"{meta.batch_id}.parquet")
            verdicts = _verdicts(batch, 3)  # rejected
            connection.execute(
                "INSERT INTO batches VALUES (?, ?, ?, ?, ?, ?, ?, ?)",
                (meta.batch_id, seq, "old", meta.to_json().decode(), json.dumps(list(rows["task_id"])), "[]", 0, None),
            )
            connection.execute(
                "INSERT INTO verdicts VALUES (?, ?)", (meta.batch_id, json.dumps([v.model_dump() for v in verdicts]))
            )
    db.close()
    store = RolloutStore(root)  # migrates to version 4
    assert store.db.read("SELECT step, count(*) FROM record_queue GROUP BY step") == [(0, 3)]
    before = {r.meta.batch_id: r for r in store.batch_records()}
    from prime_rl.orchestrator.record import compact

    (record,) = compact(store, upto=0, keep_logprobs=False)
    assert (record.step, record.batches, record.samples) == (0, 3, 3 * len(verdicts))
    assert not list((root / "batches").glob("*.parquet")) and not store.db.read("SELECT 1 FROM batches")
    assert {r.meta.batch_id: r for r in store.batch_records()} == before
    assert store.read_batch("old-s0-b1").column("completion_tokens").to_pylist() == [[]] * len(verdicts)
    assert store.read_batch("old-s0-b2").column("completion_tokens").to_pylist() == [[4, 5]] * len(verdicts)
    assert store.all_verdicts()["old-s0-b0"] == verdicts
    assert store.batch_count() == 3
    store.close()
    assert RolloutStore(root, reader=True).batch_count() == 3


@pytest.mark.parametrize("listener", [False, True], ids=["one_port", "trusted_listener"])
def test_the_server_writes_the_record_after_answering_the_commit_and_serves_meanwhile(
    server_factory: Any, monkeypatch: pytest.MonkeyPatch, listener: bool
) -> None:
    """Over HTTP the commit is answered before its step's record is written, and requests are served
    while the file is written (outside the lock: ``record_writer.py``); then the record appears and
    the payload files it replaced go. Before, the commit's ledger call wrote it under the one lock
    (commit p50 270-360 ms in a closed loop, every request waiting behind it). With a trusted
    listener the commit is answered on its loop and the record written on the server's."""
    import threading
    import time

    from prime_rl.api.client import OrchestratorClient
    from prime_rl.orchestrator import record_writer

    release, writing = threading.Event(), threading.Event()
    write = record_writer.write_step

    def held_write(*args: Any) -> Any:
        writing.set()
        assert release.wait(30)
        return write(*args)

    monkeypatch.setattr(record_writer, "write_step", held_write)

    def payloads(batch_id: str) -> list[Path]:
        return list(server.ledger.store.batches_dir.glob(f"{batch_id}.*arrow"))

    server = server_factory("--trainer.samples_per_step", "8", "--trainer.keep_checkpoints", "1",
                            *(["--orchestrator.trusted_port", "0"] if listener else []))  # fmt: skip
    assert (server.trusted_url != server.url) == listener
    admin = OrchestratorClient(server.trusted_url, timeout_s=10, retries=0, admin_token=server.admin_token)
    workers = [OrchestratorClient(server.url, timeout_s=10, retries=0) for _ in range(2)]
    ids = [w.register(f"w{i}").worker_id for i, w in enumerate(workers)]
    stored: list[str] = []
    with admin, workers[0], workers[1]:
        for step in range(2):  # step 0's record is due at the commit of step 1 (lag 1)
            for worker, worker_id in zip(workers, ids, strict=True):
                lease = worker.get_tasks(worker_id)
                batch = make_batch(lease, lease.step)
                answer = worker.submit_rollouts(batch)
                stored.append(answer.batch_id)
                admin.post_verdicts(VerdictRequest(batch_id=answer.batch_id, verdicts=_verdicts(batch, 0), validator_id="v"))
            assert admin.claim(step, 8).ready
            started = time.perf_counter()
            admin.commit(step, step + 1)
            assert time.perf_counter() - started < 5  # answered, whether or not a record is being written
        assert writing.wait(10)  # the record of step 0 is being written now, and held there
        assert admin.status().step == 2 and workers[0].get_tasks(ids[0]).step == 2  # served meanwhile
        assert not list((server.ledger.store.root / RECORD_DIR).glob("step_*.parquet"))
        assert all(payloads(b) for b in stored[:2])
        release.set()
        deadline = time.monotonic() + 20
        while not list((server.ledger.store.root / RECORD_DIR).glob("step_*.parquet")) and time.monotonic() < deadline:
            time.sleep(0.05)
    [path] = list((server.ledger.store.root / RECORD_DIR).glob("step_*.parquet"))
    assert path.name == "step_00000000.parquet"
    assert sorted(pq.read_table(path).column("batch_id").unique().to_pylist()) == sorted(stored[:2])
    deadline = time.monotonic() + 20
    while any(payloads(b) for b in stored[:2]) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not any(payloads(b) for b in stored[:2])  # replaced by the record
    assert all(payloads(b) for b in stored[2:])  # step 1's batches wait for the next commit's record


def test_the_payload_cache_serves_recent_payloads_from_memory_within_its_bound(tmp_path: Path) -> None:
    """The reads after a submission (pending, claim, record) come from memory, the cache never
    holds more than its bound, and what it serves is what the file holds."""
    import pyarrow.ipc as ipc

    from prime_rl.orchestrator.payloads import PayloadCache

    ledger = _ledger(tmp_path)
    seen: dict[str, Any] = {}
    _cycles(ledger, 0, 3, seen)
    store = ledger.store
    first = [store.batches_dir / file for (file,) in store.db.read("SELECT file FROM batches")]
    assert first and all(path in store.payloads for path in first)
    opened: list[str] = []
    real_open = ipc.open_file

    def counted(source: Any, *args: Any, **kwargs: Any) -> Any:
        opened.append(str(source))
        return real_open(source, *args, **kwargs)

    ipc.open_file = counted
    try:
        _cycles(ledger, 3, CYCLES, seen)  # every read of these batches, the record's included
    finally:
        ipc.open_file = real_open
    assert ledger.step >= 6 and _record(tmp_path).num_rows and opened == []
    # a payload file the record replaced leaves the cache with the file
    compacted = set(_record(tmp_path).column("batch_id").to_pylist())
    gone = [path for path in first if path.name.split(".")[0] in compacted]
    assert gone and not any(path.exists() or path in store.payloads for path in gone)
    # bounded: the oldest go first; a miss reads the file, and serves the same table
    (batch_id, file) = store.db.read("SELECT batch_id, file FROM batches ORDER BY seq DESC LIMIT 1")[0]
    table = store.read_batch(batch_id)
    small = PayloadCache(max_bytes=int(2.5 * table.nbytes))
    for name in ("a.arrow", "b.arrow", "c.arrow"):
        small.put(store.batches_dir / name, table)
    assert len(small) == 2 and small.nbytes <= small.max_bytes
    assert small.read(store.batches_dir / file).equals(table) and len(small) == 2
    store.payloads = PayloadCache(max_bytes=0)  # nothing held: every read is the file's
    assert store.read_batch(batch_id).equals(table)
