"""Closed loop over HTTP: N identities against one orchestrator process on a core of its own.

The outside probe of issue 44, rebuilt: a real orchestrator process (``prime-rl orchestrator``,
durable as it ships: group commit, ``synchronous`` as configured, backpressure on through
``max_buffered_samples``), pinned to the machine's last CPU; everything else on the other CPUs:

  - N identities in one load process (asyncio + aiohttp, one coroutine each, ``--identities``):
    register, then ``GET /tasks`` -> ``POST /rollouts`` with a batch of 2 prompts x 4 samples (128
    prompt + 384 completion tokens, toploc proofs of 258 B per 32 tokens: what ``soak.py``
    submits; the proofs random bytes and the log-probs random, 6 decimals, each list drawn from a
    pool of 64 made at the start; the token ids follow a pattern), as fast as answers come; a 429
    is followed by a sleep of its ``Retry-After``;
  - a validator playing by the rules (``GET /validator/pending``, every sample accepted with one
    recomputed log-prob per completion token, all -0.5, ``POST /validator/verdicts``), in a thread;
  - a trainer (``POST /trainer/claim`` of ``samples_per_step``, then ``POST /trainer/commit``), in a
    thread.

After ``--warmup-s`` it counts, for ``--seconds``: batches acknowledged per wall-clock second (a
full lease cycle: lease, submit, verdicts, claimed or settled), ``/tasks`` and ``/rollouts`` p50/p99
(every answer), the validator's and trainer's call p99, and how busy the orchestrator's core was
(its process CPU seconds over the window's wall seconds, ``/proc``). A core under 100% busy while
answers wait is time lost to something other than work (the issue's 43 cycles/s at 43% busy).

``--window-s W`` makes it a long run, the outside probe of issue 44 as it will be rerun: the same
loop, reported per window of W seconds from the first to the last (cycles per wall-clock second,
CPU per cycle, ``/tasks`` and ``/rollouts`` p50/p99, the trusted calls' p99, the orchestrator's RSS,
the run folder's bytes per acknowledged batch; and, to tell where a slower answer waited: the
load process's own loop lag, the clients' CPU per cycle and how busy they kept the other CPUs, the
server's phases per window). At the end the orchestrator is killed (``kill -9``)
under the load, started again on the same folder (seconds until it answers), and every batch the
load saw acknowledged must be in its store, open or compacted into the record.

``--trusted-listener``: the validator and trainer call the orchestrator's trusted listener
(``orchestrator.trusted_port``) where the code version has one.

``--gc-census``: the orchestrator notes what each of its garbage collections examined and freed
(``gc_census.py``); the result's ``gc_census`` sums up the window's collections. The census costs
CPU: compare such runs with each other, not with runs without it.

``--compare LABEL=PATH`` (repeatable) runs the same loop, in the same invocation, against another
checkout's packages (``PYTHONPATH``), e.g. a worktree of the issue's ``0d0cd53``. The load process
and the clients are this tree's; the HTTP API they use is the same in all.

Run: ``OMP_WAIT_POLICY=PASSIVE .venv/bin/python benchmarks/closed_loop.py --identities 256
--seconds 60 [--compare issue=/tmp/old] --json benchmarks/results/closed_loop.json``
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import json
import math
import os
import random
import secrets
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections import deque
from pathlib import Path
from typing import Any

from closed_loop_windows import (  # benchmarks/
    buckets,
    cpu_seconds,
    quantiles,
    rss_mb,
    sample_windows,
    server_windows,
    window_rows,
    windowed,
)
from gc_census import summary as gc_census_summary  # benchmarks/
from run_toml import write_run_toml  # benchmarks/
from swarm_figures import trusted_calls  # benchmarks/

from prime_rl.launch.local import free_port

REPO = Path(__file__).resolve().parents[1]
PROMPTS, GROUP, PROMPT, COMPLETION = 2, 4, 128, 384
SAMPLES_PER_STEP = 128
PROOF_BYTES = 258 * (COMPLETION // 32)  # toploc's proof size per sample
VALIDATOR_POSTS = 4  # the validator's verdict posts in flight at once
LOGPROB_POOL = 64  # distinct log-prob lists the load's samples are drawn from


def write_config(root: Path, port: int, admin_token: str, *, judgeable_key: bool, trusted_port: int | None) -> Path:
    """The run's TOML: backpressure on, limits sized for many identities at one address; the trusted
    roles on a listener of their own at ``trusted_port`` (None: on the workers' port)."""
    orchestrator = {
        "host": "127.0.0.1", "port": port, "async_level": 1, "prompts_per_batch": PROMPTS,
        "task_timeout_s": 60.0, "admin_token": admin_token, "register_rate_per_minute": 0.0,
        "max_open_leases_per_address": 1 << 20, "max_fresh_workers_per_network": 0, "probation_tokens": 0,
        "release_after_tokens": 16, "max_buffered_samples": 8 * SAMPLES_PER_STEP,
        **({"lease_judgeable": False} if judgeable_key else {}),
        **({"trusted_port": trusted_port} if trusted_port is not None else {}),
    }  # fmt: skip
    sections: dict[str, dict[str, Any]] = {
        "tasks": {"num_tasks": 1000, "digits": 1, "seed": 0},
        "sampling": {"group_size": GROUP, "temperature": 1.0, "max_new_tokens": COMPLETION},
        "orchestrator": orchestrator,
        "trainer": {"samples_per_step": SAMPLES_PER_STEP, "filter_zero_advantage": False},
    }
    return write_run_toml(root, sections)


def _steal_seconds(cpu: int) -> float:
    """Seconds CPU ``cpu`` was stolen by the hypervisor so far (``/proc/stat``; 0 where not counted):
    on a shared virtual machine, what makes a CPU second buy less work from one run to the next."""
    for line in Path("/proc/stat").read_text().splitlines():
        fields = line.split()
        if fields[0] == f"cpu{cpu}" and len(fields) > 8:
            return int(fields[8]) / os.sysconf("SC_CLK_TCK")
    return 0.0


def _phase_worst(phases: dict[str, Any]) -> dict[str, float]:
    """The worst window's p99 of each phase (``lock``, ``run``, ``durable``, ``held``, ``loop``, ``gc``)
    over the calls it was logged for."""
    worst: dict[str, float] = {}
    for name, figures in phases.items():
        phase = name.split(" ", 1)[0]
        worst[phase] = max(worst.get(phase, 0.0), figures["p99_ms_worst_window"])
    return worst


# ------------------------------------------------------------------ the load process


async def _identity(session: Any, url: str, number: int, window: tuple[float, float], out: dict[str, Any],
                    logprobs: list[list[float]]) -> None:  # fmt: skip
    async with session.post(f"{url}/workers/register", json={"name": f"loop{number}"}) as response:
        registered = await response.json()
    worker_id, headers = registered["worker_id"], {"Authorization": f"Bearer {registered['token']}"}
    begin, end = window
    cycle = 0
    while time.time() < end:
        started = time.time()
        async with session.get(f"{url}/tasks", params={"worker_id": worker_id}, headers=headers) as response:
            status, body = response.status, await response.read()
            retry_after = float(response.headers.get("Retry-After", "1") or 1)
        if begin <= started < end:
            out["tasks"].append((started, time.time() - started))
            out["statuses"][str(status)] = out["statuses"].get(str(status), 0) + 1
        if status == 429:
            await asyncio.sleep(retry_after)
            continue
        if status != 200:
            await asyncio.sleep(1.0)
            continue
        lease = json.loads(body)
        cycle += 1
        samples = [
            {"task_id": task["task_id"], "group_index": g, "prompt_tokens": list(range(3, 3 + PROMPT)),
             "completion_tokens": [(7 * i + g + cycle) % 30000 for i in range(COMPLETION)], "sampling_seed": seed,
             "temperature": 1.0, "reward": float(g % 2), "advantage": 0.5 - g % 2,
             "proofs": base64.b64encode(os.urandom(PROOF_BYTES)).decode(),
             "inference_logprobs": random.choice(logprobs)}
            for task in lease["tasks"] for g, seed in enumerate(task["sampling_seeds"])
        ]  # fmt: skip
        batch = {"worker_id": worker_id, "step": lease["step"], "batch_index": lease["batch_index"],
                 "policy_version": lease["policy_version"], "samples": samples}  # fmt: skip
        posted = time.time()
        async with session.post(f"{url}/rollouts", json=batch, headers=headers) as response:
            status = response.status
            answer = await response.read()
        if status == 200:
            out["acknowledged"].append((posted, json.loads(answer)["batch_id"]))
        if begin <= posted < end:
            out["rollouts"].append((posted, time.time() - posted))
            out["submitted" if status == 200 else f"rollouts_{status}"] = (
                out.get("submitted" if status == 200 else f"rollouts_{status}", 0) + 1
            )


async def _lag_probe(window: tuple[float, float], out: dict[str, Any]) -> None:
    """The load process's own event-loop lag (how late a 50 ms sleep wakes), so that a slower answer
    measured by the load can be told apart from a busier load process."""
    out["loop_lag"] = []
    while time.time() < window[1]:
        started = time.perf_counter()
        await asyncio.sleep(0.05)
        if time.time() >= window[0]:
            out["loop_lag"].append((time.time(), time.perf_counter() - started - 0.05))


async def _load(url: str, identities: int, window: tuple[float, float]) -> dict[str, Any]:
    import aiohttp

    out: dict[str, Any] = {"tasks": [], "rollouts": [], "statuses": {}, "acknowledged": []}
    # Each sample's log-probs are drawn from a pool made once: drawing 384 of them per sample was
    # 39% of the load process's CPU, on the CPU the validator and trainer share (closed_loop.md, run 14).
    logprobs = [[round(-random.expovariate(2.0), 6) for _ in range(COMPLETION)] for _ in range(LOGPROB_POOL)]
    connector = aiohttp.TCPConnector(limit=0)
    timeout = aiohttp.ClientTimeout(total=120)
    async with aiohttp.ClientSession(connector=connector, timeout=timeout) as session:
        probe = asyncio.create_task(_lag_probe(window, out))
        results = await asyncio.gather(
            *(_identity(session, url, n, window, out, logprobs) for n in range(identities)), return_exceptions=True
        )
        await probe
    out["errors"] = [repr(r) for r in results if isinstance(r, BaseException)][:5]
    return out


def load_main(url: str, identities: int, begin: float, end: float, path: str, width: float) -> None:
    """Run the load; write its summary, per window of ``width`` seconds as well when ``width`` > 0,
    and every acknowledged batch id (to check the store after a restart)."""
    out = asyncio.run(_load(url, identities, (begin, end)))
    summary = {"tasks": quantiles([v for _, v in out["tasks"]]), "rollouts": quantiles([v for _, v in out["rollouts"]]),
               "statuses": out["statuses"], "submitted": out.get("submitted", 0), "errors": out["errors"],
               "rejected": {k: v for k, v in out.items() if k.startswith("rollouts_")},
               "acknowledged": [batch_id for _, batch_id in out["acknowledged"]]}  # fmt: skip
    if width > 0:
        count = math.ceil((end - begin) / width)
        summary["windows"] = {"tasks": windowed(out["tasks"], begin, width, count),
                              "rollouts": windowed(out["rollouts"], begin, width, count),
                              "loop_lag": windowed(out["loop_lag"], begin, width, count),
                              "submitted": [len(w) for w in buckets(out["acknowledged"], begin, width, count)]}  # fmt: skip
    Path(path).write_text(json.dumps(summary))


# ------------------------------------------------------------------ the trusted roles


def _validator(url: str, token: str, stop: threading.Event, times: dict[str, list[tuple[float, float]]], window: tuple[float, float],
               waiting: list[tuple[float, int]], arrays: str) -> None:  # fmt: skip
    """Judge every pending batch (all accepted), posting a page's verdicts ``VALIDATOR_POSTS`` at a
    time: one post after another cannot keep up with the swarm (each waits its turn at the server),
    and a batch left unjudged would be counted as a cycle the orchestrator never did. ``arrays``: the
    listing's per-token lists, ``packed`` (what ``OrchestratorClient`` asks for) or ``json`` (a code
    version before packed arrays answers JSON lists either way)."""
    from concurrent.futures import ThreadPoolExecutor

    import requests

    local, headers = threading.local(), {"Authorization": f"Bearer {token}"}

    def post(batch: dict[str, Any]) -> None:
        if not hasattr(local, "session"):
            local.session = requests.Session()
        verdicts = [
            {"sample_index": i, "accepted": True, "reason": "ok", "reward": s["reward"], "advantage": s["advantage"],
             "logprobs": [-0.5] * _length(s["completion_tokens"])}
            for i, s in enumerate(batch["samples"])
        ]  # fmt: skip
        started = time.time()
        local.session.post(f"{url}/validator/verdicts", json={"batch_id": batch["batch_id"], "verdicts": verdicts},
                           headers=headers, timeout=60).raise_for_status()  # fmt: skip
        if window[0] <= started < window[1]:
            times["POST /validator/verdicts"].append((started, time.time() - started))

    session = requests.Session()
    judged: deque[str] = deque(maxlen=4096)  # the batches judged last (a pending page may list them again)
    with ThreadPoolExecutor(VALIDATOR_POSTS) as pool:
        while not stop.is_set():
            started = time.time()
            pending = session.get(f"{url}/validator/pending", params={"limit": str(4 * VALIDATOR_POSTS), "arrays": arrays}, headers=headers,
                                  timeout=60).json()  # fmt: skip
            if window[0] <= started < window[1]:
                times["GET /validator/pending"].append((started, time.time() - started))
                waiting.append((started, int(pending.get("pending_batches", 0))))  # the batches awaiting verdicts
            fresh = [b for b in pending.get("batches", []) if b["batch_id"] not in judged]
            if not fresh:
                time.sleep(0.05)
                continue
            for _ in pool.map(post, fresh):  # raises a failed post's error here
                pass
            judged.extend(b["batch_id"] for b in fresh)


def _length(tokens: list[int] | dict[str, str]) -> int:
    """The number of tokens of a listed list, JSON or packed (``{"dtype": "<i4", "b64": ...}``)."""
    return len(tokens) if isinstance(tokens, list) else len(base64.b64decode(tokens["b64"])) // 4


def _trainer(url: str, token: str, stop: threading.Event, times: dict[str, list[tuple[float, float]]], window: tuple[float, float], steps: list[int]) -> None:
    import requests

    session, headers = requests.Session(), {"Authorization": f"Bearer {token}"}
    step = 0
    while not stop.is_set():
        started = time.time()
        claim = session.post(f"{url}/trainer/claim", json={"step": step, "min_samples": SAMPLES_PER_STEP,
                             "filter_zero_advantage": False}, headers=headers, timeout=60).json()  # fmt: skip
        if window[0] <= started < window[1]:
            times["POST /trainer/claim"].append((started, time.time() - started))
        if not claim.get("ready"):
            time.sleep(0.05)
            continue
        started = time.time()
        session.post(f"{url}/trainer/commit", json={"step": step, "policy_version": step + 1}, headers=headers,
                     timeout=60).raise_for_status()  # fmt: skip
        if window[0] <= started < window[1]:
            times["POST /trainer/commit"].append((started, time.time() - started))
            steps.append(step)
        step += 1


def start_pinned(argv: list[str], env: dict[str, str] | None, core: int, out: Path, probe_url: str,
                 label: str) -> tuple[subprocess.Popen[bytes], float]:  # fmt: skip
    """Start the server ``argv`` on ``core`` in a session of its own (its output appended to ``out``);
    return it and the seconds until ``probe_url`` answered 200."""
    import requests

    began = time.time()
    server = subprocess.Popen(
        argv, stdout=out.open("ab"), stderr=subprocess.STDOUT, env=env,
        preexec_fn=lambda: os.sched_setaffinity(0, {core}), start_new_session=True,
    )  # fmt: skip
    deadline = time.time() + 180
    while True:
        try:
            if requests.get(probe_url, timeout=2).status_code == 200:
                return server, time.time() - began
        except requests.RequestException:
            pass
        if time.time() > deadline or server.poll() is not None:
            stop_pinned(server)
            raise RuntimeError(f"{label}: server did not start: {out.read_text()[-2000:]}")
        time.sleep(0.05)


def stop_pinned(server: subprocess.Popen[bytes]) -> None:
    """SIGTERM to the server's own process group (``start_pinned`` started it in a session of its own)."""
    if server.poll() is not None:
        return
    os.killpg(server.pid, signal.SIGTERM)
    try:
        server.wait(30)
    except subprocess.TimeoutExpired:
        os.killpg(server.pid, signal.SIGKILL)
        server.wait(10)


def _start_orchestrator(label: str, config: Path, env: dict[str, str], core: int, root: Path, url: str) -> tuple[subprocess.Popen[bytes], float]:
    """Start the orchestrator on ``core``; return it and the seconds until ``/status`` answered."""
    argv = [sys.executable, "-m", "prime_rl.cli", "orchestrator", "--config", str(config)]
    return start_pinned(argv, env, core, root / "orchestrator.out", f"{url}/status", f"{label}: orchestrator")


def _restart_check(label: str, config: Path, env: dict[str, str], core: int, root: Path, url: str, acknowledged: list[str]) -> dict[str, Any]:
    """After the load (and the orchestrator's kill -9 under it): start the orchestrator again on the
    same folder, time it until it answers, and check that every acknowledged batch is in its store
    (open, or compacted into the record)."""
    import sqlite3

    orchestrator, seconds = _start_orchestrator(label, config, env, core, root, url)
    try:
        rss = rss_mb(orchestrator.pid)
    finally:
        stop_pinned(orchestrator)
    connection = sqlite3.connect(f"file:{root / 'run' / 'orchestrator' / 'state.sqlite'}?mode=ro", uri=True)
    try:
        stored = {row[0] for row in connection.execute("SELECT batch_id FROM batches UNION SELECT batch_id FROM compacted")}
    finally:
        connection.close()
    missing = [batch_id for batch_id in acknowledged if batch_id not in stored]
    return {"seconds_to_serve": round(seconds, 2), "rss_mb_after_start": round(rss, 1), "acknowledged": len(acknowledged),
            "stored": len(stored), "acknowledged_missing": len(missing), "missing_examples": missing[:5]}  # fmt: skip


def _role(body: Any, ended: list[str], *args: Any) -> None:
    """Run a trusted role's loop; a failed call ends it, noted in ``ended`` (no traceback)."""
    import requests

    try:
        body(*args)
    except requests.RequestException as error:
        ended.append(f"{body.__name__}: {error!r}"[:300])


# ------------------------------------------------------------------ one code version


def run_one(label: str, pythonpath: str, args: argparse.Namespace, core: int, arrays: str = "packed") -> dict[str, Any]:
    root = Path(tempfile.mkdtemp(prefix=f"closed-loop-{label}-"))
    try:
        port, token = free_port(), secrets.token_urlsafe(24)
        known = subprocess.run(  # the config keys this code version knows (a --compare checkout may predate them)
            [sys.executable, "-c", "from prime_rl.config import load_config; o = load_config(None, []).orchestrator; "
             "print(*[k for k in ('lease_judgeable', 'trusted_port') if hasattr(o, k)])"],
            env=dict(os.environ, PYTHONPATH=pythonpath) if pythonpath else None, capture_output=True, text=True,
        ).stdout.split()  # fmt: skip
        trusted_port = free_port() if args.trusted_listener and "trusted_port" in known else None
        config = write_config(root, port, token, judgeable_key="lease_judgeable" in known, trusted_port=trusted_port)
        env = dict(os.environ, OMP_WAIT_POLICY="PASSIVE", **({"PYTHONPATH": pythonpath} if pythonpath else {}))
        census = root / "gc_census.jsonl"
        if args.gc_census:  # a sitecustomize that installs it in the orchestrator (only its env names it)
            (root / "census").mkdir()
            (root / "census" / "sitecustomize.py").write_text(
                f"import sys\nsys.path.insert(0, {str(Path(__file__).parent)!r})\n"
                f"import gc_census\ngc_census.install({str(census)!r})\n"
            )
            env["PYTHONPATH"] = os.pathsep.join(p for p in (str(root / "census"), pythonpath) if p)
        url = f"http://127.0.0.1:{port}"
        trusted_url = f"http://127.0.0.1:{trusted_port}" if trusted_port is not None else url
        orchestrator, _ = _start_orchestrator(label, config, env, core, root, url)
        try:
            begin = time.time() + args.warmup_s
            end = begin + args.seconds
            window = (begin, end)
            load_out = root / "load.json"
            load = subprocess.Popen([sys.executable, __file__, "--load", url, str(args.identities), str(begin), str(end),
                                     str(load_out), str(args.window_s)])  # fmt: skip
            stop = threading.Event()
            times: dict[str, list[tuple[float, float]]] = {k: [] for k in ("GET /validator/pending", "POST /validator/verdicts",
                                                                           "POST /trainer/claim", "POST /trainer/commit")}  # fmt: skip
            steps: list[int] = []
            waiting: list[tuple[float, int]] = []  # (time, batches awaiting verdicts) from each listing
            ended: list[str] = []  # a role's call that failed (the orchestrator killed under it, at the end of --window-s)
            roles = [threading.Thread(target=_role, args=(_validator, ended, trusted_url, token, stop, times, window, waiting, arrays), daemon=True),
                     threading.Thread(target=_role, args=(_trainer, ended, trusted_url, token, stop, times, window, steps), daemon=True)]  # fmt: skip
            for role in roles:
                role.start()
            time.sleep(max(0.0, begin - time.time()))
            cpu_begin, steal_begin = cpu_seconds(orchestrator.pid), _steal_seconds(core)
            samples = sample_windows(orchestrator.pid, load.pid, root, begin, end, args.window_s)
            cpu_used = cpu_seconds(orchestrator.pid) - cpu_begin
            stolen = _steal_seconds(core) - steal_begin
            if args.window_s > 0:  # kill -9 under load: what was acknowledged must be in the store after the restart
                os.killpg(orchestrator.pid, signal.SIGKILL)
                orchestrator.wait(10)
            load.wait(timeout=300)
            stop.set()
            for role in roles:
                role.join(70)
            loaded = json.loads(load_out.read_text())
        finally:
            stop_pinned(orchestrator)
        acknowledged = loaded.pop("acknowledged")
        result = {
            "label": label, "identities": args.identities, "seconds": args.seconds, "trusted_listener": trusted_port is not None,
            "cycles_per_wall_s": round(loaded["submitted"] / args.seconds, 1),
            "orchestrator_core_busy": round(cpu_used / args.seconds, 3),
            "cpu_ms_per_cycle": round(1000 * cpu_used / max(1, loaded["submitted"]), 2),
            "orchestrator_cpu_stolen_share": round(stolen / args.seconds, 3),
            "steps_committed": len(steps), "load": loaded, "roles_ended_by": ended,
            "trusted": {name: quantiles([v for _, v in values]) for name, values in times.items()},
            # server side, the whole run (warm-up included): where trusted calls waited (``lock``: for the
            # ledger thread; ``run``; ``durable``), each untrusted call's run (``held``), the loop's lag
            "server_phases": trusted_calls(root / "run").get("orchestrator", {}).get("calls", {}),
        }  # fmt: skip
        if args.gc_census:
            result["gc_census"] = gc_census_summary(census, begin, end)
            print(f"[{label}] gc census of the window: {result['gc_census']}", flush=True)
        if args.window_s > 0:
            count = len(samples) - 1  # (the first is the start's)
            result["windows"] = window_rows(loaded.pop("windows"), samples, times, server_windows(root / "run", begin, args.window_s, count),
                                             waiting, begin, args.window_s, count)  # fmt: skip
            result["restart"] = _restart_check(label, config, env, core, root, url, acknowledged)
            for row in result["windows"]:
                print(f"[{label}] window {row['window']}: {row['batches_acknowledged']} batches ({row['batches_judged']} judged), {row['cycles_per_wall_s']} "
                      f"cycles/s, {row['cpu_ms_per_cycle']} CPU ms/cycle, /tasks p99 {row['tasks']['p99_ms']} ms, "
                      f"/rollouts p99 {row['rollouts']['p99_ms']} ms, trusted p99 {max(v or 0 for v in row['trusted_p99_ms'].values())} ms, "
                      f"RSS {row['rss_mb']} MB, {row['disk_bytes_per_batch']} B/batch on disk", flush=True)  # fmt: skip
            print(f"[{label}] restart: {result['restart']}", flush=True)
        print(f"[{label}] {result['cycles_per_wall_s']} cycles/s wall, core {100 * result['orchestrator_core_busy']:.0f}% busy "
              f"({100 * result['orchestrator_cpu_stolen_share']:.0f}% stolen), "
              f"{result['cpu_ms_per_cycle']} CPU ms/cycle; /tasks {loaded['tasks']}; /rollouts {loaded['rollouts']}; "
              f"steps {len(steps)}; trusted {result['trusted']}; server side, worst window p99 ms: "
              f"{_phase_worst(result['server_phases'])}", flush=True)  # fmt: skip
        return result
    finally:
        import shutil

        shutil.rmtree(root, ignore_errors=True)


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv and argv[0] == "--load":
        url, identities, begin, end, path, width = argv[1:7]
        load_main(url, int(identities), float(begin), float(end), path, float(width))
        return 0
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--identities", type=int, default=256)
    parser.add_argument("--seconds", type=float, default=60.0, help="the measured window")
    parser.add_argument("--warmup-s", type=float, default=15.0)
    parser.add_argument("--repeats", type=int, default=1, help="runs of each code version, alternating")
    parser.add_argument("--compare", action="append", default=[], metavar="LABEL=PATH",
                        help="another checkout to measure in the same run (its packages' src on PYTHONPATH); repeatable")  # fmt: skip
    parser.add_argument("--window-s", type=float, default=0.0,
                        help="also report each window of this many seconds (throughput, CPU, p50/p99, RSS, disk), then "
                             "restart the orchestrator on the same store: its time to serve, and every acknowledged batch in it")  # fmt: skip
    parser.add_argument("--trusted-listener", action="store_true",
                        help="the validator and trainer on the orchestrator's trusted listener (orchestrator.trusted_port), "
                             "where the code version has one; default: on the workers' port")  # fmt: skip
    parser.add_argument("--gc-census", action="store_true",
                        help="the orchestrator notes what each garbage collection examined and freed (gc_census.py)")  # fmt: skip
    parser.add_argument("--json-listings-too", action="store_true",
                        help="also run this tree with its validator asking for JSON listings (label new-json-listings), "
                             "in the same invocation; the others ask for packed ones (arrays=packed)")  # fmt: skip
    parser.add_argument("--json", default="", help="write the results here")
    args = parser.parse_args(argv)
    cpus = sorted(os.sched_getaffinity(0))
    if len(cpus) < 2:
        raise SystemExit("needs 2 CPUs: the orchestrator's own and the rest")
    core = cpus[-1]
    os.sched_setaffinity(0, set(cpus[:-1]))  # this process, the load process and the roles' threads
    versions = [("new", "", "packed")] + ([("new-json-listings", "", "json")] if args.json_listings_too else [])
    for entry in args.compare:
        label, _, path = entry.partition("=")
        versions.append((label, os.pathsep.join(str(p) for p in sorted(Path(path).glob("packages/*/src"))), "packed"))
    runs = []
    for repeat in range(args.repeats):
        for label, pythonpath, arrays in versions if repeat % 2 == 0 else versions[::-1]:
            runs.append(run_one(label, pythonpath, args, core, arrays))
    summary = {
        label: {"cycles_per_wall_s": [r["cycles_per_wall_s"] for r in runs if r["label"] == label],
                "median_cycles_per_wall_s": statistics.median(r["cycles_per_wall_s"] for r in runs if r["label"] == label)}
        for label, _, _ in versions
    }  # fmt: skip
    result = {"machine": {"cpus": len(cpus), "orchestrator_cpu": core, "load_average_end": os.getloadavg()},
              "args": vars(args), "runs": runs, "summary": summary}  # fmt: skip
    if args.json:
        Path(args.json).write_text(json.dumps(result, indent=1) + "\n")
    print(json.dumps(summary))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
