"""Manifest signatures: HMAC-SHA256 (stdlib) or Ed25519 (needs ``cryptography``).

The origin signs :meth:`Manifest.signed_payload`; every relay and client pins a key and
rejects manifests that are unsigned or signed by anything else. The signature covers
every shard digest, so a relay can neither alter data nor the manifest undetected.

- ``HmacKey(secret)``: one shared secret on origin and readers. Simple, but anyone holding
  the secret can also sign: use it inside one trust domain.
- ``Ed25519PrivateKey`` / ``Ed25519PublicKey``: the origin keeps the private key, readers pin
  the 32-byte public key. Requires the ``ed25519`` extra (``cryptography``):
  ``pip install "intellect2-shardcast[ed25519]"``; without it every Ed25519 operation, and
  :func:`load_key` of an Ed25519 spec, raises :class:`~shardcast.errors.MissingExtraError`.

Key ids are the first 16 hex chars of SHA-256 of the (public) key material, so a reader
can tell "wrong key" from "corrupt signature".
"""

from __future__ import annotations

import hmac
import os
from dataclasses import dataclass
from types import ModuleType
from typing import Protocol

from .digest import digest_bytes
from .errors import MissingExtraError, SignatureError
from .manifest import Manifest, Signature

ED25519_EXTRA = '"intellect2-shardcast[ed25519]"'


def _ed25519() -> ModuleType:
    """``cryptography``'s Ed25519 module, or a one-line error naming the extra to install."""
    try:
        from cryptography.hazmat.primitives.asymmetric import ed25519
    except ModuleNotFoundError:
        raise MissingExtraError(
            f"Ed25519 keys need the 'cryptography' package: pip install {ED25519_EXTRA} "
            "(or use an hmac:<secret> key, which needs nothing extra)"
        ) from None
    return ed25519


class SigningKey(Protocol):
    @property
    def key_id(self) -> str: ...

    def sign(self, payload: bytes) -> Signature: ...


class VerifyKey(Protocol):
    @property
    def key_id(self) -> str: ...

    @property
    def scheme(self) -> str: ...

    def verify(self, payload: bytes, signature: Signature) -> bool: ...


@dataclass(frozen=True)
class HmacKey:
    """A shared secret usable for both signing and verifying (``scheme = "hmac-sha256"``)."""

    secret: bytes
    scheme: str = "hmac-sha256"

    def __post_init__(self) -> None:
        if len(self.secret) < 16:
            raise ValueError("HMAC secret must be at least 16 bytes")

    @property
    def key_id(self) -> str:
        return digest_bytes(b"shardcast-hmac-id:" + self.secret)[:16]

    def sign(self, payload: bytes) -> Signature:
        value = hmac.new(self.secret, payload, "sha256").hexdigest()
        return Signature(self.scheme, self.key_id, value)

    def verify(self, payload: bytes, signature: Signature) -> bool:
        expected = hmac.new(self.secret, payload, "sha256").hexdigest()
        return hmac.compare_digest(expected, signature.value)


@dataclass(frozen=True)
class Ed25519PublicKey:
    """A pinned Ed25519 public key (32 raw bytes)."""

    public_bytes: bytes
    scheme: str = "ed25519"

    @property
    def key_id(self) -> str:
        return digest_bytes(self.public_bytes)[:16]

    def verify(self, payload: bytes, signature: Signature) -> bool:
        ed25519 = _ed25519()
        from cryptography.exceptions import InvalidSignature

        try:
            key = ed25519.Ed25519PublicKey.from_public_bytes(self.public_bytes)
            key.verify(bytes.fromhex(signature.value), payload)
        except (InvalidSignature, ValueError):
            return False
        return True


@dataclass(frozen=True)
class Ed25519PrivateKey:
    """An Ed25519 signing key (32-byte raw seed). ``generate()`` makes a new one."""

    seed: bytes

    @classmethod
    def generate(cls) -> Ed25519PrivateKey:
        _ed25519()  # a key nobody can use is no key: fail before making one
        return cls(os.urandom(32))

    def public_key(self) -> Ed25519PublicKey:
        ed25519 = _ed25519()
        from cryptography.hazmat.primitives import serialization

        key = ed25519.Ed25519PrivateKey.from_private_bytes(self.seed)
        raw = key.public_key().public_bytes(serialization.Encoding.Raw, serialization.PublicFormat.Raw)
        return Ed25519PublicKey(raw)

    @property
    def key_id(self) -> str:
        return self.public_key().key_id

    def sign(self, payload: bytes) -> Signature:
        value = _ed25519().Ed25519PrivateKey.from_private_bytes(self.seed).sign(payload).hex()
        return Signature("ed25519", self.key_id, value)


def sign_manifest(manifest: Manifest, key: SigningKey) -> Manifest:
    """Return ``manifest`` with a signature over its canonical payload."""
    return manifest.with_signature(key.sign(manifest.signed_payload()))


def verify_manifest(manifest: Manifest, key: VerifyKey | None) -> None:
    """Raise :class:`SignatureError` unless ``manifest`` is signed by ``key``.

    With ``key=None`` nothing is checked (unsigned deployments); a present signature is
    then ignored, since there is nothing to check it against.
    """
    if key is None:
        return
    signature = manifest.signature
    if signature is None:
        raise SignatureError(f"manifest v{manifest.version} is unsigned but a verify key is pinned")
    if signature.scheme != key.scheme or signature.key_id != key.key_id:
        raise SignatureError(
            f"manifest v{manifest.version} is signed with {signature.scheme}:{signature.key_id}, "
            f"expected {key.scheme}:{key.key_id}"
        )
    if not key.verify(manifest.signed_payload(), signature):
        raise SignatureError(f"manifest v{manifest.version}: signature does not verify (tampered manifest?)")


def load_key(spec: str) -> HmacKey | Ed25519PublicKey | Ed25519PrivateKey:
    """Parse a key spec used by the CLI and env vars.

    ``hmac:<secret text>``, ``hmac-file:<path>``, ``ed25519-public:<64 hex>``,
    ``ed25519-private:<64 hex seed>``.

    Raises:
        ValueError: an unknown kind or a malformed key.
        MissingExtraError: an Ed25519 spec without the ``ed25519`` extra installed (checked
            here, so a command fails before doing any work).
    """
    kind, _, value = spec.partition(":")
    if kind == "hmac":
        return HmacKey(value.encode())
    if kind == "hmac-file":
        with open(value, "rb") as handle:
            return HmacKey(handle.read().strip())
    if kind not in ("ed25519-public", "ed25519-private"):
        raise ValueError(
            f"unknown key spec {kind[:20]!r}: use hmac:<secret>, hmac-file:<path>, "
            "ed25519-public:<hex>, ed25519-private:<hex>"
        )
    try:
        raw = bytes.fromhex(value)
    except ValueError:
        raw = b""
    if len(raw) != 32:
        raise ValueError(f"key spec {kind!r} needs 64 hex characters (32 bytes)")
    _ed25519()
    return Ed25519PublicKey(raw) if kind == "ed25519-public" else Ed25519PrivateKey(raw)
