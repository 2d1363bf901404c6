"""The sampling noise's documented formula in Python integers, for the oracle tests.

Shared by ``test_sampling.py`` (the torch path) and ``test_native_sampling.py`` (the C path):
it uses no int64 wrapping tricks and no code of the package, so it checks both independently.
"""

from __future__ import annotations

M64 = (1 << 64) - 1
GAMMA = 0x9E3779B97F4A7C15


def mix(z: int) -> int:
    """SplitMix64's finaliser."""
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & M64
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & M64
    return z ^ (z >> 31)


def position_key(seed: int, seq: int, pos: int) -> int:
    """The per-(seed, sequence, position) key that every vocabulary entry's draw hashes from."""
    return mix((mix((mix((seed + GAMMA) & M64) + seq * GAMMA) & M64) + pos * GAMMA) & M64)


def uniform_at(key: int, v: int) -> float:
    """u in (0, 1) for vocabulary entry ``v`` under ``key``: the top 53 bits, centred."""
    return ((mix((key + (v + 1) * GAMMA) & M64) >> 11) + 0.5) * 2.0**-53
