"""Fixtures shared by every package's tests (pytest loads this rootdir conftest for all of them)."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent / "tests" / "support"))


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
