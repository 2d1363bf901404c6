"""The origin: publishes files or in-memory state dicts as versions and serves its data directory over HTTP."""

from __future__ import annotations

import logging
import os
from collections.abc import Mapping
from typing import Any

from .manifest import Manifest
from .planning import DEFAULT_SHARD_SIZE
from .publish import DEFAULT_GRACE_S, DEFAULT_KEEP, publish_file, publish_tensors
from .served import ServedDir
from .signing import SigningKey

log = logging.getLogger("shardcast.origin")


class Origin(ServedDir):
    """Publish checkpoints as numbered versions and serve them.

    ::

        with Origin("/srv/shardcast", port=8000) as origin:
            manifest = origin.publish("model.safetensors")   # -> version 1, 2, ...
            manifest = origin.publish(model.state_dict())    # from memory: no file written first

    Args:
        data_dir: served directory (layout in :mod:`shardcast.layout`).
        host / port: bind address (default 127.0.0.1; ``0.0.0.0`` to serve the network;
            port 0 picks a free port).
        token: require ``Authorization: Bearer <token>`` on every request.
        signing_key: sign every manifest (clients pin the matching key).
        keep: versions kept listed (default 5); older ones are deleted ``grace_s`` (default
            300 s) after they stop being listed, so in-flight downloads finish. Each kept
            version is a full copy: the directory holds up to ``keep`` x the checkpoint size
            (see "Retention and disk use" in the README).
        shard_size / encoding / delta: defaults for :meth:`publish`.
    """

    def __init__(
        self,
        data_dir: str | os.PathLike[str],
        *,
        host: str = "127.0.0.1",
        port: int = 8000,
        token: str | None = None,
        signing_key: SigningKey | None = None,
        keep: int = DEFAULT_KEEP,
        grace_s: float = DEFAULT_GRACE_S,
        shard_size: int = DEFAULT_SHARD_SIZE,
        encoding: str = "raw",
        delta: bool = False,
        rate_limit_bps: float | None = None,
    ) -> None:
        super().__init__(
            data_dir,
            host=host,
            port=port,
            token=token,
            rate_limit_bps=rate_limit_bps,
            keep=keep,
            grace_s=grace_s,
            name="origin",
        )
        self.signing_key = signing_key
        self.shard_size = shard_size
        self.encoding = encoding
        self.delta = delta

    def publish(
        self,
        source: str | os.PathLike[str] | Mapping[str, Any],
        *,
        version: int | None = None,
        **overrides: object,
    ) -> Manifest:
        """Publish a new version from a file path or from a state dict in memory.

        A path goes through :func:`shardcast.publish.publish_file`; a mapping of name ->
        tensor through :func:`shardcast.publish.publish_tensors` (laid out as the safetensors
        file ``save_file`` would write; ``file_name=`` and ``metadata=`` may be passed). Other
        keyword arguments override this origin's defaults for this version only.
        """
        options: dict[str, object] = {
            "shard_size": self.shard_size,
            "encoding": self.encoding,
            "delta": self.delta,
            "signing_key": self.signing_key,
            "keep": self.keep,
            "grace_s": self.grace_s,
        }
        options.update(overrides)
        if isinstance(source, Mapping):
            return publish_tensors(self.data_dir, source, version=version, **options)  # type: ignore[arg-type]
        return publish_file(self.data_dir, source, version=version, **options)  # type: ignore[arg-type]
