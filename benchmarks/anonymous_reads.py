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

"old" is the code of commit ``OLD_COMMIT`` (extracted with ``git archive`` into a temporary
folder); "new" is this working tree. Both run in the same invocation, on the same machine.

Run: ``.venv/bin/python benchmarks/anonymous_reads.py`` (about 2 minutes). Writes
``benchmarks/results/anonymous_reads.{json,md}``.
"""

from __future__ import annotations

import argparse
import hashlib
import http.client
import json
import os
import platform
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
    with OrchestratorServer(config, tasks) as server:
        print(server.url, flush=True)
        sys.stdin.read()


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

    return {"n": len(ordered), "p50_ms": at(0.5), "p90_ms": at(0.9), "p99_ms": at(0.99), "max_ms": round(ordered[-1], 2)}


def _measure(label: str, source: Path, work: Path) -> dict[str, Any]:
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
        quiet = _status_latencies(url, QUIET_S)
        outs = [work / f"{label}-load-{i}.json" for i in range(CLIENTS)]
        clients = [
            subprocess.Popen([sys.executable, me, "--load", url, str(LOADED_S + 2), str(out)], env=env) for out in outs
        ]
        time.sleep(1.0)  # the clients are looping
        loaded = _status_latencies(url, LOADED_S)
        for client in clients:
            client.wait(LOADED_S + 60)
        loads = [json.loads(out.read_text()) for out in outs]
    finally:
        if server.stdin is not None:
            server.stdin.close()
        server.wait(30)
    calls = sum(load["workers_calls"] for load in loads)
    return {
        "quiet": _percentiles(quiet),
        "loaded": _percentiles(loaded)
        | {
            "load_requests": sum(load["requests"] for load in loads),
            "workers_mean_bytes": round(sum(load["workers_bytes"] for load in loads) / max(1, calls)),
            "workers_mean_ms": round(1000 * sum(load["workers_s"] for load in loads) / max(1, calls), 1),
        },
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--serve", type=Path)
    parser.add_argument("--load", nargs=3)
    args = parser.parse_args()
    if args.serve:
        return _serve(args.serve)
    if args.load:
        return _load(args.load[0], float(args.load[1]), Path(args.load[2]))
    results: dict[str, Any] = {
        "workers": WORKERS, "clients": CLIENTS, "quiet_s": QUIET_S, "loaded_s": LOADED_S, "old_commit": OLD_COMMIT,
        "machine": f"{platform.processor() or platform.machine()}, {os.cpu_count()} CPUs (shared)",
        "load_average_before": [round(x, 1) for x in os.getloadavg()],
    }  # fmt: skip
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        old = work / "old"
        old.mkdir()
        archive = subprocess.run(["git", "-C", str(ROOT), "archive", OLD_COMMIT, "packages"], check=True, capture_output=True)
        subprocess.run(["tar", "-x", "-C", str(old)], input=archive.stdout, check=True)
        for label, source in (("old", old), ("new", ROOT)):
            results[label] = _measure(label, source, work)
            print(label, json.dumps(results[label]), flush=True)
    results["load_average_after"] = [round(x, 1) for x in os.getloadavg()]
    out = ROOT / "benchmarks" / "results"
    (out / "anonymous_reads.json").write_text(json.dumps(results, indent=2) + "\n")
    lines = [
        f"# Anonymous reads: /status latency, {WORKERS:,} workers, {CLIENTS} clients looping every anonymous endpoint",
        "",
        f"Machine: {results['machine']}, load average (1, 5, 15 min) {results['load_average_before']} before, "
        f"{results['load_average_after']} after. old = {OLD_COMMIT}, new = this tree. "
        "Written by benchmarks/anonymous_reads.py.",
        "",
        "| code | phase | /status p50 ms | p90 ms | p99 ms | max ms | n | load requests | /workers bytes | /workers ms |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for label in ("old", "new"):
        for phase in ("quiet", "loaded"):
            r = results[label][phase]
            lines.append(
                f"| {label} | {phase} | {r['p50_ms']} | {r['p90_ms']} | {r['p99_ms']} | {r['max_ms']} | {r['n']} | "
                f"{r.get('load_requests', '')} | {r.get('workers_mean_bytes', '')} | {r.get('workers_mean_ms', '')} |"
            )
    (out / "anonymous_reads.md").write_text("\n".join(lines) + "\n")


if __name__ == "__main__":
    main()
