"""Shared fixtures for the verifiers tests."""

from __future__ import annotations

import json
import os
import socket
from collections.abc import Iterator
from pathlib import Path

import pytest

# Public math-equivalence cases (Math-Verify's test suite, Apache-2.0; provenance per row in "source"),
# kept in the repository so the test never depends on a file outside it.
PUBLIC_CASES = Path(__file__).parent / "data" / "math_equiv_public.jsonl"


def load_public_cases() -> list[dict]:
    return [json.loads(line) for line in PUBLIC_CASES.read_text().splitlines() if line.strip()]


@pytest.fixture(scope="session")
def public_cases() -> list[dict]:
    cases = load_public_cases()
    assert cases, f"{PUBLIC_CASES} is empty"
    return cases


@pytest.fixture(scope="session")
def warm_pool():
    """The default math pool, started once (worker boot is not part of any timeout)."""
    from verifiers.math import default_pool

    pool = default_pool()
    pool.warm()
    return pool


def _processes_tagged(tag: str) -> list[str]:
    found = []
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            if tag.encode() in Path(f"/proc/{pid}/cmdline").read_bytes():
                found.append(pid)
        except OSError:
            pass  # exited meanwhile, or not ours to read
    return found


@pytest.fixture
def processes_tagged():
    """``find(tag) -> [pid, ...]``: live processes whose command line contains ``tag``."""
    return _processes_tagged


@pytest.fixture
def loopback_listener() -> Iterator[socket.socket]:
    """A TCP socket listening on the host's 127.0.0.1 (any free port), ``accept`` timing out after 0.5 s.

    The network-isolation tests point a sandboxed program at it and then check that nothing
    arrived: ``accept()`` must raise ``TimeoutError``.
    """
    server = socket.socket()
    try:
        server.bind(("127.0.0.1", 0))
        server.listen(1)
        server.settimeout(0.5)
        yield server
    finally:
        server.close()
