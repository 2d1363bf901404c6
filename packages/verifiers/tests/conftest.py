"""Shared fixtures for the verifiers tests."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

PUBLIC_CASES = Path("/work/shared/bench/math_equiv_public.jsonl")


def load_public_cases() -> list[dict]:
    if not PUBLIC_CASES.exists():
        return []
    return [json.loads(line) for line in PUBLIC_CASES.read_text().splitlines() if line.strip()]


@pytest.fixture(scope="session")
def public_cases() -> list[dict]:
    cases = load_public_cases()
    if not cases:
        pytest.skip(f"{PUBLIC_CASES} not present")
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
