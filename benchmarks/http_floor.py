"""The HTTP floor: what a request that does no work costs a server process, against a lease cycle.

Issue 44 asks for 1,000 durable lease cycles per wall-clock second from one orchestrator process
on one core: 1 ms of that core per cycle, every request of the cycle included. This measures the
part no change to the orchestrator's own work can remove, on the same machine and in one run:

  - ``bare GET``: aiohttp's ``web.Application`` (what the orchestrator is built on) answering
    ``{"ok": true}`` to a GET, with no middleware and no access log;
  - ``bare POST 59 KB``: the same server reading a body of a closed-loop batch's size (8 samples of
    128 + 384 tokens) and discarding it;
  - ``orchestrator GET /health``: the real ``prime-rl orchestrator`` (``closed_loop.py``'s run: durable, backpressure on),
    whose ``/health`` goes through its middleware and route table and makes no ledger call.

Each server is a process of its own, pinned to the machine's last CPU (as ``closed_loop.py`` pins
the orchestrator); the load is this process on the other CPUs: ``--connections`` coroutines on
keep-alive connections, each sending its next request when its answer arrived. For ``--seconds``
after ``--warmup-s`` it counts the answers and the server process's CPU seconds (``/proc``), so
the figure is CPU per request, which does not depend on how fast the load can ask.

``--cycle-json`` (a ``closed_loop.py`` result) turns it into a floor per cycle: the requests that
run made per acknowledged batch, each at its floor, against that run's CPU per cycle. A GET
(``/tasks``, ``/validator/pending``) is priced at ``orchestrator GET /health``; a POST
(``/rollouts``, the validator's verdicts, the trainer's claim and commit) at ``bare POST 59 KB`` plus
what the orchestrator's middleware and routing add to a GET (``/health`` minus ``bare GET``): an
upper bound, since only ``/rollouts`` carries a body that large.

Run: ``OMP_WAIT_POLICY=PASSIVE .venv/bin/python benchmarks/http_floor.py --repeats 3
--cycle-json benchmarks/results/closed_loop_packed_ab.json --json benchmarks/results/http_floor.json``
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import secrets
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from closed_loop import _start_orchestrator, start_pinned, stop_pinned, write_config  # benchmarks/
from closed_loop_windows import cpu_seconds  # benchmarks/

from prime_rl.launch.local import free_port

BODY_BYTES = 59_370  # closed_loop.py's batch as JSON: 8 samples of 128 prompt and 384 completion tokens

BARE_SERVER = """
import sys
from aiohttp import web

async def ok(request):
    return web.json_response({"ok": True})

async def sink(request):
    body = await request.read()
    return web.json_response({"bytes": len(body)})

app = web.Application(client_max_size=1 << 24)
app.router.add_get("/null", ok)
app.router.add_post("/sink", sink)
web.run_app(app, host="127.0.0.1", port=int(sys.argv[1]), access_log=None, print=None)
"""


def _start_bare(port: int, core: int, out: Path) -> subprocess.Popen[bytes]:
    argv = [sys.executable, "-c", BARE_SERVER, str(port)]
    return start_pinned(argv, None, core, out, f"http://127.0.0.1:{port}/null", "bare aiohttp")[0]


async def _drive(method: str, url: str, body: bytes | None, connections: int, window: tuple[float, float]) -> int:
    """Keep ``connections`` requests in flight until the window ends; the answers inside it."""
    import aiohttp

    answered = 0

    async def one() -> None:
        nonlocal answered
        while time.time() < window[1]:
            started = time.time()
            async with session.request(method, url, data=body) as response:
                await response.read()
                if response.status != 200:
                    raise RuntimeError(f"{method} {url}: {response.status}")
            if started >= window[0]:
                answered += 1

    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0)) as session:
        await asyncio.gather(*(one() for _ in range(connections)))
    return answered


def measure(label: str, pid: int, method: str, url: str, body: bytes | None, args: argparse.Namespace) -> dict[str, Any]:
    """Drive one endpoint; the server's CPU per answer over the measured window."""
    begin = time.time() + args.warmup_s
    end = begin + args.seconds
    cpu: list[float] = []

    async def sample_cpu() -> None:
        await asyncio.sleep(max(0.0, begin - time.time()))
        cpu.append(cpu_seconds(pid))

    async def run() -> int:
        probe = asyncio.create_task(sample_cpu())
        answered = await _drive(method, url, body, args.connections, (begin, end))
        await probe
        return answered

    answered = asyncio.run(run())
    used = cpu_seconds(pid) - cpu[0]
    # (the last answers may arrive a little after ``end``; the CPU is read after them too)
    return {
        "label": label, "answers": answered, "answers_per_s": round(answered / args.seconds, 1),
        "server_cpu_s": round(used, 3), "server_busy": round(used / args.seconds, 3),
        "cpu_us_per_request": round(1e6 * used / max(answered, 1), 1),
    }  # fmt: skip


def floor_per_cycle(path: Path, get_us: float, post_us: float) -> dict[str, Any]:
    """From a ``closed_loop.py`` result: each run's GETs and POSTs per acknowledged batch, their floor
    at ``get_us`` and ``post_us`` each, and that run's CPU per cycle."""
    result = json.loads(path.read_text())
    runs = []
    for run in result["runs"]:
        cycles = run["cycles_per_wall_s"] * run["seconds"]
        calls = {"GET /tasks": run["load"]["tasks"]["n"], "POST /rollouts": run["load"]["rollouts"]["n"]}
        calls.update({name: call["n"] for name, call in run["trusted"].items()})
        gets = sum(n for name, n in calls.items() if name.startswith("GET ")) / cycles
        posts = sum(n for name, n in calls.items() if name.startswith("POST ")) / cycles
        floor = (gets * get_us + posts * post_us) / 1000
        runs.append({"label": run["label"], "gets_per_cycle": round(gets, 3), "posts_per_cycle": round(posts, 3),
                     "floor_ms_per_cycle": round(floor, 3), "cpu_ms_per_cycle": run["cpu_ms_per_cycle"],
                     "floor_share_of_cycle": round(floor / run["cpu_ms_per_cycle"], 3)})  # fmt: skip
    return {"file": str(path), "get_us": get_us, "post_us": post_us, "runs": runs}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seconds", type=float, default=20.0)
    parser.add_argument("--warmup-s", type=float, default=3.0)
    parser.add_argument("--connections", type=int, default=64)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--cycle-json", type=Path, default=None, help="a closed_loop.py result to compare with")
    parser.add_argument("--json", default="")
    args = parser.parse_args(argv)
    cpus = sorted(os.sched_getaffinity(0))
    if len(cpus) < 2:
        raise SystemExit("needs 2 CPUs: the server's own and the load's")
    core = cpus[-1]
    os.sched_setaffinity(0, set(cpus[:-1]))
    body = b"x" * BODY_BYTES
    runs = []
    root = Path(tempfile.mkdtemp(prefix="http-floor-"))
    try:
        for repeat in range(args.repeats):
            port = free_port()
            bare = _start_bare(port, core, root / "bare.out")
            try:
                runs.append(measure("bare GET", bare.pid, "GET", f"http://127.0.0.1:{port}/null", None, args))
                runs.append(measure("bare POST 59 KB", bare.pid, "POST", f"http://127.0.0.1:{port}/sink", body, args))
            finally:
                stop_pinned(bare)
            run_root = root / f"orchestrator{repeat}"
            run_root.mkdir()
            port = free_port()
            config = write_config(run_root, port, secrets.token_urlsafe(24), judgeable_key=True, trusted_port=None)
            url = f"http://127.0.0.1:{port}"
            orchestrator, _ = _start_orchestrator("floor", config, dict(os.environ, OMP_WAIT_POLICY="PASSIVE"), core, run_root, url)
            try:
                runs.append(measure("orchestrator GET /health", orchestrator.pid, "GET", f"{url}/health", None, args))
            finally:
                stop_pinned(orchestrator)
            for line in runs[-3:]:
                print(json.dumps(line), flush=True)
    finally:
        shutil.rmtree(root, ignore_errors=True)
    labels = list(dict.fromkeys(run["label"] for run in runs))
    summary: dict[str, Any] = {
        label: {"cpu_us_per_request_min": min(r["cpu_us_per_request"] for r in runs if r["label"] == label),
                "cpu_us_per_request_median": statistics.median(r["cpu_us_per_request"] for r in runs if r["label"] == label)}
        for label in labels
    }  # fmt: skip
    result: dict[str, Any] = {"machine": {"cpus": len(cpus), "server_cpu": core, "load_average_end": os.getloadavg()},
                              "args": {k: str(v) for k, v in vars(args).items()}, "runs": runs, "summary": summary}  # fmt: skip
    if args.cycle_json is not None:
        median = {label: figures["cpu_us_per_request_median"] for label, figures in summary.items()}
        get_us = median["orchestrator GET /health"]
        post_us = median["bare POST 59 KB"] + max(0.0, get_us - median["bare GET"])
        result["cycles"] = floor_per_cycle(args.cycle_json, get_us, post_us)
    if args.json:
        Path(args.json).write_text(json.dumps(result, indent=1) + "\n")
    print(json.dumps(summary))
    return 0


if __name__ == "__main__":
    sys.exit(main())
