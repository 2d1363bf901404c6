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

    OMP_WAIT_POLICY=PASSIVE python benchmarks/shardcast_bench.py --size 1GiB --repeat 1
    python benchmarks/shardcast_bench.py --compression
"""

from __future__ import annotations

import argparse
import contextlib
import os
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import requests

os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
OURS = [sys.executable, "-m", "shardcast.cli"]
REF_VERSION = "0.3.2"
DEVNULL = subprocess.DEVNULL


@dataclass
class Run:
    publish_s: float = float("nan")
    first_s: float = float("nan")
    all_s: float = float("nan")
    rss_mb: dict[str, float] = field(default_factory=dict)
    ok: bool = True
    note: str = ""


class PeakRss:
    """Samples VmHWM (peak resident set after exec) of watched processes every 20 ms.

    wait4's ru_maxrss is not used: it includes the pre-exec copy of this process.
    """

    def __init__(self) -> None:
        self.peaks: dict[int, float] = {}
        threading.Thread(target=self._loop, daemon=True).start()

    def _loop(self) -> None:
        while True:
            time.sleep(0.02)
            for pid in list(self.peaks):
                try:
                    with open(f"/proc/{pid}/status") as handle:
                        for line in handle:
                            if line.startswith("VmHWM:"):
                                self.peaks[pid] = max(self.peaks[pid], int(line.split()[1]) / 1024)
                except (OSError, ValueError):
                    pass

    def spawn(self, cmd: list[str], **kwargs: object) -> subprocess.Popen:  # type: ignore[type-arg]
        proc = subprocess.Popen(cmd, start_new_session=True, **kwargs)  # type: ignore[call-overload]
        self.peaks[proc.pid] = 0.0
        return proc

    def of(self, proc: subprocess.Popen) -> float:  # type: ignore[type-arg]
        return self.peaks.get(proc.pid, float("nan"))


RSS = PeakRss()


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def stop(proc: subprocess.Popen) -> float:  # type: ignore[type-arg]
    """Terminate a process and its whole session (the reference spawns wget children)."""
    for sig in (signal.SIGTERM, signal.SIGKILL):
        try:
            os.killpg(proc.pid, sig)
        except ProcessLookupError:
            break
        try:
            proc.wait(10)
            break
        except subprocess.TimeoutExpired:
            continue
    with contextlib.suppress(ProcessLookupError):
        os.killpg(proc.pid, signal.SIGKILL)  # leftovers in the group
    return RSS.of(proc)


def wait_for(predicate: Callable[[], bool], timeout: float) -> bool:
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        try:
            if predicate():
                return True
        except requests.RequestException:
            pass
        time.sleep(0.02)
    return False


def run_clients(
    start: Callable[[int], subprocess.Popen], count: int, t0: float, timeout: float, restarts: int
):  # type: ignore[no-untyped-def,type-arg]
    """Start ``count`` clients; restart failed ones up to ``restarts`` times (after 1 s).

    Returns (finish times of the successful clients, peak RSS, all ok, number of restarts).
    """
    procs = {i: start(i) for i in range(count)}
    tries = dict.fromkeys(procs, 0)
    done: dict[int, float] = {}
    rss, ok, restarted = 0.0, True, 0
    while len(done) < count and time.monotonic() - t0 < timeout:
        for i, proc in list(procs.items()):
            if i in done or proc.poll() is None:
                continue
            rss = max(rss, RSS.of(proc))
            if proc.returncode != 0 and tries[i] < restarts:
                tries[i] += 1
                restarted += 1
                time.sleep(1.0)
                procs[i] = start(i)
                continue
            done[i] = time.monotonic() - t0 if proc.returncode == 0 else float("nan")
            ok &= proc.returncode == 0
        time.sleep(0.01)
    for i, proc in procs.items():
        if i not in done:
            rss = max(rss, stop(proc))
            ok = False
    return sorted(t for t in done.values() if t == t), rss, ok, restarted


def log_file(path: Path) -> object:
    """Where a child's stderr goes: a file when SHARDCAST_BENCH_LOGS is set (work dirs are then kept)."""
    return open(path, "a") if os.environ.get("SHARDCAST_BENCH_LOGS") else DEVNULL


def files_ok(paths: list[Path], size: int) -> bool:
    return all(p.exists() and p.stat().st_size == size for p in paths)


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


# ---- table -------------------------------------------------------------------------------


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


# ---- compression -------------------------------------------------------------------------


def _changed_fraction(old: Path, new: Path) -> float:
    """Fraction of tensor elements whose stored (bf16) value differs between two checkpoints."""
    from safetensors.torch import load_file

    a, b = load_file(str(old)), load_file(str(new))
    changed = sum(int((a[k].view(-1) != b[k].view(-1)).sum()) for k in a)
    return changed / sum(t.numel() for t in a.values())


def main_compression(args: argparse.Namespace) -> None:
    """zstd and XOR-delta sizes on a bf16 safetensors checkpoint before/after one AdamW step."""
    import torch
    from safetensors.torch import save_file
    from transformers import LlamaConfig, LlamaForCausalLM

    from shardcast import Client, Origin

    torch.manual_seed(0)
    config = LlamaConfig(
        vocab_size=32000,
        hidden_size=args.hidden,
        intermediate_size=int(args.hidden * 2.6875),
        num_hidden_layers=args.layers,
        num_attention_heads=8,
        num_key_value_heads=4,
    )
    base = Path(args.workdir or tempfile.mkdtemp(prefix="shardcast-compress-"))
    base.mkdir(parents=True, exist_ok=True)
    rows = []
    try:
        for lr in (3e-7, 1e-5, 1e-4):
            model = LlamaForCausalLM(config)  # fp32 master weights, as a trainer keeps them

            def save(path: Path, model: LlamaForCausalLM = model) -> None:
                state = {k: v.detach().to(torch.bfloat16).contiguous() for k, v in model.state_dict().items()}
                save_file(state, str(path), metadata={"format": "pt"})

            save(base / "v1.safetensors")
            optimizer = torch.optim.AdamW(model.parameters(), lr=lr, weight_decay=0.0)
            tokens = torch.randint(0, config.vocab_size, (4, 64))
            model(input_ids=tokens, labels=tokens).loss.backward()
            optimizer.step()
            save(base / "v2.safetensors")
            new = (base / "v2.safetensors").read_bytes()
            changed = _changed_fraction(base / "v1.safetensors", base / "v2.safetensors")
            with Origin(
                base / f"origin{lr}", port=0, encoding="zstd", delta=True, shard_size=args.shard_size
            ) as origin:
                origin.publish(base / "v1.safetensors", file_name="model.safetensors")
                t0 = time.monotonic()
                manifest = origin.publish(base / "v2.safetensors", file_name="model.safetensors")
                publish_s = time.monotonic() - t0
                client = Client([origin.url])
                first = client.fetch(1, base / "c" / "v1.safetensors")
                full = client.fetch(2, base / "c" / "v2full.safetensors")
                delta = client.fetch(2, base / "c" / "v2.safetensors", base=first.path)
                assert delta.used_delta and (base / "c" / "v2.safetensors").read_bytes() == new
            assert manifest.delta is not None
            rows.append(
                (
                    lr,
                    len(new),
                    manifest.stored_bytes,
                    sum(d.stored_size for d in manifest.delta.shards),
                    changed,
                    publish_s,
                    full.seconds,
                    delta.seconds,
                )
            )
            shutil.rmtree(base / "c", ignore_errors=True)
    finally:
        if not args.workdir:
            shutil.rmtree(base, ignore_errors=True)
    params = sum(p.numel() for p in LlamaForCausalLM(config).parameters()) / 1e6
    print(
        f"\nshardcast compression: random Llama ({params:.0f} M params, bf16 safetensors), one AdamW step, "
        f"{args.shard_size / 1e6:g} MB shards, loopback\n"
    )
    header = (
        f"{'AdamW lr':>9}{'file MB':>9}{'zstd MB':>9}{'zstd %':>8}{'delta MB':>10}{'delta %':>9}"
        f"{'elems changed %':>16}{'publish s':>11}{'fetch full s':>14}{'fetch delta s':>15}"
    )
    print(header)
    print("-" * len(header))
    for lr, size, zstd, delta, changed, publish_s, full_s, delta_s in rows:
        print(
            f"{lr:>9.0e}{size / 1e6:>9.1f}{zstd / 1e6:>9.1f}{100 * zstd / size:>8.1f}{delta / 1e6:>10.2f}"
            f"{100 * delta / size:>9.1f}{100 * changed:>16.2f}{publish_s:>11.2f}{full_s:>14.2f}{delta_s:>15.2f}"
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
        "--hidden", type=int, default=512, help="--compression: model hidden size (default 512)"
    )
    parser.add_argument("--layers", type=int, default=8, help="--compression: model layers (default 8)")
    args = parser.parse_args()
    if args.compression:
        main_compression(args)
    else:
        main_transfer(args)


if __name__ == "__main__":
    main()
