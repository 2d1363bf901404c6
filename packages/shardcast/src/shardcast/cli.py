"""Command line: ``shardcast origin|publish|relay|ls|fetch`` (stable; scripts rely on it).

Exit status: 0 on success, 1 on a shardcast error (message on stderr), 2 on bad usage,
130 when interrupted. Secrets can come from the environment instead of the command line:
``SHARDCAST_TOKEN`` (bearer token) and ``SHARDCAST_KEY`` (key spec, see
:func:`shardcast.signing.load_key`).
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import signal
import sys
import threading
import time
from collections.abc import Sequence
from typing import TYPE_CHECKING

from . import __version__
from .errors import ShardcastError
from .planning import DEFAULT_SHARD_SIZE
from .publish import DEFAULT_GRACE_S, DEFAULT_KEEP, publish_file
from .signing import Ed25519PrivateKey, Ed25519PublicKey, HmacKey, load_key

if TYPE_CHECKING:
    from .transfer import Progress

# Servers and the client import aiohttp (slow to import): they are imported in run() only
# by the commands that need them, so `shardcast publish` starts fast.

log = logging.getLogger("shardcast")


def _urls(text: str) -> list[str]:
    urls = [u for u in (part.strip() for part in text.replace(" ", ",").split(",")) if u]
    if not urls:
        raise argparse.ArgumentTypeError("expected one or more URLs separated by commas")
    return urls


def _size(text: str) -> int:
    units = {"k": 10**3, "m": 10**6, "g": 10**9, "ki": 2**10, "mi": 2**20, "gi": 2**30}
    lowered = text.strip().lower().removesuffix("b")
    for suffix in sorted(units, key=len, reverse=True):
        if lowered.endswith(suffix):
            return int(float(lowered[: -len(suffix)]) * units[suffix])
    try:
        return int(lowered)
    except ValueError:
        raise argparse.ArgumentTypeError(f"bad size {text!r}: use bytes or 50M, 1Gi, ...") from None


def _common(parser: argparse.ArgumentParser, *, key_help: str) -> None:
    parser.add_argument(
        "--token", default=os.environ.get("SHARDCAST_TOKEN"), help="bearer token (env SHARDCAST_TOKEN)"
    )
    parser.add_argument(
        "--key", default=os.environ.get("SHARDCAST_KEY"), help=key_help + " (env SHARDCAST_KEY)"
    )
    parser.add_argument("--log-level", default="INFO", choices=["DEBUG", "INFO", "WARNING", "ERROR"])


def _serve_args(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--data-dir", required=True, help="directory served as static files")
    parser.add_argument("--port", type=int, default=8000, help="TCP port (default 8000; 0 = any free port)")
    parser.add_argument("--host", default="0.0.0.0", help="bind address (default 0.0.0.0)")
    parser.add_argument(
        "--keep", type=int, default=DEFAULT_KEEP, help=f"versions kept (default {DEFAULT_KEEP})"
    )
    parser.add_argument(
        "--grace",
        type=float,
        default=DEFAULT_GRACE_S,
        help=f"seconds before a retired version is deleted (default {DEFAULT_GRACE_S:g})",
    )
    parser.add_argument(
        "--rate-limit", type=_size, default=None, help="max bytes/s per shard response (default unlimited)"
    )


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="shardcast", description="Broadcast checkpoints through an HTTP relay tree."
    )
    parser.add_argument("--version", action="version", version=f"shardcast {__version__}")
    sub = parser.add_subparsers(dest="command", required=True)

    origin = sub.add_parser(
        "origin", help="serve a data directory (publish into it with `shardcast publish`)"
    )
    _serve_args(origin)
    _common(origin, key_help="unused by the server; kept for symmetry")

    publish = sub.add_parser("publish", help="publish FILE as the next version in DATA_DIR")
    publish.add_argument("file", help="file to publish (e.g. model.safetensors)")
    publish.add_argument(
        "--data-dir", required=True, help="origin data directory (a running origin serves it at once)"
    )
    publish.add_argument(
        "--shard-size", type=_size, default=DEFAULT_SHARD_SIZE, help="bytes per shard (default 50M)"
    )
    publish.add_argument(
        "--encoding", choices=["raw", "zstd"], default="raw", help="shard encoding (default raw)"
    )
    publish.add_argument(
        "--delta", action="store_true", help="also write XOR+zstd deltas against the previous version"
    )
    publish.add_argument(
        "--version-number", type=int, default=None, help="version number (default: next free)"
    )
    publish.add_argument(
        "--keep", type=int, default=DEFAULT_KEEP, help=f"versions kept (default {DEFAULT_KEEP})"
    )
    publish.add_argument(
        "--grace", type=float, default=DEFAULT_GRACE_S, help="seconds before a retired version is deleted"
    )
    _common(publish, key_help="signing key: hmac:<secret>, hmac-file:<path> or ed25519-private:<hex>")

    relay = sub.add_parser("relay", help="mirror upstream servers and serve verified shards")
    relay.add_argument("--upstream", type=_urls, required=True, help="upstream URL[,URL...]")
    _serve_args(relay)
    relay.add_argument(
        "--upstream-token", default=os.environ.get("SHARDCAST_UPSTREAM_TOKEN"), help="token sent upstream"
    )
    relay.add_argument(
        "--poll-interval", type=float, default=2.0, help="seconds between upstream polls (default 2)"
    )
    _common(relay, key_help="pinned manifest key: hmac:<secret> or ed25519-public:<hex>")

    ls = sub.add_parser("ls", help="list versions offered by servers")
    ls.add_argument("--servers", type=_urls, required=True, help="server URL[,URL...]")
    ls.add_argument("--json", action="store_true", help="machine-readable output")
    _common(ls, key_help="unused")

    fetch = sub.add_parser("fetch", help="download a version, verified, to --output")
    fetch.add_argument("--servers", type=_urls, required=True, help="server URL[,URL...]")
    fetch.add_argument("--version", dest="version_spec", default="latest", help="N, vN or latest (default)")
    fetch.add_argument("--output", required=True, help="destination file (replaced atomically when verified)")
    fetch.add_argument(
        "--deadline", type=float, default=3600.0, help="give up after this many seconds (default 3600)"
    )
    fetch.add_argument("--base", default=None, help="previous version's file, to download only deltas")
    fetch.add_argument("--concurrency", type=int, default=8, help="shards in flight (default 8)")
    fetch.add_argument(
        "--rate-limit", type=_size, default=None, help="max bytes/s over all connections (e.g. 100M)"
    )
    fetch.add_argument("--no-progress", action="store_true", help="no progress bar")
    fetch.add_argument("--fsync", action="store_true", help="flush the file to disk before placing it")
    _common(fetch, key_help="pinned manifest key: hmac:<secret> or ed25519-public:<hex>")

    keygen = sub.add_parser("keygen", help="print a new Ed25519 key pair as key specs (needs cryptography)")
    keygen.add_argument("--log-level", default="WARNING")
    return parser


def _verify_key(spec: str | None) -> HmacKey | Ed25519PublicKey | None:
    if not spec:
        return None
    key = load_key(spec)
    return key.public_key() if isinstance(key, Ed25519PrivateKey) else key


def _wait_for_signal() -> None:
    stop = threading.Event()
    for signum in (signal.SIGINT, signal.SIGTERM):
        signal.signal(signum, lambda *_: stop.set())
    while not stop.wait(1.0):
        pass


class ProgressBar:
    """A one-line progress bar on stderr: percent, shards, MB/s, ETA."""

    def __init__(self, enabled: bool) -> None:
        self.enabled = enabled and sys.stderr.isatty()
        self.last_line = 0.0

    def __call__(self, progress: Progress) -> None:
        if not self.enabled:
            return
        fraction = progress.bytes_done / progress.bytes_total if progress.bytes_total else 1.0
        rate = progress.bytes_per_s
        eta = (progress.bytes_total - progress.bytes_done) / rate if rate > 0 else float("inf")
        width = 30
        bar = "#" * int(fraction * width) + "-" * (width - int(fraction * width))
        sys.stderr.write(
            f"\rv{progress.version} [{bar}] {fraction * 100:5.1f}% {progress.shards_done}/{progress.shards_total} shards "
            f"{rate / 1e6:7.1f} MB/s ETA {eta:5.0f}s"
        )
        sys.stderr.flush()

    def close(self) -> None:
        if self.enabled:
            sys.stderr.write("\n")


def run(args: argparse.Namespace) -> int:
    if args.command == "keygen":
        private = Ed25519PrivateKey.generate()
        print(f"ed25519-private:{private.seed.hex()}")
        print(f"ed25519-public:{private.public_key().public_bytes.hex()}")
        return 0
    if args.command == "origin":
        from .origin import Origin

        origin = Origin(
            args.data_dir,
            host=args.host,
            port=args.port,
            token=args.token,
            keep=args.keep,
            grace_s=args.grace,
            rate_limit_bps=args.rate_limit,
        )
        with origin:
            print(f"origin serving {origin.data_dir.root} on {origin.url}", flush=True)
            _wait_for_signal()
        return 0
    if args.command == "publish":
        signing = load_key(args.key) if args.key else None
        if isinstance(signing, Ed25519PublicKey):
            raise ShardcastError(
                "publish needs a signing key (hmac:... or ed25519-private:...), not a public key"
            )
        manifest = publish_file(
            args.data_dir,
            args.file,
            version=args.version_number,
            shard_size=args.shard_size,
            encoding=args.encoding,
            delta=args.delta,
            signing_key=signing,
            keep=args.keep,
            grace_s=args.grace,
        )
        print(
            f"v{manifest.version} {manifest.file_name} {manifest.file_size} bytes {manifest.num_shards} shards {manifest.file_digest}"
        )
        return 0
    if args.command == "relay":
        from .relay import Relay

        relay = Relay(
            args.upstream,
            args.data_dir,
            host=args.host,
            port=args.port,
            token=args.token,
            upstream_token=args.upstream_token,
            verify_key=_verify_key(args.key),
            poll_interval_s=args.poll_interval,
            keep=args.keep,
            grace_s=args.grace,
            rate_limit_bps=args.rate_limit,
        )
        with relay:
            print(f"relay serving {relay.data_dir.root} on {relay.url}", flush=True)
            _wait_for_signal()
        return 0
    if args.command == "ls":
        from .client import Client

        listing = Client(args.servers, token=args.token).list_versions()
        if args.json:
            print(
                json.dumps(
                    {
                        "versions": {str(k): v for k, v in sorted(listing.versions.items())},
                        "complete": {str(k): v for k, v in sorted(listing.complete.items())},
                        "errors": listing.errors,
                    }
                )
            )
        else:
            for number in sorted(listing.versions):
                complete = listing.complete.get(number, [])
                print(
                    f"v{number}\tcomplete on {len(complete)}/{len(listing.versions[number])} servers\t"
                    + ",".join(listing.versions[number])
                )
            for server, error in listing.errors.items():
                print(f"unreachable {server}: {error}", file=sys.stderr)
        if not listing.versions and listing.errors and len(listing.errors) == len(args.servers):
            raise ShardcastError("no server reachable")
        return 0
    if args.command == "fetch":
        from .client import Client

        client = Client(
            args.servers,
            token=args.token,
            verify_key=_verify_key(args.key),
            concurrency=args.concurrency,
            max_bytes_per_second=args.rate_limit,
        )
        bar = ProgressBar(not args.no_progress)
        started = time.monotonic()
        try:
            result = client.fetch(
                args.version_spec, args.output, deadline_s=args.deadline, base=args.base, progress=bar
            )
        finally:
            bar.close()
        for report in result.servers:
            log.info(
                "server %s: %d bytes, %d bad shards, success %.2f%s%s",
                report.url,
                report.bytes_served,
                report.bad_shards,
                report.success_rate,
                ", dropped" if report.dropped else "",
                f", last error: {report.last_error}" if report.last_error else "",
            )
        print(
            f"v{result.version} -> {result.path}: {result.manifest.file_size} bytes, downloaded {result.bytes_downloaded}, "
            f"resumed {result.bytes_resumed}, bad shards {result.bad_shards}, {time.monotonic() - started:.2f}s"
            + (", delta" if result.used_delta else ""),
            flush=True,
        )
        return 0
    raise AssertionError(args.command)


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    logging.basicConfig(
        level=getattr(logging, args.log_level, logging.INFO),
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
    )
    try:
        return run(args)
    except KeyboardInterrupt:
        print("shardcast: interrupted", file=sys.stderr)
        return 130
    except (ShardcastError, OSError, ValueError) as exc:
        print(f"shardcast {args.command}: error: {type(exc).__name__}: {exc}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    raise SystemExit(main())
