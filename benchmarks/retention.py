"""Retention: the disk and memory a run's history costs per sample, built through the real code path.

Each configuration runs in a process of its own, driving a ``Ledger`` (as ``soak.py`` does: the
HTTP layer's cost does not depend on history) in a closed loop with the store at
``synchronous=FULL`` (an fsync per commit, the store's default):

  - 64 identities take turns: ``lease`` (backpressure on), ``submit`` (a real batch: 2 prompts x 4
    samples, 128 prompt + 384 completion tokens, toploc proofs of 258 B per 32 tokens, inference
    log-probs, fsynced). Token ids are drawn uniformly from a 151,936-token vocabulary (Qwen's) and
    log-probs uniformly from [-8, 0]: both compress worse than real text and real log-probs, so the
    bytes per sample are an upper bound for samples of this length;
  - the validator: ``pending``, ``record_verdicts`` (one recomputed log-prob per completion token;
    about one batch in 67 rejected);
  - the trainer: ``claim`` (128 samples) and ``commit`` whenever a step's samples are there.

Every ``EVERY`` cycles it records the orchestrator's RSS (after ``gc.collect`` and ``malloc_trim``,
so the allocator's free lists do not hide a trend) and the bytes of its data dir
(``state.sqlite`` with its ``-wal``, ``batches/``, ``record/``). Per sample: the slope of a least-
squares line through the second half of those points (the first half warms up: SQLite's free
pages, the record's lag); per million samples: that slope times 10^6, an extrapolation from the
measured range (stated as such in the results). At the end a restart (a fresh ``Ledger`` on the
same store) is timed and checked: every acknowledged batch, verdict and claim is there, read
through the store's audit calls (the record included).

Configurations: ``main`` (today's code: ``--main DIR``, a checkout whose ``packages/*/src`` go first
on ``PYTHONPATH``), ``record`` (this tree, the default: trained samples' log-probs dropped) and
``record_keep`` (``orchestrator.keep_claimed_logprobs = true``).

Run: ``python benchmarks/retention.py --cycles 1200 --main /work/main``; writes
``benchmarks/results/retention.json`` and ``retention.md``.
"""

from __future__ import annotations

import argparse
import base64
import contextlib
import ctypes
import gc
import hashlib
import json
import os
import platform
import random
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from history_ledger import COMPLETION, GROUP, PROMPT, PROMPTS, history_ledger  # benchmarks/

IDENTITIES = 64
VOCAB = 151_936
EVERY = 50
SAMPLES_PER_BATCH = GROUP * PROMPTS
ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "benchmarks" / "results"
CONFIGS = {
    "main": [],
    "record": [],
    "record_keep": ["--orchestrator.keep_claimed_logprobs", "true"],
}


def _rss_mb() -> float:
    gc.collect()
    with contextlib.suppress(OSError):
        ctypes.CDLL("libc.so.6").malloc_trim(0)
    with open("/proc/self/statm") as handle:
        return int(handle.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 2**20


def _bytes(path: Path) -> int:
    return sum(p.stat().st_size for p in path.rglob("*") if p.is_file()) if path.exists() else 0


def _disk(data: Path) -> dict[str, int]:
    sqlite = sum(p.stat().st_size for p in data.glob("state.sqlite*") if p.is_file())
    return {"sqlite": sqlite, "payload": _bytes(data / "batches"), "record": _bytes(data / "record")}


def child(run_dir: Path, cycles: int, extra: list[str]) -> dict[str, Any]:
    """Build ``cycles`` batches of history through the ledger; the points, commit times and the restart."""
    from prime_rl.api.protocol import (
        ClaimRequest,
        CommitRequest,
        RolloutBatch,
        RolloutSample,
        Verdict,
        VerdictRequest,
    )

    ledger = history_ledger(run_dir, *extra)
    data = Path(ledger.store.root)
    workers = [ledger.workers[ledger.register(f"id{i}").worker_id] for i in range(IDENTITIES)]
    points: list[dict[str, Any]] = []
    commits: list[float] = []
    rejected = 0
    rng = random.Random(0)
    started = time.perf_counter()
    for number in range(cycles):
        worker = workers[number % IDENTITIES]
        lease = ledger.lease(worker, None, None)
        prompt_of = {task.task_id: [rng.randrange(VOCAB) for _ in range(PROMPT)] for task in lease.tasks}
        samples = [
            RolloutSample(
                task_id=task.task_id, group_index=g, prompt_tokens=prompt_of[task.task_id],
                completion_tokens=[rng.randrange(VOCAB) for _ in range(COMPLETION)], sampling_seed=seed,
                temperature=1.0, reward=float(g % 2), advantage=0.5 - g % 2,
                proofs=base64.b64encode(rng.randbytes(258 * (COMPLETION // 32))).decode(),
                inference_logprobs=[rng.uniform(-8.0, 0.0) for _ in range(COMPLETION)],
            )
            for task in lease.tasks
            for g, seed in enumerate(task.sampling_seeds)
        ]  # fmt: skip
        batch = RolloutBatch(
            worker_id=lease.worker_id, step=lease.step, batch_index=lease.batch_index,
            policy_version=lease.step, samples=samples,
        )  # fmt: skip
        body = batch.model_dump_json().encode()
        answer = ledger.submit(worker, batch, hashlib.sha256(body).hexdigest())
        ledger.pending(1)
        accept = number % 67 != 5  # about 1 in 67, a different identity each time (coprime with 64)
        rejected += not accept
        verdicts = [
            Verdict(sample_index=i, accepted=accept, reason="ok" if accept else "toploc_mismatch",
                    reward=s.reward if accept else 0.0, advantage=s.advantage if accept else 0.0,
                    logprobs=[lp + rng.uniform(-1e-3, 1e-3) for lp in s.inference_logprobs] if accept else [])
            for i, s in enumerate(samples)
        ]  # fmt: skip
        ledger.record_verdicts(VerdictRequest(batch_id=answer.batch_id, verdicts=verdicts))
        if ledger.claim(ClaimRequest(step=ledger.step, min_samples=128)).ready:
            wall = time.perf_counter()
            ledger.commit(CommitRequest(step=ledger.step, policy_version=ledger.step + 1))
            commits.append(time.perf_counter() - wall)
        if (number + 1) % EVERY == 0:
            points.append({"batches": number + 1, "samples": (number + 1) * SAMPLES_PER_BATCH, "rss_mb": _rss_mb(),
                           **_disk(data), "elapsed_s": time.perf_counter() - started})  # fmt: skip
    step = ledger.step
    ledger.store.close()
    wall = time.perf_counter()
    again = history_ledger(run_dir, *extra)
    restart_s = time.perf_counter() - wall
    records = again.store.batch_records()
    verdicts_stored = again.store.all_verdicts()
    check = {
        "batches": len(records) == cycles and len({r.meta.batch_id for r in records}) == cycles,
        "verdicts": len(verdicts_stored) == cycles,
        "claims": again.store.claim_steps() == list(range(step)),
        "step": again.step == step,
    }
    ordered = sorted(commits)
    return {
        "cycles": cycles, "samples": cycles * SAMPLES_PER_BATCH, "rejected_batches": rejected, "step": step,
        "points": points, "elapsed_s": time.perf_counter() - started, "restart_s": restart_s, "restart_check": check,
        "commit_p50_ms": 1e3 * statistics.median(ordered) if ordered else 0.0,
        "commit_p99_ms": 1e3 * ordered[min(len(ordered) - 1, int(0.99 * len(ordered)))] if ordered else 0.0,
        "record_files": len(list((data / "record").glob("*.parquet"))),
        "payload_files_left": len([p for p in (data / "batches").iterdir() if p.suffix in (".arrow", ".parquet")]),
    }  # fmt: skip


def _slope(points: list[dict[str, Any]], key: str | Callable[[dict[str, Any]], float]) -> float:
    """Least-squares slope of ``key`` per sample over the second half of ``points``."""
    half = points[len(points) // 2 :]
    xs = [p["samples"] for p in half]
    ys = [float(key(p)) if callable(key) else float(p[key]) for p in half]
    mean_x, mean_y = statistics.fmean(xs), statistics.fmean(ys)
    return sum((x - mean_x) * (y - mean_y) for x, y in zip(xs, ys, strict=True)) / sum((x - mean_x) ** 2 for x in xs)


def summarize(run: dict[str, Any]) -> dict[str, float]:
    points = run["points"]
    total = lambda p: p["sqlite"] + p["payload"] + p["record"]  # noqa: E731
    per_sample = _slope(points, total)
    return {
        "disk_bytes_per_sample": per_sample,
        "sqlite_bytes_per_sample": _slope(points, "sqlite"),
        "payload_bytes_per_sample": _slope(points, "payload"),
        "record_bytes_per_sample": _slope(points, "record"),
        "disk_gib_per_million": per_sample * 1e6 / 2**30,
        "rss_mb_per_million": _slope(points, "rss_mb") * 1e6,
        "rss_mb_end": points[-1]["rss_mb"],
        "rss_mb_half": points[len(points) // 2]["rss_mb"],
        "cycles_per_s": run["cycles"] / run["elapsed_s"],
    }


def report(results: dict[str, Any]) -> str:
    runs = results["runs"]
    lines = [
        "# Retention: disk and memory per sample of history",
        "",
        f"`benchmarks/retention.py --cycles {results['cycles']}` on {results['machine']}, {results['date']}. "
        "The machine was shared (other helpers' tests and benchmarks were running): the per-sample slopes "
        "are byte counts and do not depend on load; cycles per second and commit times do.",
        "",
        "Each configuration built its history through the real code path in a process of its own: 64 identities "
        "lease (backpressure on) and submit real parquet batches (8 samples of 128 prompt + 384 completion tokens, "
        "toploc proofs, inference log-probs; token ids uniform over a 151,936-token vocabulary and log-probs uniform "
        "in [-8, 0], which compress worse than real ones: an upper bound), the validator judges each (recomputed log-probs; 1 batch in 67 "
        "rejected), the trainer claims 128 samples and commits; `synchronous=FULL`. `main` is today's code "
        f"({results['main_commit']}); `record` is this branch (settled steps compacted into `record/step_<S>.parquet`, "
        "trained samples' log-probs dropped); `record_keep` is this branch with `keep_claimed_logprobs = true`.",
        "",
        "Per sample: the slope of a least-squares line through the second half of the points taken every "
        f"{EVERY} batches (bytes of `state.sqlite` with its `-wal`, `batches/`, `record/`; RSS). **Per million samples is "
        "an extrapolation** of that slope from the measured range ("
        + ", ".join(f"{run['label']}: {run['samples']:,} samples" for run in runs)
        + "), not a run of a million samples.",
        "",
        "| config | disk per sample | of it SQLite | payload files | record files | disk per million samples | RSS slope per million samples (extrapolated) | RSS at half / end | cycles/s | commit p50 / p99 | restart | restart check |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for run in runs:
        s = run["summary"]
        check = "all there" if all(run["restart_check"].values()) else f"FAILED {run['restart_check']}"
        lines.append(
            f"| {run['label']} | {s['disk_bytes_per_sample'] / 1024:.2f} KiB | {s['sqlite_bytes_per_sample'] / 1024:.2f} KiB | "
            f"{s['payload_bytes_per_sample'] / 1024:.2f} KiB | {s['record_bytes_per_sample'] / 1024:.2f} KiB | "
            f"{s['disk_gib_per_million']:.2f} GiB | {s['rss_mb_per_million']:+.1f} MB | {s['rss_mb_half']:.0f} / {s['rss_mb_end']:.0f} MB | "
            f"{s['cycles_per_s']:.1f} | {run['commit_p50_ms']:.1f} / {run['commit_p99_ms']:.1f} ms | {run['restart_s']:.2f} s | {check} |"
        )  # fmt: skip
    by = {run["label"]: run["summary"] for run in runs}
    if "main" in by and "record" in by:
        lines += [
            "",
            f"Against today's code, in the same run: the record takes {by['record']['disk_bytes_per_sample'] / by['main']['disk_bytes_per_sample']:.2f}x "
            f"the disk per sample ({by['record']['disk_gib_per_million']:.2f} GiB against {by['main']['disk_gib_per_million']:.2f} GiB per million samples); "
            f"keeping the trained samples' per-token data, {by['record_keep']['disk_gib_per_million']:.2f} GiB."
            if "record_keep" in by else "",
        ]  # fmt: skip
    lines += [
        "",
        "Memory: the orchestrator holds open work only (issue #44 item 1), in every configuration here, today's "
        "code included. Over these short ranges RSS still warms up (SQLite's page cache, pyarrow's memory pool, "
        "the lease book up to its first fold), and a straight line through the second half, extrapolated to a "
        "million samples, gives the column above: an extrapolation of warm-up, not a cost per sample. The long "
        "range is in `soak.md` (same orchestrator state, 64 identities): 179 MB at 1,000 judged batches, 189 MB at "
        "13,382 and 193 MB at 1,004,022 (8 samples each), about 4 MB over 7.9 million samples once warm. The "
        "orchestrator holds nothing of the record in memory: it is written from the store at a commit and read "
        "back only for a lookup of a compacted batch.",
        "",
        "Commit: the compaction runs inside the trainer's commit, under the server's lock (one step's settled "
        "batches: their payload files read, one record file written and fsynced, one transaction, the payload "
        "files deleted); the commit times above include it, on a shared machine. "
        + (f"The `record` runs used commit {results['record_commit']}." if results.get("record_commit") else ""),
        "",
        *(
            [
                f"Commit check (`--commit-check {results['commit_check']['cycles']}`, after the record runs, on this tree "
                f"with payloads read by `ParquetFile.read`; load average {results['commit_check']['load']:.1f}): "
                + "; ".join(
                    f"{r['label']}: commit p50 {r['commit_p50_ms']:.1f} ms, p99 {r['commit_p99_ms']:.1f} ms over {r['step']} steps"
                    for r in results["commit_check"]["runs"]
                )
                + ".",
                "",
            ]
            if results.get("commit_check")
            else []
        ),
        "Restart check: after the run, a fresh `Ledger` on the same store; every acknowledged batch (its metadata "
        "and task ids, through `batch_records`, the record included), every verdict (`all_verdicts`) and every "
        "step's claim is there.",
        "",
        "Per run: "
        + "; ".join(
            f"{run['label']}: {run['cycles']:,} batches, {run['step']} steps, {run['record_files']} record files, "
            f"{run['payload_files_left']} payload files left"
            for run in runs
        )
        + ".",
    ]
    return "\n".join(lines) + "\n"


def _run(label: str, tree: Path, cycles: int) -> dict[str, Any]:
    """One configuration in a process of its own, with ``tree``'s packages first on the path."""
    env = {**os.environ, "PYTHONPATH": ":".join(str(p) for p in sorted(Path(tree).glob("packages/*/src")))}
    run_dir = Path(tempfile.mkdtemp(prefix=f"retention-{label}-"))
    try:
        out = subprocess.run(
            [sys.executable, __file__, "--child", label, "--run-dir", str(run_dir), "--cycles", str(cycles)],
            env=env, check=True, capture_output=True, text=True, timeout=3600,
        )  # fmt: skip
    finally:
        shutil.rmtree(run_dir, ignore_errors=True)
    return {"label": label, **json.loads(out.stdout.strip().splitlines()[-1])}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--cycles", type=int, default=1200)
    parser.add_argument("--main", type=Path, default=None, help="a checkout of today's code (runs the 'main' config)")
    parser.add_argument("--child", choices=sorted(CONFIGS))
    parser.add_argument("--run-dir", type=Path)
    parser.add_argument("--report", action="store_true", help="rewrite retention.md from retention.json")
    parser.add_argument(
        "--commit-check", type=int, default=0, help="only: N cycles of main and record, commit times into retention.json"
    )
    args = parser.parse_args()
    if args.report:
        results = json.loads((RESULTS / "retention.json").read_text())
        for run in results["runs"]:
            run["summary"] = summarize(run)
        (RESULTS / "retention.json").write_text(json.dumps(results, indent=1) + "\n")
        (RESULTS / "retention.md").write_text(report(results))
        return
    if args.child:
        print(json.dumps(child(args.run_dir, args.cycles, CONFIGS[args.child])))
        return
    if args.commit_check:
        results = json.loads((RESULTS / "retention.json").read_text())
        check = {"cycles": args.commit_check, "load": os.getloadavg()[0], "runs": []}
        for label in ("main", "record") if args.main is not None else ("record",):
            run = _run(label, args.main if label == "main" else ROOT, args.commit_check)
            check["runs"].append({k: run[k] for k in ("label", "commit_p50_ms", "commit_p99_ms", "step")})
        results["commit_check"] = check
        (RESULTS / "retention.json").write_text(json.dumps(results, indent=1) + "\n")
        (RESULTS / "retention.md").write_text(report(results))
        return
    runs = []
    for label in CONFIGS:
        if label == "main" and args.main is None:
            continue
        run = _run(label, args.main if label == "main" else ROOT, args.cycles)
        run["summary"] = summarize(run)
        print(label, json.dumps(run["summary"]), flush=True)
        runs.append(run)
    main_commit = ""
    if args.main is not None:
        main_commit = subprocess.run(
            ["git", "-C", str(args.main), "log", "-1", "--format=%h"], capture_output=True, text=True
        ).stdout.strip()
    results = {
        "cycles": args.cycles, "machine": f"{platform.machine()}, {os.cpu_count()} cores (shared)",
        "date": time.strftime("%Y-%m-%d"), "main_commit": main_commit, "runs": runs,
        "record_commit": subprocess.run(
            ["git", "-C", str(ROOT), "log", "-1", "--format=%h"], capture_output=True, text=True
        ).stdout.strip(),
    }  # fmt: skip
    RESULTS.mkdir(parents=True, exist_ok=True)
    (RESULTS / "retention.json").write_text(json.dumps(results, indent=1) + "\n")
    (RESULTS / "retention.md").write_text(report(results))


if __name__ == "__main__":
    main()
