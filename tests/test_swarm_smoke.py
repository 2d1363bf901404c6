"""The smoke rehearsal (issue 33): ``benchmarks/swarm.py`` with 16 identities and 2 seeded kills.

The whole swarm runs for real (``prime-rl run`` with orchestrator, validator, trainer, origin and two
relays, one swarm host with 16 identities, one of them hostile) on loopback; the orchestrator and the
swarm host are SIGKILLed once the first step is published (the supervisor restarts the one, the
harness the other, whose identities resume). It must finish its steps with every invariant of
``benchmarks/swarm_checks.py`` holding and no honest identity rejected or banned. Then the checker
itself must fail: a planted unstored acknowledgement and a planted second claim of a trained sample
are each reported by id.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

BENCHMARKS = Path(__file__).resolve().parents[1] / "benchmarks"
sys.path.insert(0, str(BENCHMARKS))

from swarm_checks import RunRecords, check_invariants  # noqa: E402

from prime_rl.config import load_config  # noqa: E402
from prime_rl.orchestrator.store import ClaimRecord, RolloutStore  # noqa: E402


def test_smoke_rehearsal_survives_two_kills_and_its_checker_can_fail(tmp_path: Path) -> None:
    argv = [sys.executable, str(BENCHMARKS / "swarm.py"), "--identities", "16", "--steps", "4", "--seed", "1",
            "--kills", "2", "--kill-gap-s", "4", "--targets", "orchestrator,host-0",
            "--root", str(tmp_path), "--no-record", "--timeout-s", "220"]  # fmt: skip
    done = subprocess.run(argv, capture_output=True, text=True, timeout=280)
    assert done.returncode == 0, done.stdout[-4000:] + done.stderr[-4000:]
    figures = json.loads((tmp_path / "figures.json").read_text())
    summary = figures["summary"]
    assert sorted(k["target"] for k in figures["kills"]) == ["host-0", "orchestrator"], figures["kills"]
    assert summary["run_exit_code"] == 0 and summary["invariants_ok"], figures["invariants"]
    assert (summary["honest_rejected"], summary["honest_banned"]) == (0, 0)
    assert not summary["emulated_wan"] and summary["network"].startswith("loopback")

    config = load_config(tmp_path / "run.toml")
    records = RunRecords.read(tmp_path)
    assert any(r["kind"] == "submitted" for r in records.records)
    # A 2xx answer for a batch the store does not hold, and a trained sample claimed a second time.
    records.records.append(
        {"kind": "submitted", "host": 0, "t": 0.0, "batch_id": "w9999-s0-b0", "honest": True}
    )
    store = RolloutStore(config.orchestrator_data_dir)
    try:
        first = store.claims()[0]
        store.write_claim(
            ClaimRecord(step=999, min_policy_version=0, time=0.0, sample_ids=first.sample_ids[:1])
        )
    finally:
        store.close()
    violations = check_invariants(config, records, host_starts={}, ended_at=0.0)
    assert violations["acked_rollouts_stored"] == ["w9999-s0-b0"]
    sample = first.sample_ids[0]
    assert violations["no_double_claim"] == [f"{sample.batch_id}/{sample.index}"]


def test_pin_orchestrator_puts_every_thread_of_the_newest_orchestrator_on_its_cpu() -> None:
    """``--pin-orchestrator``: each thread of the orchestrator process, those started before the pin
    included, runs on the chosen CPU alone (swarm.md, N=1024: the trusted calls' p99 with the
    orchestrator on a core of its own); ``--orchestrator-nice N``: each runs at nice N."""
    import os
    import threading
    import time
    from types import SimpleNamespace

    import pytest
    from swarm import Swarm

    cpus = sorted(os.sched_getaffinity(0))
    if len(cpus) < 2:
        pytest.skip("needs 2 CPUs")
    nice = os.getpriority(os.PRIO_PROCESS, 0) + 5  # nicer than this process: allowed without privileges
    script = "import threading, time\nthreading.Thread(target=time.sleep, args=(60,)).start()\ntime.sleep(60)\n"
    child = subprocess.Popen([sys.executable, "-c", script])
    harness = SimpleNamespace(done=threading.Event(), core=cpus[-1], child_pids=lambda: {"orchestrator": child.pid},
                              args=SimpleNamespace(orchestrator_nice=nice))  # fmt: skip
    walkers = [
        threading.Thread(target=Swarm.each_orchestrator_thread, args=(harness, apply))
        for apply in (lambda tid: Swarm.pin_orchestrator(harness, tid), lambda tid: Swarm.prioritize_orchestrator(harness, tid))
    ]  # fmt: skip
    for walker in walkers:
        walker.start()
    try:
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline:
            tids = [int(t) for t in os.listdir(f"/proc/{child.pid}/task")]
            if len(tids) == 2 and all(
                os.sched_getaffinity(t) == {cpus[-1]} and os.getpriority(os.PRIO_PROCESS, t) == nice for t in tids
            ):
                break
            time.sleep(0.1)
        else:
            raise AssertionError(
                f"threads not pinned: {[(os.sched_getaffinity(t), os.getpriority(os.PRIO_PROCESS, t)) for t in tids]}"
            )
    finally:
        harness.done.set()
        for walker in walkers:
            walker.join(10)
        child.kill()
        child.wait(10)
