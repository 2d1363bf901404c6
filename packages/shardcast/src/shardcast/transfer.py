"""The download engine shared by clients and relays: shards from many servers, verified.

For each shard job the engine repeatedly

1. picks the best server that has the version (:class:`~shardcast.servers.ServerPool`),
2. GETs the stored shard, with ``Range: bytes=<have>-`` when part of it is already on
   disk (resume after a dropped connection or a restart),
3. streams it into the sink while hashing, and checks size and SHA-256 against the manifest.

Failures are attributed: a connection error backs the server off; a digest mismatch
penalises every server that contributed bytes to the shard and restarts the shard
elsewhere; a 404 from a relay that is still mirroring ("partial") is not a failure, the
shard is retried shortly (pipelining down the tree). Each shard gets at most
``max_attempts`` failed attempts, and everything is bounded by the overall deadline and by
the stall timeout: when no server has answered anything for ``stall_timeout_s`` (default
60 s) the transfer fails with :class:`~shardcast.errors.NoServerAvailableError` instead of
backing off until the deadline. It is never silent meanwhile: a server becoming
unreachable is logged at once, and a status line every 15 s says what it waits for.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import logging
import time
from dataclasses import dataclass, field
from typing import Protocol

import aiohttp

from .digest import new_hasher
from .errors import DeadlineExceededError, IntegrityError, NoServerAvailableError, VersionGoneError
from .progress import (
    DEFAULT_STALL_TIMEOUT_S,
    STATUS_LOG_S,
    Progress,
    ProgressCallback,
    server_states,
    status_line,
)
from .remote import ServerError, VersionTracker, describe_failure
from .servers import ServerPool

log = logging.getLogger("shardcast.transfer")

CHUNK = 1 << 20
NOT_YET_RETRY_S = 0.2


@dataclass(frozen=True)
class ShardJob:
    """One stored object to download: ``url_path`` (no leading slash), expected size and digest."""

    index: int
    url_path: str
    stored_size: int
    stored_digest: str
    delta: bool = False


class ShardSink(Protocol):
    """Where shard bytes go. Implemented by the client (output file) and the relay (data dir)."""

    def is_done(self, job: ShardJob) -> bool: ...
    def present(self, job: ShardJob) -> int: ...
    def prefix_hasher(self, job: ShardJob, nbytes: int) -> hashlib._Hash: ...
    def write(self, job: ShardJob, position: int, data: bytes) -> None: ...
    def finish(self, job: ShardJob) -> None: ...
    def reset(self, job: ShardJob) -> None: ...
    def checkpoint(self) -> None: ...


@dataclass
class TransferStats:
    bytes_downloaded: int = 0
    bytes_resumed: int = 0
    bad_shards: int = 0
    failed_requests: int = 0


class RateLimiter:
    """Token bucket over all connections of one transfer (``bytes_per_s``)."""

    def __init__(self, bytes_per_s: float) -> None:
        self.rate = bytes_per_s
        self.next_free = time.monotonic()

    async def consume(self, nbytes: int) -> None:
        now = time.monotonic()
        self.next_free = max(self.next_free, now) + nbytes / self.rate
        delay = self.next_free - now - 0.05
        if delay > 0:
            await asyncio.sleep(delay)


class _ShardMissing(Exception):
    pass


class _ShardCorrupt(Exception):
    pass


@dataclass
class _JobState:
    have: int = 0
    hasher: hashlib._Hash = field(default_factory=new_hasher)
    contributors: set[str] = field(default_factory=set)


@dataclass
class Transfer:
    """Download ``jobs`` into ``sink``. Create one per version and call :meth:`run`."""

    session: aiohttp.ClientSession
    pool: ServerPool
    tracker: VersionTracker
    sink: ShardSink
    jobs: list[ShardJob]
    deadline: float
    concurrency: int = 8
    max_attempts: int = 6
    progress: ProgressCallback | None = None
    rate_limiter: RateLimiter | None = None
    stall_timeout_s: float = DEFAULT_STALL_TIMEOUT_S
    stats: TransferStats = field(default_factory=TransferStats)

    async def run(self) -> TransferStats:
        self._slots = asyncio.Semaphore(self.concurrency)
        self._not_yet: dict[tuple[int, bool, str], float] = {}
        self._started = time.monotonic()
        self._bytes_total = sum(job.stored_size for job in self.jobs)
        self._bytes_done = 0
        self._shards_done = 0
        self._last_report = 0.0
        self._last_contact = self._started
        self._changed = asyncio.Event()
        pending = []
        for job in self.jobs:
            if self.sink.is_done(job):
                self._shards_done += 1
                self._bytes_done += job.stored_size
                self.stats.bytes_resumed += job.stored_size
            else:
                pending.append(job)
        tasks = [asyncio.create_task(self._run_job(job)) for job in pending]
        checkpointer = asyncio.create_task(self._checkpoint_loop())
        watcher = asyncio.create_task(self._status_loop())
        try:
            async with asyncio.timeout(max(0.0, self.deadline - time.monotonic())):
                await asyncio.gather(*tasks)
        except TimeoutError:
            raise DeadlineExceededError(self._deadline_message()) from None
        finally:
            for task in tasks:
                task.cancel()
            checkpointer.cancel()
            watcher.cancel()
            await asyncio.gather(*tasks, checkpointer, watcher, return_exceptions=True)
            self.sink.checkpoint()
        self._report(force=True)
        return self.stats

    async def _checkpoint_loop(self) -> None:
        while True:
            await asyncio.sleep(0.5)
            self.sink.checkpoint()

    async def _status_loop(self) -> None:
        """Log progress, or what the transfer waits for, every STATUS_LOG_S seconds."""
        downloaded = self.stats.bytes_downloaded
        while True:
            await asyncio.sleep(STATUS_LOG_S)
            now = time.monotonic()
            recent, downloaded = self.stats.bytes_downloaded - downloaded, self.stats.bytes_downloaded
            line = status_line(
                self._progress(now),
                recent_bytes=recent,
                window_s=STATUS_LOG_S,
                silent_s=now - self._last_contact,
                servers=server_states(self.pool, self.tracker, now),
            )
            # Waiting on a relay that is still mirroring is normal; silence from every server is not.
            silent = now - self._last_contact >= STATUS_LOG_S
            log.log(logging.WARNING if silent else logging.INFO, "%s", line)

    def _progress(self, now: float) -> Progress:
        elapsed = now - self._started
        return Progress(
            version=self.tracker.manifest.version,
            shards_done=self._shards_done,
            shards_total=len(self.jobs),
            bytes_done=self._bytes_done,
            bytes_total=self._bytes_total,
            bytes_per_s=self.stats.bytes_downloaded / elapsed if elapsed > 0 else 0.0,
            elapsed_s=elapsed,
        )

    def _report(self, force: bool = False) -> None:
        now = time.monotonic()
        if self.progress is None or (not force and now - self._last_report < 0.25):
            return
        self._last_report = now
        self.progress(self._progress(now))

    def _contact(self) -> None:
        """A server answered (bytes, a status, an index): the transfer is not stalled."""
        self._last_contact = time.monotonic()

    def _check_time(self) -> None:
        now = time.monotonic()
        if now > self.deadline:
            raise DeadlineExceededError(self._deadline_message())
        if now - self._last_contact > self.stall_timeout_s:
            raise NoServerAvailableError(
                f"no server has answered for {now - self._last_contact:.0f} s "
                f"(stall timeout {self.stall_timeout_s:g} s) with v{self.tracker.manifest.version} at "
                f"{self._shards_done}/{len(self.jobs)} shards (partial data kept for resume): "
                + "; ".join(server_states(self.pool, self.tracker, now))
            )

    def _deadline_message(self) -> str:
        errors = "; ".join(f"{r.url}: {r.last_error}" for r in self.pool.reports() if r.last_error)
        return (
            f"deadline passed with v{self.tracker.manifest.version} incomplete "
            f"({self._shards_done}/{len(self.jobs)} shards done; partial data kept for resume). "
            f"Last server errors: {errors or 'none'}"
        )

    async def _run_job(self, job: ShardJob) -> None:
        state = _JobState()
        state.have = min(self.sink.present(job), job.stored_size)
        if state.have:
            state.hasher = self.sink.prefix_hasher(job, state.have)
            self.stats.bytes_resumed += state.have
            self._bytes_done += state.have
        attempts = 0
        failed_on: set[str] = set()
        while True:
            self._check_time()
            async with self._slots:
                server = await self._pick(job, failed_on)
                if server is None:
                    continue
                pool_state = self.pool.states[server]
                pool_state.in_flight += 1
                started, before = time.monotonic(), state.have
                try:
                    await self._download(server, job, state)
                    if state.hasher.hexdigest() != job.stored_digest:
                        raise _ShardCorrupt(f"shard {job.index} digest mismatch")
                    self.sink.finish(job)
                except _ShardMissing:
                    await self._on_missing(server, job)
                    continue
                except ServerError as exc:
                    attempts += 1
                    failed_on.add(server)
                    self.stats.failed_requests += 1
                    was_alive = pool_state.consecutive_failures == 0
                    self.pool.record_failure(server, exc.reason, unreachable=exc.unreachable)
                    if was_alive:
                        log.warning("%s failed: %s; retrying with back-off", server, exc.reason)
                except (_ShardCorrupt, IntegrityError) as exc:
                    attempts += 1
                    failed_on.add(server)
                    self.stats.bad_shards += 1
                    for url in state.contributors or {server}:
                        self.pool.record_bad_shard(url, f"corrupt shard {job.index}: {exc}")
                    self._bytes_done -= state.have
                    self.sink.reset(job)
                    state = _JobState()
                else:
                    if pool_state.consecutive_failures:
                        log.info("%s answers again", server)
                    self.pool.record_success(server, state.have - before, time.monotonic() - started)
                    self._shards_done += 1
                    self._report(force=True)
                    return
                finally:
                    pool_state.in_flight -= 1
                    self._signal()
            if attempts >= self.max_attempts:
                raise NoServerAvailableError(
                    f"shard {job.index} of v{self.tracker.manifest.version} failed {attempts} times; "
                    f"last error: {self.pool.states[server].last_error}"
                )

    async def _pick(self, job: ShardJob, failed_on: set[str]) -> str | None:
        """Choose a server or sleep briefly and return None (caller loops, checking the deadline)."""
        now = time.monotonic()
        statuses = self.tracker.status
        have_it = {u for u in self.pool.urls if statuses.get(u) and statuses[u].state != "absent"}
        allowed = {u for u in have_it if self._not_yet.get((job.index, job.delta, u), 0.0) <= now}
        if failed_on and not (allowed - failed_on - self._dead(now)):
            failed_on.clear()  # every candidate failed once: give them another chance
        choice = self.pool.choose(allowed, exclude=failed_on)
        if choice is not None:
            return choice.url
        await self._refresh_unknown(now)
        if self.pool.usable() == [] or all(self.pool.states[u].dropped for u in self.pool.urls):
            raise NoServerAvailableError(
                "every server was dropped: "
                + "; ".join(f"{r.url}: {r.last_error}" for r in self.pool.reports())
            )
        fresh_absent = [
            u
            for u in self.pool.urls
            if statuses.get(u) and statuses[u].state == "absent" and now - statuses[u].checked_at < 5
        ]
        if len(fresh_absent) == len(self.pool.urls):
            hint = " (retired by its origin)" if self.tracker.retired_upstream else ""
            raise VersionGoneError(
                f"version {self.tracker.manifest.version} is no longer listed by any server{hint}; "
                f"{self._shards_done}/{len(self.jobs)} shards were done"
            )
        await self._wait_change(NOT_YET_RETRY_S)
        return None

    def _signal(self) -> None:
        """Wake jobs waiting for a server slot (a request finished)."""
        self._changed.set()
        self._changed = asyncio.Event()

    async def _wait_change(self, timeout: float) -> None:
        with contextlib.suppress(asyncio.TimeoutError):
            await asyncio.wait_for(self._changed.wait(), timeout)

    def _dead(self, now: float) -> set[str]:
        return {u for u, s in self.pool.states.items() if not s.alive(now)}

    async def _refresh_unknown(self, now: float) -> None:
        """Re-ask servers that do not (yet) offer the version, at most every 0.5 s each."""
        for url in self.pool.urls:
            status = self.tracker.status.get(url)
            if (status is None or status.state == "absent") and self.pool.states[url].alive(now):
                with contextlib.suppress(Exception):
                    await self.tracker.refresh(url)
                    self._contact()

    async def _on_missing(self, server: str, job: ShardJob) -> None:
        try:
            state = await self.tracker.refresh(server, force=True)
        except Exception as exc:
            self.pool.record_failure(server, f"index refresh failed: {exc}", unreachable=True)
            return
        self._contact()
        if state == "partial":
            self._not_yet[(job.index, job.delta, server)] = time.monotonic() + NOT_YET_RETRY_S
        elif state == "complete":
            self.pool.record_failure(server, f"404 for shard {job.index} of a version it lists as complete")

    async def _download(self, server: str, job: ShardJob, state: _JobState) -> None:
        url = f"{server}/{job.url_path}"
        headers = {"Range": f"bytes={state.have}-"} if state.have else {}
        if state.have >= job.stored_size:
            return
        try:
            async with self.session.get(url, headers=headers) as response:
                self._contact()
                if response.status == 404:
                    raise _ShardMissing()
                if response.status == 200 and state.have:
                    # Server ignored Range: start this shard over.
                    self._bytes_done -= state.have
                    self.sink.reset(job)
                    state.have, state.hasher = 0, new_hasher()
                elif response.status == 206:
                    content_range = response.headers.get("Content-Range", "")
                    if not content_range.startswith(f"bytes {state.have}-"):
                        raise ServerError(server, f"bad Content-Range {content_range!r} for {url}")
                elif response.status != 200:
                    raise ServerError(
                        server,
                        f"HTTP {response.status} for {url}",
                        status=response.status,
                        unreachable=response.status in (401, 403, 429, 503),
                    )
                state.contributors.add(server)
                async for chunk in response.content.iter_chunked(CHUNK):
                    if state.have + len(chunk) > job.stored_size:
                        raise _ShardCorrupt(
                            f"shard {job.index} longer than the manifest's {job.stored_size} bytes"
                        )
                    self.sink.write(job, state.have, chunk)
                    self._contact()
                    state.hasher.update(chunk)
                    state.have += len(chunk)
                    self._bytes_done += len(chunk)
                    self.stats.bytes_downloaded += len(chunk)
                    self._report()
                    if self.rate_limiter is not None:
                        await self.rate_limiter.consume(len(chunk))
        except (TimeoutError, aiohttp.ClientError, OSError) as exc:
            raise ServerError(server, f"{describe_failure(exc)} (GET {url})", unreachable=True) from None
        if state.have < job.stored_size:
            raise ServerError(
                server, f"{url} ended after {state.have} of {job.stored_size} bytes", unreachable=True
            )
