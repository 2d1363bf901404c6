"""Exception types. Every failure a caller may want to handle has its own class.

All derive from :class:`ShardcastError`, so ``except ShardcastError`` catches everything
this package raises on purpose.
"""

from __future__ import annotations


class ShardcastError(Exception):
    """Base class for every error raised by shardcast."""


class ManifestError(ShardcastError):
    """A manifest or index is malformed, inconsistent or exceeds a safety limit.

    Raised for untrusted input: bad JSON, a version name that is not a plain integer,
    a file name with path components, a shard count that does not match the sizes,
    absurd sizes or shard counts.
    """


class SignatureError(ManifestError):
    """A manifest's signature is missing (while a key is pinned), unknown or wrong."""


class IntegrityError(ShardcastError):
    """Bytes do not match the digest the manifest promises (shard or whole file)."""


class VersionNotFoundError(ShardcastError):
    """The requested version is not listed by any reachable server."""


class VersionGoneError(ShardcastError):
    """The version disappeared from every server while it was being downloaded."""


class NoServerAvailableError(ShardcastError):
    """Every server is unreachable, refuses us, or has been dropped as faulty."""


class DeadlineExceededError(ShardcastError):
    """The overall deadline of an operation passed before it finished."""


class PublishError(ShardcastError):
    """Publishing a file as a new version failed (bad input file, version clash, disk)."""


class AlreadyPublished(PublishError):
    """The version to publish already exists in the data dir (a replayed publish, or a clash).

    ``version`` is its number. A publisher that replays a step after a crash catches this one type
    instead of matching the message.
    """

    def __init__(self, version: int, message: str) -> None:
        super().__init__(message)
        self.version = version


class MissingExtraError(ShardcastError, ImportError):
    """An optional feature's dependency is not installed; the message names the extra to install."""
