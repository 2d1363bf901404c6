"""Logging setup and the metrics JSONL writer: one of each per process.

Every process of a run writes
  - human log lines to stderr and ``<run_dir>/logs/<name>.log``
    (format ``HH:MM:SS [LEVEL] [name] message``), one line per meaningful event;
  - machine-readable metrics to ``<run_dir>/metrics/<name>.jsonl``: one JSON object per line,
    ``{"time": unix_seconds, "role": str, "name": str, "event": str, ...fields}``.
    Lines are flushed as written so ``tail -f`` and a crashed process both keep every record.

Use ``init_process(role, name, run_dir)`` once in a role's ``main``; library code only calls
``logging.getLogger(__name__)`` and ``get_metrics()``. Experiment trackers (W&B, TensorBoard:
:mod:`prime_rl.trackers`) receive every record a process's writer writes, through
``add_sink``; a sink that raises is dropped with one warning, so a tracker never stops a run.

Pitfall: values must be JSON-serialisable; numpy/torch scalars are converted with ``float()``/
``int()``/``.item()`` by ``_jsonable``; NaN/Inf become the strings "nan"/"inf"/"-inf" so every
line stays strict JSON.

A long wait logs what it waits for at least every ``WAIT_LOG_EVERY_S`` (paced by :class:`WaitLog`),
so no process ever looks hung.
"""

from __future__ import annotations

import atexit
import json
import logging
import math
import os
import sys
import threading
import time
from collections import defaultdict
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any, Protocol

__all__ = [
    "WAIT_LOG_EVERY_S",
    "CallTimes",
    "MetricsSink",
    "MetricsWriter",
    "ProcessPaths",
    "WaitLog",
    "add_sink",
    "get_metrics",
    "init_process",
    "process_paths",
    "read_metrics",
    "setup_logging",
]

log = logging.getLogger(__name__)

LOG_FORMAT = "%(asctime)s [%(levelname)s] [%(processname)s] %(message)s"
LOG_DATEFMT = "%H:%M:%S"


@dataclass(frozen=True)
class ProcessPaths:
    """Where one process writes: ``log`` (text) and ``metrics`` (JSONL)."""

    log: Path
    metrics: Path


def process_paths(run_dir: str | Path, name: str) -> ProcessPaths:
    """``<run_dir>/logs/<name>.log`` and ``<run_dir>/metrics/<name>.jsonl``."""
    root = Path(run_dir)
    return ProcessPaths(log=root / "logs" / f"{name}.log", metrics=root / "metrics" / f"{name}.jsonl")


class _NameFilter(logging.Filter):
    def __init__(self, name: str) -> None:
        super().__init__()
        self._process_name = name

    def filter(self, record: logging.LogRecord) -> bool:
        record.processname = self._process_name
        return True


def setup_logging(name: str, log_file: str | Path | None = None, level: int | str = "INFO") -> None:
    """Configure the root logger: stderr plus (optionally) ``log_file``, one format for both.

    Idempotent: handlers installed by a previous call are replaced, not duplicated.
    """
    root = logging.getLogger()
    for handler in list(root.handlers):
        if getattr(handler, "_prime_rl", False):
            root.removeHandler(handler)
            handler.close()
    formatter = logging.Formatter(LOG_FORMAT, LOG_DATEFMT)
    handlers: list[logging.Handler] = [logging.StreamHandler(sys.stderr)]
    if log_file is not None:
        Path(log_file).parent.mkdir(parents=True, exist_ok=True)
        handlers.append(logging.FileHandler(log_file, encoding="utf-8"))
    for handler in handlers:
        handler.setFormatter(formatter)
        handler.addFilter(_NameFilter(name))
        handler._prime_rl = True  # type: ignore[attr-defined]
        root.addHandler(handler)
    root.setLevel(level)
    # aiohttp logs one line per request at INFO; that is noise next to our event lines.
    logging.getLogger("aiohttp.access").setLevel(logging.WARNING)


def _jsonable(value: Any) -> Any:
    if isinstance(value, bool) or value is None or isinstance(value, str | int):
        return value
    if isinstance(value, float):
        if math.isnan(value):
            return "nan"
        if math.isinf(value):
            return "inf" if value > 0 else "-inf"
        return value
    if isinstance(value, dict):
        return {str(k): _jsonable(v) for k, v in value.items()}
    if isinstance(value, list | tuple | set | frozenset):
        return [_jsonable(v) for v in value]
    if isinstance(value, Path):
        return str(value)
    item = getattr(value, "item", None)  # numpy / torch scalars
    if callable(item):
        try:
            return _jsonable(item())
        except (TypeError, ValueError, RuntimeError):
            pass
    return str(value)


class MetricsSink(Protocol):
    """Receives every record a process's metrics file receives (an experiment tracker)."""

    def log(self, record: Mapping[str, Any]) -> None: ...

    def close(self) -> None: ...


_SINKS: list[MetricsSink] = []


def _close_sinks() -> None:
    while _SINKS:
        sink = _SINKS.pop()
        try:
            sink.close()
        except Exception as error:  # a tracker failing at exit must not hide the process's exit code
            log.warning("closing %s failed: %s", type(sink).__name__, error)


def add_sink(sink: MetricsSink) -> None:
    """Forward every record of this process's writer (now and after later ``init_process``) to
    ``sink``; sinks are closed at interpreter exit."""
    if not _SINKS:
        atexit.register(_close_sinks)
    _SINKS.append(sink)


def _forward(record: Mapping[str, Any]) -> None:
    for sink in list(_SINKS):
        try:
            sink.log(record)
        except Exception as error:  # trackers are optional: one that breaks is dropped, the run goes on
            log.warning("dropping metrics sink %s after an error: %s", type(sink).__name__, error)
            _SINKS.remove(sink)


class MetricsWriter:
    """Append-only JSONL metrics file; thread-safe; each record flushed on write.

    ``writer.log("step", step=3, loss=0.12)`` writes
    ``{"time": 1712.3, "role": "trainer", "name": "trainer", "event": "step", "step": 3, "loss": 0.12}``.
    A writer with ``path=None`` drops records (for library use without a run dir); a writer with a
    file also hands each record to the sinks of ``add_sink``.
    """

    def __init__(self, path: str | Path | None, *, role: str, name: str) -> None:
        self.path = Path(path) if path is not None else None
        self.role = role
        self.name = name
        self._lock = threading.Lock()
        self._file: IO[str] | None = None
        if self.path is not None:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            self._file = open(self.path, "a", encoding="utf-8")  # noqa: SIM115 - lives with the writer

    def log(self, event: str, **fields: Any) -> None:
        """Write one record; never raises on odd values (they are stringified)."""
        if self._file is None:
            return
        record = {"time": time.time(), "role": self.role, "name": self.name, "event": event}
        record.update({k: _jsonable(v) for k, v in fields.items()})
        line = json.dumps(record, allow_nan=False, separators=(",", ":"))
        with self._lock:
            self._file.write(line + "\n")
            self._file.flush()
            _forward(record)  # under the lock: sinks see records one at a time, in file order

    def close(self) -> None:
        with self._lock:
            if self._file is not None:
                self._file.close()
                self._file = None


_METRICS = MetricsWriter(None, role="library", name="library")


def get_metrics() -> MetricsWriter:
    """The process-wide writer set by ``init_process`` (a no-op writer before that)."""
    return _METRICS


def init_process(
    role: str, name: str, run_dir: str | Path | None, level: int | str = "INFO"
) -> MetricsWriter:
    """Set up logging and the metrics writer of this process; returns the writer.

    With ``run_dir=None`` logs go to stderr only and metrics are dropped.
    """
    global _METRICS
    paths = process_paths(run_dir, name) if run_dir is not None else None
    setup_logging(name, paths.log if paths else None, level=os.environ.get("PRIME_RL_LOG_LEVEL", level))
    _METRICS.close()
    _METRICS = MetricsWriter(paths.metrics if paths else None, role=role, name=name)
    _METRICS.log("start", pid=os.getpid())
    return _METRICS


def read_metrics(path: str | Path) -> Iterator[dict[str, Any]]:
    """Yield the records of a metrics JSONL file, skipping a torn last line of a killed process."""
    with open(path, encoding="utf-8") as handle:
        for line in handle:
            line = line.strip()
            if not line:
                continue
            try:
                record = json.loads(line)
            except json.JSONDecodeError:
                continue
            if isinstance(record, dict):
                yield record


WAIT_LOG_EVERY_S = 30.0
"""Seconds between progress lines while a process waits (for a policy version, for work, ...)."""


class WaitLog:
    """Paces the progress lines of one wait: a long wait logs what it waits for at least every
    ``every_s`` seconds, so it never looks like a hang (and a short one stays quiet)."""

    def __init__(self, every_s: float = WAIT_LOG_EVERY_S) -> None:
        self.started = time.monotonic()
        self.every_s = every_s
        self._next = self.started + every_s

    def due(self) -> float | None:
        """The seconds waited so far when a progress line is due (then the next is ``every_s`` away), else None."""
        now = time.monotonic()
        if now < self._next:
            return None
        self._next = now + self.every_s
        return now - self.started


class CallTimes:
    """Latencies per window: every ``window_s`` the first call after it ends the window and logs one
    metrics ``event``: per ``"METHOD /path"`` key the calls, the ones that failed (status 0: no
    answer, 429, 5xx), and p50/p99/max in ms. Thread-safe. ``record`` fits
    ``OrchestratorClient(on_answer=...)`` (a role's calls as it waited for them, ``role.py``); the
    orchestrator records where its trusted calls spend their time with it (``orchestrator/delivery.py``)."""

    def __init__(
        self,
        event: str,
        window_s: float = 10.0,
        clock: Callable[[], float] = time.monotonic,
        writer: MetricsWriter | None = None,
    ) -> None:
        self.event, self.window_s, self._clock = event, window_s, clock
        self._writer = writer  # None: the process's (``get_metrics``), looked up at each window's end
        self._lock = threading.Lock()
        self._since = clock()
        self._times: dict[str, list[float]] = defaultdict(list)
        self._failed: dict[str, int] = defaultdict(int)

    def record(self, method: str, path: str, status: int, seconds: float) -> None:
        key = f"{method} {path}"
        with self._lock:
            self._times[key].append(seconds)
            self._failed[key] += status == 0 or status == 429 or status >= 500
            if self._clock() - self._since < self.window_s:
                return
        self.flush()

    def flush(self) -> None:
        """Log the window so far (if it holds a call) and start the next one (``run_role`` at exit)."""
        with self._lock:
            now = self._clock()
            times, failed, since = self._times, self._failed, self._since
            self._times, self._failed, self._since = defaultdict(list), defaultdict(int), now
        if not times:
            return
        calls = {}
        for name, values in sorted(times.items()):
            ordered = sorted(values)
            calls[name] = {
                "n": len(ordered), "failed": failed[name],
                "p50_ms": round(1000 * ordered[len(ordered) // 2], 2),
                "p99_ms": round(1000 * ordered[min(len(ordered) - 1, int(0.99 * len(ordered)))], 2),
                "max_ms": round(1000 * ordered[-1], 2),
            }  # fmt: skip
        (self._writer or get_metrics()).log(self.event, window_s=round(now - since, 2), calls=calls)
