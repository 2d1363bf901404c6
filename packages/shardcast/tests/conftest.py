"""Fixtures for shardcast tests: random files, in-process origins/relays on loopback ports."""

from __future__ import annotations

import os
import random
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, TypeVar

import pytest

from shardcast import Origin, Relay

sys.path.insert(0, str(Path(__file__).parent))


def random_bytes(size: int, seed: int = 0) -> bytes:
    return random.Random(seed).randbytes(size)


def write_random(path: Path, size: int, seed: int = 0) -> Path:
    path.write_bytes(random_bytes(size, seed))
    return path


def wait_until(predicate: Callable[[], object], timeout: float = 30.0, what: str = "condition") -> None:
    """Poll ``predicate`` until truthy; fail the test (not hang) after ``timeout`` seconds."""
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        if predicate():
            return
        time.sleep(0.02)
    raise AssertionError(f"timed out after {timeout}s waiting for {what}")


Server = TypeVar("Server", Origin, Relay)


def _started(build: Callable[..., Server]) -> Iterator[Callable[..., Server]]:
    """Yield a factory that starts what ``build`` makes; stop every one it started afterwards."""
    started: list[Server] = []

    def make(*args: Any, **kwargs: Any) -> Server:
        server = build(*args, **kwargs).start()
        started.append(server)
        return server

    yield make
    for server in started:
        server.stop()


@pytest.fixture
def origin_factory(tmp_path: Path) -> Iterator[Callable[..., Origin]]:
    def build(name: str = "origin", **kwargs: Any) -> Origin:
        kwargs.setdefault("port", 0)
        kwargs.setdefault("shard_size", 64 * 1024)
        return Origin(tmp_path / name, **kwargs)

    yield from _started(build)


@pytest.fixture
def relay_factory(tmp_path: Path) -> Iterator[Callable[..., Relay]]:
    def build(upstreams: list[str], name: str, **kwargs: Any) -> Relay:
        kwargs.setdefault("port", 0)
        kwargs.setdefault("poll_interval_s", 0.1)
        return Relay(upstreams, tmp_path / name, **kwargs)

    yield from _started(build)


@pytest.fixture
def payload(tmp_path: Path) -> Path:
    """A 1 MB + 123 B random file (16 shards of 64 KiB, the last one short)."""
    return write_random(tmp_path / "model.safetensors", (1 << 20) + 123, seed=1)


def files_equal(a: os.PathLike[str] | str, b: os.PathLike[str] | str) -> bool:
    return Path(a).read_bytes() == Path(b).read_bytes()
