"""The relay: mirror one or more upstreams and re-serve, verified shard by shard.

Loop (every ``poll_interval_s``):

1. read every upstream's ``index.json`` (unreachable upstreams are skipped, the relay keeps
   serving what it has);
2. pick the newest listed version not yet complete here (older backlog within ``keep``
   follows, newest first);
3. fetch its manifest (validated, signature checked), write it to ``v<N>/manifest.json``
   and list ``v<N>`` as ``complete: false``;
4. download shards from all upstreams with the client's engine, every delta shard before
   any full shard (a client holding the previous version needs only the deltas); each shard
   is verified and only then renamed into ``v<N>/``, where it is served at once, so a
   downstream relay or client can fetch shard 0 while shard 9 is in flight;
5. mark the version ``complete: true``; versions beyond ``keep`` are retired (unlisted).

A sweep thread (:mod:`shardcast.retention`) deletes each retired version once ``grace_s`` has
passed since it was retired, whether or not a newer version arrives.

All local paths come from validated integers (:mod:`shardcast.layout`), so nothing an
upstream sends can make the relay write outside its data directory.
"""

from __future__ import annotations

import asyncio
import logging
import os
import shutil
import threading
import time
from collections.abc import Sequence
from typing import Self

import aiohttp

from .errors import ManifestError, ShardcastError, VersionGoneError
from .layout import DataDir, Index, IndexEntry, RetiredEntry, shard_url_path
from .manifest import Manifest, parse_manifest
from .planning import MAX_SHARDS
from .progress import DEFAULT_DEADLINE_S
from .publish import DEFAULT_GRACE_S, DEFAULT_KEEP
from .remote import (
    ServerError,
    VersionTracker,
    fetch_index,
    first_valid_manifest,
    make_session,
    normalise_url,
)
from .served import ServedDir
from .servers import ServerPool
from .signing import VerifyKey
from .sinks import MirrorSink
from .transfer import ShardJob, Transfer, TransferStats

log = logging.getLogger("shardcast.relay")

REJECT_RETRY_S = 60.0
"""A version whose manifest was rejected is not retried for this long."""


class Relay(ServedDir):
    """Mirror ``upstreams`` into ``data_dir`` and serve it (start/stop or ``with``).

    Args:
        upstreams: origin or relay base URLs.
        data_dir: served directory; the relay writes nothing outside it.
        host / port: bind address of the relay's server (port 0 picks a free port).
        token: bearer token required from our downstream readers.
        upstream_token: bearer token sent upstream.
        verify_key: pinned manifest key; unsigned or wrongly signed manifests are rejected.
        poll_interval_s: upstream polling period (default 2 s; the reference used 30 s).
        keep / grace_s: retention, as on the origin: a retired version is deleted ``grace_s``
            after it stopped being listed (within one sweep, :func:`shardcast.retention.sweep_interval_s`),
            even if no newer version arrives.
        concurrency / per_server_connections: download parallelism.
        rate_limit_bps: optional per-response serving rate limit.
        local_sources: data directories on this machine that may hold the same versions (the
            origin's, when the relay runs beside it): a shard found there with the manifest's size
            is hard-linked instead of downloaded, then verified like any shard on disk (a wrong one
            is deleted and downloaded), so one machine keeps one copy.
        deadline_s: give up on one version after this long (it is retried at the next poll,
            resuming what was already verified).
    """

    def __init__(
        self,
        upstreams: Sequence[str],
        data_dir: str | os.PathLike[str],
        *,
        host: str = "127.0.0.1",
        port: int = 8000,
        token: str | None = None,
        upstream_token: str | None = None,
        verify_key: VerifyKey | None = None,
        poll_interval_s: float = 2.0,
        keep: int = DEFAULT_KEEP,
        grace_s: float = DEFAULT_GRACE_S,
        concurrency: int = 8,
        per_server_connections: int = 4,
        deadline_s: float = DEFAULT_DEADLINE_S,
        max_shards: int = MAX_SHARDS,
        rate_limit_bps: float | None = None,
        local_sources: Sequence[str | os.PathLike[str]] = (),
    ) -> None:
        if isinstance(upstreams, str | bytes):
            raise TypeError(f"upstreams must be a list of URLs, not one string: write Relay([{upstreams!r}], ...)")
        if not upstreams:
            raise ValueError("Relay needs at least one upstream URL")
        self.upstreams = list(dict.fromkeys(normalise_url(u) for u in upstreams))
        super().__init__(
            data_dir,
            host=host,
            port=port,
            token=token,
            rate_limit_bps=rate_limit_bps,
            keep=keep,
            grace_s=grace_s,
            name="relay",
        )
        self.local_sources = [DataDir(source) for source in local_sources]
        self.upstream_token = upstream_token
        self.verify_key = verify_key
        self.poll_interval_s = poll_interval_s
        self.concurrency = concurrency
        self.per_server_connections = per_server_connections
        self.deadline_s = deadline_s
        self.max_shards = max_shards
        self._rejected: dict[int, float] = {}
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._upstream_ok: dict[str, bool] = {}
        self.last_error: str = ""

    def start(self) -> Self:
        super().start()
        self._stop.clear()
        self._thread = threading.Thread(
            target=lambda: asyncio.run(self._main()), name="shardcast-relay", daemon=True
        )
        self._thread.start()
        log.info("relay %s following %s", self.url, ", ".join(self.upstreams))
        return self

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=15)
        super().stop()

    def local_index(self) -> Index:
        return self.data_dir.read_index()

    # ---- the loop ------------------------------------------------------------------------

    async def _main(self) -> None:
        session = make_session(self.upstream_token, connections_per_host=self.per_server_connections + 2)
        try:
            while not self._stop.is_set():
                try:
                    await self._poll(session)
                except Exception as exc:  # the relay must keep serving whatever happens upstream
                    self.last_error = str(exc)
                    log.error("relay poll failed: %s: %s", type(exc).__name__, exc)
                await asyncio.get_running_loop().run_in_executor(None, self._stop.wait, self.poll_interval_s)
        finally:
            await session.close()

    async def _poll(self, session: aiohttp.ClientSession) -> None:
        indexes: dict[str, Index] = {}
        for upstream, result in zip(
            self.upstreams,
            await asyncio.gather(*(fetch_index(session, u) for u in self.upstreams), return_exceptions=True),
            strict=True,
        ):
            ok = isinstance(result, Index)
            if self._upstream_ok.get(upstream) != ok:
                if ok:
                    log.info("upstream %s reachable", upstream)
                else:
                    log.warning(
                        "upstream %s unreachable: %s (still serving local versions)", upstream, result
                    )
                self._upstream_ok[upstream] = ok
            if isinstance(result, Index):
                indexes[upstream] = result
        listed: dict[int, list[str]] = {}
        for upstream, index in indexes.items():
            for entry in index.versions:
                listed.setdefault(entry.version, []).append(upstream)
        local = self.data_dir.read_index()
        now = time.monotonic()
        newest_complete = local.latest(complete_only=True) or 0
        for version in sorted(listed, reverse=True)[: self.keep]:
            mine = local.entry(version)
            if (mine is not None and mine.complete) or version < newest_complete:
                continue  # done, or older than what we already serve: never go back
            if self._rejected.get(version, 0.0) > now or self._stop.is_set():
                continue
            await self._mirror(session, version, listed[version])
            return  # re-read upstream indexes: a newer version may have appeared meanwhile

    async def _mirror(self, session: aiohttp.ClientSession, version: int, sources: list[str]) -> None:
        try:
            manifest, source = await first_valid_manifest(
                session, sources, version, verify_key=self.verify_key, max_shards=self.max_shards
            )
        except ManifestError as exc:
            log.error("rejecting v%d: %s", version, exc)
            self.last_error = str(exc)
            self._rejected[version] = time.monotonic() + REJECT_RETRY_S
            return
        self._install_manifest(manifest)
        jobs = _mirror_jobs(manifest)
        sink = MirrorSink(self.data_dir, manifest)
        await asyncio.to_thread(link_local_shards, self.local_sources, self.data_dir, manifest.version, jobs)
        await asyncio.to_thread(sink.adopt_existing, jobs)
        tracker = VersionTracker(session, manifest, verify_key=self.verify_key)
        tracker.mark_agrees(source)
        await asyncio.gather(*(tracker.refresh(u) for u in self.upstreams), return_exceptions=True)
        pool = ServerPool(self.upstreams, max_in_flight=self.per_server_connections)
        started = time.monotonic()
        log.info(
            "mirroring v%d: %d shards, %d bytes from %s",
            version,
            len(jobs),
            sum(j.stored_size for j in jobs),
            sources,
        )
        transfers = [
            Transfer(
                session=session,
                pool=pool,
                tracker=tracker,
                sink=sink,
                jobs=phase,
                deadline=started + self.deadline_s,
                concurrency=self.concurrency,
            )
            for phase in _phases(jobs)
        ]
        stop_watch = asyncio.create_task(self._cancel_on_stop())
        run = asyncio.create_task(_run_in_order(transfers))
        try:
            done, _ = await asyncio.wait({run, stop_watch}, return_when=asyncio.FIRST_COMPLETED)
            if run not in done:
                run.cancel()
                await asyncio.gather(run, return_exceptions=True)
                return
            stats = run.result()
        except VersionGoneError as exc:
            log.warning("v%d vanished upstream while mirroring: %s", version, exc)
            self._retire(version)
            return
        except (ShardcastError, ServerError, OSError) as exc:
            log.error("mirroring v%d failed (will resume): %s", version, exc)
            self.last_error = str(exc)
            return
        finally:
            stop_watch.cancel()
        sink.cleanup()
        self.data_dir.update_index(add=IndexEntry(version, True), keep=self.keep, grace_s=self.grace_s)
        log.info(
            "mirrored v%d in %.2fs: %d bytes, %d bad shards re-fetched",
            version,
            time.monotonic() - started,
            stats.bytes_downloaded,
            stats.bad_shards,
        )

    async def _cancel_on_stop(self) -> None:
        await asyncio.get_running_loop().run_in_executor(None, self._stop.wait)

    def _install_manifest(self, manifest: Manifest) -> None:
        """Write the manifest (replacing a different one from an earlier origin life) and list as partial."""
        path = self.data_dir.manifest_path(manifest.version)
        if path.exists():
            try:
                same = parse_manifest(path.read_bytes()).identity() == manifest.identity()
            except (ManifestError, OSError):
                same = False
            if not same:
                shutil.rmtree(self.data_dir.version_dir(manifest.version), ignore_errors=True)
        self.data_dir.version_dir(manifest.version).mkdir(exist_ok=True)
        if not path.exists():
            self.data_dir.atomic_write(path, manifest.to_json())
        self.data_dir.update_index(
            add=IndexEntry(manifest.version, False), keep=self.keep, grace_s=self.grace_s
        )

    def _retire(self, version: int) -> None:
        with self.data_dir.locked():
            index = self.data_dir.read_index()
            remaining = tuple(e for e in index.versions if e.version != version)
            retired = (*index.retired, RetiredEntry(version, time.time()))
            self.data_dir.write_index(Index(remaining, retired))


def _phases(jobs: list[ShardJob]) -> list[list[ShardJob]]:
    """Delta shards, then full shards (each phase only if non-empty).

    A client holding the previous version needs only the deltas; in one transfer they would be
    interleaved with the full shards (a job whose server is busy goes back in the queue), so a
    client's small delta would wait for most of the relay's full mirror, at every tier.
    """
    return [phase for phase in ([j for j in jobs if j.delta], [j for j in jobs if not j.delta]) if phase]


async def _run_in_order(transfers: list[Transfer]) -> TransferStats:
    """Run each transfer after the previous one; their statistics added up."""
    total = TransferStats()
    for transfer in transfers:
        stats = await transfer.run()
        total.bytes_downloaded += stats.bytes_downloaded
        total.bytes_resumed += stats.bytes_resumed
        total.bad_shards += stats.bad_shards
        total.failed_requests += stats.failed_requests
    return total


def link_local_shards(sources: Sequence[DataDir], target: DataDir, version: int, jobs: list[ShardJob]) -> int:
    """Hard-link into ``target`` the shards of ``version`` that a data directory on this machine
    holds with the expected size; the number linked. Unverified: the caller verifies what is on
    disk (``MirrorSink.adopt_existing``). Another disk, or no such file: nothing, it is downloaded."""
    linked = 0
    for job in jobs:
        final = target.shard_path(version, job.index, job.delta)
        if final.exists():
            continue
        for source in sources:
            candidate = source.shard_path(version, job.index, job.delta)
            try:
                if candidate.stat().st_size != job.stored_size:
                    continue
                final.parent.mkdir(parents=True, exist_ok=True)
                os.link(candidate, final)
            except OSError:
                continue
            linked += 1
            break
    return linked


def _mirror_jobs(manifest: Manifest) -> list[ShardJob]:
    jobs = []
    if manifest.delta is not None:
        jobs += [
            ShardJob(
                i, shard_url_path(manifest.version, i, delta=True), d.stored_size, d.stored_digest, delta=True
            )
            for i, d in enumerate(manifest.delta.shards)
        ]
    jobs += [
        ShardJob(s.index, shard_url_path(manifest.version, s.index), s.stored_size, s.stored_digest)
        for s in manifest.shards
    ]
    return jobs
