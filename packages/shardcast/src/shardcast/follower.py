"""Follow the newest version: a background thread that fetches each new one and calls back.

This is what an inference worker needs for hot reloads::

    client = Client(["http://relay-a:8000", "http://relay-b:8000"])
    follower = Follower(client, lambda r: reload_weights(r.path), output_dir="/ckpt").start()
    ...                                  # or: client.follower(callback, output_dir=...)
    follower.stop()

A follower needs only something that lists versions and fetches one (:class:`VersionSource`,
which :class:`~shardcast.client.Client` is); it does not import the client, so the
dependency points one way: client -> follower.
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
from typing import Protocol

from .errors import ShardcastError
from .progress import DEFAULT_DEADLINE_S
from .results import FetchResult, VersionListing

log = logging.getLogger("shardcast.follower")


class VersionSource(Protocol):
    """What a follower polls and fetches through (a :class:`~shardcast.client.Client`)."""

    def list_versions(self) -> VersionListing: ...

    async def afetch(
        self,
        version: int | str,
        output: str | os.PathLike[str] | None,
        *,
        deadline_s: float,
        base: str | os.PathLike[str] | None,
        base_digest: str | None,
    ) -> FetchResult: ...


class Follower(threading.Thread):
    """Background thread that fetches every new newest version and calls ``callback``.

    Each version lands in ``output_dir/v<N>/<file_name>`` (atomically); the previous
    version is passed as delta base; only the newest ``keep`` version directories are kept
    (``keep=None``: none is removed, the caller prunes). Errors are logged (and passed to
    ``on_error``) and retried at the next poll; the callback runs on this thread, after the
    file is complete and verified.

    ``start()`` runs it in the background (``stop()`` ends it); calling ``run()`` directly
    follows in the calling thread until ``stop()`` is called or ``stop`` is set.

    Args:
        client: lists versions and fetches them (a :class:`~shardcast.client.Client`: its
            servers, token and pinned key apply).
        callback: called with each new version's :class:`~shardcast.results.FetchResult`.
        output_dir: where ``v<N>/<file_name>`` directories are written.
        poll_interval_s: seconds between listings (default 5).
        keep: version directories kept, newest first (default 3; at least 1; ``None``: all).
        deadline_s: limit of one version's download (default the client's fetch default).
        on_error: also called with every error (they are logged and retried regardless).
        stop: an event that ends the follower when set (default: its own, set by ``stop()``).
    """

    def __init__(
        self,
        client: VersionSource,
        callback: Callable[[FetchResult], None],
        *,
        output_dir: str | os.PathLike[str],
        poll_interval_s: float = 5.0,
        keep: int | None = 3,
        deadline_s: float = DEFAULT_DEADLINE_S,
        on_error: Callable[[Exception], None] | None = None,
        stop: threading.Event | None = None,
    ) -> None:
        super().__init__(name="shardcast-follower", daemon=True)
        self.client = client
        self.callback = callback
        self.output_dir = Path(output_dir)
        self.poll_interval_s = poll_interval_s
        self.keep = None if keep is None else max(1, keep)
        self.deadline_s = deadline_s
        self.on_error = on_error
        self.last: FetchResult | None = None
        self._stop_event = stop if stop is not None else threading.Event()

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
            # isascii too: str.isdigit accepts '²', which int() then refuses (the orchestrator's pitfall)
            if p.is_dir() and p.name[0] == "v" and p.name[1:].isascii() and p.name[1:].isdigit()
        )
        for number in versions[: max(0, len(versions) - keep)]:
            shutil.rmtree(self.output_dir / f"v{number}", ignore_errors=True)
