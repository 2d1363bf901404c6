"""Disk a real `prime-rl run` takes in its run directory, sampled while it runs and after it ends.

Runs ``python -m prime_rl.cli run`` on the test suite's tiny model (``tests/support/tiny_lm.py``)
with the sources under ``--src`` first on ``PYTHONPATH`` (so the same script measures ``main`` and a
branch), samples the run directory's bytes once a second (each inode counted once: hard links are
one copy) and prints one JSON object: peak and final bytes, the peak in policy files, the policy
file's size, the trainer's policy versions at the end, bytes per folder at the end (a folder's
hard links to files elsewhere count in both), exit code and wall time.

    python benchmarks/run_disk.py --src /path/to/checkout --steps 6 --keep 2 --work /tmp/x

Results: ``benchmarks/results/run_disk.md``.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import socket
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def _bytes(root: Path) -> int:
    seen: set[tuple[int, int]] = set()
    total = 0
    for directory, _, files in os.walk(root):
        for name in files:
            try:
                info = os.lstat(os.path.join(directory, name))
            except OSError:
                continue
            if (info.st_dev, info.st_ino) not in seen:
                seen.add((info.st_dev, info.st_ino))
                total += info.st_size
    return total


def _ports(count: int) -> list[int]:
    sockets = [socket.socket() for _ in range(count)]
    for s in sockets:
        s.bind(("127.0.0.1", 0))
    ports = [s.getsockname()[1] for s in sockets]
    for s in sockets:
        s.close()
    return ports


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--src", required=True, help="checkout whose packages/*/src are imported")
    parser.add_argument("--work", required=True, help="scratch folder (deleted first)")
    parser.add_argument("--steps", type=int, default=6)
    parser.add_argument("--keep", type=int, default=2, help="shardcast.keep_versions")
    parser.add_argument("--timeout", type=float, default=900.0)
    args = parser.parse_args()
    work = Path(args.work)
    shutil.rmtree(work, ignore_errors=True)
    work.mkdir(parents=True)
    sys.path.insert(0, str(ROOT / "tests" / "support"))
    from tiny_lm import save_tiny_lm  # type: ignore[import-not-found]

    model = save_tiny_lm(work / "model")
    policy_bytes = sum(f.stat().st_size for f in Path(model).glob("*.safetensors"))
    orchestrator, origin, relay = _ports(3)
    run_dir = work / "run"
    config = f"""run_dir = "{run_dir}"
[model]
path = "{model}"
dtype = "float32"
[tasks]
num_tasks = 64
digits = 1
seed = 0
[sampling]
group_size = 4
temperature = 1.0
max_new_tokens = 4
[orchestrator]
port = {orchestrator}
async_level = 1
prompts_per_batch = 2
task_timeout_s = 60.0
release_after_tokens = 16
[shardcast]
origin_port = {origin}
relay_ports = [{relay}]
keep_versions = {args.keep}
[trainer]
total_steps = {args.steps}
samples_per_step = 16
filter_zero_advantage = false
[workers]
count = 2
hostile = []
[evaluator]
enabled = false
"""
    (work / "run.toml").write_text(config)
    src = Path(args.src)
    env = dict(os.environ, PYTHONPATH=":".join(str(p) for p in sorted((src / "packages").glob("*/src"))))
    env.update(OMP_WAIT_POLICY="PASSIVE", TOKENIZERS_PARALLELISM="false")
    started = time.monotonic()
    process = subprocess.Popen(
        [sys.executable, "-m", "prime_rl.cli", "run", "--config", str(work / "run.toml")],
        cwd=work, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )  # fmt: skip
    peak = 0
    while process.poll() is None and time.monotonic() - started < args.timeout:
        peak = max(peak, _bytes(run_dir) if run_dir.exists() else 0)
        time.sleep(1.0)
    if process.poll() is None:
        process.terminate()
        process.wait(60)
    final = _bytes(run_dir)
    by_dir = {entry.name: _bytes(entry) for entry in sorted(run_dir.iterdir()) if entry.is_dir()}
    shardcast = run_dir / "shardcast"
    by_dir |= {f"shardcast/{e.name}": _bytes(e) for e in sorted(shardcast.iterdir())} if shardcast.is_dir() else {}
    versions = sorted(p.name for p in (run_dir / "policies").glob("v*"))
    print(json.dumps({
        "src": str(src), "steps": args.steps, "keep_versions": args.keep, "exit_code": process.returncode,
        "wall_s": round(time.monotonic() - started, 1), "policy_bytes": policy_bytes, "peak_bytes": peak,
        "peak_policy_files": round(peak / policy_bytes, 1), "final_bytes": final,
        "final_policy_files": round(final / policy_bytes, 1), "trainer_versions_at_end": versions,
        "final_by_dir": by_dir,
    }))  # fmt: skip


if __name__ == "__main__":
    main()
