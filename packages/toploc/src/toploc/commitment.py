"""The host-side commitment: the polynomial a proof is, and its value at the verifier's top-k.

Per chunk: the smallest injective modulus m of the selected flat indices, then the unique
polynomial f of degree < k over GF(65497) with f(idx mod m) = bf16 bits of the value.
The C kernels of :mod:`toploc.native` run where they compiled (GIL released), else the
numpy functions of :mod:`toploc.field`; results are identical (tested).

This is the reference every other path is checked against: :mod:`toploc.proofs` uses it
on CPU, and :mod:`toploc.cuda` compares its kernels with it before enabling them.
"""

from __future__ import annotations

import numpy as np

from toploc import native
from toploc.field import evaluate, find_injective_moduli, interpolate


def commit(indices: np.ndarray, values: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """``([C] moduli, [C, k] coefficients)`` committing to ``values`` at flat ``indices``.

    ``indices`` ``[C, k]`` int64; ``values`` ``[C, k]`` uint16 bf16 patterns of finite
    numbers (< 0xFF80 < P, so no aliasing).
    """
    if indices.shape[0] == 0:
        return np.zeros(0, np.int64), np.zeros(indices.shape, np.int64)
    if native.available():
        return native.commit(indices, values.astype(np.uint16))
    moduli = find_injective_moduli(indices)
    return moduli, interpolate(indices % moduli[:, None], values)


def evaluate_at(coeffs: np.ndarray, moduli: np.ndarray, indices: np.ndarray) -> np.ndarray:
    """``[C, k]`` int64: each chunk's committed polynomial ``f_c`` at ``indices mod m_c``."""
    if native.available():
        return native.evaluate(coeffs, moduli, indices)
    return evaluate(coeffs, indices % moduli[:, None])
