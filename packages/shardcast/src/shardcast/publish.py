"""Publishing a file, or a state dict from memory, as a new version into an origin's data directory.

Order of operations (what makes it safe for concurrent readers):

1. Shards are written into a private directory ``.staging/v<N>-<random>/``, hashing each
   shard and the whole file in the same pass (one read of the input: the file, or the
   tensors laid out as a safetensors file by :mod:`shardcast.tensors`).
2. ``manifest.json`` is written last into that directory.
3. The directory is renamed to ``v<N>`` (one atomic ``rename``): readers see either no
   ``v<N>`` or a complete one.
4. ``index.json`` is rewritten atomically, listing ``v<N>``; versions beyond the newest
   ``keep`` are retired and deleted only after ``grace_s`` seconds.

Publishing never touches other versions' files except by that delayed deletion.
"""

from __future__ import annotations

import logging
import os
import shutil
import tempfile
import time
from collections.abc import Callable, Iterator, Mapping
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from . import codec
from .digest import digest_bytes, new_hasher
from .errors import AlreadyPublished, PublishError
from .layout import MANIFEST_NAME, DataDir, IndexEntry, delta_name, shard_name
from .manifest import (
    MAX_FILE_SIZE,
    DeltaInfo,
    Manifest,
    ShardInfo,
    StoredInfo,
    parse_manifest,
    validate_file_name,
)
from .planning import DEFAULT_SHARD_SIZE, MAX_SHARDS, ShardSpan, plan_shards
from .signing import SigningKey, sign_manifest
from .tensors import SafetensorsStream

log = logging.getLogger("shardcast.publish")

DEFAULT_KEEP = 5
"""Versions kept listed (reference default ``max_distribution_folders = 5``)."""
DEFAULT_GRACE_S = 300.0
"""Seconds a retired version stays on disk so in-flight downloads can finish."""


def next_version(data_dir: DataDir) -> int:
    """1 + the largest version listed, retired or present on disk (1 for an empty dir)."""
    index = data_dir.read_index()
    seen = (
        [e.version for e in index.versions] + [r.version for r in index.retired] + data_dir.local_versions()
    )
    return max(seen, default=0) + 1


def read_local_manifest(data_dir: DataDir, version: int) -> Manifest:
    return parse_manifest(data_dir.manifest_path(version).read_bytes())


def read_decoded_shard(data_dir: DataDir, manifest: Manifest, index: int) -> bytes:
    """Original bytes of one shard of a locally stored version (decoding full shards)."""
    stored = data_dir.shard_path(manifest.version, index).read_bytes()
    return codec.decode(stored, manifest.encoding, manifest.shards[index].size)


def publish_file(
    data_dir: DataDir | str | os.PathLike[str],
    path: str | os.PathLike[str],
    *,
    version: int | None = None,
    shard_size: int = DEFAULT_SHARD_SIZE,
    encoding: str = "raw",
    delta: bool = False,
    signing_key: SigningKey | None = None,
    keep: int = DEFAULT_KEEP,
    grace_s: float = DEFAULT_GRACE_S,
    file_name: str | None = None,
) -> Manifest:
    """Publish ``path`` as version ``version`` (default: next free number) and return its manifest.

    Args:
        encoding: ``"raw"`` (default; zero-copy serving) or ``"zstd"``.
        delta: also write ``xor-zstd`` delta shards against the newest listed version when it
            has the same file size; clients holding that version download only the deltas.
        signing_key: sign the manifest (see :mod:`shardcast.signing`).
        keep / grace_s: retention (see :meth:`DataDir.update_index`); every kept version is a
            full copy on disk, so a data directory holds up to ``keep`` (plus those retired
            less than ``grace_s`` ago) times the checkpoint size.
        file_name: the name clients save under (default: ``path``'s base name).

    Raises:
        AlreadyPublished: the version is already present (a ``PublishError``).
        PublishError: missing/oversized input, bad arguments.
    """
    source = Path(path)
    if not source.is_file():
        raise PublishError(f"cannot publish {source}: not a regular file")
    name = validate_file_name(file_name or source.name)

    def read_shards(spans: list[ShardSpan]) -> Iterator[tuple[ShardSpan, bytes]]:
        with open(source, "rb") as handle:
            for span in spans:
                data = handle.read(span.size)
                if len(data) != span.size:
                    raise PublishError(
                        f"{source} changed size while publishing (short read at shard {span.index})"
                    )
                yield span, data
            if handle.read(1):
                raise PublishError(f"{source} grew while publishing")

    return _publish(
        data_dir,
        name,
        source.stat().st_size,
        read_shards,
        version=version,
        shard_size=shard_size,
        encoding=encoding,
        delta=delta,
        signing_key=signing_key,
        keep=keep,
        grace_s=grace_s,
    )


def publish_tensors(
    data_dir: DataDir | str | os.PathLike[str],
    tensors: Mapping[str, Any],
    *,
    file_name: str = "model.safetensors",
    metadata: Mapping[str, str] | None = None,
    version: int | None = None,
    shard_size: int = DEFAULT_SHARD_SIZE,
    encoding: str = "raw",
    delta: bool = False,
    signing_key: SigningKey | None = None,
    keep: int = DEFAULT_KEEP,
    grace_s: float = DEFAULT_GRACE_S,
) -> Manifest:
    """Publish a state dict from memory as a safetensors file, writing only the shards to disk.

    The version is byte for byte what ``safetensors.torch.save_file(tensors, file_name,
    metadata)`` followed by :func:`publish_file` would publish (same shards, digests and
    verification; clients cannot tell the two apart), but the checkpoint is written to disk
    once instead of twice, and memory holds one shard (plus one tensor's CPU copy for GPU or
    non-contiguous tensors) on top of the tensors themselves.

    ::

        publish_tensors("/srv/shardcast", model.state_dict())          # -> version N
        safetensors.torch.load_file(client.fetch("latest", "/ckpt/model.safetensors").path)

    Args:
        tensors: ``{name: torch.Tensor | numpy.ndarray}`` (see :mod:`shardcast.tensors`).
            Tensors sharing storage (tied weights) are each written in full; ``save_file``
            refuses them instead.
        file_name: the name clients save under.
        metadata: the safetensors header's ``__metadata__`` (``{str: str}``), e.g.
            ``{"format": "pt"}`` as transformers writes it.
        version / shard_size / encoding / delta / signing_key / keep / grace_s: as in
            :func:`publish_file`.

    Raises:
        AlreadyPublished: the version is already present (a ``PublishError``).
        PublishError: a value that is not a tensor, an unsupported dtype, bad arguments (see
            :class:`shardcast.tensors.SafetensorsStream`).

    Pitfall: do not modify the tensors (an optimizer step) until this returns.
    """
    name = validate_file_name(file_name)
    stream = SafetensorsStream(tensors, metadata)

    def read_shards(spans: list[ShardSpan]) -> Iterator[tuple[ShardSpan, bytes]]:
        for span in spans:
            yield span, stream.read(span.offset, span.size)

    return _publish(
        data_dir,
        name,
        stream.size,
        read_shards,
        version=version,
        shard_size=shard_size,
        encoding=encoding,
        delta=delta,
        signing_key=signing_key,
        keep=keep,
        grace_s=grace_s,
    )


def _publish(
    data_dir: DataDir | str | os.PathLike[str],
    name: str,
    size: int,
    read_shards: Callable[[list[ShardSpan]], Iterator[tuple[ShardSpan, bytes]]],
    *,
    version: int | None,
    shard_size: int,
    encoding: str,
    delta: bool,
    signing_key: SigningKey | None,
    keep: int,
    grace_s: float,
) -> Manifest:
    """The steps shared by every source (module docstring): stage, manifest, rename, index."""
    store = data_dir if isinstance(data_dir, DataDir) else DataDir(data_dir)
    if encoding not in ("raw", "zstd"):
        raise PublishError(f"unknown encoding {encoding!r}: use 'raw' or 'zstd'")
    if keep < 1:
        raise PublishError("keep must be >= 1")
    if size > MAX_FILE_SIZE or -(-size // max(shard_size, 1)) > MAX_SHARDS or shard_size < 1:
        raise PublishError(
            f"cannot publish {size} bytes with shard_size {shard_size}: too many shards or bad size"
        )
    started = time.monotonic()
    with store.locked():
        number = next_version(store) if version is None else version
        if store.version_dir(number).exists():
            raise AlreadyPublished(number, f"version {number} already exists in {store.root}")
        base = _delta_base(store, size) if delta else None
        staging = Path(tempfile.mkdtemp(dir=store.staging, prefix=f"v{number}-"))
        try:
            shards = read_shards(plan_shards(size, shard_size))
            manifest = _write_shards(store, shards, staging, number, name, size, shard_size, encoding, base)
            if signing_key is not None:
                manifest = sign_manifest(manifest, signing_key)
            (staging / MANIFEST_NAME).write_bytes(manifest.to_json())
            for child in [staging, *staging.iterdir()]:
                os.chmod(child, 0o755 if child.is_dir() else 0o644)
            os.rename(staging, store.version_dir(number))
        except BaseException:
            shutil.rmtree(staging, ignore_errors=True)
            raise
    _, deleted = store.update_index(add=IndexEntry(number, True), keep=keep, grace_s=grace_s)
    log.info(
        "published v%d: %s, %d bytes, %d shards, %s%s in %.2fs%s",
        number,
        name,
        size,
        manifest.num_shards,
        encoding,
        f" + delta vs v{base.version}" if base else "",
        time.monotonic() - started,
        f"; deleted expired {deleted}" if deleted else "",
    )
    return manifest


def _delta_base(store: DataDir, size: int) -> Manifest | None:
    latest = store.read_index().latest(complete_only=True)
    if latest is None:
        return None
    try:
        base = read_local_manifest(store, latest)
    except (OSError, ValueError) as exc:
        log.warning("no delta: cannot read base v%d manifest: %s", latest, exc)
        return None
    return base if base.file_size == size else None


def _write_shards(
    store: DataDir,
    source: Iterator[tuple[ShardSpan, bytes]],
    staging: Path,
    number: int,
    name: str,
    size: int,
    shard_size: int,
    encoding: str,
    base: Manifest | None,
) -> Manifest:
    whole = new_hasher()
    shards: list[ShardInfo] = []
    deltas: list[StoredInfo] = []

    def store_shard(index: int, data: bytes) -> tuple[ShardInfo, StoredInfo | None]:
        digest = digest_bytes(data)
        stored = codec.encode(data, encoding)
        stored_digest = digest if encoding == "raw" else digest_bytes(stored)
        (staging / shard_name(index)).write_bytes(stored)
        delta_info = None
        if base is not None:
            delta_bytes = codec.encode_delta(data, read_decoded_shard(store, base, index))
            (staging / delta_name(index)).write_bytes(delta_bytes)
            delta_info = StoredInfo(len(delta_bytes), digest_bytes(delta_bytes))
        return ShardInfo(index, len(data), digest, len(stored), stored_digest), delta_info

    # The whole-file hash (sequential by nature) runs on this thread while a worker hashes,
    # encodes and writes the same shard: hashlib and file I/O release the GIL, so the two
    # passes overlap on two cores.
    with ThreadPoolExecutor(1, thread_name_prefix="shardcast-publish") as pool:
        for span, data in source:
            job = pool.submit(store_shard, span.index, data)
            whole.update(data)
            shard_info, delta_info = job.result()
            shards.append(shard_info)
            if delta_info is not None:
                deltas.append(delta_info)
    delta = None if base is None else DeltaInfo(base.version, base.file_digest, "xor-zstd", tuple(deltas))
    return Manifest(
        version=number,
        file_name=name,
        file_size=size,
        shard_size=shard_size,
        file_digest=whole.hexdigest(),
        created_at=time.time(),
        encoding=encoding,
        shards=tuple(shards),
        delta=delta,
    )
