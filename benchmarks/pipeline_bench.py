"""What asynchrony buys: the same number of policy steps with async_level 0, 1 and 2.

Runs the whole pipeline (`prime-rl run`: orchestrator, shardcast origin + relay, trainer, validator,
2 honest workers) on the tiny random Llama of tests/support (CPU), once per async level and
repeat, and reads the run's metrics files:

- wall-clock from the trainer process's start to its last commit (the supervisor's own start-up
  of the other processes is excluded: it is the same for every level);
- trainer waiting for data: sum of the trainer's `batch.waited_s` (idle until enough accepted samples);
- workers waiting for weights: sum over workers of `weights_wait.waited_s` (blocked until the policy
  version `step - async_level` arrives through shardcast);
- worker idle: per worker, the wall-clock minus its generation time (`rollouts.generate_s`), averaged
  over workers -- all the time a worker is not generating (waiting for weights, for a lease the
  orchestrator cannot issue yet, or for HTTP round trips).

With async_level 0 every step is strictly sequential (generate -> validate -> train -> broadcast ->
reload); with 1 or 2, workers generate step s+1 with an older policy while the trainer computes step s.
The tiny model has random weights, so rewards are all 0: the zero-advantage filter is switched off
here (the trainer still runs forward and backward on every sample).

    OMP_WAIT_POLICY=PASSIVE .venv/bin/python benchmarks/pipeline_bench.py --steps 6 --repeats 2
"""

from __future__ import annotations

import argparse
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests" / "support"))

from tiny_lm import save_tiny_lm  # noqa: E402

from prime_rl.metrics import read_metrics  # noqa: E402


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def run_once(
    model_dir: Path, run_dir: Path, async_level: int, steps: int, timeout_s: float
) -> dict[str, float]:
    overrides = {
        "run_dir": str(run_dir),
        "model.path": str(model_dir),
        "orchestrator.async_level": str(async_level),
        "orchestrator.port": str(free_port()),
        "shardcast.origin_port": str(free_port()),
        "shardcast.relay_ports": f"[{free_port()}]",
        "trainer.total_steps": str(steps),
        "trainer.filter_zero_advantage": "false",
        "trainer.checkpoint_every": str(steps),
        "workers.count": "2",
        "workers.hostile": "[]",
        "evaluator.enabled": "false",
    }
    argv = [sys.executable, "-m", "prime_rl.cli", "run", "--config", str(ROOT / "configs" / "tiny-cpu.toml")]
    for key, value in overrides.items():
        argv += [f"--{key}", value]
    env = dict(os.environ, OMP_WAIT_POLICY="PASSIVE", TOKENIZERS_PARALLELISM="false")
    started = time.time()
    done = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=timeout_s)
    if done.returncode != 0:
        raise RuntimeError(
            f"async_level {async_level}: run failed ({done.returncode}); logs in {run_dir}/logs"
        )
    metrics = run_dir / "metrics"
    trainer = list(read_metrics(metrics / "trainer.jsonl"))
    commits = [r["time"] for r in trainer if r.get("event") == "commit"]
    trainer_started = min(r["time"] for r in trainer if r.get("event") == "start")
    worker_wait = 0.0
    idle = []
    end = max(commits)
    for path in sorted(metrics.glob("worker-*.jsonl")):
        records = list(read_metrics(path))
        worker_wait += sum(r.get("waited_s", 0.0) for r in records if r.get("event") == "weights_wait")
        busy = sum(
            r.get("generate_s", 0.0)
            for r in records
            if r.get("event") == "rollouts" and trainer_started <= r["time"] <= end
        )
        idle.append(end - trainer_started - busy)
    trainer_wait = sum(r.get("waited_s", 0.0) for r in trainer if r.get("event") == "batch")
    return {
        "wall_s": max(commits) - trainer_started,
        "total_s": time.time() - started,
        "trainer_wait_s": trainer_wait,
        "worker_wait_s": worker_wait,
        "worker_idle_s": sum(idle) / max(len(idle), 1),
        "steps": float(len(commits)),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--steps", type=int, default=6, help="policy steps per run")
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--levels", type=int, nargs="+", default=[0, 1, 2])
    parser.add_argument("--timeout", type=float, default=900.0, help="seconds per run")
    parser.add_argument("--hidden", type=int, default=256, help="hidden size of the tiny Llama")
    parser.add_argument("--layers", type=int, default=4, help="layers of the tiny Llama")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="pipeline-bench-") as tmp:
        model_dir = save_tiny_lm(Path(tmp) / "tiny-lm", hidden_size=args.hidden, num_layers=args.layers)
        results: dict[int, list[dict[str, float]]] = {level: [] for level in args.levels}
        for repeat in range(args.repeats):
            for level in args.levels:  # interleaved so machine noise hits every level alike
                result = run_once(
                    model_dir, Path(tmp) / f"run-a{level}-r{repeat}", level, args.steps, args.timeout
                )
                results[level].append(result)
                print(
                    f"# async {level} repeat {repeat}: "
                    + ", ".join(f"{k} {v:.1f}" for k, v in result.items())
                )
    print(
        f"\npipeline: {args.steps} policy steps, tiny Llama (hidden {args.hidden}, {args.layers} layers, CPU), "
        f"2 honest workers, {args.repeats} repeats"
    )
    print(
        "| async_level | wall-clock s (min / median) | trainer waiting for data s | "
        "workers waiting for weights s | worker idle s (mean per worker) |"
    )
    print("|---|---|---|---|---|")
    for level, runs in results.items():
        wall = [r["wall_s"] for r in runs]
        print(
            f"| {level} | {min(wall):.1f} / {statistics.median(wall):.1f} | "
            f"{statistics.median(r['trainer_wait_s'] for r in runs):.1f} | "
            f"{statistics.median(r['worker_wait_s'] for r in runs):.1f} | "
            f"{statistics.median(r['worker_idle_s'] for r in runs):.1f} |"
        )
    print("(waiting/idle columns: medians over repeats)")


if __name__ == "__main__":
    main()
