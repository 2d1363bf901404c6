"""Broadcast model checkpoints to many machines through an HTTP relay tree, verified shard by shard.

::

    from shardcast import Origin, Relay, Client

    with Origin("/srv/origin", port=8000) as origin:
        origin.publish("model.safetensors")                    # version 1
        origin.publish(model.state_dict())                     # version 2, from memory
    Client(["http://origin:8000"]).fetch("latest", "model.safetensors")
    Client(["http://relay:8000"]).follower(reload, output_dir="/ckpt").start()  # hot reloads

Names are imported lazily (PEP 562), so ``shardcast publish`` and manifest tools start
without loading aiohttp.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

__version__ = "0.4.1"

from shardcast._name_clash import warn_on_name_clash as _warn_on_name_clash

_warn_on_name_clash("shardcast", "intellect2-shardcast", others_hint="the reference implementation `shardcast` 0.3.2 on PyPI")

_EXPORTS = {
    "Client": "client",
    "FetchResult": "results",
    "Follower": "follower",
    "VersionListing": "results",
    "DeadlineExceededError": "errors",
    "IntegrityError": "errors",
    "ManifestError": "errors",
    "NoServerAvailableError": "errors",
    "PublishError": "errors",
    "AlreadyPublished": "errors",
    "ShardcastError": "errors",
    "SignatureError": "errors",
    "VersionGoneError": "errors",
    "VersionNotFoundError": "errors",
    "DataDir": "layout",
    "Index": "layout",
    "IndexEntry": "layout",
    "parse_index": "layout",
    "DeltaInfo": "manifest",
    "Manifest": "manifest",
    "ShardInfo": "manifest",
    "Signature": "manifest",
    "parse_manifest": "manifest",
    "parse_version_name": "manifest",
    "Origin": "origin",
    "DEFAULT_SHARD_SIZE": "planning",
    "ShardSpan": "planning",
    "plan_shards": "planning",
    "publish_file": "publish",
    "publish_tensors": "publish",
    "SafetensorsStream": "tensors",
    "Relay": "relay",
    "HttpServer": "server",
    "ServerReport": "servers",
    "Ed25519PrivateKey": "signing",
    "Ed25519PublicKey": "signing",
    "HmacKey": "signing",
    "load_key": "signing",
    "sign_manifest": "signing",
    "verify_manifest": "signing",
    "Progress": "progress",
    "MissingExtraError": "errors",
}

__all__ = [
    "DEFAULT_SHARD_SIZE",
    "AlreadyPublished",
    "Client",
    "DataDir",
    "DeadlineExceededError",
    "DeltaInfo",
    "Ed25519PrivateKey",
    "Ed25519PublicKey",
    "FetchResult",
    "Follower",
    "HmacKey",
    "HttpServer",
    "Index",
    "IndexEntry",
    "IntegrityError",
    "Manifest",
    "ManifestError",
    "MissingExtraError",
    "NoServerAvailableError",
    "Origin",
    "Progress",
    "PublishError",
    "Relay",
    "SafetensorsStream",
    "ServerReport",
    "ShardInfo",
    "ShardSpan",
    "ShardcastError",
    "Signature",
    "SignatureError",
    "VersionGoneError",
    "VersionListing",
    "VersionNotFoundError",
    "__version__",
    "load_key",
    "parse_index",
    "parse_manifest",
    "parse_version_name",
    "plan_shards",
    "publish_file",
    "publish_tensors",
    "sign_manifest",
    "verify_manifest",
]


def __getattr__(name: str) -> Any:
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'shardcast' has no attribute {name!r}")
    value = getattr(importlib.import_module(f".{module}", __name__), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return __all__


if TYPE_CHECKING:
    from .client import Client
    from .errors import (
        AlreadyPublished,
        DeadlineExceededError,
        IntegrityError,
        ManifestError,
        MissingExtraError,
        NoServerAvailableError,
        PublishError,
        ShardcastError,
        SignatureError,
        VersionGoneError,
        VersionNotFoundError,
    )
    from .follower import Follower
    from .layout import DataDir, Index, IndexEntry, parse_index
    from .manifest import DeltaInfo, Manifest, ShardInfo, Signature, parse_manifest, parse_version_name
    from .origin import Origin
    from .planning import DEFAULT_SHARD_SIZE, ShardSpan, plan_shards
    from .progress import Progress
    from .publish import publish_file, publish_tensors
    from .relay import Relay
    from .results import FetchResult, VersionListing
    from .server import HttpServer
    from .servers import ServerReport
    from .signing import (
        Ed25519PrivateKey,
        Ed25519PublicKey,
        HmacKey,
        load_key,
        sign_manifest,
        verify_manifest,
    )
    from .tensors import SafetensorsStream
