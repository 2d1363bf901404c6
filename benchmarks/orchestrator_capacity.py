"""Orchestrator capacity: lease cycles per second on one core, at the start and after a long history.

A *lease cycle* is what one honest worker costs the orchestrator per batch, called on the ``Ledger``
directly (no HTTP): ``status`` -> ``lease`` -> ``submit`` (a small rollout batch: 2 prompts x 2
samples, 64 prompt + 64 completion tokens, proofs; parquet + fsync) -> ``record_verdicts`` (every
sample accepted, with log-probs; the release book's ``judged`` event). Sixteen identities take turns.
Timed is what the server does per request (parsing and validating the JSON body, the ledger call),
not the building of the request bodies. The *lease path* is ``lease`` + the lease book's
``mark_answered`` alone (no payload), the part that grew with history.

Phases, each code version in its own (single-threaded Python) child process; every rate is given
per wall second and per CPU second of that process (``time.process_time``: on a shared machine the
CPU rate is what one dedicated core would do, the wall rate adds fsync waits and time lost to
other processes):

1. ``start``: ``CYCLES_PER_WINDOW`` full cycles on a fresh store;
2. ``history``: leases issued, answered and judged as fast as the lease path allows (``lease``,
   then the lease book's ``mark_answered`` and ``mark_judged``, accepted: no batch files, as if a
   batch had been stored and the validator had accepted it) until
   ``HISTORY_LEASES`` leases were issued or the code version's ``HISTORY_LIMITS`` (wall and CPU
   seconds) ran out, with a rate per window of ``REPORT_EVERY`` leases. The new code's SQLite store
   runs this phase with ``synchronous=OFF`` (no fsync per lease; the same statements, so the same
   CPU work): with an fsync per lease on this shared disk 10^6 leases take hours of wall time. Its
   wall rates in this phase are therefore not durable rates; the CPU rates are comparable, and the
   ``after`` phase is measured with ``synchronous=FULL`` again;
3. ``after``: ``CYCLES_PER_WINDOW`` full cycles again, with all that history behind them;
4. ``restart``: the seconds a fresh ``Ledger`` takes to open that store.

Then the startup with 10^6 recorded events: a JSON-lines journal of 1,000 registrations, 499,500
leases and 499,500 expiries (nothing answered, so nothing folds: the worst case) is opened by each
code version (the new one imports it into SQLite on that first open), and the new one opens it a
second time.

"old" is the code of commit 6618b31 (checked out with ``git worktree`` into a temporary folder);
"new" is this working tree. Both run in the same invocation, on the same machine.

Run: ``.venv/bin/python benchmarks/orchestrator_capacity.py`` (about 6 minutes on 2 shared cores).
Writes ``benchmarks/results/orchestrator_capacity.{md,json}``.
"""

from __future__ import annotations

import argparse
import base64
import hashlib
import json
import os
import platform
import resource
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from history_ledger import judgeable_off  # benchmarks/

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests" / "support"))  # synthetic_batches

OLD_COMMIT = "6618b31"
IDENTITIES = 16
CYCLES_PER_WINDOW = 400
HISTORY_LEASES = 1_000_000
HISTORY_LIMITS = {"old": (90.0, 20.0), "new": (3600.0, 1200.0)}
"""Per code version, the history phase's (wall, CPU) seconds limit: the old code slows with every
lease (hours to 10^6), the new one must get there."""
REPORT_EVERY = 2_000
STARTUP_EVENTS = 1_000_000
ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "benchmarks" / "results"
PACKAGES = ("toploc", "shardcast", "grpo", "verifiers", "prime_rl")


# ------------------------------------------------------------------ child: one code version


def _config(run_dir: Path) -> Any:
    from prime_rl.config import load_config

    return load_config(
        None,
        [
            "--run_dir", str(run_dir), "--orchestrator.prompts_per_batch", "2", "--sampling.group_size", "2",
            "--orchestrator.task_timeout_s", "1e9", "--orchestrator.max_open_leases", "4", *judgeable_off(),
        ],
    )  # fmt: skip


def _ledger(run_dir: Path) -> Any:
    from prime_rl.orchestrator.ledger import Ledger
    from prime_rl.orchestrator.store import RolloutStore
    from prime_rl.tasks import TaskSet

    config = _config(run_dir)
    tasks = TaskSet([{"prompt": f"What is {i} + {i}?"} for i in range(1000)])
    return Ledger(config, tasks, RolloutStore(config.orchestrator_data_dir))


class _Clock:
    """Wall and CPU seconds (``time.process_time``: this process, all its threads) of timed sections."""

    def __init__(self) -> None:
        self.wall = self.cpu = 0.0

    def __enter__(self) -> _Clock:
        self._wall, self._cpu = time.perf_counter(), time.process_time()
        return self

    def __exit__(self, *exc: object) -> None:
        self.wall += time.perf_counter() - self._wall
        self.cpu += time.process_time() - self._cpu


def _cycle(ledger: Any, worker: Any, proofs: str, spent: _Clock, leasing: _Clock) -> None:
    """One full lease cycle, timed into ``spent`` (everything the orchestrator does) and ``leasing``
    (``lease`` alone).

    Timed: what the server does with each request (body parsing and validation, the ledger call);
    not timed: building the worker's and the validator's request bodies.
    """
    from synthetic_batches import synthetic_batch  # tests/support

    from prime_rl.api.protocol import RolloutBatch, Verdict, VerdictRequest

    with spent:
        ledger.status()
        with leasing:
            lease = ledger.lease(worker, None, None)
    batch = synthetic_batch(
        lease, lease.step, prompt_tokens=range(3, 67), completion=lambda g: [(7 * i + g) % 3000 for i in range(64)],
        reward=lambda g: float(g % 2), advantage=lambda g: 0.5 - g % 2, logprobs=[-0.5] * 64, proofs=proofs,
        temperature=1.0,
    )  # fmt: skip
    samples = batch.samples
    body = batch.model_dump_json().encode()
    with spent:
        answer = ledger.submit(worker, RolloutBatch.model_validate_json(body), hashlib.sha256(body).hexdigest())
    verdicts = [
        Verdict(sample_index=i, accepted=True, reason="ok", reward=s.reward, advantage=s.advantage, logprobs=[-0.5] * 64)
        for i, s in enumerate(samples)
    ]
    body = VerdictRequest(batch_id=answer.batch_id, verdicts=verdicts).model_dump_json().encode()
    with spent:
        ledger.record_verdicts(VerdictRequest.model_validate_json(body))


def _window(ledger: Any, workers: list[Any], cycles: int, proofs: str) -> dict[str, float]:
    spent, leasing = _Clock(), _Clock()
    for number in range(cycles):
        _cycle(ledger, workers[number % len(workers)], proofs, spent, leasing)
    return {
        "cycles_per_s": cycles / spent.wall,
        "cycles_per_cpu_s": cycles / spent.cpu,
        "lease_ms": 1e3 * leasing.wall / cycles,
        "lease_cpu_ms": 1e3 * leasing.cpu / cycles,
        "cycles": cycles,
    }


def _judged(ledger: Any, lease: Any) -> None:
    """The validator accepted the lease's batch: what lets an answered lease fold (in the old code,
    and until the fold waited for the verdict, a lease folded once answered)."""
    mark = getattr(ledger.leases, "mark_judged", None)
    if mark is not None:
        mark(lease.worker_id, lease.batch_index, rejected=False)


def _issued(ledger: Any) -> int:
    return sum(ledger.leases.issued(w) for w in ledger.workers)


def child_capacity(run_dir: Path, history_seconds: float, history_cpu_seconds: float) -> dict[str, Any]:
    proofs = base64.b64encode(os.urandom(258 * 2)).decode()
    ledger = _ledger(run_dir)
    workers = [ledger.workers[ledger.register(f"id{i}").worker_id] for i in range(IDENTITIES)]
    result: dict[str, Any] = {"start": _window(ledger, workers, CYCLES_PER_WINDOW, proofs)}
    print(f"  start: {result['start']}", flush=True)
    history: list[dict[str, float]] = []
    wall_started, cpu_started = time.perf_counter(), time.process_time()
    issued = _issued(ledger)
    window = _Clock()
    db = getattr(ledger.store, "db", None)  # the new code's StateDB (the old code has none)
    if db is not None:
        db.connection.execute("PRAGMA synchronous=OFF")
    while (
        issued < HISTORY_LEASES
        and time.perf_counter() - wall_started < history_seconds
        and time.process_time() - cpu_started < history_cpu_seconds
    ):
        with window:
            lease = ledger.lease(workers[issued % len(workers)], None, None)
            ledger.leases.mark_answered(lease.worker_id, lease.batch_index)
            _judged(ledger, lease)
        issued += 1
        if issued % REPORT_EVERY == 0:
            history.append({"issued": issued, "leases_per_s": REPORT_EVERY / window.wall,
                            "leases_per_cpu_s": REPORT_EVERY / window.cpu})  # fmt: skip
            window = _Clock()
            print(f"  history: {history[-1]}", flush=True)
    if db is not None:
        db.connection.execute("PRAGMA synchronous=FULL")
    result["history"] = history
    result["history_synchronous_off"] = db is not None
    result["history_leases"] = _issued(ledger)
    result["history_wall_s"] = time.perf_counter() - wall_started
    result["history_cpu_s"] = time.process_time() - cpu_started
    result["max_rss_mb"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    result["after"] = _window(ledger, workers, CYCLES_PER_WINDOW, proofs)
    result["after"]["leases_issued_before"] = result["history_leases"]
    print(f"  after: {result['after']}", flush=True)
    started = time.perf_counter()
    _ledger(run_dir)
    result["restart_s"] = time.perf_counter() - started
    data = Path(_config(run_dir).orchestrator_data_dir)
    result["store_bytes"] = sum(p.stat().st_size for p in data.glob("*") if p.is_file())
    return result


def profile_cycles(cycles: int) -> None:
    """Where a full cycle's time goes: ``cycles`` cycles of this tree under ``cProfile`` (after 100
    unprofiled ones), the top functions by cumulative time into ``orchestrator_cycle_profile.txt``."""
    import cProfile
    import io
    import pstats

    with tempfile.TemporaryDirectory() as tmp:
        proofs = base64.b64encode(os.urandom(258 * 2)).decode()
        ledger = _ledger(Path(tmp))
        workers = [ledger.workers[ledger.register(f"id{i}").worker_id] for i in range(IDENTITIES)]
        _window(ledger, workers, 100, proofs)
        profiler = cProfile.Profile()
        profiler.enable()
        rates = _window(ledger, workers, cycles, proofs)
        profiler.disable()
    out = io.StringIO()
    pstats.Stats(profiler, stream=out).sort_stats("cumulative").print_stats(30)
    header = (
        f"# python benchmarks/orchestrator_capacity.py --profile {cycles}  (this tree; load average "
        f"{' '.join(f'{x:.1f}' for x in os.getloadavg())}; under cProfile, so slower than unprofiled)\n"
        f"# {rates}\n"
    )
    RESULTS.mkdir(parents=True, exist_ok=True)
    (RESULTS / "orchestrator_cycle_profile.txt").write_text(header + out.getvalue())
    print(header + out.getvalue())


def child_startup(journal_dir: Path, opens: int) -> dict[str, Any]:
    """Wall and CPU seconds each of ``opens`` consecutive ``Ledger`` opens of the run dir took."""
    seconds, cpu_seconds = [], []
    for _ in range(opens):
        clock = _Clock()
        with clock:
            ledger = _ledger(journal_dir)
        seconds.append(clock.wall)
        cpu_seconds.append(clock.cpu)
        assert len(ledger.workers) == 1000, len(ledger.workers)
        del ledger
    return {"open_s": seconds, "open_cpu_s": cpu_seconds}


def write_journal(run_dir: Path) -> None:
    """A JSON-lines journal of ``STARTUP_EVENTS`` events (see module docstring), as the old code writes it."""
    from prime_rl.api.assignment import task_ids

    data = Path(_config(run_dir).orchestrator_data_dir)
    data.mkdir(parents=True, exist_ok=True)
    workers = 1000
    per_worker = (STARTUP_EVENTS - workers) // (2 * workers)
    key = b"k" * 32
    with open(data / "journal.jsonl", "w") as handle:
        for number in range(workers):
            event = {"event": "register", "worker_id": f"w{number:04d}", "name": "x", "number": number,
                     "token_sha256": "0" * 64, "time": 1.0}  # fmt: skip
            handle.write(json.dumps(event) + "\n")
        for index in range(per_worker):
            for number in range(workers):
                worker_id = f"w{number:04d}"
                ids = list(task_ids(key=key, worker_id=worker_id, step=0, batch_index=index, num_tasks=1000, prompts_per_batch=2))
                lease = {"worker_id": worker_id, "step": 0, "batch_index": index, "task_ids": ids, "issued_at": 1.0,
                         "deadline": 2.0, "source_worker_id": worker_id, "source_step": 0, "source_batch_index": index}  # fmt: skip
                handle.write(json.dumps({"event": "lease", "lease": lease, "reissues": None, "address": "", "time": 1.0}) + "\n")
                handle.write(json.dumps({"event": "lease_expired", "worker_id": worker_id, "batch_index": index, "time": 3.0}) + "\n")


# ------------------------------------------------------------------ parent


def _run_child(source_root: Path, args: list[str]) -> dict[str, Any]:
    env = dict(os.environ, OMP_WAIT_POLICY="PASSIVE", PYTHONPATH=os.pathsep.join(
        str(source_root / "packages" / name / "src") for name in PACKAGES))  # fmt: skip
    with tempfile.NamedTemporaryFile(suffix=".json") as out:
        subprocess.run([sys.executable, __file__, *args, "--out", out.name], env=env, check=True)
        return json.loads(Path(out.name).read_text())


def _table(results: dict[str, Any]) -> str:
    lines = [
        "| code | full cycles/s at start (wall / CPU) | lease path /s, first window (wall / CPU) | leases issued | "
        "lease path /s, last window (wall / CPU) | full cycles/s after (wall / CPU) | restart s | store MB | peak RSS MB |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for name, r in results["capacity"].items():
        first, last = r["history"][0], r["history"][-1]
        lines.append(
            f"| {name} | {r['start']['cycles_per_s']:.0f} / {r['start']['cycles_per_cpu_s']:.0f} | "
            f"{first['leases_per_s']:.0f} / {first['leases_per_cpu_s']:.0f} | {r['history_leases']:,} | "
            f"{last['leases_per_s']:.0f} / {last['leases_per_cpu_s']:.0f} | "
            f"{r['after']['cycles_per_s']:.0f} / {r['after']['cycles_per_cpu_s']:.0f} | {r['restart_s']:.2f} | "
            f"{r['store_bytes'] / 1e6:.1f} | {r.get('max_rss_mb', 0):.0f} |"
        )
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--child", choices=["capacity", "startup", "journal"])
    parser.add_argument("--dir")
    parser.add_argument("--opens", type=int, default=1)
    parser.add_argument("--profile", type=int, default=0, help="profile this many full cycles of this tree and stop")
    parser.add_argument("--history-seconds", type=float, default=90.0)
    parser.add_argument("--history-cpu-seconds", type=float, default=20.0)
    parser.add_argument("--out")
    args = parser.parse_args()
    if args.profile:
        profile_cycles(args.profile)
        return
    if args.child:
        if args.child == "capacity":
            result = child_capacity(Path(args.dir), args.history_seconds, args.history_cpu_seconds)
        elif args.child == "startup":
            result = child_startup(Path(args.dir), args.opens)
        else:
            write_journal(Path(args.dir))
            result = {}
        Path(args.out).write_text(json.dumps(result))
        return
    with tempfile.TemporaryDirectory() as tmp:
        old = Path(tmp) / "old"
        subprocess.run(["git", "-C", str(ROOT), "worktree", "add", "--detach", str(old), OLD_COMMIT], check=True,
                       capture_output=True)  # fmt: skip
        try:
            results: dict[str, Any] = {"machine": f"{platform.processor() or platform.machine()}, {os.cpu_count()} cores",
                                       "load": " ".join(f"{x:.1f}" for x in os.getloadavg()),
                                       "old_commit": OLD_COMMIT, "capacity": {}, "startup": {}}  # fmt: skip
            for name, source in (("old", old), ("new", ROOT)):
                print(f"{name}: capacity", flush=True)
                seconds, cpu_seconds = HISTORY_LIMITS[name]
                results["capacity"][name] = _run_child(source, [
                    "--child", "capacity", "--dir", str(Path(tmp) / f"cap-{name}"),
                    "--history-seconds", str(seconds), "--history-cpu-seconds", str(cpu_seconds),
                ])  # fmt: skip
            template = Path(tmp) / "startup-template"
            _run_child(ROOT, ["--child", "journal", "--dir", str(template)])
            for name, source, opens in (("old", old, 1), ("new", ROOT, 2)):
                run_dir = Path(tmp) / f"startup-{name}"
                shutil.copytree(template, run_dir)
                print(f"{name}: startup after {STARTUP_EVENTS:,} events", flush=True)
                results["startup"][name] = _run_child(source, ["--child", "startup", "--dir", str(run_dir), "--opens", str(opens)])
                print(f"  {results['startup'][name]}", flush=True)
        finally:
            subprocess.run(["git", "-C", str(ROOT), "worktree", "remove", "--force", str(old)], check=False)
    results["settings"] = {"identities": IDENTITIES, "cycles_per_window": CYCLES_PER_WINDOW,
                           "history_leases_cap": HISTORY_LEASES, "history_limits_s": HISTORY_LIMITS,
                           "startup_events": STARTUP_EVENTS}  # fmt: skip
    RESULTS.mkdir(parents=True, exist_ok=True)
    (RESULTS / "orchestrator_capacity.json").write_text(json.dumps(results, indent=1))
    startup = results["startup"]
    text = (
        "# Orchestrator capacity (benchmarks/orchestrator_capacity.py)\n\n"
        f"Machine: {results['machine']}, load average {results['load']} at the start (a shared machine: compare "
        f"the CPU rates); each code version in one child process; old = commit "
        f"{OLD_COMMIT}, new = this tree. A lease cycle = status -> lease -> submit (2x2 samples, parquet + fsync) -> "
        f"verdicts, on the Ledger (no HTTP), {IDENTITIES} identities taking turns; history = leases issued and answered "
        f"through the lease path until {HISTORY_LEASES:,} were issued or the time ran out (wall / CPU s: "
        + ", ".join(f"{name} {wall:.0f} / {cpu:.0f}" for name, (wall, cpu) in HISTORY_LIMITS.items()) + ").\n\n"
        + _table(results)
        + "\n\nStartup with "
        f"{STARTUP_EVENTS:,} recorded events (1,000 registrations, leases and expiries, nothing foldable), wall / CPU "
        f"seconds: old {startup['old']['open_s'][0]:.1f} / {startup['old']['open_cpu_s'][0]:.1f} (JSON-lines replay); "
        f"new {startup['new']['open_s'][0]:.1f} / {startup['new']['open_cpu_s'][0]:.1f} on the first open (import into "
        f"SQLite + replay), {startup['new']['open_s'][1]:.1f} / {startup['new']['open_cpu_s'][1]:.1f} on the next.\n"
    )
    (RESULTS / "orchestrator_capacity.md").write_text(text)
    print(text)


if __name__ == "__main__":
    main()
