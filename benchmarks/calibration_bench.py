"""Honest-noise calibration times of the demo model: fresh, cached, and for a new environment.

    python benchmarks/calibration_bench.py --repeats 2 --baseline /path/to/other/checkout
        -> benchmarks/results/calibration.md (+ calibration.json)

Each case is one ``prime-rl calibrate-noise`` process (process start, model load, the measurement
or the cache read, the file written) on ``configs/tiny-cpu.toml`` with the HF decode
(``--workers.backend hf``: what a validator measures at start), in a cache folder of its own:

  * ``fresh``: an empty cache: the full measurement (``validator.calibration_tokens`` = 1,024);
  * ``cached``: the same run again;
  * ``new environment``: another task set and prompt template (``--tasks.source arithmetic``,
    ``--tasks.ops ["*"]``, another template) on the same model, after ``fresh`` filled the cache;
  * ``self-check``: the 256-token measurement a validator makes at start when the run's profile
    was measured under another calibration key (``validator.self_check_tokens``).

``--baseline DIR`` runs the same cases (but the self-check, which it lacks) with another checkout's
packages (e.g. the main branch) in the same session, for the comparison. min and median over
``--repeats``.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
CONFIG = REPO / "configs" / "tiny-cpu.toml"
NEW_ENV = [
    "--tasks.source", "arithmetic", "--tasks.ops", '["*"]', "--tasks.digits", "2",
    "--tasks.prompt_template", "Compute: {prompt}\nResult:",
]  # fmt: skip


def pythonpath(checkout: Path) -> str:
    return os.pathsep.join(str(p) for p in sorted((checkout / "packages").glob("*/src")))


def calibrate(checkout: Path, cache: Path, run_dir: Path, *extra: str) -> float:
    """Seconds of one ``prime-rl calibrate-noise`` process (raises if it fails)."""
    env = dict(os.environ, PYTHONPATH=pythonpath(checkout), PRIME_RL_NOISE_CACHE=str(cache),
               OMP_WAIT_POLICY="PASSIVE", TOKENIZERS_PARALLELISM="false")  # fmt: skip
    argv = [sys.executable, "-m", "prime_rl.cli", "calibrate-noise", "--config", str(CONFIG),
            "--run_dir", str(run_dir), "--workers.backend", "hf", *extra]  # fmt: skip
    started = time.monotonic()
    done = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=1800, check=False)
    seconds = time.monotonic() - started
    if done.returncode != 0:
        raise RuntimeError(f"calibrate-noise failed ({done.returncode}): {done.stdout[-2000:]}{done.stderr[-2000:]}")
    return seconds


def cases(checkout: Path, work: Path, repeats: int, self_check: bool = True) -> dict[str, list[float]]:
    times: dict[str, list[float]] = {"fresh": [], "cached": [], "new environment": []}
    if self_check:
        times["self-check"] = []
    for repeat in range(repeats):
        cache = work / f"cache-{repeat}"
        shutil.rmtree(cache, ignore_errors=True)
        run = work / f"run-{repeat}"
        times["fresh"].append(calibrate(checkout, cache, run / "a"))
        times["cached"].append(calibrate(checkout, cache, run / "b"))
        times["new environment"].append(calibrate(checkout, cache, run / "c", *NEW_ENV))
        if self_check:
            times["self-check"].append(
                calibrate(checkout, work / f"check-cache-{repeat}", run / "d", "--validator.calibration_tokens", "256")
            )
        print(json.dumps({"checkout": str(checkout), "repeat": repeat, **{k: v[-1] for k, v in times.items()}}))
    return times


def table(rows: dict[str, dict[str, list[float]]]) -> list[str]:
    lines = ["| code | case | min s | median s | runs |", "|---|---|---|---|---|"]
    for name, times in rows.items():
        for case, values in times.items():
            lines.append(
                f"| {name} | {case} | {min(values):.1f} | {statistics.median(values):.1f} | "
                + ", ".join(f"{v:.1f}" for v in values)
                + " |"
            )
    return lines


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--baseline", default="", help="another checkout to time in the same session (e.g. main)")
    parser.add_argument("--out", default=str(REPO / "benchmarks" / "results" / "calibration"))
    args = parser.parse_args()
    work = Path(tempfile.mkdtemp(prefix="calibration-bench-"))
    try:
        rows = {"this branch": cases(REPO, work / "branch", args.repeats)}
        if args.baseline:
            rows["baseline"] = cases(Path(args.baseline), work / "baseline", args.repeats, self_check=False)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    out = Path(args.out)
    out.with_suffix(".json").write_text(json.dumps(rows, indent=1) + "\n")
    print("\n".join(table(rows)))
    print(f"machine: {platform.machine()}, {os.cpu_count()} CPUs")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
