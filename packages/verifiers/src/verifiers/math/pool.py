"""A pool of warm worker processes that decide math equivalence under a hard deadline.

Why processes: sympy work cannot be interrupted from another thread, and SIGALRM only works
in the main thread (math-verify's limitation). Each request goes to an idle worker over a
pipe; the caller waits with `select` until its deadline and, if the worker is late, kills
it (SIGKILL) and starts a replacement in the background. This works from any thread and
from inside a running asyncio loop (the wait blocks only the calling thread).

Latency: a warm round trip is ~0.2 ms plus the comparison itself; a worker boots in about
a second (sympy import), which is never charged to a request's timeout.

Pitfall: after `os.fork()` the child gets a fresh pool (workers belong to one process).
"""

from __future__ import annotations

import atexit
import contextlib
import json
import os
import select
import subprocess
import sys
import threading
import time
from dataclasses import dataclass

from verifiers.errors import WorkerError

BOOT_TIMEOUT_S = 120.0


class _Worker:
    def __init__(self, memory_mb: int):
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "verifiers.math._worker", str(memory_mb)],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,
            start_new_session=True,
            bufsize=0,
        )
        self.buffer = b""
        if self._read_line(time.monotonic() + BOOT_TIMEOUT_S) is None:
            self.kill()
            raise WorkerError("math worker did not start (is sympy importable in this interpreter?)")

    def _read_line(self, deadline: float) -> dict | None:
        assert self.proc.stdout is not None
        fd = self.proc.stdout.fileno()
        while b"\n" not in self.buffer:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                return None
            ready, _, _ = select.select([fd], [], [], remaining)
            if not ready:
                return None
            chunk = os.read(fd, 65536)
            if not chunk:
                return None
            self.buffer += chunk
        line, self.buffer = self.buffer.split(b"\n", 1)
        return json.loads(line)

    def ask(self, request: dict, timeout: float) -> dict | None:
        """The worker's reply, or None if it missed the deadline or died (then it is dead)."""
        assert self.proc.stdin is not None
        try:
            self.proc.stdin.write(json.dumps(request).encode() + b"\n")
        except (BrokenPipeError, OSError):
            return None
        return self._read_line(time.monotonic() + timeout)

    def kill(self) -> None:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(self.proc.pid, 9)
        self.proc.wait()
        for stream in (self.proc.stdin, self.proc.stdout):
            if stream is not None:
                stream.close()


@dataclass(frozen=True)
class PoolReply:
    """Outcome of one request: `status` is "ok", "timeout" or "error"."""

    equal: bool
    status: str
    error: str | None = None


class MathWorkerPool:
    """Up to `size` warm sympy worker processes, each limited to `memory_mb` of address space.

    Thread-safe. `ask(request, timeout)` blocks the calling thread until a worker is free and
    then at most `timeout` seconds for the answer; a late worker is killed and replaced.
    """

    def __init__(self, size: int = 2, *, memory_mb: int = 1024):
        if size < 1:
            raise ValueError(f"pool size must be >= 1, got {size}")
        self.size = size
        self.memory_mb = memory_mb
        self._pid = os.getpid()
        self._idle: list[_Worker] = []
        self._live = 0
        self._cond = threading.Condition()
        self._closed = False

    def _spawn_into_idle(self) -> None:
        try:
            worker = _Worker(self.memory_mb)
        except Exception:
            with self._cond:
                self._live -= 1
                self._cond.notify()
            return
        with self._cond:
            if self._closed:
                worker.kill()
                self._live -= 1
            else:
                self._idle.append(worker)
            self._cond.notify()

    def warm(self) -> None:
        """Start all `size` workers now and wait until they are ready."""
        with self._cond:
            missing = self.size - self._live
            self._live += missing
        threads = [threading.Thread(target=self._spawn_into_idle, daemon=True) for _ in range(missing)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()

    def _acquire(self) -> _Worker:
        with self._cond:
            while True:
                if self._closed:
                    raise WorkerError("pool is closed")
                if self._idle:
                    return self._idle.pop()
                if self._live < self.size:
                    self._live += 1
                    break
                self._cond.wait()
        try:
            return _Worker(self.memory_mb)
        except Exception:
            with self._cond:
                self._live -= 1
                self._cond.notify()
            raise

    def _release(self, worker: _Worker, healthy: bool) -> None:
        if healthy and not self._closed:
            with self._cond:
                self._idle.append(worker)
                self._cond.notify()
            return
        worker.kill()
        if self._closed:
            with self._cond:
                self._live -= 1
                self._cond.notify()
            return
        threading.Thread(target=self._spawn_into_idle, daemon=True).start()  # stays counted in _live

    def ask(self, request: dict, timeout: float) -> PoolReply:
        worker = self._acquire()
        reply = None
        try:
            reply = worker.ask(request, timeout)
        finally:
            self._release(worker, healthy=reply is not None)
        if reply is None:
            return PoolReply(False, "timeout", f"no answer within {timeout:g} s; worker killed")
        if reply.get("error"):
            return PoolReply(False, "error", reply["error"])
        return PoolReply(bool(reply["equal"]), "ok")

    def close(self) -> None:
        """Kill all workers; later `ask` calls raise WorkerError."""
        with self._cond:
            self._closed = True
            idle, self._idle = self._idle, []
            self._live -= len(idle)
            self._cond.notify_all()
        for worker in idle:
            worker.kill()


_default: MathWorkerPool | None = None
_default_lock = threading.Lock()


def default_pool() -> MathWorkerPool:
    """The process-wide pool (size = max(2, CPU count), 1 GiB per worker), created lazily."""
    global _default
    with _default_lock:
        if _default is None or _default._pid != os.getpid() or _default._closed:
            _default = MathWorkerPool(max(2, os.cpu_count() or 2))
        return _default


def configure_default_pool(size: int, *, memory_mb: int = 1024) -> MathWorkerPool:
    """Replace the process-wide pool (closing the old one)."""
    global _default
    with _default_lock:
        if _default is not None and _default._pid == os.getpid():
            _default.close()
        _default = MathWorkerPool(size, memory_mb=memory_mb)
        return _default


@atexit.register
def _shutdown() -> None:
    if _default is not None and _default._pid == os.getpid():
        _default.close()
