"""Broadcast model checkpoints to many machines through an HTTP relay tree, verified shard by shard.

::

    from shardcast import Origin, Relay, Client

    with Origin("/srv/origin", port=8000) as origin:
        origin.publish("model.safetensors")                    # version 1
    Client(["http://origin:8000"]).fetch("latest", "model.safetensors")
"""

from .client import Client, FetchResult, Follower, VersionListing
from .errors import (
    DeadlineExceededError,
    IntegrityError,
    ManifestError,
    NoServerAvailableError,
    PublishError,
    ShardcastError,
    SignatureError,
    VersionGoneError,
    VersionNotFoundError,
)
from .layout import DataDir, Index, IndexEntry, parse_index
from .manifest import DeltaInfo, Manifest, ShardInfo, Signature, parse_manifest, parse_version_name
from .origin import Origin
from .planning import DEFAULT_SHARD_SIZE, ShardSpan, plan_shards
from .publish import publish_file
from .relay import Relay
from .server import HttpServer
from .servers import ServerReport
from .signing import Ed25519PrivateKey, Ed25519PublicKey, HmacKey, load_key, sign_manifest, verify_manifest
from .transfer import Progress

__version__ = "0.4.0"

__all__ = [
    "DEFAULT_SHARD_SIZE",
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
    "NoServerAvailableError",
    "Origin",
    "Progress",
    "PublishError",
    "Relay",
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
    "sign_manifest",
    "verify_manifest",
]
