"""Anonymous reads against a crowded orchestrator: ``/status`` latency while 4 clients loop every
anonymous endpoint (issue 34, item 5; acceptance: ``/status`` p99 under 20 ms).

Setup, per code version, each in its own processes: an orchestrator (``OrchestratorServer`` on
loopback) whose store holds ``WORKERS`` registered identities (the register events written in
one transaction, then replayed, as a restart would), no batches. Then:

1. ``quiet``: one client asks ``GET /status`` for ``QUIET_S`` seconds, sequentially, alone;
2. ``loaded``: the same while ``CLIENTS`` client processes loop, as fast as answers come,
   over every endpoint that needs no token: ``GET /health``, ``GET /status``, ``GET /workers``
   (as each version serves it by default), ``GET /workers?order=accepted&limit=200`` and
   ``POST /workers/register`` (refused at once by the per-network rate limit after its burst).

Reported per phase: ``/status`` latency percentiles (ms), and for ``loaded`` the requests the
load clients completed, the mean ``/workers`` answer size and latency.

"old" is the code of commit ``--old`` (default ``OLD_COMMIT``, extracted with ``git archive`` into
a temporary folder); "new" is this working tree. Both run in the same invocation, on the same
machine, ``--repeats`` times, alternating old and new (on a shared machine the load of others
moves the tail more than the code does: compare medians of the same run, and read the load
average it records).

Run: ``.venv/bin/python benchmarks/anonymous_reads.py`` (about 2 minutes). Writes
``benchmarks/results/<--out>.{json,md}`` (default ``anonymous_reads``). The A/B of the garbage
collector fix (frozen loaded heap, untracked snapshot rows):
``--old 829a86d --repeats 3 --quiet-s 3 --loaded-s 10 --out anonymous_reads_gc``.
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import hashlib
import http.client
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

OLD_COMMIT = "9c6e37c"
WORKERS = 10_000
CLIENTS = 4
QUIET_S = 5.0
LOADED_S = 20.0
ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("toploc", "shardcast", "grpo", "verifiers", "prime_rl")


def _serve(run_dir: Path) -> None:
    """Child: fill a store with ``WORKERS`` registrations, serve it, print the URL, wait for stdin EOF."""
    from prime_rl.config import load_config
    from prime_rl.orchestrator.server import OrchestratorServer
    from prime_rl.orchestrator.store import RolloutStore
    from prime_rl.tasks import TaskSet

    config = load_config(None, ["--run_dir", str(run_dir), "--orchestrator.port", "0"])
    store = RolloutStore(config.orchestrator_data_dir)
    now = time.time()
    store.append_events(
        [
            {
                "event": "register",
                "worker_id": f"w{i:04d}",
                "name": f"sybil-{i}",
                "number": i,
                "token_sha256": hashlib.sha256(f"token{i}".encode()).hexdigest(),
                "time": now,
            }
            for i in range(WORKERS)
        ]
    )
    store.close()
    tasks = TaskSet([{"prompt": f"{i} + {i} = ?", "answer": str(2 * i)} for i in range(64)])
    profile = _ServerProfile()
    with OrchestratorServer(config, tasks) as server:
        assert server._loop is not None
        watcher = asyncio.run_coroutine_threadsafe(profile.watch_loop(), server._loop)
        profile.phase("quiet")  # what came before (the store's replay, start-up) is not served time
        print(server.url, flush=True)
        for line in sys.stdin:  # one line per phase the parent starts; EOF ends
            profile.phase(line.strip())
        watcher.cancel()
    profile.phase("")
    (run_dir / "profile.json").write_text(json.dumps(profile.phases))


class _ServerProfile:
    """In the server process, per phase: garbage collections (wall and CPU ms of the thread that
    ran them, by generation), event-loop lag (how late a 2 ms timer fires) and the process's CPU
    seconds against wall seconds. A collection whose wall time is far above its CPU time, or a
    process using much less than a core while clients wait, was held off the CPU by the machine
    (other processes), not by its own work."""

    def __init__(self) -> None:
        self.phases: dict[str, Any] = {}
        self._name, self._started, self._cpu = "startup", time.monotonic(), sum(os.times()[:2])
        self._gcs: list[tuple[int, float, float]] = []
        self._lags: list[float] = []
        self._gc_at = (0.0, 0.0)
        gc.callbacks.append(self._on_gc)

    def _on_gc(self, phase: str, info: dict[str, Any]) -> None:
        if phase == "start":
            self._gc_at = (time.perf_counter(), time.thread_time())
        else:
            wall, cpu = self._gc_at
            self._gcs.append(
                (info["generation"], 1000 * (time.perf_counter() - wall), 1000 * (time.thread_time() - cpu))
            )

    async def watch_loop(self) -> None:
        while True:
            started = time.perf_counter()
            await asyncio.sleep(0.002)
            self._lags.append(1000 * (time.perf_counter() - started) - 2.0)

    def phase(self, name: str) -> None:
        """Close the current phase's record and start ``name``'s."""
        now, cpu = time.monotonic(), sum(os.times()[:2])
        full = [(wall, cpu_ms) for generation, wall, cpu_ms in self._gcs if generation == 2]
        lags = sorted(self._lags)
        self.phases[self._name] = {
            "wall_s": round(now - self._started, 2),
            "cpu_s": round(cpu - self._cpu, 2),
            "collections": len(self._gcs),
            "full_collections": len(full),
            "full_collection_wall_ms_max": round(max((w for w, _ in full), default=0.0), 2),
            "full_collection_cpu_ms_max": round(max((c for _, c in full), default=0.0), 2),
            "collection_wall_ms_sum": round(sum(w for _, w, _ in self._gcs), 1),
            "collection_cpu_ms_sum": round(sum(c for _, _, c in self._gcs), 1),
            "loop_lag_ms_p99": round(lags[int(0.99 * len(lags))], 2) if lags else None,
            "loop_lag_ms_max": round(lags[-1], 2) if lags else None,
        }
        self._name, self._started, self._cpu = name, now, cpu
        self._gcs, self._lags = [], []


def _load(url: str, seconds: float, out: Path) -> None:
    """Child: loop over the anonymous endpoints for ``seconds``; write counts and /workers stats."""
    host, port = url.removeprefix("http://").split(":")
    connection = http.client.HTTPConnection(host, int(port), timeout=30)
    calls = [
        ("GET", "/health", None),
        ("GET", "/status", None),
        ("GET", "/workers", None),
        ("GET", "/workers?order=accepted&limit=200", None),
        ("POST", "/workers/register", b'{"name": "flood"}'),
    ]
    done, workers_bytes, workers_s, workers_calls = 0, 0, 0.0, 0
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        for method, path, body in calls:
            started = time.monotonic()
            headers = {"Content-Type": "application/json"} if body else {}
            connection.request(method, path, body=body, headers=headers)
            payload = connection.getresponse().read()
            if path.startswith("/workers") and method == "GET":
                workers_bytes += len(payload)
                workers_s += time.monotonic() - started
                workers_calls += 1
            done += 1
    out.write_text(json.dumps({"requests": done, "workers_calls": workers_calls,
                               "workers_bytes": workers_bytes, "workers_s": workers_s}))  # fmt: skip


def _status_latencies(url: str, seconds: float) -> list[float]:
    host, port = url.removeprefix("http://").split(":")
    connection = http.client.HTTPConnection(host, int(port), timeout=30)
    latencies = []
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        started = time.perf_counter()
        connection.request("GET", "/status")
        connection.getresponse().read()
        latencies.append((time.perf_counter() - started) * 1000)
    return latencies


def _percentiles(values: list[float]) -> dict[str, float]:
    ordered = sorted(values)

    def at(q: float) -> float:
        return round(ordered[min(len(ordered) - 1, int(q * len(ordered)))], 2)

    return {
        "n": len(ordered),
        "p50_ms": at(0.5),
        "p90_ms": at(0.9),
        "p99_ms": at(0.99),
        "max_ms": round(ordered[-1], 2),
    }


def _measure(label: str, source: Path, work: Path, quiet_s: float, loaded_s: float) -> dict[str, Any]:
    env = os.environ | {"PYTHONPATH": os.pathsep.join(str(source / "packages" / p / "src") for p in PACKAGES)}
    me = str(Path(__file__).resolve())
    server = subprocess.Popen(
        [sys.executable, me, "--serve", str(work / label)], stdin=subprocess.PIPE, stdout=subprocess.PIPE, env=env,
        text=True,
    )  # fmt: skip
    try:
        assert server.stdout is not None
        url = server.stdout.readline().strip()
        if not url.startswith("http://"):
            raise RuntimeError(f"{label}: the orchestrator did not start")
        quiet = _status_latencies(url, quiet_s)
        assert server.stdin is not None
        server.stdin.write("loaded\n")
        server.stdin.flush()
        outs = [work / f"{label}-load-{i}.json" for i in range(CLIENTS)]
        clients = [
            subprocess.Popen([sys.executable, me, "--load", url, str(loaded_s + 2), str(out)], env=env)
            for out in outs
        ]
        time.sleep(1.0)  # the clients are looping
        loaded = _status_latencies(url, loaded_s)
        for client in clients:
            client.wait(loaded_s + 60)
        loads = [json.loads(out.read_text()) for out in outs]
    finally:
        if server.stdin is not None:
            server.stdin.close()
        server.wait(30)
    calls = sum(load["workers_calls"] for load in loads)
    profile = json.loads((work / label / "profile.json").read_text())
    return {
        "quiet": _percentiles(quiet) | {"server": profile["quiet"]},
        "loaded": _percentiles(loaded)
        | {
            "server": profile["loaded"],
            "load_requests": sum(load["requests"] for load in loads),
            "workers_mean_bytes": round(sum(load["workers_bytes"] for load in loads) / max(1, calls)),
            "workers_mean_ms": round(1000 * sum(load["workers_s"] for load in loads) / max(1, calls), 1),
        },
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--serve", type=Path)
    parser.add_argument("--load", nargs=3)
    parser.add_argument("--old", default=OLD_COMMIT, help="the commit measured as 'old'")
    parser.add_argument("--repeats", type=int, default=1, help="old/new pairs, alternating")
    parser.add_argument("--quiet-s", type=float, default=QUIET_S)
    parser.add_argument("--loaded-s", type=float, default=LOADED_S)
    parser.add_argument("--out", default="anonymous_reads", help="results file stem")
    args = parser.parse_args()
    if args.serve:
        return _serve(args.serve)
    if args.load:
        return _load(args.load[0], float(args.load[1]), Path(args.load[2]))
    results: dict[str, Any] = {
        "workers": WORKERS, "clients": CLIENTS, "quiet_s": args.quiet_s, "loaded_s": args.loaded_s,
        "old_commit": args.old, "repeats": args.repeats,
        "machine": f"{platform.processor() or platform.machine()}, {os.cpu_count()} CPUs (shared)",
        "load_average_before": [round(x, 1) for x in os.getloadavg()], "runs": [],
    }  # fmt: skip
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        old = work / "old"
        old.mkdir()
        archive = subprocess.run(
            ["git", "-C", str(ROOT), "archive", args.old, "packages"], check=True, capture_output=True
        )
        subprocess.run(["tar", "-x", "-C", str(old)], input=archive.stdout, check=True)
        for repeat in range(args.repeats):
            order = (("old", old), ("new", ROOT)) if repeat % 2 == 0 else (("new", ROOT), ("old", old))
            for label, source in order:
                run = {
                    "code": label,
                    "repeat": repeat,
                    "load_average": [round(x, 1) for x in os.getloadavg()],
                }
                run |= _measure(f"{label}{repeat}", source, work, args.quiet_s, args.loaded_s)
                results["runs"].append(run)
                print(json.dumps(run), flush=True)
    results["load_average_after"] = [round(x, 1) for x in os.getloadavg()]
    results["summary"] = {
        f"{label} {phase}": {
            stat: {"min": min(values), "median": statistics.median(values), "max": max(values)}
            for stat in ("p50_ms", "p99_ms", "max_ms")
            if (values := [run[phase][stat] for run in results["runs"] if run["code"] == label])
        }
        for label in ("old", "new")
        for phase in ("quiet", "loaded")
    }
    out = ROOT / "benchmarks" / "results"
    (out / f"{args.out}.json").write_text(json.dumps(results, indent=2) + "\n")
    lines = [
        f"# Anonymous reads: /status latency, {WORKERS:,} workers, {CLIENTS} clients looping every anonymous endpoint",
        "",
        f"Machine: {results['machine']}, load average (1, 5, 15 min) {results['load_average_before']} before, "
        f"{results['load_average_after']} after. old = {args.old}, new = this tree; {args.repeats} run(s) of each, "
        f"alternating; {args.quiet_s:g} s quiet, {args.loaded_s:g} s loaded per run. "
        f"Written by `benchmarks/anonymous_reads.py{' '.join(['', *sys.argv[1:]])}`.",
        "",
        "| code | run | load avg (1 min) | phase | /status p50 ms | p90 ms | p99 ms | max ms | n | load requests | /workers bytes | /workers ms |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for run in results["runs"]:
        for phase in ("quiet", "loaded"):
            r = run[phase]
            lines.append(
                f"| {run['code']} | {run['repeat']} | {run['load_average'][0]} | {phase} | {r['p50_ms']} | {r['p90_ms']} | "
                f"{r['p99_ms']} | {r['max_ms']} | {r['n']} | {r.get('load_requests', '')} | "
                f"{r.get('workers_mean_bytes', '')} | {r.get('workers_mean_ms', '')} |"
            )
    lines += [
        "",
        "| code | phase | p99 ms min | p99 ms median | p99 ms max | p50 ms median |",
        "|---|---|---|---|---|---|",
    ]
    for key, stats in results["summary"].items():
        if stats:
            p99 = stats["p99_ms"]
            lines.append(
                f"| {key.replace(' ', ' | ')} | {p99['min']} | {p99['median']} | {p99['max']} | {stats['p50_ms']['median']} |"
            )
    lines += [
        "",
        "Inside the server process (``_ServerProfile``): CPU seconds it used over wall seconds, garbage "
        "collections (full ones: the longest, wall and CPU ms), event-loop lag of a 2 ms timer.",
        "",
        "| code | run | phase | server CPU s / wall s | collections | full | longest full: wall ms | CPU ms | "
        "all collections: wall ms | CPU ms | loop lag p99 ms | max ms |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for run in results["runs"]:
        for phase in ("quiet", "loaded"):
            p = run[phase]["server"]
            lines.append(
                f"| {run['code']} | {run['repeat']} | {phase} | {p['cpu_s']} / {p['wall_s']} | {p['collections']} | "
                f"{p['full_collections']} | {p['full_collection_wall_ms_max']} | {p['full_collection_cpu_ms_max']} | "
                f"{p['collection_wall_ms_sum']} | {p['collection_cpu_ms_sum']} | {p['loop_lag_ms_p99']} | "
                f"{p['loop_lag_ms_max']} |"
            )
    (out / f"{args.out}.md").write_text("\n".join(lines) + "\n")


if __name__ == "__main__":
    main()
