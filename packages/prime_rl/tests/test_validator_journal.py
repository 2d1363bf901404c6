"""The validator's journal: per-identity evidence and failure counts survive a restart."""

from __future__ import annotations

import json
import sqlite3

import numpy as np
import pytest
from steering import steering_sampler
from validator_setup import (  # tests/support
    submit_honest_and_steered,
    validator_at_orchestrator,
)

import toploc
from prime_rl.validator.evidence import EvidenceLedger
from prime_rl.validator.journal import ValidatorJournal
from prime_rl.validator.process import FailureTracker, Validator


def _tests() -> toploc.EvidenceTests:
    honest = [toploc.Observations(np.zeros(1000), np.zeros(1000))]
    # the journal's persistence, on the per-token tests (one 1,000-token sample bounds no per-sample event)
    return toploc.EvidenceTests.from_profile(toploc.NoiseProfile.calibrate(honest), toploc.EvidencePolicy(unit="token"))


def _obs(margins: list[float]) -> toploc.Observations:
    return toploc.Observations(np.array(margins), np.zeros(len(margins)))


def _judge(journal: ValidatorJournal, ledger: EvidenceLedger, tracker: FailureTracker, worker: str, batch: str,
           margins: list[list[float]], accepted: int, rejected: int) -> None:  # fmt: skip
    """What the validator does per batch: evidence (journalled before the post), then failure counts."""
    assert ledger.record(worker, batch, [_obs(m) for m in margins]) is not None
    journal.evidence(batch, worker, ledger)
    tracker.record(worker, accepted=accepted, rejected=rejected)
    journal.failures(batch, worker, tracker, ledger)


def test_journal_restores_evidence_counts_and_bans_and_compacts(tmp_path) -> None:  # type: ignore[no-untyped-def]
    tests, path = _tests(), tmp_path / "validator" / "journal.jsonl"
    journal, ledger, tracker = ValidatorJournal(path), EvidenceLedger(tests), FailureTracker(0.5, 4)
    _judge(journal, ledger, tracker, "honest", "h-0", [[0.0] * 16] * 4, 4, 0)
    _judge(journal, ledger, tracker, "steer", "s-0", [[0.5] * 16] * 4, 4, 0)  # every token exceeds: banned
    _judge(journal, ledger, tracker, "honest", "h-1", [[0.0] * 16] * 4, 4, 0)
    _judge(journal, ledger, tracker, "cheat", "c-0", [[0.0] * 8], 0, 4)  # banned by its rejected share
    # counted into the evidence, but its verdicts' post failed (so no failure counts yet)
    assert ledger.record("honest", "h-2", [_obs([0.0] * 16)]) is not None
    journal.evidence("h-2", "honest", ledger)
    assert "steer" in ledger.ban_reasons and tracker.banned == {"cheat"}
    restored_ledger, restored_tracker = EvidenceLedger(tests), FailureTracker(0.5, 4)
    ValidatorJournal(path).restore(restored_ledger, restored_tracker)
    for worker in ("honest", "steer", "cheat"):
        assert restored_ledger.workers[worker].state() == ledger.workers[worker].state()
    # posted batches are never offered again: only the one in flight is remembered
    assert restored_ledger.counted_batches == {"h-2"} == ledger.counted_batches
    assert restored_ledger.ban_reasons == ledger.ban_reasons
    assert restored_tracker.counts == tracker.counts == {"honest": [8, 0], "steer": [4, 0], "cheat": [0, 4]}
    assert restored_tracker.banned == {"cheat"}
    # a batch judged again after the restart (its post had failed) is not counted twice
    assert restored_ledger.record("honest", "h-2", [_obs([0.5] * 16)]) is None
    # compact: one evidence and one failures row per worker, and reading it again gives the same state
    with sqlite3.connect(path.with_suffix(".sqlite")) as db:
        assert sorted(db.execute("SELECT worker_id FROM evidence")) == [("cheat",), ("honest",), ("steer",)]
        assert sorted(db.execute("SELECT worker_id FROM failures")) == [("cheat",), ("honest",), ("steer",)]
    again_ledger, again_tracker = EvidenceLedger(tests), FailureTracker(0.5, 4)
    ValidatorJournal(path).restore(again_ledger, again_tracker)
    assert again_ledger.counted_batches == ledger.counted_batches and again_tracker.counts == tracker.counts
    assert again_ledger.workers["steer"].state() == ledger.workers["steer"].state()


def test_evidence_off_keeps_failure_counts_and_journalled_evidence(tmp_path) -> None:  # type: ignore[no-untyped-def]
    path = tmp_path / "journal.jsonl"
    journal, ledger, tracker = ValidatorJournal(path), EvidenceLedger(_tests()), FailureTracker(0.5, 4)
    _judge(journal, ledger, tracker, "w", "b", [[0.0] * 4], 2, 1)
    tracker_off = FailureTracker(0.5, 4)
    state = ValidatorJournal(path).restore(None, tracker_off)  # a validator started without evidence
    assert tracker_off.counts == {"w": [2, 1]} and "w" in state.evidence
    back = EvidenceLedger(_tests())
    ValidatorJournal(path).restore(back, FailureTracker(0.5, 4))  # and turned on again: still there
    assert back.workers["w"].state() == ledger.workers["w"].state()


def test_a_restarted_validator_process_forgives_nothing(tmp_path, tiny_lm_dir, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    """A real validator judges two workers through a real orchestrator, stops, and starts again on
    the same run directory: evidence and failure counts are in the run's ledger, as before the stop."""
    with validator_at_orchestrator(
        tmp_path, tiny_lm_dir,
        "--validator.max_batches", "4", "--validator.calibration_tokens", "512",
        num_tasks=40, group_size=4, max_new_tokens=12,
    ) as (config, server, validator):  # fmt: skip
        ids = submit_honest_and_steered(server.url, validator, monkeypatch, steering_sampler(0.2), batches=2)
        validator.run_loop()
        validator.close()
        # Since issue 45 the run's ledger (the orchestrator's store) holds what the validator learnt.
        before = dict(server.store.evidence_rows())
        rows = {w: json.loads(text) for w, text in before.items()}
        assert set(rows) == set(ids.values()) and sum(r["accepted"] + r["rejected"] for r in rows.values()) == 32
        assert all(r["evidence"]["samples"] == 16 for r in rows.values())
        steer, honest = (toploc.WorkerEvidence.restore(validator.evidence, rows[ids[b]]["evidence"]).state() for b in ("steer", "honest"))  # type: ignore[arg-type]
        assert steer.history_score > honest.history_score
        restarted = Validator(config)  # same run directory: the same profile, nothing of its own to restore
        restarted.close()
        assert dict(server.store.evidence_rows()) == before and not restarted.established
    assert not (tmp_path / "validator" / "journal.sqlite").exists()  # no journal any more (migration note)


@pytest.mark.parametrize("bad", ["", "[]", '{"event": "evidence", "worker_id": "w", "batch_id": "b", "state": 3}'])
def test_a_malformed_journal_never_stops_a_restart(tmp_path, bad: str) -> None:  # type: ignore[no-untyped-def]
    path = tmp_path / "journal.jsonl"
    path.write_text(bad + "\n")
    ledger, tracker = EvidenceLedger(_tests()), FailureTracker(0.5, 4)
    ValidatorJournal(path).restore(ledger, tracker)
    assert not ledger.workers and not tracker.counts


def test_two_restarts_in_a_row_forgive_nothing(tmp_path) -> None:  # type: ignore[no-untyped-def]
    """Restart, judge on, restart again: evidence, counted batches, failure counts and bans are those
    of a validator that never stopped."""
    tests, path = _tests(), tmp_path / "validator" / "journal.jsonl"
    journal, ledger, tracker = ValidatorJournal(path), EvidenceLedger(tests), FailureTracker(0.5, 4)
    _judge(journal, ledger, tracker, "honest", "h-0", [[0.0] * 16] * 4, 4, 0)
    _judge(journal, ledger, tracker, "steer", "s-0", [[0.5] * 16] * 4, 4, 0)
    _judge(journal, ledger, tracker, "cheat", "c-0", [[0.0] * 8], 0, 4)
    first, first_ledger, first_tracker = ValidatorJournal(path), EvidenceLedger(tests), FailureTracker(0.5, 4)
    first.restore(first_ledger, first_tracker)
    _judge(first, first_ledger, first_tracker, "honest", "h-1", [[0.0] * 16] * 4, 3, 1)
    second_ledger, second_tracker = EvidenceLedger(tests), FailureTracker(0.5, 4)
    ValidatorJournal(path).restore(second_ledger, second_tracker)
    assert {w: e.state() for w, e in second_ledger.workers.items()} == {
        w: e.state() for w, e in first_ledger.workers.items()
    }
    assert second_ledger.counted_batches == set()  # all posted
    assert second_tracker.counts == {"honest": [7, 1], "steer": [4, 0], "cheat": [0, 4]}
    assert second_tracker.banned == {"cheat"} and set(second_ledger.ban_reasons) == {"steer"}


def test_an_evidence_ban_survives_two_restarts_when_its_snapshot_does_not_restore(tmp_path) -> None:  # type: ignore[no-untyped-def]
    """A journal (here: the JSON-lines one of an older validator) whose banned worker's snapshot no
    longer restores: the first restart keeps the ban, and so must the second (the JSON-lines
    journal's compaction dropped it with the snapshot, so a second restart forgave the worker)."""
    path = tmp_path / "validator" / "journal.jsonl"
    path.parent.mkdir()
    event = {"event": "evidence", "batch_id": "s-0", "worker_id": "steer", "state": {"format": "old"}, "ban_reason": "steered"}
    path.write_text(json.dumps(event) + "\n")
    for _ in range(2):
        ledger = EvidenceLedger(_tests())
        ValidatorJournal(path).restore(ledger, FailureTracker(0.5, 4))
        assert ledger.ban_reasons == {"steer": "steered"} and "steer" not in ledger.workers


def test_a_torn_line_of_an_old_journal_costs_only_itself(tmp_path) -> None:  # type: ignore[no-untyped-def]
    """An old JSON-lines journal whose append was glued onto a torn line (a crash mid-write): the
    import keeps the whole record after the tear, and drops a torn last line alone."""
    path = tmp_path / "journal.jsonl"
    failures = {"event": "failures", "batch_id": "b", "worker_id": "w", "accepted": 3, "rejected": 1, "banned": True}
    path.write_text('{"event": "failures", "worker_id": "x", "acc' + json.dumps(failures) + '\n{"event": "evid')
    tracker = FailureTracker(0.5, 4)
    ValidatorJournal(path).restore(None, tracker)
    assert tracker.counts == {"w": [3, 1]} and tracker.banned == {"w"}


def test_the_journal_stays_as_large_as_the_set_of_identities(tmp_path) -> None:  # type: ignore[no-untyped-def]
    """Hundreds of judged batches of three identities leave three rows per table (issue #44)."""
    tests, path = _tests(), tmp_path / "validator" / "journal.jsonl"
    journal, ledger, tracker = ValidatorJournal(path), EvidenceLedger(tests), FailureTracker(0.5, 4)
    for number in range(300):
        worker = ("a", "b", "c")[number % 3]
        _judge(journal, ledger, tracker, worker, f"{worker}-{number}", [[0.0] * 4], 1, 0)
    with sqlite3.connect(path.with_suffix(".sqlite")) as db:
        rows = {table: db.execute(f"SELECT count(*) FROM {table}").fetchone()[0] for table in ("evidence", "evidence_batches", "failures")}
    assert rows == {"evidence": 3, "evidence_batches": 0, "failures": 3}
    assert ledger.counted_batches == set()
