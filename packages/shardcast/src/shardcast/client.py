"""The client: list the versions servers offer, fetch one verified and atomically, or follow the newest.

Typical use (an inference worker hot-reloading weights)::

    client = Client(["http://relay-a:8000", "http://relay-b:8000"])
    result = client.fetch("latest", "/ckpt/model.safetensors")
    follower = client.follower(lambda r: reload_weights(r.path), output_dir="/ckpt").start()
    ...
    follower.stop()

Following is :class:`~shardcast.follower.Follower`'s job: it polls and fetches through any
object that lists and fetches like a client, and :meth:`Client.follower` hands it this one.
The dependency points one way (client -> follower); results live in :mod:`shardcast.results`.

Synchronous methods run a private event loop (``asyncio.run``); inside async code use the
``a``-prefixed coroutines.
"""

from __future__ import annotations

import asyncio
import logging
import os
import threading
import time
from collections.abc import Callable, Sequence
from pathlib import Path

import aiohttp

from .digest import digest_file
from .errors import ManifestError, NoServerAvailableError, VersionNotFoundError
from .follower import Follower
from .layout import Index, shard_url_path
from .manifest import Manifest
from .planning import MAX_SHARDS
from .progress import DEFAULT_DEADLINE_S, DEFAULT_STALL_TIMEOUT_S, ProgressCallback
from .remote import (
    ServerError,
    VersionTracker,
    fetch_index,
    first_valid_manifest,
    make_session,
    normalise_url,
)
from .results import FetchResult, VersionListing
from .servers import ServerPool
from .signing import VerifyKey
from .sinks import OutputSink
from .transfer import RateLimiter, ShardJob, Transfer

log = logging.getLogger("shardcast.client")



class Client:
    """Downloads versions from a set of origin/relay servers.

    Args:
        servers: a list of base URLs (``http://host:port``; ``host:port`` is accepted). A
            single string is refused with a TypeError rather than guessed at (it would
            otherwise be iterated character by character): write ``Client([url])``.
        token: bearer token sent to every server.
        verify_key: pinned manifest key (:mod:`shardcast.signing`); unsigned manifests are
            then rejected.
        concurrency: shards in flight at once (default 8).
        per_server_connections: cap of concurrent shard requests per server (default 4).
        max_attempts: failed attempts per shard before giving up (default 6).
        read_timeout_s: a server silent for this long mid-response is abandoned (default 30).
        max_bytes_per_second: optional client-side rate limit over all connections.
        max_shards: refuse manifests with more shards (default 1,000,000).
    """

    def __init__(
        self,
        servers: Sequence[str],
        *,
        token: str | None = None,
        verify_key: VerifyKey | None = None,
        concurrency: int = 8,
        per_server_connections: int = 4,
        max_attempts: int = 6,
        read_timeout_s: float = 30.0,
        max_bytes_per_second: float | None = None,
        max_shards: int = MAX_SHARDS,
    ) -> None:
        if isinstance(servers, str | bytes):
            raise TypeError(f"servers must be a list of URLs, not one string: write Client([{servers!r}])")
        if not servers:
            raise ValueError("Client needs at least one server URL")
        self.servers = list(dict.fromkeys(normalise_url(s) for s in servers))
        self.token = token
        self.verify_key = verify_key
        self.concurrency = concurrency
        self.per_server_connections = per_server_connections
        self.max_attempts = max_attempts
        self.read_timeout_s = read_timeout_s
        self.max_bytes_per_second = max_bytes_per_second
        self.max_shards = max_shards

    def _session(self) -> aiohttp.ClientSession:
        return make_session(
            self.token,
            connections_per_host=self.per_server_connections + 2,
            read_timeout_s=self.read_timeout_s,
        )

    # ---- listing -------------------------------------------------------------------------

    async def _indexes(self, session: aiohttp.ClientSession) -> tuple[dict[str, Index], dict[str, str]]:
        results = await asyncio.gather(
            *(fetch_index(session, s) for s in self.servers), return_exceptions=True
        )
        indexes, errors = {}, {}
        for server, result in zip(self.servers, results, strict=True):
            if isinstance(result, Index):
                indexes[server] = result
            elif isinstance(result, ManifestError):
                errors[server] = f"corrupt index: {result}"
            elif isinstance(result, ServerError):
                errors[server] = f"unreachable: {result.reason}"
            else:
                errors[server] = f"{type(result).__name__}: {result}"
        return indexes, errors

    async def alist_versions(self) -> VersionListing:
        async with self._session() as session:
            indexes, errors = await self._indexes(session)
        return _listing(indexes, errors)

    def list_versions(self) -> VersionListing:
        """Versions listed by each reachable server (unreachable ones appear in ``errors``)."""
        return asyncio.run(self.alist_versions())

    # ---- fetch ---------------------------------------------------------------------------

    def fetch(
        self,
        version: int | str = "latest",
        output: str | os.PathLike[str] | None = None,
        *,
        deadline_s: float = DEFAULT_DEADLINE_S,
        stall_timeout_s: float = DEFAULT_STALL_TIMEOUT_S,
        base: str | os.PathLike[str] | None = None,
        progress: ProgressCallback | None = None,
        verify_whole_file: bool = True,
        fsync: bool = False,
    ) -> FetchResult:
        """Download ``version`` (an int, ``"v7"``, or ``"latest"``) to ``output``.

        ``output`` defaults to the manifest's file name in the current directory.
        ``deadline_s`` bounds the whole download; ``stall_timeout_s`` ends it sooner when no
        server has answered anything for that long (every server dead or cut off). ``base``
        is the previous version's file; when the manifest carries a delta against exactly
        that file (checked by digest) only the delta shards are downloaded.
        ``verify_whole_file`` (default on) also checks the whole-file digest, hashed while
        shards arrive; ``fsync`` (default off) flushes the file to disk before the rename
        (power-loss durability at the cost of a full writeback).

        Raises:
            VersionNotFoundError, VersionGoneError, NoServerAvailableError,
            DeadlineExceededError, ManifestError/SignatureError, IntegrityError.
        """
        return asyncio.run(
            self.afetch(
                version,
                output,
                deadline_s=deadline_s,
                stall_timeout_s=stall_timeout_s,
                base=base,
                progress=progress,
                verify_whole_file=verify_whole_file,
                fsync=fsync,
            )
        )

    async def afetch(
        self,
        version: int | str = "latest",
        output: str | os.PathLike[str] | None = None,
        *,
        deadline_s: float = DEFAULT_DEADLINE_S,
        stall_timeout_s: float = DEFAULT_STALL_TIMEOUT_S,
        base: str | os.PathLike[str] | None = None,
        progress: ProgressCallback | None = None,
        verify_whole_file: bool = True,
        fsync: bool = False,
        base_digest: str | None = None,
    ) -> FetchResult:
        started = time.monotonic()
        deadline = started + deadline_s
        async with self._session() as session:
            indexes, errors = await self._indexes(session)
            listing = _listing(indexes, errors)
            if not indexes:
                raise NoServerAvailableError(
                    "no server gave a usable index: " + "; ".join(f"{k} {v}" for k, v in errors.items())
                )
            number = _resolve(version, listing)
            manifest, source = await self._manifest(session, number, listing)
            target = Path(output) if output is not None else Path.cwd() / manifest.file_name
            target = target.resolve()
            use_delta = await _delta_usable(manifest, base, base_digest)
            tracker = VersionTracker(session, manifest, verify_key=self.verify_key)
            tracker.mark_agrees(source)
            await asyncio.gather(*(tracker.refresh(s) for s in self.servers), return_exceptions=True)
            pool = ServerPool(self.servers, max_in_flight=self.per_server_connections)
            jobs = _jobs(manifest, use_delta)
            sink = OutputSink(manifest, target, use_delta=use_delta, base_path=Path(base) if base else None)
            log.info(
                "fetching v%d (%s, %d bytes, %d shards%s) from %d servers",
                number,
                manifest.file_name,
                manifest.file_size,
                manifest.num_shards,
                ", delta" if use_delta else "",
                len(self.servers),
            )
            transfer = Transfer(
                session=session,
                pool=pool,
                tracker=tracker,
                sink=sink,
                jobs=jobs,
                deadline=deadline,
                concurrency=self.concurrency,
                max_attempts=self.max_attempts,
                progress=progress,
                rate_limiter=RateLimiter(self.max_bytes_per_second) if self.max_bytes_per_second else None,
                stall_timeout_s=stall_timeout_s,
            )
            try:
                stats = await transfer.run()
                await asyncio.to_thread(sink.finalize, verify_whole_file, fsync)
            finally:
                sink.close()
        seconds = time.monotonic() - started
        log.info(
            "fetched v%d to %s: %d bytes downloaded, %d resumed, %d bad shards, %.2fs",
            number,
            target,
            stats.bytes_downloaded,
            stats.bytes_resumed,
            stats.bad_shards,
            seconds,
        )
        return FetchResult(
            version=number,
            path=target,
            manifest=manifest,
            bytes_downloaded=stats.bytes_downloaded,
            bytes_resumed=stats.bytes_resumed,
            bad_shards=stats.bad_shards,
            used_delta=use_delta,
            seconds=seconds,
            servers=tuple(pool.reports()),
        )

    async def _manifest(
        self, session: aiohttp.ClientSession, number: int, listing: VersionListing
    ) -> tuple[Manifest, str]:
        """First valid manifest, trying servers that list the version as complete first."""
        complete = listing.complete.get(number, [])
        order = complete + [s for s in listing.versions[number] if s not in complete]
        return await first_valid_manifest(
            session, order, number, verify_key=self.verify_key, max_shards=self.max_shards
        )


    # ---- follow --------------------------------------------------------------------------

    def follower(
        self,
        callback: Callable[[FetchResult], None],
        *,
        output_dir: str | os.PathLike[str],
        poll_interval_s: float = 5.0,
        keep: int | None = 3,
        deadline_s: float = DEFAULT_DEADLINE_S,
        on_error: Callable[[Exception], None] | None = None,
    ) -> Follower:
        """A :class:`~shardcast.follower.Follower` of this client's servers (call ``.start()``,
        later ``.stop()``); ``keep=None`` leaves pruning to the caller."""
        return Follower(
            self,
            callback,
            output_dir=output_dir,
            poll_interval_s=poll_interval_s,
            keep=keep,
            deadline_s=deadline_s,
            on_error=on_error,
        )

    def follow(
        self,
        callback: Callable[[FetchResult], None],
        *,
        output_dir: str | os.PathLike[str],
        poll_interval_s: float = 5.0,
        keep: int | None = 3,
        deadline_s: float = DEFAULT_DEADLINE_S,
        stop: threading.Event | None = None,
    ) -> None:
        """Block, fetching each new newest version into ``output_dir/v<N>/<file>`` until ``stop`` is set."""
        Follower(
            self,
            callback,
            output_dir=output_dir,
            poll_interval_s=poll_interval_s,
            keep=keep,
            deadline_s=deadline_s,
            stop=stop,
        ).run()

def _listing(indexes: dict[str, Index], errors: dict[str, str]) -> VersionListing:
    versions: dict[int, list[str]] = {}
    complete: dict[int, list[str]] = {}
    for server, index in indexes.items():
        for entry in index.versions:
            versions.setdefault(entry.version, []).append(server)
            if entry.complete:
                complete.setdefault(entry.version, []).append(server)
    return VersionListing(versions, complete, errors)


def _resolve(version: int | str, listing: VersionListing) -> int:
    from .manifest import parse_version_name

    if version == "latest":
        latest = listing.latest()
        if latest is None:
            raise VersionNotFoundError("no server lists any version yet")
        return latest
    number = parse_version_name(version)
    if number not in listing.versions:
        available = sorted(listing.versions)
        raise VersionNotFoundError(
            f"version {number} is not listed by any reachable server (available: {available})"
        )
    return number


async def _delta_usable(
    manifest: Manifest, base: str | os.PathLike[str] | None, base_digest: str | None
) -> bool:
    if base is None or manifest.delta is None:
        return False
    path = Path(base)
    if not path.is_file() or path.stat().st_size != manifest.file_size:
        return False
    if base_digest is None:
        base_digest = await asyncio.to_thread(digest_file, path)
    return base_digest == manifest.delta.base_digest


def _jobs(manifest: Manifest, use_delta: bool) -> list[ShardJob]:
    if use_delta:
        assert manifest.delta is not None
        return [
            ShardJob(
                i, shard_url_path(manifest.version, i, delta=True), d.stored_size, d.stored_digest, delta=True
            )
            for i, d in enumerate(manifest.delta.shards)
        ]
    return [
        ShardJob(s.index, shard_url_path(manifest.version, s.index), s.stored_size, s.stored_digest)
        for s in manifest.shards
    ]
