"""Fixtures shared by every package's tests (pytest loads this rootdir conftest for all of them)."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent / "tests" / "support"))


@pytest.fixture(scope="session", autouse=True)
def _noise_profile_cache(tmp_path_factory):
    """Honest-noise profiles measured by tests go to a temporary folder, never to the user's cache
    (prime_rl.validator.noise_cache; child processes inherit the variable)."""
    import os

    previous = os.environ.get("PRIME_RL_NOISE_CACHE")
    os.environ["PRIME_RL_NOISE_CACHE"] = str(tmp_path_factory.mktemp("noise-profiles"))
    yield
    if previous is None:
        os.environ.pop("PRIME_RL_NOISE_CACHE", None)
    else:
        os.environ["PRIME_RL_NOISE_CACHE"] = previous


@pytest.fixture(scope="session")
def tiny_tokenizer():
    """Character-level tokenizer made in code (see tests/support/tiny_lm.py)."""
    from tiny_lm import make_tiny_tokenizer

    return make_tiny_tokenizer()


@pytest.fixture(scope="session")
def tiny_lm():
    """A 2-layer random-weight Llama (hidden 64) in fp32, eval mode. Do not mutate it."""
    from tiny_lm import make_tiny_lm

    return make_tiny_lm()


@pytest.fixture(scope="session")
def tiny_lm_dir(tmp_path_factory):
    """A from_pretrained-loadable directory holding the tiny model and its tokenizer."""
    from tiny_lm import save_tiny_lm

    return save_tiny_lm(tmp_path_factory.mktemp("tiny_lm"))
