"""Soak: a run's history built through the real code path, and what each request costs as it grows.

One process drives a ``Ledger`` (no HTTP: the ledger is where history costs; the HTTP layer's
cost per request does not depend on history) in a closed loop, as a swarm, a validator and a
trainer playing by the rules would:

  - 64 identities take turns: ``status``, ``lease`` (backpressure on: ``max_buffered_samples``),
    ``submit`` (a real batch: 2 prompts x 4 samples, 128 prompt + 384 completion tokens each,
    toploc proofs of 258 B per 32 tokens, inference log-probs: a parquet file of about 30 KB);
  - the validator: ``pending`` (reads the batch back), ``record_verdicts`` (every sample accepted,
    one recomputed log-prob per completion token);
  - the trainer: ``claim`` + ``commit`` whenever a step's samples are there;
  - ``GET /workers``'s snapshot every 64 cycles, and every cycle of a timed window.

Durability as the server has it (``group_commit.py``): every payload is fsynced (file and folder)
before its commit, and each cycle ends with one fsync of SQLite's write-ahead log that covers the
cycle's commits; code without group commit (``main`` before issue #44) runs with
``synchronous=FULL`` (an fsync per commit, its own way). Every batch is judged and claimed or
settled: the history is a run that did work.

Windows of ``WINDOW`` cycles are timed at each checkpoint of ``CHECKPOINTS`` (wall and CPU per
request type, p50/p99), then the loop goes on until the next checkpoint or ``--seconds`` ran out.
At the end: RSS, store bytes per batch, and a restart (a fresh ``Ledger`` on the same store: its
seconds, and that every acknowledged batch, verdict and claim is there).

Run: ``python benchmarks/soak.py --seconds 600 --label new`` (this tree) and, for today's code,
the same with ``PYTHONPATH`` pointing at another checkout's packages (``--label main``).
Writes ``benchmarks/results/soak_<label>.json``; ``--report`` writes ``soak.md`` from them.
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
import statistics
import tempfile
import time
from collections import defaultdict
from pathlib import Path
from typing import Any

from history_ledger import COMPLETION, GROUP, PROMPT, PROMPTS, history_ledger  # benchmarks/

IDENTITIES = 64
WINDOW = 1024
"""Cycles per timed window: 1,024 calls of every request type but ``commit``, of which 64 claims
return a step (every 16th cycle) and are committed; so each p99 but commit's (the largest of its 64)
is read from more than a handful of slow calls."""
CHECKPOINTS = (1_000, 3_000, 10_000, 30_000, 100_000, 300_000, 1_000_000)
ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "benchmarks" / "results"


class Timer:
    """Per request type: wall and CPU seconds of each call."""

    def __init__(self) -> None:
        self.wall: dict[str, list[float]] = defaultdict(list)
        self.cpu: dict[str, list[float]] = defaultdict(list)
        self.on = False

    def __call__(self, name: str, function: Any, *args: Any) -> Any:
        wall, cpu = time.perf_counter(), time.process_time()
        result = function(*args)
        if self.on:
            self.wall[name].append(time.perf_counter() - wall)
            self.cpu[name].append(time.process_time() - cpu)
        return result

    def summary(self) -> dict[str, dict[str, float]]:
        out = {}
        for name, walls in self.wall.items():
            ordered = sorted(walls)
            out[name] = {
                "n": len(walls),
                "p50_ms": 1e3 * statistics.median(ordered),
                "p99_ms": 1e3 * ordered[min(len(ordered) - 1, int(0.99 * len(ordered)))],
                "cpu_ms": 1e3 * statistics.mean(self.cpu[name]),
            }
        return out


def _rss_mb() -> float:
    with open("/proc/self/statm") as handle:
        return int(handle.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 2**20


def _dir_bytes(path: Path) -> int:
    total = 0
    for root, _, files in os.walk(path):
        for name in files:
            total += os.path.getsize(os.path.join(root, name))
    return total


def _fill_and_measure(
    run_dir: Path, ledger: Any, fill: int, cycles: int, one_cycle_of: Any, timer: Timer,
    windows: list[dict[str, Any]], started: float, label: str,
) -> tuple[Any, int]:
    """Extend the history by ``fill`` settled batches written straight into the store (a documented
    direct fill: batch index rows closed, verdicts without log-probs, as claimed samples keep them,
    and the workers' counters; no payload files), reopen the ledger (a restart) and time one
    more window of real cycles on top. Real cycles at 10-15 per second on this shared machine
    would need days to get there."""
    import json as _json

    from prime_rl.orchestrator.store import BatchMeta

    store = ledger.store
    verdicts = _json.dumps([
        {"sample_index": i, "accepted": True, "reason": "ok", "detail": "", "reward": float(i % 2),
         "advantage": 0.5 - i % 2, "logprobs": [], "beyond_tolerance": 0}
        for i in range(GROUP * PROMPTS)
    ], separators=(",", ":"))  # fmt: skip
    start = len(ledger.batches)
    names = [w.worker_id for w in ledger.workers.values()]
    chunk = 20_000
    for low in range(start, start + fill, chunk):
        rows, verdict_rows, counts = [], [], defaultdict(int)
        for seq in range(low, min(start + fill, low + chunk)):
            worker = names[seq % len(names)]
            meta = BatchMeta(f"{worker}-s0-f{seq}", worker, 0, 10**6 + seq, 0, 1.0, "0" * 64, seq, None)
            rows.append((meta.batch_id, seq, worker, meta.to_json().decode(), "[0,0,0,0,1,1,1,1]",
                         "[0,1,2,3,4,5,6,7]", 0, None))  # fmt: skip
            verdict_rows.append((meta.batch_id, verdicts))
            for name, n in (("batches", 1), ("samples", 8), ("accepted", 8)):
                counts[(worker, name)] += n
        with store.db.transaction() as connection:
            connection.executemany("INSERT INTO batches VALUES (?, ?, ?, ?, ?, ?, ?, ?)", rows)
            connection.executemany("INSERT INTO verdicts VALUES (?, ?)", verdict_rows)
            connection.executemany(
                "INSERT INTO counters VALUES ('worker', ?, ?, ?) ON CONFLICT (scope, key, name) DO UPDATE SET n = n + excluded.n",
                [(w, name, n) for (w, name), n in counts.items()],
            )
    store.db.sync()
    store.close()
    wall = time.perf_counter()
    ledger = history_ledger(run_dir)
    restart_s = time.perf_counter() - wall
    cycles += fill
    for _ in range(WINDOW // 4):  # warm
        one_cycle_of(ledger, cycles)
        cycles += 1
    timer.on = True
    timer.wall.clear()
    timer.cpu.clear()
    wall, cpu = time.perf_counter(), time.process_time()
    for _ in range(WINDOW):
        one_cycle_of(ledger, cycles)
        cycles += 1
    window = {
        "batches": cycles, "cycles_per_wall_s": WINDOW / (time.perf_counter() - wall),
        "cycles_per_cpu_s": WINDOW / (time.process_time() - cpu), "rss_mb": _rss_mb(),
        "elapsed_s": time.perf_counter() - started, "requests": timer.summary(), "filled": fill,
        "restart_after_fill_s": restart_s,
    }  # fmt: skip
    timer.on = False
    windows.append(window)
    print(f"[{label}] {cycles} batches ({fill} filled): restart {restart_s:.2f} s, "
          f"{window['cycles_per_wall_s']:.0f} cycles/s wall, rss {window['rss_mb']:.0f} MB, "
          f"lease p99 {window['requests']['lease']['p99_ms']:.2f} ms", flush=True)  # fmt: skip
    return ledger, cycles


def child(run_dir: Path, seconds: float, label: str, fills: tuple[int, ...] = ()) -> dict[str, Any]:
    from prime_rl.api.protocol import (
        ClaimRequest,
        CommitRequest,
        RolloutBatch,
        RolloutSample,
        Verdict,
        VerdictRequest,
    )  # fmt: skip
    from prime_rl.orchestrator.workers_view import build_snapshot

    ledger = history_ledger(run_dir)
    db = ledger.store.db
    group = hasattr(db, "defer_sync")
    if group:
        db.defer_sync()
    sync = db.sync if group else (lambda: None)
    workers = [ledger.workers[ledger.register(f"id{i}").worker_id] for i in range(IDENTITIES)]
    proofs = base64.b64encode(os.urandom(258 * (COMPLETION // 32))).decode()
    timer = Timer()
    acknowledged: list[str] = []
    windows: list[dict[str, Any]] = []
    started = time.perf_counter()
    cycles = 0
    checkpoint = 0

    def one_cycle(number: int) -> None:
        worker = workers[number % IDENTITIES]
        timer("status", ledger.status)
        lease = timer("lease", ledger.lease, worker, None, None)
        samples = [
            RolloutSample(
                task_id=task.task_id, group_index=g, prompt_tokens=list(range(3, 3 + PROMPT)),
                completion_tokens=[(7 * i + g + number) % 30000 for i in range(COMPLETION)], sampling_seed=seed,
                temperature=1.0, reward=float(g % 2), advantage=0.5 - g % 2, proofs=proofs,
                inference_logprobs=[-0.5] * COMPLETION,
            )
            for task in lease.tasks
            for g, seed in enumerate(task.sampling_seeds)
        ]  # fmt: skip
        body = RolloutBatch(
            worker_id=lease.worker_id, step=lease.step, batch_index=lease.batch_index,
            policy_version=lease.step, samples=samples,
        ).model_dump_json().encode()  # fmt: skip
        answer = timer("submit", lambda: ledger.submit(worker, RolloutBatch.model_validate_json(body), hashlib.sha256(body).hexdigest()))
        sync()
        acknowledged.append(answer.batch_id)
        timer("pending", ledger.pending, 1)
        verdicts = [
            Verdict(sample_index=i, accepted=True, reason="ok", reward=s.reward, advantage=s.advantage,
                    logprobs=[-0.5] * COMPLETION)
            for i, s in enumerate(samples)
        ]  # fmt: skip
        request = VerdictRequest(batch_id=answer.batch_id, verdicts=verdicts).model_dump_json().encode()
        timer("verdicts", lambda: ledger.record_verdicts(VerdictRequest.model_validate_json(request)))
        timer("own_verdicts", ledger.batch_verdicts, worker, answer.batch_id)
        claim = timer("claim", ledger.claim, ClaimRequest(step=ledger.step, min_samples=128))
        if claim.ready:
            timer("commit", ledger.commit, CommitRequest(step=ledger.step, policy_version=ledger.step + 1))
        if number % 64 == 0 or timer.on:  # every cycle of a timed window: enough calls for a p99
            timer("workers", build_snapshot, ledger)
        sync()

    def one_cycle_of(new: Any, number: int) -> None:
        nonlocal ledger, workers, sync
        ledger = new
        new.store.db.defer_sync()
        sync = new.store.db.sync
        workers = [new.workers[w.worker_id] for w in workers]
        one_cycle(number)

    while time.perf_counter() - started < seconds and checkpoint < len(CHECKPOINTS):
        target = CHECKPOINTS[checkpoint]
        while cycles < target - WINDOW and time.perf_counter() - started < seconds:
            one_cycle(cycles)
            cycles += 1
        if time.perf_counter() - started >= seconds:
            break
        timer.on = True
        timer.wall.clear()
        timer.cpu.clear()
        wall, cpu = time.perf_counter(), time.process_time()
        for _ in range(WINDOW):
            one_cycle(cycles)
            cycles += 1
        window = {
            "batches": cycles, "cycles_per_wall_s": WINDOW / (time.perf_counter() - wall),
            "cycles_per_cpu_s": WINDOW / (time.process_time() - cpu), "rss_mb": _rss_mb(),
            "elapsed_s": time.perf_counter() - started, "requests": timer.summary(),
        }  # fmt: skip
        timer.on = False
        windows.append(window)
        print(f"[{label}] {cycles} batches: {window['cycles_per_wall_s']:.0f} cycles/s wall, "
              f"{window['cycles_per_cpu_s']:.0f}/cpu s, rss {window['rss_mb']:.0f} MB, "
              f"lease p99 {window['requests']['lease']['p99_ms']:.2f} ms", flush=True)  # fmt: skip
        checkpoint += 1
    for amount in fills if group else ():
        ledger, cycles = _fill_and_measure(run_dir, ledger, amount, cycles, one_cycle_of, timer, windows, started, label)
        db = ledger.store.db
    result: dict[str, Any] = {"label": label, "group_commit": group, "batches": cycles, "windows": windows,
                              "step": ledger.step, "elapsed_s": time.perf_counter() - started,
                              "max_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024}  # fmt: skip
    data = Path(ledger.store.root)
    result["store_bytes"] = _dir_bytes(data)
    result["bytes_per_batch"] = result["store_bytes"] / max(1, cycles)
    claims_before = {step: ledger.claims[step] for step in range(ledger.step)}
    ledger.store.close()
    wall = time.perf_counter()
    again = history_ledger(run_dir)
    result["restart_s"] = time.perf_counter() - wall
    result["restart_rss_mb"] = _rss_mb()
    missing = [b for b in acknowledged if b not in again.batches]
    judged = [b for b in acknowledged[-200:] if again.batches[b].verdicts is None]
    claims_after = {step: again.claims[step] for step in range(again.step)}
    result["restart_check"] = {
        "acknowledged": len(acknowledged), "missing": len(missing), "unjudged_of_last_200": len(judged),
        "stored": len(again.batches), "claims_equal": claims_after == claims_before, "step": again.step,
    }  # fmt: skip
    print(f"[{label}] restart {result['restart_s']:.2f} s: {result['restart_check']}", flush=True)
    return result


def report() -> None:
    runs = {p.stem.removeprefix("soak_"): json.loads(p.read_text()) for p in sorted(RESULTS.glob("soak_*.json"))}
    lines = ["# Soak: request cost, memory, restart and disk as history grows (benchmarks/soak.py)", ""]
    lines.append(f"Machine: {platform.machine()}, {os.cpu_count()} cores shared with other processes (five other "
                 "engineers' jobs ran meanwhile), load average at report time "
                 f"{' '.join(f'{x:.1f}' for x in os.getloadavg())}. Wall times include time lost to them.")  # fmt: skip
    lines.append("")
    for label, run in runs.items():
        lines += [f"## {label} ({'group commit' if run['group_commit'] else 'synchronous=FULL, an fsync per commit'})", ""]
        lines.append(f"{run['batches']:,} judged batches in {run['elapsed_s']:.0f} s; step {run['step']}; "
                     f"store {run['store_bytes'] / 2**20:.1f} MiB = {run['bytes_per_batch'] / 1024:.1f} KiB per batch "
                     f"(8 samples); restart {run['restart_s']:.2f} s; max RSS {run['max_rss_mb']:.0f} MB.")  # fmt: skip
        lines.append(f"Restart check: {run['restart_check']}")
        lines.append("")
        names = sorted({name for w in run["windows"] for name in w["requests"]})
        lines.append("| batches | cycles/s wall | cycles/CPU s | RSS MB | " + " | ".join(f"{n} p50/p99 (cpu) ms" for n in names) + " |")
        lines.append("|" + "---|" * (4 + len(names)))
        for w in run["windows"]:
            cells = []
            for n in names:
                r = w["requests"].get(n)
                cells.append(f"{r['p50_ms']:.2f}/{r['p99_ms']:.2f} ({r['cpu_ms']:.2f})" if r else "-")
            lines.append(f"| {w['batches']:,} | {w['cycles_per_wall_s']:.0f} | {w['cycles_per_cpu_s']:.0f} | {w['rss_mb']:.0f} | " + " | ".join(cells) + " |")
        lines.append("")
        first, last = run["windows"][0], run["windows"][-1]
        if len(run["windows"]) > 1:
            lines.append(f"Last window ({last['batches']:,} batches) against the first ({first['batches']:,}), per request type: "
                         "p99 ratio / CPU-per-request ratio:")  # fmt: skip
            lines.append("")
            for n in names:
                a, b = first["requests"].get(n), last["requests"].get(n)
                if a and b:
                    lines.append(f"- {n}: p99 x{b['p99_ms'] / a['p99_ms']:.2f}, CPU x{b['cpu_ms'] / a['cpu_ms']:.2f}")
            lines.append(f"- RSS: {first['rss_mb']:.0f} -> {last['rss_mb']:.0f} MB (x{last['rss_mb'] / first['rss_mb']:.2f})")
            lines.append("")
    (RESULTS / "soak.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--seconds", type=float, default=600.0, help="wall-clock bound of the history phase")
    parser.add_argument("--label", default="new", help="name of this code version in the results")
    parser.add_argument("--report", action="store_true", help="write soak.md from the soak_*.json results")
    parser.add_argument("--keep", action="store_true", help="keep the run directory")
    parser.add_argument("--fill", default="", help="comma-separated: then add this many settled batches directly, "
                        "a timed window after each (group-commit code only)")  # fmt: skip
    args = parser.parse_args()
    if args.report:
        report()
        return
    run_dir = Path(tempfile.mkdtemp(prefix=f"soak-{args.label}-"))
    try:
        fills = tuple(int(n) for n in args.fill.split(",") if n)
        result = child(run_dir, args.seconds, args.label, fills)
    finally:
        if not args.keep:
            shutil.rmtree(run_dir, ignore_errors=True)
    RESULTS.mkdir(parents=True, exist_ok=True)
    (RESULTS / f"soak_{args.label}.json").write_text(json.dumps(result, indent=1) + "\n")


if __name__ == "__main__":
    main()
