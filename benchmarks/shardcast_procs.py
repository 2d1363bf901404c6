"""Process plumbing of benchmarks/shardcast_bench.py: spawn a node with its peak RSS sampled,
stop a node's whole session, poll for a condition, and run (and restart) a fleet of clients.

Shared by both systems and the limit runs so that every row is measured the same way.
"""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import requests

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
        self._sampler: threading.Thread | None = None  # started by the first spawn, not at import:
        # a test that only imports a benchmark (pytest's whole session) must not get a 20 ms loop

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
        if self._sampler is None:
            self._sampler = threading.Thread(target=self._loop, daemon=True)
            self._sampler.start()
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
