"""Manifest signatures: HMAC-SHA256 and Ed25519; tampering and wrong keys are detected."""

from __future__ import annotations

import dataclasses

import pytest
from shardcast_testlib import make_manifest  # type: ignore[import-not-found]

from shardcast.errors import SignatureError
from shardcast.manifest import parse_manifest
from shardcast.signing import Ed25519PrivateKey, HmacKey, load_key, sign_manifest, verify_manifest


def test_hmac_sign_verify_round_trip() -> None:
    key = HmacKey(b"0123456789abcdef-secret")
    signed = sign_manifest(make_manifest(), key)
    parsed = parse_manifest(signed.to_json())
    verify_manifest(parsed, key)  # no exception
    verify_manifest(parsed, None)  # unsigned deployments ignore signatures


def test_tampered_manifest_fails() -> None:
    key = HmacKey(b"0123456789abcdef-secret")
    signed = sign_manifest(make_manifest(), key)
    shard = dataclasses.replace(signed.shards[0], digest="00" * 32, stored_digest="00" * 32)
    tampered = dataclasses.replace(signed, shards=(shard, *signed.shards[1:]))
    with pytest.raises(SignatureError, match="does not verify"):
        verify_manifest(tampered, key)


def test_unsigned_and_wrong_key_fail() -> None:
    key = HmacKey(b"0123456789abcdef-secret")
    with pytest.raises(SignatureError, match="unsigned"):
        verify_manifest(make_manifest(), key)
    other = HmacKey(b"another-secret-of-16-bytes")
    with pytest.raises(SignatureError, match="expected"):
        verify_manifest(sign_manifest(make_manifest(), other), key)
    with pytest.raises(ValueError):
        HmacKey(b"short")


def test_ed25519() -> None:
    pytest.importorskip("cryptography")
    private = Ed25519PrivateKey.generate()
    public = private.public_key()
    signed = parse_manifest(sign_manifest(make_manifest(), private).to_json())
    verify_manifest(signed, public)
    flipped = dataclasses.replace(signed, file_size=signed.file_size, file_digest="cd" * 32)
    with pytest.raises(SignatureError):
        verify_manifest(flipped, public)
    spec = load_key(f"ed25519-public:{public.public_bytes.hex()}")
    assert spec == public


def test_load_key_specs() -> None:
    assert isinstance(load_key("hmac:0123456789abcdef"), HmacKey)
    with pytest.raises(ValueError, match="unknown key spec"):
        load_key("rsa:abc")
