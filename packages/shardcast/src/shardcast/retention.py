"""Retention on a serving node: delete retired versions once their grace period is over.

A version beyond ``keep`` is retired (unlisted) when a newer one is added to the index, and its
directory is deleted by :meth:`DataDir.update_index <shardcast.layout.DataDir.update_index>`
``grace_s`` seconds later. That call only happens when something touches the index, so an
origin or relay that receives no new version would keep a retired version forever: the
:class:`RetentionSweeper` thread calls it on a timer instead, so a retired version is gone
within ``grace_s`` + one sweep interval whatever arrives.
"""

from __future__ import annotations

import logging
import threading

from .layout import DataDir

log = logging.getLogger("shardcast.retention")


def sweep_interval_s(grace_s: float) -> float:
    """Seconds between sweeps: a quarter of the grace period, within [0.5, 30].

    So a retired version outlives its grace period by at most a quarter of it (30 s for the
    default 300 s), and a short grace (tests) does not turn the sweep into a busy loop.
    """
    return max(0.5, min(30.0, grace_s / 4))


class RetentionSweeper:
    """A daemon thread that calls :meth:`collect` every :func:`sweep_interval_s` until stopped.

    ``name`` labels the thread and the log lines (``"origin"``, ``"relay"``). Safe to run next to
    publishing or mirroring: every index change holds the data directory's lock.
    """

    def __init__(self, data_dir: DataDir, *, keep: int, grace_s: float, name: str) -> None:
        self.data_dir = data_dir
        self.keep = keep
        self.grace_s = grace_s
        self.name = name
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def collect(self) -> list[int]:
        """Delete retired versions whose grace period is over; returns their numbers."""
        _, deleted = self.data_dir.update_index(keep=self.keep, grace_s=self.grace_s)
        if deleted:
            log.info("%s deleted expired versions %s", self.name, deleted)
        return deleted

    def start(self) -> None:
        self._stop.clear()
        self._thread = threading.Thread(target=self._loop, name=f"shardcast-{self.name}-gc", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=5)
            self._thread = None

    def _loop(self) -> None:
        interval = sweep_interval_s(self.grace_s)
        while not self._stop.wait(interval):
            try:
                self.collect()
            except OSError as exc:
                log.warning("%s garbage collection failed: %s", self.name, exc)
