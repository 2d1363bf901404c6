"""`shardcast_bench.py --memory`: publishing a state dict from memory vs writing it to a file first.

Both paths publish the same bf16 state dict (random, seeded) into an origin data directory:

- file:   ``safetensors.torch.save_file(state, path)`` then ``shardcast.publish_file(dir, path)``
          (what a trainer does without the in-memory path: the checkpoint is written twice);
- memory: ``shardcast.publish_tensors(dir, state)`` (written once, as shards).

Each run is a fresh process (so peak memory is comparable), alternating file/memory for each
repeat. Reported per path: seconds until the version is listed, seconds including ``os.sync()``
(until the bytes are on the disk, not only in the page cache), CPU seconds of the publishing
process (user + system, all threads: the robust figure on a shared machine), bytes handed to ``write()``
(``wchar`` of /proc/self/io), disk used afterwards, and peak RSS above the state dict itself
(VmHWM after resetting it through /proc/self/clear_refs). Both must produce the same
``file_digest``: clients receive the same bytes either way.

Needs torch and safetensors (imported only when this mode runs).
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

TENSOR_ELEMENTS = 4096 * 4096  # 32 MiB per bf16 tensor, about a 7B model's attention matrix


def _proc_field(path: str, key: str) -> int:
    for line in Path(path).read_text().splitlines():
        if line.startswith(key):
            return int(line.split()[1])
    raise RuntimeError(f"no {key} in {path}")


def _cpu_seconds() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def _disk_bytes(root: Path) -> int:
    return sum(p.stat().st_size for p in root.rglob("*") if p.is_file())


def child(kind: str, size: int, shard_size: int, work: Path) -> dict[str, object]:
    """One publish in this process; returns its measurements."""
    import torch
    from safetensors.torch import save_file

    from shardcast import publish_file, publish_tensors

    generator = torch.Generator().manual_seed(0)
    state = {}
    remaining = size // 2
    while remaining > 0:
        count = min(TENSOR_ELEMENTS, remaining)
        state[f"layers.{len(state)}.weight"] = torch.randn(count, generator=generator).to(torch.bfloat16)
        remaining -= count
    Path("/proc/self/clear_refs").write_text("5")  # reset VmHWM to the current RSS
    rss_before = _proc_field("/proc/self/status", "VmRSS:")
    written_before = _proc_field("/proc/self/io", "wchar:")
    cpu_before = _cpu_seconds()
    started = time.perf_counter()
    if kind == "file":
        path = work / "model.safetensors"
        save_file(state, path)
        manifest = publish_file(work / "origin", path, shard_size=shard_size)
    else:
        manifest = publish_tensors(work / "origin", state, shard_size=shard_size)
    published = time.perf_counter() - started
    cpu = _cpu_seconds() - cpu_before
    os.sync()
    synced = time.perf_counter() - started
    return {
        "kind": kind,
        "file_size": manifest.file_size,
        "publish_s": published,
        "synced_s": synced,
        "cpu_s": cpu,
        "written_mb": (_proc_field("/proc/self/io", "wchar:") - written_before) / 1e6,
        "disk_mb": _disk_bytes(work) / 1e6,
        "peak_extra_mb": (_proc_field("/proc/self/status", "VmHWM:") - rss_before) / 1024,
        "file_digest": manifest.file_digest,
    }


def main_memory(args: argparse.Namespace) -> None:
    """Alternate file and memory publishes in fresh processes; print one table."""
    base = Path(args.workdir or tempfile.mkdtemp(prefix="shardcast-memory-"))
    base.mkdir(parents=True, exist_ok=True)
    runs: dict[str, list[dict]] = {"file": [], "memory": []}
    try:
        for repeat in range(args.repeat):
            for kind in ("file", "memory"):
                work = base / f"{kind}{repeat}"
                work.mkdir()
                out = subprocess.run(
                    [sys.executable, __file__, kind, str(args.size), str(args.shard_size), str(work)],
                    check=True,
                    capture_output=True,
                    text=True,
                )
                runs[kind].append(json.loads(out.stdout.splitlines()[-1]))
                shutil.rmtree(work, ignore_errors=True)
    finally:
        if not args.workdir:
            shutil.rmtree(base, ignore_errors=True)
    digests = {r["file_digest"] for rs in runs.values() for r in rs}
    file_size = runs["file"][0]["file_size"]
    print(
        f"\nshardcast publish from memory vs file: {file_size / 2**20:.0f} MiB bf16 state dict "
        f"({-(-args.size // (2 * TENSOR_ELEMENTS))} tensors), {args.shard_size / 1e6:g} MB shards, "
        f"{args.repeat} repeat(s) each in fresh processes, {os.cpu_count()} CPUs; times min/median\n"
    )
    header = f"{'path':<40}{'publish s':>12}{'+ sync s':>12}{'CPU s':>12}{'written MB':>12}{'disk MB':>10}{'peak extra MB':>15}"
    print(header)
    print("-" * len(header))
    labels = {
        "file": "file: save_file + publish_file",
        "memory": "memory: publish_tensors",
    }
    for kind, label in labels.items():
        rs = runs[kind]

        def cell(key: str, rs: list[dict] = rs) -> str:
            values = [r[key] for r in rs]
            return (
                f"{min(values):.2f}/{statistics.median(values):.2f}"
                if len(values) > 1
                else f"{values[0]:.2f}"
            )

        print(
            f"{label:<40}{cell('publish_s'):>12}{cell('synced_s'):>12}{cell('cpu_s'):>12}"
            f"{max(r['written_mb'] for r in rs):>12.0f}{max(r['disk_mb'] for r in rs):>10.0f}"
            f"{max(r['peak_extra_mb'] for r in rs):>15.0f}"
        )
    print(
        f"\nsame file_digest on every run (clients receive the same bytes): {len(digests) == 1}; "
        f"1-min load average at end: {os.getloadavg()[0]:.1f}"
    )


if __name__ == "__main__":
    kind, size, shard_size, work = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), Path(sys.argv[4])
    print(json.dumps(child(kind, size, shard_size, work)))
