"""What an origin and a relay share: a data directory served over HTTP and swept of retired versions.

:class:`~shardcast.origin.Origin` and :class:`~shardcast.relay.Relay` both serve their
directory with an :class:`~shardcast.server.HttpServer` and delete retired versions with a
:class:`~shardcast.retention.RetentionSweeper`; this base class starts and stops the two
together (start/stop or ``with``). Subclasses add what they do on top: publishing, mirroring.
"""

from __future__ import annotations

import os
from typing import Self

from .layout import DataDir
from .retention import RetentionSweeper
from .server import HttpServer


class ServedDir:
    """``data_dir`` served on ``host:port`` (bearer ``token``, optional rate limit), ``keep`` versions kept."""

    def __init__(
        self,
        data_dir: str | os.PathLike[str],
        *,
        host: str,
        port: int,
        token: str | None,
        rate_limit_bps: float | None,
        keep: int,
        grace_s: float,
        name: str,
    ) -> None:
        self.data_dir = DataDir(data_dir)
        self.server = HttpServer(
            self.data_dir, host=host, port=port, token=token, rate_limit_bps=rate_limit_bps
        )
        self.keep = keep
        self.grace_s = grace_s
        self._sweeper = RetentionSweeper(self.data_dir, keep=keep, grace_s=grace_s, name=name)

    @property
    def url(self) -> str:
        return self.server.url

    def collect_garbage(self) -> list[int]:
        """Delete retired versions whose grace period is over; returns their numbers."""
        return self._sweeper.collect()

    def start(self) -> Self:
        self.server.start()
        self._sweeper.start()
        return self

    def stop(self) -> None:
        self._sweeper.stop()
        self.server.stop()

    def __enter__(self) -> Self:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()
