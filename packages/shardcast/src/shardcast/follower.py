"""Follow the newest version: a background thread that fetches each new one and calls back.

This is what an inference worker needs for hot reloads (see :meth:`Client.follower`).
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import os
import shutil
import threading
from collections.abc import Callable
from pathlib import Path

from .client import Client, FetchResult
from .errors import ShardcastError

log = logging.getLogger("shardcast.follower")


class Follower(threading.Thread):
    """Background thread that fetches every new newest version and calls ``callback``.

    Each version lands in ``output_dir/v<N>/<file_name>`` (atomically); the previous
    version is passed as delta base; only the newest ``keep`` version directories are kept
    (``keep=None``: none is removed, the caller prunes). Errors are logged (and passed to
    ``on_error``) and retried at the next poll; the callback runs on this thread, after the
    file is complete and verified.
    """

    def __init__(
        self,
        client: Client,
        callback: Callable[[FetchResult], None],
        output_dir: Path,
        poll_interval_s: float,
        keep: int | None,
        deadline_s: float,
        on_error: Callable[[Exception], None] | None,
    ) -> None:
        super().__init__(name="shardcast-follower", daemon=True)
        self.client = client
        self.callback = callback
        self.output_dir = output_dir
        self.poll_interval_s = poll_interval_s
        self.keep = None if keep is None else max(1, keep)
        self.deadline_s = deadline_s
        self.on_error = on_error
        self.last: FetchResult | None = None
        self._stop_event = threading.Event()

    def start(self) -> Follower:  # type: ignore[override]
        super().start()
        return self

    def stop(self, timeout: float | None = 10.0) -> None:
        self._stop_event.set()
        if self.is_alive() and threading.current_thread() is not self:
            self.join(timeout)

    def run(self) -> None:
        while not self._stop_event.is_set():
            try:
                self._poll_once()
            except (ShardcastError, OSError) as exc:
                log.warning("follower: %s", exc)
                if self.on_error is not None:
                    self.on_error(exc)
            self._stop_event.wait(self.poll_interval_s)

    def _poll_once(self) -> None:
        listing = self.client.list_versions()
        latest = listing.latest()
        if latest is None or (self.last is not None and latest <= self.last.version):
            return
        output = self.output_dir / f"v{latest}" / "_incoming"
        output.parent.mkdir(parents=True, exist_ok=True)
        base = self.last
        result = asyncio.run(
            self.client.afetch(
                latest,
                output,
                deadline_s=self.deadline_s,
                base=base.path if base else None,
                base_digest=base.manifest.file_digest if base else None,
            )
        )
        final = result.path.with_name(result.manifest.file_name)
        os.replace(result.path, final)
        result = dataclasses.replace(result, path=final)
        self.last = result
        if self.keep is not None:
            self._prune(self.keep)
        self.callback(result)

    def _prune(self, keep: int) -> None:
        versions = sorted(
            int(p.name[1:])
            for p in self.output_dir.iterdir()
            if p.is_dir() and p.name[1:].isdigit() and p.name[0] == "v"
        )
        for number in versions[: max(0, len(versions) - keep)]:
            shutil.rmtree(self.output_dir / f"v{number}", ignore_errors=True)
