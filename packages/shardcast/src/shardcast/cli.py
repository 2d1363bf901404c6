"""Command line: ``shardcast origin|publish|relay|ls|fetch|keygen`` (stable; scripts rely on it).

Each subcommand is one row of :data:`COMMANDS`: its help line, the function that declares
its arguments and the function that runs it. Exit status: 0 on success, 1 on an error
(one line on stderr, never a traceback: bad input, unreachable servers, a missing extra),
2 on bad usage, 130 when interrupted. Secrets can come from the environment instead of the
command line: ``SHARDCAST_TOKEN`` (bearer token) and ``SHARDCAST_KEY`` (key spec, see
:func:`shardcast.signing.load_key`).

Servers and the client import aiohttp (slow to import): each command's function imports
what it needs, so ``shardcast publish`` starts fast.
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
from collections.abc import Callable, Sequence
from contextlib import AbstractContextManager
from dataclasses import dataclass
from typing import Any

from . import __version__
from .errors import ShardcastError
from .planning import DEFAULT_SHARD_SIZE
from .progress import DEFAULT_DEADLINE_S, DEFAULT_STALL_TIMEOUT_S, ProgressBar
from .publish import DEFAULT_GRACE_S, DEFAULT_KEEP, publish_file
from .signing import Ed25519PrivateKey, Ed25519PublicKey, HmacKey, load_key

log = logging.getLogger("shardcast")


# ---- argument types and shared options -----------------------------------------------------


def _urls(text: str) -> list[str]:
    urls = [u for u in (part.strip() for part in text.replace(" ", ",").split(",")) if u]
    if not urls:
        raise argparse.ArgumentTypeError("expected one or more URLs separated by commas")
    return urls


def _size(text: str) -> int:
    units = {"k": 10**3, "m": 10**6, "g": 10**9, "ki": 2**10, "mi": 2**20, "gi": 2**30}
    lowered = text.strip().lower().removesuffix("b")
    try:
        for suffix in sorted(units, key=len, reverse=True):
            if lowered.endswith(suffix):
                return int(float(lowered[: -len(suffix)]) * units[suffix])
        return int(lowered)
    except ValueError:
        raise argparse.ArgumentTypeError(f"bad size {text!r}: use bytes or 50M, 1Gi, ...") from None


def _port(text: str) -> int:
    try:
        port = int(text)
    except ValueError:
        port = -1
    if not 0 <= port <= 65535:
        raise argparse.ArgumentTypeError(f"bad port {text!r}: use an integer 0..65535 (0 = any free port)")
    return port


def _secrets(parser: argparse.ArgumentParser, *, key_help: str) -> None:
    parser.add_argument(
        "--token", default=os.environ.get("SHARDCAST_TOKEN"), help="bearer token (env SHARDCAST_TOKEN)"
    )
    parser.add_argument(
        "--key", default=os.environ.get("SHARDCAST_KEY"), help=key_help + " (env SHARDCAST_KEY)"
    )


def _retention(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--keep", type=int, default=DEFAULT_KEEP, help=f"versions kept (default {DEFAULT_KEEP})"
    )
    parser.add_argument(
        "--grace",
        type=float,
        default=DEFAULT_GRACE_S,
        help=f"seconds before a retired version is deleted (default {DEFAULT_GRACE_S:g})",
    )


def _serving(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--data-dir", required=True, help="directory served as static files")
    parser.add_argument("--port", type=_port, default=8000, help="TCP port (default 8000; 0 = any free port)")
    parser.add_argument("--host", default="0.0.0.0", help="bind address (default 0.0.0.0)")
    _retention(parser)
    parser.add_argument(
        "--rate-limit", type=_size, default=None, help="max bytes/s per shard response (default unlimited)"
    )


def _serving_options(args: argparse.Namespace) -> dict[str, Any]:
    """The keyword arguments that ``_serving`` and ``_secrets`` give an Origin or a Relay."""
    return {
        "host": args.host,
        "port": args.port,
        "token": args.token,
        "keep": args.keep,
        "grace_s": args.grace,
        "rate_limit_bps": args.rate_limit,
    }


def _verify_key(spec: str | None) -> HmacKey | Ed25519PublicKey | None:
    if not spec:
        return None
    key = load_key(spec)
    return key.public_key() if isinstance(key, Ed25519PrivateKey) else key


def _serve_until_signal(server: AbstractContextManager[Any], what: str) -> int:
    """Run ``server`` (an Origin or Relay) until SIGINT/SIGTERM."""
    stop = threading.Event()
    with server as running:
        for signum in (signal.SIGINT, signal.SIGTERM):
            signal.signal(signum, lambda *_: stop.set())
        print(f"{what} serving {running.data_dir.root} on {running.url}", flush=True)
        while not stop.wait(1.0):
            pass
    return 0


# ---- origin --------------------------------------------------------------------------------


def _origin_arguments(parser: argparse.ArgumentParser) -> None:
    _serving(parser)
    _secrets(parser, key_help="unused by the server; accepted for symmetry")


def _origin(args: argparse.Namespace) -> int:
    from .origin import Origin

    origin = Origin(args.data_dir, **_serving_options(args))
    return _serve_until_signal(origin, "origin")


# ---- publish -------------------------------------------------------------------------------


def _publish_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("file", help="file to publish (e.g. model.safetensors)")
    parser.add_argument(
        "--data-dir", required=True, help="origin data directory (a running origin serves it at once)"
    )
    parser.add_argument(
        "--shard-size", type=_size, default=DEFAULT_SHARD_SIZE, help="bytes per shard (default 50M)"
    )
    parser.add_argument(
        "--encoding", choices=["raw", "zstd"], default="raw", help="shard encoding (default raw)"
    )
    parser.add_argument(
        "--delta", action="store_true", help="also write XOR+zstd deltas against the previous version"
    )
    parser.add_argument("--version-number", type=int, default=None, help="version number (default: next free)")
    _retention(parser)
    _secrets(parser, key_help="signing key: hmac:<secret>, hmac-file:<path> or ed25519-private:<hex>")


def _publish(args: argparse.Namespace) -> int:
    signing = load_key(args.key) if args.key else None
    if isinstance(signing, Ed25519PublicKey):
        raise ShardcastError("publish needs a signing key (hmac:... or ed25519-private:...), not a public key")
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
        f"v{manifest.version} {manifest.file_name} {manifest.file_size} bytes "
        f"{manifest.num_shards} shards {manifest.file_digest}"
    )
    return 0


# ---- relay ---------------------------------------------------------------------------------


def _relay_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--upstream", type=_urls, required=True, help="upstream URL[,URL...]")
    _serving(parser)
    parser.add_argument(
        "--upstream-token", default=os.environ.get("SHARDCAST_UPSTREAM_TOKEN"), help="token sent upstream"
    )
    parser.add_argument(
        "--poll-interval", type=float, default=2.0, help="seconds between upstream polls (default 2)"
    )
    _secrets(parser, key_help="pinned manifest key: hmac:<secret> or ed25519-public:<hex>")


def _relay(args: argparse.Namespace) -> int:
    from .relay import Relay

    relay = Relay(
        args.upstream,
        args.data_dir,
        upstream_token=args.upstream_token,
        verify_key=_verify_key(args.key),
        poll_interval_s=args.poll_interval,
        **_serving_options(args),
    )
    return _serve_until_signal(relay, "relay")


# ---- ls ------------------------------------------------------------------------------------


def _ls_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--servers", type=_urls, required=True, help="server URL[,URL...]")
    parser.add_argument("--json", action="store_true", help="machine-readable output")
    _secrets(parser, key_help="unused; accepted for symmetry")


def _ls(args: argparse.Namespace) -> int:
    from .client import Client

    client = Client(args.servers, token=args.token)
    listing = client.list_versions()
    if args.json:
        offered = {str(k): v for k, v in sorted(listing.versions.items())}
        whole = {str(k): v for k, v in sorted(listing.complete.items())}
        print(json.dumps({"versions": offered, "complete": whole, "errors": listing.errors}))
    else:
        for number in sorted(listing.versions):
            complete = listing.complete.get(number, [])
            print(
                f"v{number}\tcomplete on {len(complete)}/{len(listing.versions[number])} servers\t"
                + ",".join(listing.versions[number])
            )
        for server, error in listing.errors.items():  # each error says why: unreachable, corrupt index, ...
            print(f"{server}: {error}", file=sys.stderr)
    if not listing.versions and len(listing.errors) == len(client.servers):
        unreachable = all(error.startswith("unreachable") for error in listing.errors.values())
        raise ShardcastError("no server reachable" if unreachable else "no server gave a usable index")
    return 0


# ---- fetch ---------------------------------------------------------------------------------


def _fetch_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--servers", type=_urls, required=True, help="server URL[,URL...]")
    parser.add_argument("--version", dest="version_spec", default="latest", help="N, vN or latest (default)")
    parser.add_argument("--output", required=True, help="destination file (replaced atomically when verified)")
    parser.add_argument(
        "--deadline",
        type=float,
        default=DEFAULT_DEADLINE_S,
        help=f"give up after this many seconds in all (default {DEFAULT_DEADLINE_S:g})",
    )
    parser.add_argument(
        "--stall-timeout",
        type=float,
        default=DEFAULT_STALL_TIMEOUT_S,
        help=f"give up when no server has answered for this many seconds (default {DEFAULT_STALL_TIMEOUT_S:g})",
    )
    parser.add_argument("--base", default=None, help="previous version's file, to download only deltas")
    parser.add_argument("--concurrency", type=int, default=8, help="shards in flight (default 8)")
    parser.add_argument(
        "--rate-limit", type=_size, default=None, help="max bytes/s over all connections (e.g. 100M)"
    )
    parser.add_argument("--no-progress", action="store_true", help="no progress bar")
    parser.add_argument("--fsync", action="store_true", help="flush the file to disk before placing it")
    _secrets(parser, key_help="pinned manifest key: hmac:<secret> or ed25519-public:<hex>")


def _fetch(args: argparse.Namespace) -> int:
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
            args.version_spec,
            args.output,
            deadline_s=args.deadline,
            stall_timeout_s=args.stall_timeout,
            base=args.base,
            progress=bar,
            fsync=args.fsync,
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


# ---- keygen --------------------------------------------------------------------------------


def _keygen_arguments(parser: argparse.ArgumentParser) -> None:
    parser.set_defaults(log_level="WARNING")


def _keygen(args: argparse.Namespace) -> int:
    private = Ed25519PrivateKey.generate()  # raises MissingExtraError without `cryptography`
    public = private.public_key()  # computed before anything is printed
    print(f"ed25519-private:{private.seed.hex()}")
    print(f"ed25519-public:{public.public_bytes.hex()}")
    return 0


# ---- the table -----------------------------------------------------------------------------


@dataclass(frozen=True)
class Command:
    """One subcommand: its ``--help`` line, its arguments, and what it runs (returns the exit status)."""

    help: str
    arguments: Callable[[argparse.ArgumentParser], None]
    run: Callable[[argparse.Namespace], int]


COMMANDS: dict[str, Command] = {
    "origin": Command(
        "serve a data directory (publish into it with `shardcast publish`)", _origin_arguments, _origin
    ),
    "publish": Command("publish FILE as the next version in DATA_DIR", _publish_arguments, _publish),
    "relay": Command("mirror upstream servers and serve verified shards", _relay_arguments, _relay),
    "ls": Command("list versions offered by servers", _ls_arguments, _ls),
    "fetch": Command("download a version, verified, to --output", _fetch_arguments, _fetch),
    "keygen": Command(
        "print a new Ed25519 key pair as key specs (needs the ed25519 extra)", _keygen_arguments, _keygen
    ),
}


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="shardcast", description="Broadcast checkpoints through an HTTP relay tree.", allow_abbrev=False
    )
    parser.add_argument("--version", action="version", version=f"shardcast {__version__}")
    sub = parser.add_subparsers(dest="command", required=True)
    for name, command in COMMANDS.items():
        child = sub.add_parser(name, help=command.help, description=command.help, allow_abbrev=False)
        child.add_argument("--log-level", default="INFO", choices=["DEBUG", "INFO", "WARNING", "ERROR"])
        command.arguments(child)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    logging.basicConfig(
        level=getattr(logging, args.log_level, logging.INFO),
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
    )
    try:
        status = COMMANDS[args.command].run(args)
        sys.stdout.flush()  # a closed pipe fails here, inside the handlers below, not at exit
        return status
    except KeyboardInterrupt:
        print("shardcast: interrupted", file=sys.stderr)
        return 130
    except BrokenPipeError:
        # `shardcast ls | head`: the reader left; say nothing and keep Python from
        # complaining again when it flushes stdout at exit.
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 1
    except (ShardcastError, OSError, ValueError, TypeError) as exc:
        print(f"shardcast {args.command}: error: {type(exc).__name__}: {exc}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    raise SystemExit(main())
