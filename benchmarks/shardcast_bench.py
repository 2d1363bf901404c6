"""Benchmark: shardcast vs the reference shardcast 0.3.2 vs the limit, on loopback.

Topology (both systems): origin -> 2 relays -> N clients (default 8), one random file
(default 1 GiB), every node a separate OS process. Clients get both relays as servers and
start as soon as a relay lists the version. Reported per system:

- publish: seconds to shard, hash and list the file on the origin;
- first / all done: seconds from the start of publish until the first / last *successful*
  client has the verified file at its destination (end to end through both relay hops);
- peak RSS (MB, VmHWM) of the origin (max of server and publisher), largest relay, largest client.

"limit" rows: a plain read of the file (page cache); one `curl` of the whole file from a
sendfile server to disk (one copy, no sharding, hashing or relaying); and N+2 concurrent
curls (one copy per relay and client, the disk-write floor of the whole topology).

The reference is pip-installed into a temporary venv (needs PyPI, `wget`; it pulls `blake3`).
Its clients need the `data1.bin` probe file on every server, provisioned here as its
README requires; a reference client that dies at start-up (probe race on the shared
/tmp/dummy.bin, a known defect) is restarted, like prime-rl's supervisor loop would, and the
restarts are reported.

`--compression` instead measures zstd and XOR-delta sizes on a real safetensors checkpoint
(random Llama, bf16) after one AdamW step (needs torch + transformers).

`--memory` instead publishes one bf16 state dict of `--size` bytes both ways in one run: from
memory (`publish_tensors`: written once, as shards) and through a file (`save_file` +
`publish_file`: written twice), and prints time, bytes written, disk used and peak memory.

    OMP_WAIT_POLICY=PASSIVE python benchmarks/shardcast_bench.py --size 1GiB --repeat 1
    python benchmarks/shardcast_bench.py --compression
    python benchmarks/shardcast_bench.py --memory --size 1GiB --repeat 5
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import tempfile
from pathlib import Path

# The parts live next to this script (it is run as a script, so its folder is on sys.path):
# shardcast_procs.py (process plumbing), shardcast_systems.py (ours, reference, limits),
# shardcast_compression.py (--compression), shardcast_memory.py (--memory). This file parses the
# CLI and prints the table.
from shardcast_compression import main_compression
from shardcast_memory import main_memory
from shardcast_procs import Run
from shardcast_systems import REF_VERSION, reference_venv, run_limits, run_ours, run_reference

os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")


def parse_size(text: str) -> int:
    units = {
        "kib": 2**10,
        "mib": 2**20,
        "gib": 2**30,
        "kb": 10**3,
        "mb": 10**6,
        "gb": 10**9,
        "k": 10**3,
        "m": 10**6,
        "g": 10**9,
    }
    low = text.lower()
    for unit in sorted(units, key=len, reverse=True):
        if low.endswith(unit):
            return int(float(low[: -len(unit)]) * units[unit])
    return int(low)


def fmt(values: list[float]) -> str:
    clean = [v for v in values if v == v]
    if not clean:
        return "n/a"
    return f"{min(clean):.2f}/{statistics.median(clean):.2f}" if len(clean) > 1 else f"{clean[0]:.2f}"


def write_random_file(path: Path, size: int) -> None:
    with open(path, "wb") as handle:
        remaining = size
        while remaining:
            chunk = os.urandom(min(remaining, 8 << 20))
            handle.write(chunk)
            remaining -= len(chunk)


def main_transfer(args: argparse.Namespace) -> None:
    base = Path(args.workdir or tempfile.mkdtemp(prefix="shardcast-bench-"))
    base.mkdir(parents=True, exist_ok=True)
    source = base / "model.bin"
    write_random_file(source, args.size)
    results: dict[str, list[Run]] = {"ours": [], f"reference {REF_VERSION}": []}
    limits: list[tuple[float, float, float]] = []
    venv = None if args.skip_reference else reference_venv(base)
    try:
        for repeat in range(args.repeat):
            for name, runner in (
                ("limit", None),
                ("ours", run_ours),
                (f"reference {REF_VERSION}", run_reference),
            ):
                work = base / f"{name.split()[0]}{repeat}"
                work.mkdir()
                if runner is None:
                    limits.append(run_limits(work, source, args.clients + 2))
                elif runner is run_ours:
                    results[name].append(run_ours(work, source, args.clients, args.shard_size, args.timeout))
                elif venv is not None:
                    results[name].append(
                        run_reference(venv, work, source, args.clients, args.shard_size, args.timeout)
                    )
                if not os.environ.get("SHARDCAST_BENCH_LOGS"):
                    shutil.rmtree(work, ignore_errors=True)
    finally:
        if not args.workdir and not os.environ.get("SHARDCAST_BENCH_LOGS"):
            shutil.rmtree(base, ignore_errors=True)
    print(
        f"\nshardcast benchmark: {args.size / 2**20:.0f} MiB file, {args.shard_size / 1e6:g} MB shards, origin -> 2 relays -> "
        f"{args.clients} clients, loopback, {os.cpu_count()} CPUs, {args.repeat} repeat(s), times as min/median\n"
    )
    header = (
        f"{'system':<22}{'publish s':>11}{'first done s':>14}{'all done s':>12}"
        f"{'origin MB':>11}{'relay MB':>10}{'client MB':>11}  ok"
    )
    print(header)
    print("-" * len(header))
    print(f"{'limit: plain read':<22}{'':>11}{fmt([r for r, _, _ in limits]):>14}")
    print(f"{'limit: 1 curl to disk':<22}{'':>11}{fmt([c for _, c, _ in limits]):>14}")
    print(
        f"{f'limit: {args.clients + 2} curls to disk':<22}{'':>11}{'':>14}{fmt([m for _, _, m in limits]):>12}"
    )
    for name, runs in results.items():
        if not runs:
            print(
                f"{name:<22}  not run ({'skipped' if args.skip_reference else 'could not install or run; see stderr'})"
            )
            continue
        rss = {k: max(r.rss_mb.get(k, float("nan")) for r in runs) for k in ("origin", "relay", "client")}
        notes = "; ".join(r.note for r in runs if r.note)
        print(
            f"{name:<22}{fmt([r.publish_s for r in runs]):>11}{fmt([r.first_s for r in runs]):>14}"
            f"{fmt([r.all_s for r in runs]):>12}{rss['origin']:>11.0f}{rss['relay']:>10.0f}{rss['client']:>11.0f}"
            f"  {all(r.ok for r in runs)}{'  (' + notes + ')' if notes else ''}"
        )
    print(
        f"\n1-min load average at end: {os.getloadavg()[0]:.1f} on {os.cpu_count()} CPUs (shared machine: timings are noisy)"
    )


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--size", type=parse_size, default=2**30, help="file size (default 1GiB)")
    parser.add_argument("--clients", type=int, default=8)
    parser.add_argument(
        "--shard-size", type=parse_size, default=50_000_000, help="shard size, both systems (default 50MB)"
    )
    parser.add_argument("--repeat", type=int, default=1)
    parser.add_argument("--timeout", type=float, default=900.0, help="per-run limit in seconds")
    parser.add_argument(
        "--workdir", default=None, help="where files go (default: a temp dir on disk, removed after)"
    )
    parser.add_argument("--skip-reference", action="store_true")
    parser.add_argument(
        "--compression", action="store_true", help="measure zstd/delta on a safetensors checkpoint"
    )
    parser.add_argument(
        "--memory", action="store_true", help="publish a state dict from memory vs through a file"
    )
    parser.add_argument(
        "--hidden", type=int, default=512, help="--compression: model hidden size (default 512)"
    )
    parser.add_argument("--layers", type=int, default=8, help="--compression: model layers (default 8)")
    args = parser.parse_args()
    if args.compression:
        main_compression(args)
    elif args.memory:
        main_memory(args)
    else:
        main_transfer(args)


if __name__ == "__main__":
    main()
