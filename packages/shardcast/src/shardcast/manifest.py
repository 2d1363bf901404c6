"""The manifest: the signed description of one published version.

A manifest is a JSON object (``v<N>/manifest.json``)::

    {
      "format": "shardcast-manifest/1",
      "version": 7,                         # integer >= 1; the directory is "v7"
      "file_name": "model.safetensors",     # a plain base name, no path components
      "file_size": 123456789,               # bytes of the original file
      "shard_size": 50000000,               # bytes per shard (the last one may be short)
      "digest_algorithm": "sha256",
      "file_digest": "<64 hex>",            # of the whole original file
      "created_at": 1790000000.0,           # unix seconds
      "encoding": "raw" | "zstd",           # how shard_XXXXXX.bin files are stored
      "shards": [{"index": 0, "size": ..., "digest": ..., "stored_size": ..., "stored_digest": ...}],
      "delta": null | {"base_version": 6, "base_digest": "<file digest of v6>", "encoding": "xor-zstd",
                       "shards": [{"stored_size": ..., "stored_digest": ...}]},
      "signature": null | {"scheme": "hmac-sha256" | "ed25519", "key_id": "...", "value": "<hex>"}
    }

``size``/``digest`` describe the decoded shard (bytes of the original file), ``stored_size``/
``stored_digest`` the bytes on disk and on the wire, so a relay verifies what it stores
without decoding. With ``encoding == "raw"`` both pairs are equal.

Everything read from the network goes through :func:`parse_manifest`, which rejects
anything malformed or inconsistent with a :class:`~shardcast.errors.ManifestError`
before any work is planned from it.
"""

from __future__ import annotations

import json
import math
import re
from dataclasses import dataclass, field, replace
from typing import Any

from .digest import DIGEST_ALGORITHM, digest_bytes
from .errors import ManifestError
from .planning import MAX_SHARD_SIZE, MAX_SHARDS, num_shards

MANIFEST_FORMAT = "shardcast-manifest/1"
ENCODINGS = ("raw", "zstd")
DELTA_ENCODINGS = ("xor-zstd",)
MAX_VERSION = 10**12
MAX_FILE_SIZE = 1 << 50
"""1 PiB: anything larger is rejected as absurd."""

_HEX64 = re.compile(r"^[0-9a-f]{64}$")
_FILE_NAME = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9._+-]{0,254}$")
_VERSION_NAME = re.compile(r"^v?([0-9]{1,12})$")


def max_stored_size(size: int) -> int:
    """Largest acceptable stored size for a shard of ``size`` decoded bytes.

    zstd's worst case is ``size + size / 128 + 512`` bytes (``ZSTD_compressBound``); we add
    slack for frame headers.
    """
    return size + size // 128 + 4096


@dataclass(frozen=True)
class ShardInfo:
    """One shard: decoded ``size``/``digest`` and stored (on-disk, on-wire) ``stored_size``/``stored_digest``."""

    index: int
    size: int
    digest: str
    stored_size: int
    stored_digest: str


@dataclass(frozen=True)
class StoredInfo:
    """Stored size and digest of one delta shard."""

    stored_size: int
    stored_digest: str


@dataclass(frozen=True)
class DeltaInfo:
    """Delta shards against ``base_version`` (whose whole-file digest is ``base_digest``).

    Delta shard ``i`` decodes as ``zstd_decompress(stored) XOR base[i-th span]``; the base
    file must have exactly the same size (same-layout checkpoints).
    """

    base_version: int
    base_digest: str
    encoding: str
    shards: tuple[StoredInfo, ...]


@dataclass(frozen=True)
class Signature:
    """A detached signature over :meth:`Manifest.signed_payload`."""

    scheme: str
    key_id: str
    value: str


@dataclass(frozen=True)
class Manifest:
    """A validated manifest. Build with :func:`parse_manifest` or by the origin's publisher."""

    version: int
    file_name: str
    file_size: int
    shard_size: int
    file_digest: str
    created_at: float
    encoding: str
    shards: tuple[ShardInfo, ...]
    delta: DeltaInfo | None = None
    signature: Signature | None = None
    digest_algorithm: str = field(default=DIGEST_ALGORITHM)

    @property
    def num_shards(self) -> int:
        return len(self.shards)

    @property
    def stored_bytes(self) -> int:
        """Total bytes of the full (non-delta) stored shards."""
        return sum(s.stored_size for s in self.shards)

    def payload(self) -> dict[str, Any]:
        """The JSON object without the signature."""
        return {
            "format": MANIFEST_FORMAT,
            "version": self.version,
            "file_name": self.file_name,
            "file_size": self.file_size,
            "shard_size": self.shard_size,
            "digest_algorithm": self.digest_algorithm,
            "file_digest": self.file_digest,
            "created_at": self.created_at,
            "encoding": self.encoding,
            "shards": [
                {
                    "index": s.index,
                    "size": s.size,
                    "digest": s.digest,
                    "stored_size": s.stored_size,
                    "stored_digest": s.stored_digest,
                }
                for s in self.shards
            ],
            "delta": None
            if self.delta is None
            else {
                "base_version": self.delta.base_version,
                "base_digest": self.delta.base_digest,
                "encoding": self.delta.encoding,
                "shards": [
                    {"stored_size": d.stored_size, "stored_digest": d.stored_digest}
                    for d in self.delta.shards
                ],
            },
        }

    def signed_payload(self) -> bytes:
        """Canonical bytes that a signature covers: sorted keys, no whitespace, UTF-8."""
        return json.dumps(self.payload(), sort_keys=True, separators=(",", ":")).encode()

    def to_json(self) -> bytes:
        """Serialise (canonical form plus the signature, if any)."""
        obj = self.payload()
        obj["signature"] = (
            None
            if self.signature is None
            else {
                "scheme": self.signature.scheme,
                "key_id": self.signature.key_id,
                "value": self.signature.value,
            }
        )
        return json.dumps(obj, sort_keys=True, separators=(",", ":")).encode()

    def identity(self) -> str:
        """Digest of the signed payload: two servers agree on a version iff identities match."""
        return digest_bytes(self.signed_payload())

    def with_signature(self, signature: Signature | None) -> Manifest:
        return replace(self, signature=signature)


def parse_version_name(name: str | int) -> int:
    """``"v12"``, ``"12"`` or ``12`` -> 12. Rejects anything else (``"../x"``, ``"v-1"``, ``"v1/.."``)."""
    if isinstance(name, bool):
        raise ManifestError(f"invalid version {name!r}: expected an integer like 12 or 'v12'")
    if isinstance(name, int):
        number = name
    else:
        match = _VERSION_NAME.fullmatch(name) if isinstance(name, str) else None
        if match is None:
            raise ManifestError(f"invalid version name {name!r}: expected 'v<N>' with N a positive integer")
        number = int(match.group(1))
    if not 1 <= number <= MAX_VERSION:
        raise ManifestError(f"invalid version {number}: must be in [1, {MAX_VERSION}]")
    return number


def validate_file_name(name: object) -> str:
    """A plain base name (letters, digits, ``._+-``; no separators, not hidden, <= 255 chars)."""
    if not isinstance(name, str) or not _FILE_NAME.fullmatch(name) or name in {".", ".."}:
        raise ManifestError(f"invalid file_name {name!r}: must be a plain file name without path components")
    return name


def _int(obj: dict[str, Any], key: str, low: int, high: int, where: str) -> int:
    value = obj.get(key)
    if type(value) is not int:
        raise ManifestError(f"{where}: {key!r} must be an integer, got {type(value).__name__}")
    if not low <= value <= high:
        raise ManifestError(f"{where}: {key}={value} out of range [{low}, {high}]")
    return value


def _hex(obj: dict[str, Any], key: str, where: str) -> str:
    value = obj.get(key)
    if not isinstance(value, str) or not _HEX64.fullmatch(value):
        raise ManifestError(f"{where}: {key!r} must be 64 lowercase hex characters")
    return value


def _keys(obj: object, required: set[str], where: str) -> dict[str, Any]:
    if not isinstance(obj, dict):
        raise ManifestError(f"{where}: expected a JSON object, got {type(obj).__name__}")
    keys = set(obj)
    if keys != required:
        missing, extra = sorted(required - keys), sorted(keys - required)
        raise ManifestError(f"{where}: missing keys {missing}, unexpected keys {extra}")
    return obj


_TOP_KEYS = {
    "format",
    "version",
    "file_name",
    "file_size",
    "shard_size",
    "digest_algorithm",
    "file_digest",
    "created_at",
    "encoding",
    "shards",
    "delta",
    "signature",
}


def parse_manifest(data: bytes | str, *, max_shards: int = MAX_SHARDS) -> Manifest:
    """Parse and strictly validate untrusted manifest bytes.

    Checks: JSON object with exactly the known keys; ``format``; integer version in
    ``[1, 10**12]``; plain ``file_name``; sizes in range; ``len(shards) == ceil(file_size /
    shard_size) <= max_shards``; each shard's index and size equal the planned span; digests
    are 64 hex chars; stored sizes within the zstd bound (equal to ``size`` for raw);
    delta base older than the version and one delta entry per shard.

    Raises:
        ManifestError: with a message naming the offending field.

    Pitfall: this does not check the signature; call :func:`shardcast.signing.verify_manifest`.
    """
    try:
        obj = json.loads(data)
    except (ValueError, UnicodeDecodeError, RecursionError) as exc:
        raise ManifestError(f"manifest is not valid JSON: {exc}") from None
    obj = _keys(obj, _TOP_KEYS, "manifest")
    if obj["format"] != MANIFEST_FORMAT:
        raise ManifestError(f"manifest: unsupported format {obj['format']!r}, expected {MANIFEST_FORMAT!r}")
    version = obj["version"]
    if type(version) is not int:
        raise ManifestError(f"manifest: version must be an integer, got {version!r}")
    version = parse_version_name(version)
    file_name = validate_file_name(obj["file_name"])
    file_size = _int(obj, "file_size", 0, MAX_FILE_SIZE, "manifest")
    shard_size = _int(obj, "shard_size", 1, MAX_SHARD_SIZE, "manifest")
    if obj["digest_algorithm"] != DIGEST_ALGORITHM:
        raise ManifestError(f"manifest: unsupported digest_algorithm {obj['digest_algorithm']!r}")
    file_digest = _hex(obj, "file_digest", "manifest")
    created_at = obj["created_at"]
    if type(created_at) not in (int, float) or not math.isfinite(created_at) or created_at < 0:
        raise ManifestError(f"manifest: created_at must be a finite non-negative number, got {created_at!r}")
    encoding = obj["encoding"]
    if encoding not in ENCODINGS:
        raise ManifestError(f"manifest: unsupported encoding {encoding!r}, expected one of {ENCODINGS}")
    expected = num_shards(file_size, shard_size)
    if expected > max_shards:
        raise ManifestError(f"manifest: {expected} shards exceeds the limit of {max_shards}")
    raw_shards = obj["shards"]
    if not isinstance(raw_shards, list) or len(raw_shards) != expected:
        count = len(raw_shards) if isinstance(raw_shards, list) else type(raw_shards).__name__
        raise ManifestError(
            f"manifest: file_size={file_size} with shard_size={shard_size} needs {expected} shards, got {count}"
        )
    shards = tuple(_parse_shard(raw, i, file_size, shard_size, encoding) for i, raw in enumerate(raw_shards))
    delta = None if obj["delta"] is None else _parse_delta(obj["delta"], version, shards)
    signature = None if obj["signature"] is None else _parse_signature(obj["signature"])
    return Manifest(
        version=version,
        file_name=file_name,
        file_size=file_size,
        shard_size=shard_size,
        file_digest=file_digest,
        created_at=float(created_at),
        encoding=encoding,
        shards=shards,
        delta=delta,
        signature=signature,
    )


def _parse_shard(raw: object, position: int, file_size: int, shard_size: int, encoding: str) -> ShardInfo:
    where = f"manifest shard {position}"
    obj = _keys(raw, {"index", "size", "digest", "stored_size", "stored_digest"}, where)
    index = _int(obj, "index", 0, MAX_SHARDS, where)
    if index != position:
        raise ManifestError(f"{where}: index {index} out of order (expected {position})")
    planned = min(shard_size, file_size - position * shard_size)
    size = _int(obj, "size", 0, MAX_SHARD_SIZE, where)
    if size != planned:
        raise ManifestError(f"{where}: size {size} disagrees with the plan ({planned} bytes)")
    stored_size = _int(obj, "stored_size", 0, max_stored_size(size), where)
    digest, stored_digest = _hex(obj, "digest", where), _hex(obj, "stored_digest", where)
    if encoding == "raw" and (stored_size != size or stored_digest != digest):
        raise ManifestError(f"{where}: raw encoding requires stored_size/stored_digest equal to size/digest")
    return ShardInfo(index, size, digest, stored_size, stored_digest)


def _parse_delta(raw: object, version: int, shards: tuple[ShardInfo, ...]) -> DeltaInfo:
    obj = _keys(raw, {"base_version", "base_digest", "encoding", "shards"}, "manifest delta")
    base_version = _int(obj, "base_version", 1, MAX_VERSION, "manifest delta")
    if base_version >= version:
        raise ManifestError(
            f"manifest delta: base_version {base_version} must be older than version {version}"
        )
    if obj["encoding"] not in DELTA_ENCODINGS:
        raise ManifestError(f"manifest delta: unsupported encoding {obj['encoding']!r}")
    entries = obj["shards"]
    if not isinstance(entries, list) or len(entries) != len(shards):
        raise ManifestError(f"manifest delta: expected {len(shards)} shard entries")
    stored = []
    for shard, entry in zip(shards, entries, strict=True):
        where = f"manifest delta shard {shard.index}"
        item = _keys(entry, {"stored_size", "stored_digest"}, where)
        stored.append(
            StoredInfo(
                _int(item, "stored_size", 0, max_stored_size(shard.size), where),
                _hex(item, "stored_digest", where),
            )
        )
    return DeltaInfo(base_version, _hex(obj, "base_digest", "manifest delta"), obj["encoding"], tuple(stored))


def _parse_signature(raw: object) -> Signature:
    obj = _keys(raw, {"scheme", "key_id", "value"}, "manifest signature")
    scheme, key_id, value = obj["scheme"], obj["key_id"], obj["value"]
    if not all(isinstance(v, str) for v in (scheme, key_id, value)) or len(key_id) > 128 or len(value) > 1024:
        raise ManifestError("manifest signature: scheme, key_id and value must be short strings")
    if not re.fullmatch(r"[0-9a-f]+", value):
        raise ManifestError("manifest signature: value must be lowercase hex")
    return Signature(scheme, key_id, value)
