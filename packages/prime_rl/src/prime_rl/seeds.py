"""Keyless seed rules shared by the sampler and the wire: the bound on seeds, and the seed after an
announced in-flight switch (:func:`reseeded`: the one reseed-at-switch rule; both backends, the
episode loop, the span plan of ``api/spans.py`` and the red team apply it).

Its own module because both sides need it and neither may import the other: the inference engines
(which apply it mid-decode) and ``api`` (``api.assignment`` re-exports it; ``api.segments`` chains
it through an episode's turn seeds). Pure ``hashlib``, no torch.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable

__all__ = ["MAX_SEED", "reseeded", "span_seed"]

MAX_SEED = 2**63 - 1
"""Sampling seeds are in [0, 2**63 - 1] so they fit a signed int64 parquet column and torch seeds."""


def span_seed(seed: int, nonce: int) -> int:
    """The sampler seed of a sample's tokens after an announced in-flight switch (``docs/inflight.md``).

    ``seed`` is the sample's lease seed, ``nonce`` the orchestrator's answer to the switch
    announcement (a MAC the worker cannot know before it has fixed the switch chunk). Public and
    keyless: SHA-256 of ``"prime-rl/span/<seed>/<nonce>"``, first 8 bytes big-endian, ``& (2**63 - 1)``.

    Raises:
        ValueError: a negative or non-int seed or nonce.
    """
    for name, value in (("seed", seed), ("nonce", nonce)):
        if isinstance(value, bool) or not isinstance(value, int) or value < 0:
            raise ValueError(f"{name} must be a non-negative int, got {value!r}")
    digest = hashlib.sha256(f"prime-rl/span/{seed}/{nonce}".encode()).digest()
    return int.from_bytes(digest[:8], "big") & MAX_SEED


def reseeded(seed: int, nonces: Iterable[int]) -> int:
    """The sampler seed after the announced switches whose nonces are ``nonces`` (oldest first):
    ``seed`` chained through :func:`span_seed` once per switch; ``seed`` itself when there is none.
    A token's seed is its run's seed (the sample's, or an episode turn's ``turn_seed``) reseeded by
    every switch at or before it."""
    for nonce in nonces:
        seed = span_seed(seed, nonce)
    return seed
