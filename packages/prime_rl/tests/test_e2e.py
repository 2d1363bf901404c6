"""Acceptance: `prime-rl run` with the tiny random model, 2 honest workers and 1 hostile worker.

Everything is a real process (orchestrator, shardcast origin + relay, trainer, validator, workers)
talking over loopback; the checks read what the run left on disk: the orchestrator's store
(verdicts and per-step claims) and every process's metrics JSONL.
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
from collections import defaultdict
from pathlib import Path
from typing import Any

import pytest

from prime_rl.orchestrator.store import RolloutStore
from prime_rl.redteam.attacks import ATTACKS, BEHAVIOURS, MIXED_CYCLE

pytestmark = pytest.mark.slow

ASYNC_LEVEL = 1
STEPS = 3  # at least this many policy versions are trained
MAX_STEPS = 12  # the run is stopped (Ctrl-C) once every acceptance condition has been observed
# Reasons the validator may give a hostile sample: the attack's own reasons (hostile.ATTACKS), or
# group_rejected / lease_rejected for the rest of a batch one of whose samples failed.
EXPECTED_REASONS = {name: set(attack.expected) for name, attack in ATTACKS.items()}


def _hostile_behaviour() -> str:
    return "mixed" if "mixed" in BEHAVIOURS else "other_weights"


def test_run_end_to_end(tiny_run: Any, helpers: Any) -> None:
    behaviour = _hostile_behaviour()
    config_path, run_dir = tiny_run(
        # Backpressure keeps the (fast) workers from flooding the store with batches no step needs.
        orchestrator={"async_level": ASYNC_LEVEL, "max_buffered_samples": 64},
        trainer={"total_steps": MAX_STEPS},
        workers={"count": 2, "hostile": [behaviour]},
        # Ban only after a full cycle of the mixed attacks (7 batches of 8 samples) has been judged.
        validator={"ban_min_samples": 56},
    )
    # On a loaded machine a slow worker may take part late: rather than a fixed number of steps,
    # the run goes on until STEPS versions are trained and every process has done its part.
    run = helpers.start_run(config_path)
    try:
        helpers.wait_for(
            lambda: run.poll() is not None or _acceptance_observed(run_dir, helpers),
            200,
            "every part to take part",
        )
        if run.poll() is None:
            run.send_signal(signal.SIGINT)
        output, _ = run.communicate(timeout=90)
    finally:
        _stop_run(run)
    logs = _tails(run_dir)
    assert run.returncode in (0, 128 + signal.SIGINT), f"run failed:\n{output[-3000:]}\n{logs}"

    names = {
        e["worker_id"]: e["worker_name"]
        for e in helpers.metrics_of(run_dir, "orchestrator")
        if e["event"] == "register"
    }
    assert sorted(names.values()) == ["hostile-0", "worker-0", "worker-1"], names
    store = RolloutStore(run_dir / "orchestrator")
    verdicts = store.all_verdicts()
    batches = {record.meta.batch_id: record for record in store.batch_records()}

    claimed_batches = {sample.batch_id for claim in store.claims() for sample in claim.sample_ids}
    # 1. Every hostile sample rejected with the reason of its attack; every honest sample accepted.
    expected_by_batch = _expected_reasons(run_dir, helpers, behaviour)
    # Without a per-batch record, a single-attack worker must give its attack's reason.
    default_reasons = EXPECTED_REASONS.get(behaviour, set().union(*EXPECTED_REASONS.values()))
    per_worker: dict[str, dict[str, int]] = defaultdict(lambda: defaultdict(int))
    for batch_id, record in batches.items():
        name = names[record.meta.worker_id]
        for verdict in verdicts.get(batch_id, []):
            if (
                verdict.reason == "expired"
            ):  # too old to train on before its turn: never validated, never used
                assert not verdict.accepted and batch_id not in claimed_batches
                continue
            per_worker[name]["accepted" if verdict.accepted else "rejected"] += 1
            if name.startswith("hostile"):
                allowed = expected_by_batch.get(batch_id, default_reasons) | {"group_rejected", "lease_rejected"}
                assert not verdict.accepted and verdict.reason in allowed, (batch_id, verdict)
            else:
                assert verdict.accepted, (name, batch_id, verdict)
    assert per_worker["worker-0"]["accepted"] > 0 and per_worker["worker-1"]["accepted"] > 0, dict(per_worker)
    hostile_seen = per_worker["hostile-0"]["rejected"] + _malformed(helpers, run_dir, names)
    assert hostile_seen > 0, "the hostile worker never got anything to the validator"
    hostile_batches = {b for b, r in batches.items() if names[r.meta.worker_id] == "hostile-0"}
    if behaviour == "mixed":
        # Each batch was rejected for its own announced attack (checked above); here: the worker
        # really cycles (attack = MIXED_CYCLE[batch_index]), and the validator judged several kinds.
        # How many hostile batches get judged before the run ends depends on the machine's load.
        assert hostile_batches <= set(expected_by_batch), "a hostile batch without its announced attack"
        submitted = [e for e in helpers.metrics_of(run_dir, "hostile-0") if e["event"] == "rollouts"]
        for event in submitted:  # stale_policy falls back to inflated_rewards while no version is too old
            scheduled = MIXED_CYCLE[event["batch_index"] % len(MIXED_CYCLE)]
            assert event["behaviour"] in {scheduled} | (
                {"inflated_rewards"} if scheduled == "stale_policy" else set()
            )
        judged = {b: {v.reason for v in verdicts.get(b, [])} - {"expired"} for b in hostile_batches}
        judged = {b: reasons for b, reasons in judged.items() if reasons}
        attacks = {e["behaviour"] for e in submitted if e["batch_id"] in judged}
        assert len(attacks) >= min(2, len(judged)), f"the mixed hostile worker repeated one attack: {attacks}"

    # 2. Weights reached the workers through shardcast (origin -> relay -> workers). The origin
    # has every version the trainer published before its last step; the relay mirrors newest
    # first and never goes back, so on a slow machine it may skip an old version, but what it
    # serves is a version the origin had.
    def available(process: str) -> set[int]:
        events = helpers.metrics_of(run_dir, process)
        return {e["policy_version"] for e in events if e["event"] == "version_available"}

    origin_versions, relay_versions = available("shardcast-origin"), available("shardcast-relay-0")
    assert set(range(1, STEPS)) <= origin_versions, origin_versions
    published = {
        e["policy_version"] for e in helpers.metrics_of(run_dir, "trainer") if e["event"] == "published"
    }
    assert relay_versions and relay_versions <= origin_versions | published, (relay_versions, origin_versions)
    for worker in ("worker-0", "worker-1"):
        loaded = [e for e in helpers.metrics_of(run_dir, worker) if e["event"] == "weights_loaded"]
        from_shardcast = {e["policy_version"] for e in loaded if e.get("source") == "shardcast"}
        assert from_shardcast and max(from_shardcast) >= 1, (worker, loaded)

    # 3. The trainer trained >= STEPS versions, each on accepted samples no older than async_level
    # (a step claimed when the run was stopped may lack its commit).
    claims = {claim.step: claim for claim in store.claims()}
    commits = [e for e in helpers.metrics_of(run_dir, "orchestrator") if e["event"] == "commit"]
    assert [e["step"] for e in commits] == list(range(len(commits))) and len(commits) >= STEPS
    assert sorted(claims) == list(range(len(claims))) and len(claims) - len(commits) in (0, 1)
    for step, claim in claims.items():
        assert claim.min_policy_version == max(0, step - ASYNC_LEVEL)
        for sample_id in claim.sample_ids:
            batch_id, index = sample_id.batch_id, sample_id.index
            assert batches[batch_id].meta.policy_version >= step - ASYNC_LEVEL, sample_id
            assert verdicts[batch_id][index].accepted, sample_id
            assert not names[batches[batch_id].meta.worker_id].startswith("hostile")
    every = [s for claim in claims.values() for s in claim.sample_ids]
    assert len(every) == len(set(every)), "a sample was claimed for two steps"

    # 4. The metrics files show it: the run's progress lines and the trainer's and validator's events.
    progress = [e for e in helpers.metrics_of(run_dir, "run") if e["event"] == "progress"]
    assert progress and progress[-1]["step"] >= STEPS
    assert any(e["event"] == "commit" for e in helpers.metrics_of(run_dir, "trainer"))
    assert helpers.metrics_of(run_dir, "validator")


def _acceptance_observed(run_dir: Path, helpers: Any) -> bool:
    """STEPS commits (also on the run's progress line), accepted samples from both honest workers, a
    judged hostile batch, and shardcast versions on the relay and in both honest workers (read from
    the metrics files)."""
    events = helpers.metrics_of(run_dir, "orchestrator")
    names = {e["worker_id"]: e["worker_name"] for e in events if e["event"] == "register"}
    accepted, rejected = defaultdict(int), defaultdict(int)
    for e in events:
        if e["event"] == "verdicts":
            accepted[names.get(e["worker_id"], "")] += e["accepted"]
            rejected[names.get(e["worker_id"], "")] += e["rejected"]
    hostile_judged = rejected["hostile-0"] > 0 or any(e["event"] == "malformed" for e in events)
    return (
        sum(1 for e in events if e["event"] == "commit") >= STEPS
        and any(e["event"] == "progress" and e["step"] >= STEPS for e in helpers.metrics_of(run_dir, "run"))
        and accepted["worker-0"] > 0
        and accepted["worker-1"] > 0
        and hostile_judged
        and any(e["event"] == "version_available" for e in helpers.metrics_of(run_dir, "shardcast-relay-0"))
        and all(
            any(
                e["event"] == "weights_loaded" and e.get("source") == "shardcast"
                for e in helpers.metrics_of(run_dir, w)
            )
            for w in ("worker-0", "worker-1")
        )
    )


def _expected_reasons(run_dir: Path, helpers: Any, behaviour: str) -> dict[str, set[str]]:
    """batch_id -> reasons allowed for the hostile worker's batch: those of the attack its metrics name
    for the batch (hostile.ATTACKS; the worker logs what it did, never what the validator should say)."""
    result = {}
    for event in helpers.metrics_of(run_dir, "hostile-0"):
        if event["event"] == "rollouts" and "batch_id" in event:
            result[event["batch_id"]] = EXPECTED_REASONS.get(event.get("behaviour", behaviour), set())
    return result


def _malformed(helpers: Any, run_dir: Path, names: dict[str, str]) -> int:
    return sum(1 for e in helpers.metrics_of(run_dir, "orchestrator") if e["event"] == "malformed")


def _tails(run_dir: Path) -> str:
    parts = []
    for path in sorted((run_dir / "logs").glob("*.out")):
        parts.append(f"--- {path.name}\n" + path.read_text(errors="replace")[-1500:])
    return "\n".join(parts)


def _run_to_end(config_path: Path, helpers: Any, timeout_s: float = 240) -> tuple[subprocess.Popen[str], str]:
    """``prime-rl run`` until it exits by itself (stopped if it has not after ``timeout_s``): the run, its output."""
    run = helpers.start_run(config_path)
    try:
        output, _ = run.communicate(timeout=timeout_s)
    finally:
        _stop_run(run)
    return run, output


def _stop_run(run: subprocess.Popen[str]) -> None:
    """Stop a supervisor that is still running the polite way (it stops its children), then the hard way."""
    if run.poll() is None:
        run.send_signal(signal.SIGTERM)
        try:
            run.communicate(timeout=60)
        except subprocess.TimeoutExpired:
            run.kill()
            run.communicate()


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    # A zombie (exited, not yet reaped by its dead parent) counts as gone.
    try:
        return Path(f"/proc/{pid}/stat").read_text().split()[2] != "Z"
    except OSError:
        return False


def test_run_ctrl_c_stops_every_child(tiny_run: Any, helpers: Any) -> None:
    """SIGINT to `prime-rl run` while its children start up: every child is gone afterwards, exit 130."""
    config_path, run_dir = tiny_run(workers={"count": 0, "hostile": []})
    run = helpers.start_run(config_path)
    try:
        started = helpers.wait_for(
            lambda: (
                (e := [x for x in helpers.metrics_of(run_dir, "run") if x["event"] == "child_started"])
                and len(e) == 5
                and e
            ),
            180,
            "orchestrator, origin, relay, trainer and validator to start",
        )
        run.send_signal(signal.SIGINT)
        output, _ = run.communicate(timeout=60)
    finally:
        _stop_run(run)
    assert run.returncode == 128 + signal.SIGINT, output[-3000:]
    assert not [e["child"] for e in started if _alive(e["pid"])]
    shutdown = [e for e in helpers.metrics_of(run_dir, "run") if e["event"] == "shutdown"]
    assert shutdown and shutdown[-1]["code"] == 130


def test_run_fails_when_a_child_fails(tiny_run: Any, helpers: Any, tmp_path: Path) -> None:
    """A child that cannot start (an empty model directory) makes `prime-rl run` stop everything,
    print that child's error and exit 1. (A model.path that does not exist at all is refused by
    `prime-rl run` itself before any child starts: test_cli.py.)"""
    empty_model = tmp_path / "empty-model"
    empty_model.mkdir()
    config_path, run_dir = tiny_run(model={"path": str(empty_model)}, workers={"count": 0, "hostile": []})
    run, output = _run_to_end(config_path, helpers)
    assert run.returncode == 1, output[-3000:]
    assert "failed with exit code" in output
    # the child's own error (the exception it died of) is printed, not only the path of its log
    (failure,) = [line for line in output.splitlines() if "failed with exit code" in line]
    assert re.search(r"failed with exit code 1: \w+(Error|Exception): \S", failure), output[-3000:]
    started = [e for e in helpers.metrics_of(run_dir, "run") if e["event"] == "child_started"]
    assert started and not [e["child"] for e in started if _alive(e["pid"])]


def test_run_stops_when_every_honest_worker_is_banned(tiny_run: Any, helpers: Any) -> None:
    """The run's only worker cheats (``workers.behaviour``) and is banned: `prime-rl run` exits 1 and
    names the ban instead of waiting forever for samples nobody will send."""
    config_path, run_dir = tiny_run(
        workers={"count": 1, "hostile": [], "behaviour": "fabricated_completion"},
        validator={"ban_min_samples": 8},
    )
    run, output = _run_to_end(config_path, helpers)
    assert run.returncode == 1, output[-3000:]
    assert "every honest worker stopped before the trainer finished" in output, output[-3000:]
    assert re.search(r"banned workers: worker-0: (evidence|\d+/\d+ samples rejected)", output), output[-3000:]
    failed = [e for e in helpers.metrics_of(run_dir, "run") if e["event"] == "failed"]
    assert [e["child"] for e in failed] == ["workers"]
    started = [e for e in helpers.metrics_of(run_dir, "run") if e["event"] == "child_started"]
    assert started and not [e["child"] for e in started if _alive(e["pid"])]
