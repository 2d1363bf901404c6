"""Talking to servers: the HTTP session, bounded reads of index/manifest, and version status.

This is the package's one HTTP client helper (aiohttp). Every response body that is
parsed is read with a size cap, so a hostile server cannot exhaust memory.
"""

from __future__ import annotations

import logging
import os
import time
from dataclasses import dataclass
from urllib.parse import urlsplit

import aiohttp

from .errors import ManifestError, NoServerAvailableError, ShardcastError
from .layout import INDEX_NAME, MAX_INDEX_BYTES, Index, manifest_url_path, parse_index
from .manifest import Manifest, parse_manifest
from .planning import MAX_SHARDS
from .signing import VerifyKey, verify_manifest

log = logging.getLogger("shardcast.remote")

MANIFEST_BYTES_PER_SHARD = 400
"""Upper bound on manifest bytes per shard (two 64-hex digests, sizes, delta entry, JSON)."""


class ServerError(ShardcastError):
    """One server failed one request (connection, HTTP status, timeout). Internal: retried elsewhere."""

    def __init__(
        self, url: str, reason: str, *, unreachable: bool = False, status: int | None = None
    ) -> None:
        super().__init__(f"{url}: {reason}")
        self.url = url
        self.reason = reason
        self.unreachable = unreachable
        self.status = status


def normalise_url(server: str) -> str:
    """``host:port`` -> ``http://host:port``; strips trailing slashes.

    Raises:
        TypeError: ``server`` is not a string.
        ValueError: not an http(s) URL with a host and a valid port.
    """
    if not isinstance(server, str):
        raise TypeError(f"a server URL must be a str like 'http://host:8000', got {type(server).__name__}")
    server = server.strip().rstrip("/")
    if "://" not in server:
        server = "http://" + server
    try:
        parts = urlsplit(server)
        parts.port  # noqa: B018 - parses the port, raising ValueError for 'host:abc'
    except ValueError as exc:
        raise ValueError(f"bad server URL {server!r}: {exc}") from None
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise ValueError(f"bad server URL {server!r}: expected http://host:port or https://host:port")
    return server


def describe_failure(exc: BaseException) -> str:
    """One short line for a failed request: what happened, without aiohttp's internals."""
    if isinstance(exc, aiohttp.ClientConnectorError):
        error = exc.os_error
        # errno names the cause ("Connection refused"); aiohttp's strerror repeats the address.
        if isinstance(error.errno, int) and error.errno > 0:
            reason = os.strerror(error.errno)
        else:
            reason = error.strerror or type(error).__name__  # DNS: "Name or service not known"
        return f"cannot connect to {exc.host}:{exc.port} ({reason})"
    if isinstance(exc, TimeoutError | aiohttp.ServerTimeoutError):
        return "no answer in time (timed out)"
    if isinstance(exc, aiohttp.ServerDisconnectedError):
        return "the server closed the connection"
    if isinstance(exc, aiohttp.ClientPayloadError):
        return "the connection broke in the middle of the response"
    return f"{type(exc).__name__}: {exc}"


def make_session(
    token: str | None, *, connections_per_host: int = 8, read_timeout_s: float = 30.0
) -> aiohttp.ClientSession:
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    connector = aiohttp.TCPConnector(limit=0, limit_per_host=connections_per_host, enable_cleanup_closed=True)
    timeout = aiohttp.ClientTimeout(total=None, sock_connect=5.0, sock_read=read_timeout_s)
    # A 1 MiB read buffer (aiohttp's default is 64 KiB) cuts per-chunk Python overhead 16x.
    return aiohttp.ClientSession(
        headers=headers, connector=connector, timeout=timeout, auto_decompress=False, read_bufsize=1 << 20
    )


async def get_bytes(session: aiohttp.ClientSession, url: str, max_bytes: int, *, server: str) -> bytes | None:
    """GET ``url``; ``None`` on 404; :class:`ServerError` on anything else that is not 200."""
    try:
        async with session.get(url) as response:
            if response.status == 404:
                return None
            if response.status != 200:
                raise ServerError(
                    server,
                    f"HTTP {response.status} for {url}",
                    status=response.status,
                    unreachable=response.status in (401, 403),
                )
            body = await response.content.read(max_bytes + 1)
            if len(body) > max_bytes:
                raise ServerError(server, f"{url} is larger than the limit of {max_bytes} bytes")
            return body
    except (TimeoutError, aiohttp.ClientError, OSError) as exc:
        raise ServerError(server, describe_failure(exc), unreachable=True) from None


async def fetch_index(session: aiohttp.ClientSession, server: str) -> Index:
    """The server's ``index.json`` (an empty index if it has none yet)."""
    body = await get_bytes(session, f"{server}/{INDEX_NAME}", MAX_INDEX_BYTES, server=server)
    return Index() if body is None else parse_index(body)


async def fetch_manifest(
    session: aiohttp.ClientSession,
    server: str,
    version: int,
    *,
    verify_key: VerifyKey | None,
    max_shards: int = MAX_SHARDS,
) -> Manifest | None:
    """Download, validate and signature-check ``v<version>/manifest.json``; ``None`` on 404.

    Raises :class:`ManifestError` (or :class:`~shardcast.errors.SignatureError`) for a hostile/corrupt manifest.
    """
    cap = 64 * 1024 + MANIFEST_BYTES_PER_SHARD * max_shards
    body = await get_bytes(session, f"{server}/{manifest_url_path(version)}", cap, server=server)
    if body is None:
        return None
    manifest = parse_manifest(body, max_shards=max_shards)
    if manifest.version != version:
        raise ManifestError(f"{server}: manifest at v{version} claims version {manifest.version}")
    verify_manifest(manifest, verify_key)
    return manifest


async def first_valid_manifest(
    session: aiohttp.ClientSession,
    servers: list[str],
    version: int,
    *,
    verify_key: VerifyKey | None,
    max_shards: int = MAX_SHARDS,
) -> tuple[Manifest, str]:
    """The first server in ``servers`` with a valid manifest for ``version``, and that manifest.

    Raises the last :class:`ManifestError` (message listing every server's problem) when
    only invalid manifests were found, :class:`NoServerAvailableError` when none was found.
    """
    problems: list[str] = []
    last_error: ManifestError | None = None
    for server in servers:
        try:
            manifest = await fetch_manifest(
                session, server, version, verify_key=verify_key, max_shards=max_shards
            )
        except ManifestError as exc:
            last_error = exc
            problems.append(f"{server}: {exc}")
            log.warning("rejected manifest v%d from %s: %s", version, server, exc)
            continue
        except ServerError as exc:
            problems.append(str(exc))
            continue
        if manifest is not None:
            return manifest, server
        problems.append(f"{server}: manifest not found")
    if last_error is not None:
        raise type(last_error)(f"no valid manifest for v{version}: " + "; ".join(problems))
    raise NoServerAvailableError(f"could not get the manifest of v{version}: " + "; ".join(problems))


@dataclass
class VersionStatus:
    """What one server last said about one version: 'complete', 'partial' or 'absent'."""

    state: str
    checked_at: float


class VersionTracker:
    """Cached per-server status of one version, refreshed at most every ``min_interval_s``.

    Also pins the manifest identity: a server whose manifest for this version differs from
    the chosen one is treated as not having it (a relay cannot substitute data).
    """

    def __init__(
        self,
        session: aiohttp.ClientSession,
        manifest: Manifest,
        *,
        verify_key: VerifyKey | None,
        min_interval_s: float = 0.5,
    ) -> None:
        self.session = session
        self.manifest = manifest
        self.identity = manifest.identity()
        self.verify_key = verify_key
        self.min_interval_s = min_interval_s
        self.status: dict[str, VersionStatus] = {}
        self.agrees: dict[str, bool] = {}
        self.retired_upstream = False

    async def refresh(self, server: str, force: bool = False) -> str:
        now = time.monotonic()
        cached = self.status.get(server)
        if cached and not force and now - cached.checked_at < self.min_interval_s:
            return cached.state
        version = self.manifest.version
        try:
            index = await fetch_index(self.session, server)
        except (ServerError, ManifestError):
            state = cached.state if cached else "absent"
            self.status[server] = VersionStatus(state, now)
            raise
        entry = index.entry(version)
        if any(r.version == version for r in index.retired):
            self.retired_upstream = True
        state = "absent" if entry is None else ("complete" if entry.complete else "partial")
        if state != "absent" and server not in self.agrees:
            try:
                other = await fetch_manifest(self.session, server, version, verify_key=self.verify_key)
            except ManifestError:
                other = None
            if other is not None:
                self.agrees[server] = other.identity() == self.identity
            else:
                state = "absent"
        if state != "absent" and not self.agrees.get(server, False):
            state = "absent"
        self.status[server] = VersionStatus(state, now)
        return state

    def mark_agrees(self, server: str) -> None:
        self.agrees[server] = True
