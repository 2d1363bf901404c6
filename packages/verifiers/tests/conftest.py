"""Shared fixtures for the verifiers tests."""

from __future__ import annotations

import json
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
