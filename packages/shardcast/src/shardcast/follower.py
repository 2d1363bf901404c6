"""Follow the newest version: a background thread that fetches each new one and calls back.

This is what an inference worker needs for hot reloads::

    client = Client(["http://relay-a:8000", "http://relay-b:8000"])
    follower = Follower(client, lambda r: reload_weights(r.path), output_dir="/ckpt").start()
    ...
    follower.stop()

A follower is built on a :class:`~shardcast.client.Client` (it lists and fetches through
it); the client does not know about followers.
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
from .progress import DEFAULT_DEADLINE_S

log = logging.getLogger("shardcast.follower")


class Follower(threading.Thread):
    """Background thread that fetches every new newest version and calls ``callback``.

    Each version lands in ``output_dir/v<N>/<file_name>`` (atomically); the previous
    version is passed as delta base; only the newest ``keep`` version directories are kept.
    Errors are logged (and passed to ``on_error``) and retried at the next poll; the
    callback runs on this thread, after the file is complete and verified.

    ``start()`` runs it in the background (``stop()`` ends it); calling ``run()`` directly
    follows in the calling thread until another thread calls ``stop()``.

    Args:
        client: lists versions and fetches them (its servers, token and pinned key apply).
        callback: called with each new version's :class:`~shardcast.client.FetchResult`.
        output_dir: where ``v<N>/<file_name>`` directories are written.
        poll_interval_s: seconds between listings (default 5).
        keep: version directories kept, newest first (default 3; at least 1).
        deadline_s: limit of one version's download (default the client's fetch default).
        on_error: also called with every error (they are logged and retried regardless).
    """

    def __init__(
        self,
        client: Client,
        callback: Callable[[FetchResult], None],
        *,
        output_dir: str | os.PathLike[str],
        poll_interval_s: float = 5.0,
        keep: int = 3,
        deadline_s: float = DEFAULT_DEADLINE_S,
        on_error: Callable[[Exception], None] | None = None,
    ) -> None:
        super().__init__(name="shardcast-follower", daemon=True)
        self.client = client
        self.callback = callback
        self.output_dir = Path(output_dir)
        self.poll_interval_s = poll_interval_s
        self.keep = max(1, keep)
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
        self._prune()
        self.callback(result)

    def _prune(self) -> None:
        versions = sorted(
            int(p.name[1:])
            for p in self.output_dir.iterdir()
            if p.is_dir() and p.name[1:].isdigit() and p.name[0] == "v"
        )
        for number in versions[: max(0, len(versions) - self.keep)]:
            shutil.rmtree(self.output_dir / f"v{number}", ignore_errors=True)
