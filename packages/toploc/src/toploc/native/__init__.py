"""Optional C kernels for the CPU path, compiled on first use and loaded with ctypes.

``toploc_cpu.c`` is plain C99 + pthreads: no torch or Python headers, so nothing is bound
to a torch ABI and the package imports with any torch. On first use it is compiled with
the system C compiler (``$CC``, else ``cc``) into ``$TOPLOC_CACHE_DIR`` (default
``~/.cache/toploc``), keyed by a hash of the source and compiler flags. Where no compiler
exists, or ``TOPLOC_NATIVE=0``, ``available()`` is False and callers use the numpy/torch
path, which gives identical results (tested).

ctypes releases the GIL for the duration of every call. Work is split over
``TOPLOC_THREADS`` pthreads (default: ``min(4, os.cpu_count())``), created per call;
no global thread settings (torch, OpenMP) are read or changed.
"""

from __future__ import annotations

import ctypes
import os
import subprocess
import threading
from pathlib import Path

import numpy as np

from toploc._build import build_cached
from toploc.errors import ActivationError

_SOURCES = [Path(__file__).with_name("toploc_cpu.c"), Path(__file__).with_name("toploc_sampling.c")]
# -ffp-contract=off: no fused multiply-add, so the draw's floating point rounds op for op as in torch.
_FLAGS = ["-O3", "-std=c99", "-ffp-contract=off", "-shared", "-fPIC", "-pthread"]
_LOCK = threading.Lock()
_LIB: ctypes.CDLL | None = None
_TRIED = False

_I64P = np.ctypeslib.ndpointer(dtype=np.int64, flags="C_CONTIGUOUS")
_F32P = np.ctypeslib.ndpointer(dtype=np.float32, flags="C_CONTIGUOUS")
_U8P = np.ctypeslib.ndpointer(dtype=np.uint8, flags="C_CONTIGUOUS")
_U16P = np.ctypeslib.ndpointer(dtype=np.uint16, flags="C_CONTIGUOUS")
_ERRORS = {
    1: "activations contain NaN or Inf",
    2: "invalid arguments",
    3: "out of memory",
    4: "no injective modulus",
}


def _threads() -> int:
    return max(1, int(os.environ.get("TOPLOC_THREADS", min(4, os.cpu_count() or 1))))


def _compile() -> ctypes.CDLL | None:
    source = b"".join(path.read_bytes() for path in _SOURCES)
    compiler = os.environ.get("CC", "cc")
    target = build_cached(
        "toploc_cpu",
        source + " ".join([compiler, *_FLAGS]).encode(),
        lambda built: [compiler, *_FLAGS, *map(str, _SOURCES), "-o", str(built), "-lm"],
        timeout=120,
    )
    if target is None:
        return None
    lib = ctypes.CDLL(str(target))
    lib.toploc_select.argtypes = [
        _U16P,
        ctypes.c_int64,
        ctypes.c_int64,
        ctypes.c_int64,
        _I64P,
        _U16P,
        ctypes.c_int,
    ]
    lib.toploc_commit.argtypes = [_I64P, _U16P, ctypes.c_int64, ctypes.c_int64, _I64P, _I64P, ctypes.c_int]
    lib.toploc_evaluate.argtypes = [
        _I64P, _I64P, _I64P, ctypes.c_int64, ctypes.c_int64, ctypes.c_int64, _I64P, ctypes.c_int,
    ]  # fmt: skip
    lib.toploc_gumbel_argmax.argtypes = [
        _F32P, ctypes.c_int64, ctypes.c_int64, ctypes.c_uint64, _I64P, _I64P, ctypes.c_double, ctypes.c_double,
        _I64P, _U8P, ctypes.c_int,
    ]  # fmt: skip
    for function in (lib.toploc_select, lib.toploc_commit, lib.toploc_evaluate, lib.toploc_gumbel_argmax):
        function.restype = ctypes.c_int
    return lib


def library() -> ctypes.CDLL | None:
    """The loaded kernels, or None where they cannot be built or are disabled."""
    global _LIB, _TRIED
    if os.environ.get("TOPLOC_NATIVE", "1") == "0":
        return None
    with _LOCK:
        if not _TRIED:
            _TRIED = True
            try:
                _LIB = _compile()
            except (OSError, subprocess.SubprocessError):
                _LIB = None
    return _LIB


def available() -> bool:
    return library() is not None


def _check(status: int) -> None:
    if status == 1:
        raise ActivationError("activations contain NaN or Inf; TOPLOC commits to finite bf16 values only")
    if status:
        raise ValueError(f"toploc native kernel failed: {_ERRORS.get(status, status)}")


def select(bits: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray]:
    """Native ``select_topk`` on ``[C, n]`` uint16 patterns → (int64 ``[C, k]``, uint16 ``[C, k]``)."""
    lib = library()
    assert lib is not None
    bits = np.ascontiguousarray(bits, dtype=np.uint16)
    chunks, n = bits.shape
    indices = np.empty((chunks, k), dtype=np.int64)
    values = np.empty((chunks, k), dtype=np.uint16)
    _check(lib.toploc_select(bits, chunks, n, k, indices, values, _threads()))
    return indices, values


def commit(indices: np.ndarray, values: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Native modulus search + interpolation: ``([C] moduli, [C, k] coefficients)``."""
    lib = library()
    assert lib is not None
    indices = np.ascontiguousarray(indices, dtype=np.int64)
    chunks, k = indices.shape
    moduli = np.empty(chunks, dtype=np.int64)
    coeffs = np.empty((chunks, k), dtype=np.int64)
    _check(
        lib.toploc_commit(
            indices, np.ascontiguousarray(values, dtype=np.uint16), chunks, k, moduli, coeffs, _threads()
        )
    )
    return moduli, coeffs


def evaluate(coeffs: np.ndarray, moduli: np.ndarray, indices: np.ndarray) -> np.ndarray:
    """Native ``f_c(indices[c, j] mod m_c)`` → ``[C, n]`` int64."""
    lib = library()
    assert lib is not None
    coeffs = np.ascontiguousarray(coeffs, dtype=np.int64)
    indices = np.ascontiguousarray(indices, dtype=np.int64)
    chunks, k = coeffs.shape
    out = np.empty(indices.shape, dtype=np.int64)
    status = lib.toploc_evaluate(
        coeffs,
        np.ascontiguousarray(moduli, dtype=np.int64),
        indices,
        chunks,
        k,
        indices.shape[1],
        out,
        _threads(),
    )
    _check(status)
    return out


def gumbel_argmax(
    logits: np.ndarray, seed: int, sequence_ids: np.ndarray, positions: np.ndarray, temperature: float, margin: float
) -> tuple[np.ndarray, np.ndarray]:
    """Native seeded Gumbel-max draw (``toploc_sampling.c``) on ``[B, V]`` float32 logits.

    Returns (int64 ``[B]`` tokens, bool ``[B]`` ambiguous): rows whose runner-up scores within
    ``margin * (1 + |best|)`` of the best, or with a non-finite logit; the caller redraws those
    with the reference, since only there can the last bit of ``log`` decide the token.
    """
    lib = library()
    assert lib is not None
    logits = np.ascontiguousarray(logits, dtype=np.float32)
    rows, vocab = logits.shape
    tokens = np.empty(rows, dtype=np.int64)
    ambiguous = np.empty(rows, dtype=np.uint8)
    _check(
        lib.toploc_gumbel_argmax(
            logits,
            rows,
            vocab,
            seed & ((1 << 64) - 1),
            np.ascontiguousarray(sequence_ids, dtype=np.int64),
            np.ascontiguousarray(positions, dtype=np.int64),
            float(temperature),
            float(margin),
            tokens,
            ambiguous,
            min(_threads(), max(1, rows)),
        )
    )
    return tokens, ambiguous.astype(bool)
