"""Arithmetic over GF(P), P = 65497, batched over many proofs at once.

All functions take ``[C, k]`` int64 arrays (C proofs, k points each) and loop in
Python only over the k points, never over the C proofs, so their cost is
O(C·k²) element operations in a handful of numpy calls per point.

The interpolating polynomial through k points with distinct x is unique, so any
correct algorithm yields the same coefficients as the reference's Newton divided
differences (``ndd.cpp``); the golden vectors check that byte for byte.

Inverses come from a precomputed table (``INVERSE_SIGNED``, 2P int64 entries)
indexed by a signed difference plus P, so the k(k-1)/2 extended-Euclid inverses
of the reference become table look-ups.
"""

from __future__ import annotations

import numpy as np
import numpy.typing as npt

#: The field prime of the reference (``MOD_N`` in ``ndd.cpp``); coefficients are < P < 2**16.
P = 65497

I64 = npt.NDArray[np.int64]


def _inverse_table() -> I64:
    """``INVERSE_SIGNED[a + P] = a^-1 mod P`` for a in (-P, P), and 0 at a = 0.

    Built with Fermat's little theorem, a^(P-2), by vectorised square-and-multiply.
    """
    a = np.arange(P, dtype=np.int64)
    result = np.ones(P, dtype=np.int64)
    base = a.copy()
    exponent = P - 2
    while exponent:
        if exponent & 1:
            result = result * base % P
        base = base * base % P
        exponent >>= 1
    result[0] = 0
    signed = np.empty(2 * P, dtype=np.int64)
    signed[P:] = result  # a >= 0
    signed[:P] = result[(np.arange(-P, 0) % P)]  # a < 0: inverse of a mod P
    return signed


INVERSE_SIGNED: I64 = _inverse_table()


def find_injective_moduli(indices: I64, *, start: int = P) -> I64:
    """Per row, the largest m <= ``start`` such that ``indices % m`` are pairwise distinct.

    Same search as the reference C++ ``from_points``: m = 65497, 65496, ... down to 1.
    Args:
        indices: ``[C, k]`` non-negative int64 flat indices.
    Returns:
        ``[C]`` int64 moduli in 1..start.
    Loops over candidate moduli (not over rows), only for rows still colliding (a few
    rows need a second modulus; ``toploc bench``: ``benchmarks/results/toploc_bench.md``).
    Pitfall: indices chosen adversarially can force thousands of candidates (e.g.
    {0..63} ∪ {61465 + 64j}, slow in the reference too); this stays vectorised but
    is still O(candidates · k log k) for that row.
    """
    num_rows, k = indices.shape
    moduli = np.full(num_rows, start, dtype=np.int64)
    pending = np.arange(num_rows)
    m = start
    while pending.size and m >= 1:
        residues = np.sort(indices[pending] % m, axis=1)
        collides = (
            (residues[:, 1:] == residues[:, :-1]).any(axis=1) if k > 1 else np.zeros(len(pending), bool)
        )
        moduli[pending] = m
        pending = pending[collides]
        m -= 1
    if pending.size:  # only possible when k > start: k values cannot be distinct mod m < k
        raise ValueError(f"no injective modulus exists for {k} indices below {start}")
    return moduli


def interpolate(x: I64, y: I64) -> I64:
    """Monomial coefficients (ascending) of the polynomials through ``(x[c, j], y[c, j])``.

    Args:
        x: ``[C, k]`` int64 in [0, P), pairwise distinct within each row.
        y: ``[C, k]`` int64 in [0, P).
    Returns:
        ``[C, k]`` int64 in [0, P): c_0..c_{k-1} with f(x) = Σ c_i x^i (mod P).
    Method: Newton divided differences d_j = f[x_0..x_j] (in place, one table inverse
    per pair), then the Newton form Σ d_j Π_{i<j}(x - x_i) expanded by Horner's rule
    on polynomials. Work buffers are preallocated: numpy temporaries of this size cost
    more than the arithmetic.
    """
    x = np.ascontiguousarray(x, dtype=np.int64)
    dd = np.asarray(y, dtype=np.int64) % P
    num_rows, k = x.shape
    numer = np.empty((num_rows, k), dtype=np.int64)
    inverse = np.empty((num_rows, k), dtype=np.int64)
    for j in range(1, k):
        width = k - j
        diff, inv = numer[:, :width], inverse[:, :width]
        # dd[:, i] <- (dd[:, i] - dd[:, i-1]) / (x[:, i] - x[:, i-j]) for i >= j
        np.subtract(dd[:, j:], dd[:, j - 1 : -1], out=diff)
        diff += P  # in (0, 2P): the product below stays < 2^33
        np.subtract(x[:, j:], x[:, :width], out=inv)
        inv += P  # INVERSE_SIGNED is indexed by a signed difference + P
        inv[...] = INVERSE_SIGNED[inv]
        diff *= inv
        np.remainder(diff, P, out=dd[:, j:])
    # Expand Newton form: f = d_0 + (x - x_0)(d_1 + (x - x_1)(d_2 + ...)).
    negative_x = P - x
    coeffs = np.zeros((num_rows, k), dtype=np.int64)
    scratch = np.zeros((num_rows, k), dtype=np.int64)
    coeffs[:, 0] = dd[:, k - 1]
    for degree, j in enumerate(range(k - 2, -1, -1)):
        # new[i] = old[i-1] + (P - x_j)·old[i] (+ d_j at i = 0); only degree + 2 terms are non-zero
        width = degree + 2
        np.multiply(coeffs[:, :width], negative_x[:, j : j + 1], out=scratch[:, :width])
        scratch[:, 1:width] += coeffs[:, : width - 1]
        scratch[:, 0] += dd[:, j]
        np.remainder(scratch[:, :width], P, out=scratch[:, :width])
        coeffs, scratch = scratch, coeffs
    return coeffs


def evaluate(coeffs: I64, x: I64) -> I64:
    """Evaluate ``f_c`` at ``x[c, :]`` by Horner's rule mod P.

    Args:
        coeffs: ``[C, k]`` int64 in [0, P), ascending powers.
        x: ``[C, n]`` int64 in [0, P).
    Returns:
        ``[C, n]`` int64 in [0, P).
    """
    coeffs = np.asarray(coeffs, dtype=np.int64)
    x = np.asarray(x, dtype=np.int64)
    result = np.zeros(x.shape, dtype=np.int64)
    for i in range(coeffs.shape[1] - 1, -1, -1):
        np.multiply(result, x, out=result)
        result += coeffs[:, i : i + 1]
        np.remainder(result, P, out=result)
    return result
