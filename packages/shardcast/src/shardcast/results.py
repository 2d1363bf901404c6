"""What a client hands back: the outcome of a fetch and the versions servers offer.

Plain frozen data, no I/O: the client makes them, a follower and callers read them.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from .manifest import Manifest
from .servers import ServerReport


@dataclass(frozen=True)
class FetchResult:
    """Outcome of one :meth:`shardcast.Client.fetch`."""

    version: int
    path: Path
    manifest: Manifest
    bytes_downloaded: int
    bytes_resumed: int
    bad_shards: int
    used_delta: bool
    seconds: float
    servers: tuple[ServerReport, ...]


@dataclass(frozen=True)
class VersionListing:
    """Versions offered by the reachable servers: ``{version: [servers]}``.

    ``errors`` maps each server that gave no usable index to why, in words that say which
    case it is: ``"unreachable: ..."`` or ``"corrupt index: ..."``.
    """

    versions: dict[int, list[str]]
    complete: dict[int, list[str]]
    errors: dict[str, str]

    def latest(self) -> int | None:
        return max(self.versions) if self.versions else None
