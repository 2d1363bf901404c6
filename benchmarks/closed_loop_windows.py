"""The closed loop's measurements (``closed_loop.py``): quantiles, per-window figures of a long
run (``--window-s``), and what is sampled from ``/proc`` and the run folder while it runs."""

from __future__ import annotations

import contextlib
import itertools
import math
import os
import statistics
import time
from pathlib import Path
from typing import Any

from swarm_checks import read_jsonl  # benchmarks/


def cpu_seconds(pid: int) -> float:
    """User + system CPU seconds of process ``pid`` (all its threads), from ``/proc``."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def quantiles(values: list[float]) -> dict[str, float | int | None]:
    if not values:
        return {"n": 0, "p50_ms": None, "p99_ms": None}
    ordered = sorted(values)
    return {"n": len(ordered), "p50_ms": round(1000 * ordered[len(ordered) // 2], 2),
            "p99_ms": round(1000 * ordered[min(len(ordered) - 1, int(0.99 * len(ordered)))], 2)}  # fmt: skip


def buckets(events: list[tuple[float, Any]], begin: float, width: float, count: int) -> list[list[Any]]:
    """``events`` (time, value) split into ``count`` windows of ``width`` seconds from ``begin``."""
    buckets: list[list[Any]] = [[] for _ in range(count)]
    for at, value in events:
        index = int((at - begin) // width)
        if 0 <= index < count:
            buckets[index].append(value)
    return buckets


def windowed(events: list[tuple[float, float]], begin: float, width: float, count: int) -> list[dict[str, Any]]:
    return [quantiles(bucket) for bucket in buckets(events, begin, width, count)]


def rss_mb(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return 0.0


def disk_bytes(root: Path) -> int:
    """Bytes of the run folder's files; one deleted while it is walked (a payload the record replaced)
    counts as gone."""
    total = 0
    for path in (root / "run").rglob("*"):
        with contextlib.suppress(FileNotFoundError):
            total += path.stat().st_size if path.is_file() else 0
    return total


def clients_cpu_seconds(load_pid: int) -> float:
    """CPU seconds of the clients so far: the load process and this one (the validator and trainer)."""
    return cpu_seconds(load_pid) + sum(os.times()[:2])


def sample_windows(pid: int, load_pid: int, root: Path, begin: float, end: float, width: float) -> list[dict[str, float]]:
    """At the end of each window of ``width`` seconds (none when ``width`` is 0): the orchestrator's
    CPU seconds so far and the clients' (``cpu_s``, ``clients_cpu_s``; the first sample is the
    start's), its RSS and the run folder's bytes on disk. Waits until ``end``."""
    if width <= 0:
        time.sleep(max(0.0, end - time.time()))
        return []
    samples: list[dict[str, float]] = [{"cpu_s": cpu_seconds(pid), "clients_cpu_s": clients_cpu_seconds(load_pid)}]
    for index in range(math.ceil((end - begin) / width)):
        time.sleep(max(0.0, min(end, begin + (index + 1) * width) - time.time()))
        samples.append({"cpu_s": cpu_seconds(pid), "clients_cpu_s": clients_cpu_seconds(load_pid),
                        "rss_mb": round(rss_mb(pid), 1), "disk_bytes": disk_bytes(root)})  # fmt: skip
    return samples


def window_rows(load: dict[str, Any], samples: list[dict[str, float]], times: dict[str, list[tuple[float, float]]],
                server: list[dict[str, float]], waiting: list[tuple[float, int]], begin: float, width: float,
                count: int) -> list[dict[str, Any]]:  # fmt: skip
    """One row per window: cycles per wall second, the orchestrator's and the clients' CPU per cycle,
    the swarm's and the trusted roles' p50/p99, the load process's loop lag, the server's phases
    (``server_windows``), the median of the batches awaiting verdicts that the validator's listings
    reported (``waiting``: time, count), RSS, disk bytes per acknowledged batch so far."""
    trusted = {name: windowed(values, begin, width, count) for name, values in times.items()}
    queue = [statistics.median(bucket) if bucket else None for bucket in buckets(waiting, begin, width, count)]
    rows, total, judged = [], 0, 0
    for index, (before, sample) in enumerate(itertools.pairwise(samples)):
        submitted = load["submitted"][index]
        total += submitted
        cpu, clients = sample["cpu_s"] - before["cpu_s"], sample["clients_cpu_s"] - before["clients_cpu_s"]
        judged += int(trusted["POST /validator/verdicts"][index]["n"] or 0)
        rows.append({
            "window": index, "batches_acknowledged": total, "batches_judged": judged, "cycles_per_wall_s": round(submitted / width, 1),
            "cpu_ms_per_cycle": round(1000 * cpu / max(1, submitted), 2),
            # the clients share the other CPUs: when they are busy, what they measure includes their own wait
            "clients_cpu_ms_per_cycle": round(1000 * clients / max(1, submitted), 2),
            "clients_cpus_busy": round(clients / width / max(1, (os.cpu_count() or 2) - 1), 3),
            "tasks": load["tasks"][index], "rollouts": load["rollouts"][index],
            "trusted_p99_ms": {name: windows[index]["p99_ms"] for name, windows in trusted.items()},
            "load_loop_lag": load["loop_lag"][index], "server_p99_ms": server[index], "awaiting_verdicts": queue[index],
            "rss_mb": sample["rss_mb"], "disk_bytes": sample["disk_bytes"],
            "disk_bytes_per_batch": round(sample["disk_bytes"] / max(1, total)),
        })  # fmt: skip
    return rows


def server_windows(run_dir: Path, begin: float, width: float, count: int) -> list[dict[str, float]]:
    """Per window, server side: each phase's worst p99 (ms) over the orchestrator's 10 s
    ``trusted_phases`` records logged in it (the loop's lag, gc pauses, each call's time on the
    ledger thread, the trusted calls' waits), so that a slower answer can be traced to its phase."""
    events = [(r["time"], r["calls"]) for path in sorted((run_dir / "metrics").glob("orchestrator*.jsonl"))
              for r in read_jsonl(path) if r.get("event") == "trusted_phases"]  # fmt: skip
    rows = []
    for bucket in buckets(events, begin, width, count):
        worst: dict[str, float] = {}
        for calls in bucket:
            for name, figures in calls.items():
                worst[name] = max(worst.get(name, 0.0), figures["p99_ms"])
        rows.append(dict(sorted(worst.items())))
    return rows
