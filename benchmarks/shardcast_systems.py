"""The systems of benchmarks/shardcast_bench.py, each run as origin -> 2 relays -> N clients in
separate OS processes: ours (the `shardcast.cli` processes), the reference shardcast 0.3.2 (in its
own temporary venv) and the "limit" rows (a plain read and curls from a sendfile server).
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import requests
from shardcast_procs import DEVNULL, RSS, Run, files_ok, free_port, log_file, run_clients, stop, wait_for

OURS = [sys.executable, "-m", "shardcast.cli"]
REF_VERSION = "0.3.2"


# ---- ours --------------------------------------------------------------------------------


def start_ours(kind: str, args: list[str]) -> tuple[subprocess.Popen, str]:  # type: ignore[type-arg]
    port = free_port()
    proc = RSS.spawn(
        [*OURS, kind, *args, "--port", str(port), "--host", "127.0.0.1", "--log-level", "WARNING"],
        stdout=DEVNULL,
        stderr=DEVNULL,
    )
    url = f"http://127.0.0.1:{port}"
    wait_for(lambda: requests.get(f"{url}/index.json", timeout=2).status_code in (200, 404), 60)
    return proc, url


def run_ours(work: Path, source: Path, clients: int, shard_size: int, timeout: float) -> Run:
    run = Run()
    origin, origin_url = start_ours("origin", ["--data-dir", str(work / "origin")])
    relays = [
        start_ours(
            "relay",
            ["--upstream", origin_url, "--data-dir", str(work / f"relay{i}"), "--poll-interval", "0.1"],
        )
        for i in range(2)
    ]
    relay_urls = [url for _, url in relays]
    outputs = [work / f"client{i}" / "model.bin" for i in range(clients)]
    try:
        t0 = time.monotonic()
        publish = RSS.spawn(
            [
                *OURS,
                "publish",
                "--data-dir",
                str(work / "origin"),
                str(source),
                "--shard-size",
                str(shard_size),
                "--log-level",
                "INFO",
            ],
            stdout=DEVNULL,
            stderr=subprocess.PIPE,
            text=True,
        )
        _, log = publish.communicate()
        # Measured inside the publisher (like the reference's broadcast()), without interpreter start-up.
        run.publish_s = (
            float(log.rsplit(" in ", 1)[1].split("s")[0]) if " in " in log else time.monotonic() - t0
        )
        wait_for(
            lambda: any(
                '"version": 1' in requests.get(f"{r}/index.json", timeout=2).text for r in relay_urls
            ),
            timeout,
        )

        def start_client(i: int) -> subprocess.Popen:  # type: ignore[type-arg]
            return RSS.spawn(
                [
                    *OURS,
                    "fetch",
                    "--servers",
                    ",".join(relay_urls),
                    "--version",
                    "1",
                    "--output",
                    str(outputs[i]),
                    "--no-progress",
                    "--log-level",
                    "WARNING",
                    "--deadline",
                    str(timeout),
                ],
                stdout=DEVNULL,
                stderr=DEVNULL,
            )

        times, run.rss_mb["client"], ok, _ = run_clients(start_client, clients, t0, timeout, restarts=0)
        run.first_s, run.all_s = (times[0], times[-1]) if times else (float("nan"), float("nan"))
        run.ok = ok and files_ok(outputs, source.stat().st_size)
        run.note = f"{len(times)}/{clients} clients succeeded"
    finally:
        run.rss_mb["origin"] = max(stop(origin), RSS.of(publish))
        run.rss_mb["relay"] = max(stop(proc) for proc, _ in relays)
    return run


# ---- reference ---------------------------------------------------------------------------

REF_ORIGIN = """
import sys, time, shardcast
data_dir, port, path, shard = sys.argv[1], int(sys.argv[2]), sys.argv[3], int(sys.argv[4])
shardcast.initialize(data_dir, port, 5)
print("ready", flush=True)
sys.stdin.readline()
t = time.monotonic(); shardcast.broadcast(path, shard); print(time.monotonic() - t, flush=True)
sys.stdin.readline()
"""


def reference_venv(base: Path) -> Path | None:
    if not shutil.which("wget"):
        print("reference needs wget on PATH", file=sys.stderr)
        return None
    venv = base / "ref-venv"
    if not (venv / "bin" / "shardcast-client").exists():
        subprocess.run([sys.executable, "-m", "venv", "--clear", str(venv)], check=True)
        out = subprocess.run(
            [str(venv / "bin" / "pip"), "install", "-q", f"shardcast=={REF_VERSION}"],
            capture_output=True,
            text=True,
        )
        if out.returncode != 0:
            print(f"reference install failed: {out.stderr[-500:]}", file=sys.stderr)
            return None
    return venv


def run_reference(venv: Path, work: Path, source: Path, clients: int, shard_size: int, timeout: float) -> Run:
    run = Run()
    probe = os.urandom(1 << 20)
    dirs = [work / "origin", work / "relay0", work / "relay1"]
    for directory in dirs:
        directory.mkdir(parents=True)
        (directory / "data1.bin").write_bytes(probe)  # the reference's bandwidth probe, provisioned by hand
    ports = [free_port() for _ in dirs]
    urls = [f"http://127.0.0.1:{p}" for p in ports]
    origin = RSS.spawn(
        [
            str(venv / "bin" / "python"),
            "-c",
            REF_ORIGIN,
            str(dirs[0]),
            str(ports[0]),
            str(source),
            str(shard_size),
        ],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=DEVNULL,
        text=True,
        cwd=work,
    )
    assert origin.stdout is not None and origin.stdin is not None
    origin.stdout.readline()
    # A relay dies at start-up if its upstream's probe fails: start it only once the origin serves.
    wait_for(lambda: requests.get(f"{urls[0]}/data1.bin", timeout=5).status_code == 200, 60)
    relays = [
        RSS.spawn(
            [
                str(venv / "bin" / "shardcast-middle"),
                "--upstream",
                urls[0],
                "--data-dir",
                str(dirs[i]),
                "--port",
                str(ports[i]),
                "--check-interval",
                "1",
                "--log-level",
                "INFO",
            ],
            stdout=DEVNULL,
            stderr=log_file(work / f"relay{i}.log"),
            cwd=work,
        )
        for i in (1, 2)
    ]
    for url in urls[1:]:
        wait_for(lambda u=url: requests.get(f"{u}/data1.bin", timeout=5).status_code == 200, 60)
    outputs = [work / f"client{i}" / "model.bin" for i in range(clients)]
    try:
        t0 = time.monotonic()
        origin.stdin.write("go\n")
        origin.stdin.flush()
        run.publish_s = float(origin.stdout.readline())
        wait_for(
            lambda: any("v1:" in requests.get(f"{u}/distribution.txt", timeout=5).text for u in urls[1:]),
            timeout,
        )

        def start_client(i: int) -> subprocess.Popen:  # type: ignore[type-arg]
            outputs[i].parent.mkdir(exist_ok=True)
            return RSS.spawn(
                [
                    str(venv / "bin" / "shardcast-client"),
                    "--servers",
                    ",".join(urls[1:]),
                    "--version",
                    "v1",
                    "--output-file",
                    str(outputs[i]),
                    "--output-dir",
                    str(outputs[i].parent / "dl"),
                    "--log-level",
                    "INFO",
                ],
                stdout=DEVNULL,
                stderr=log_file(outputs[i].parent / "client.log"),
                cwd=outputs[i].parent,
            )

        times, run.rss_mb["client"], ok, restarted = run_clients(
            start_client, clients, t0, timeout, restarts=5
        )
        run.first_s, run.all_s = (times[0], times[-1]) if times else (float("nan"), float("nan"))
        run.ok = ok and files_ok(outputs, source.stat().st_size)
        run.note = f"{len(times)}/{clients} clients succeeded, {restarted} restarts"
    finally:
        origin.stdin.write("stop\n")
        origin.stdin.flush()
        run.rss_mb["origin"] = stop(origin)
        run.rss_mb["relay"] = max(stop(r) for r in relays)
    return run


# ---- limit -------------------------------------------------------------------------------


def run_limits(work: Path, source: Path, copies: int) -> tuple[float, float, float]:
    """(plain read s, one curl to disk s, ``copies`` concurrent curls to disk s)."""
    t0 = time.monotonic()
    with open(source, "rb") as handle:
        while handle.read(8 << 20):
            pass
    read_s = time.monotonic() - t0
    subprocess.run(
        [
            *OURS,
            "publish",
            "--data-dir",
            str(work / "single"),
            str(source),
            "--shard-size",
            str(max(1, source.stat().st_size)),
            "--log-level",
            "WARNING",
        ],
        stdout=DEVNULL,
        check=True,
    )
    server, url = start_ours("origin", ["--data-dir", str(work / "single")])
    try:
        t0 = time.monotonic()
        subprocess.run(["curl", "-s", "-o", str(work / "curl.bin"), f"{url}/v1/shard_000000.bin"], check=True)
        curl_s = time.monotonic() - t0
        # The topology writes one copy per relay and per client: that many concurrent copies
        # from one sendfile server is the floor for "all done" on this machine's disk.
        t0 = time.monotonic()
        curls = [
            subprocess.Popen(["curl", "-s", "-o", str(work / f"curl{i}.bin"), f"{url}/v1/shard_000000.bin"])
            for i in range(copies)
        ]
        for proc in curls:
            proc.wait()
        many_s = time.monotonic() - t0
    finally:
        stop(server)
    return read_s, curl_s, many_s
