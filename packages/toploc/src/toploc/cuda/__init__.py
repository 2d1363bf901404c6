"""CUDA kernels (``toploc_cuda.cu``): fused select + commit for provers, select + evaluate for verifiers.

Compiled on first use with ``nvcc`` (``$CUDA_HOME/bin/nvcc`` or on ``PATH``) for the current
device's architecture into ``$TOPLOC_CACHE_DIR`` (default ``~/.cache/toploc``), and loaded
with ctypes: the kernels take raw device pointers and torch's current CUDA stream, so no
compiled code is bound to a torch ABI. ``available()`` is False without a CUDA device, without
nvcc, when compilation fails, or with ``TOPLOC_CUDA=0``; callers then use the torch path
(selection by int64 keys with ``torch.topk`` on the device, interpolation on the host).

Status: the .cu file compiles with nvcc 13 (sm_80/sm_90) in CI-less development, but it has
NOT been run on a GPU yet; the CUDA tests skip without a device.

One thread block per chunk (k <= 1024, chunk size < 2^31; otherwise the torch path runs).
Safety net: after loading, both kernels are run once on random and tie-heavy chunks and
compared with the torch/host path; on any disagreement they are disabled with a
``RuntimeWarning`` and the torch path is used.
"""

from __future__ import annotations

import ctypes
import os
import shutil
import subprocess
import threading
import warnings
from pathlib import Path

import numpy as np
import torch

from toploc._build import build_cached
from toploc.commitment import commit
from toploc.errors import ActivationError
from toploc.field import INVERSE_SIGNED, P
from toploc.selection import select_topk

_SOURCE = Path(__file__).with_name("toploc_cuda.cu")
_LOCK = threading.Lock()
_LIBS: dict[str, ctypes.CDLL | None] = {}
_INVERSE: dict[torch.device, torch.Tensor] = {}
MAX_K = 1024


def _nvcc() -> str | None:
    home = os.environ.get("CUDA_HOME") or os.environ.get("CUDA_PATH")
    if home and (Path(home) / "bin" / "nvcc").exists():
        return str(Path(home) / "bin" / "nvcc")
    return shutil.which("nvcc")


def compile_library(arch: str, nvcc: str | None = None) -> Path | None:
    """Compile the kernels for ``arch`` (e.g. ``"sm_90"``); returns the .so path or None."""
    nvcc = nvcc or _nvcc()
    if nvcc is None:
        return None
    flags = ["-O3", "-shared", "-Xcompiler", "-fPIC", f"-arch={arch}"]
    key = _SOURCE.read_bytes() + " ".join(flags).encode()
    return build_cached(
        f"toploc_cuda_{arch}", key, lambda built: [nvcc, *flags, str(_SOURCE), "-o", str(built)], timeout=600
    )


def _library(device: torch.device) -> ctypes.CDLL | None:
    major, minor = torch.cuda.get_device_capability(device)
    arch = f"sm_{major}{minor}"
    with _LOCK:
        if arch not in _LIBS:
            try:
                path = compile_library(arch)
                lib = ctypes.CDLL(str(path)) if path else None
            except (OSError, subprocess.SubprocessError):
                lib = None
            if lib is not None:
                # Both kernels take the bits pointer, three int64 sizes (chunks, n, k), then seven pointers.
                for function in (lib.toploc_cuda_select_commit, lib.toploc_cuda_select_evaluate):
                    function.argtypes = [ctypes.c_void_p, *[ctypes.c_int64] * 3, *[ctypes.c_void_p] * 7]
                    function.restype = ctypes.c_int
            if lib is not None and not _passes_self_test(lib, device):
                warnings.warn(
                    "toploc CUDA kernels disagree with the reference path on this device; using the torch path",
                    RuntimeWarning,
                    stacklevel=3,
                )
                lib = None
            _LIBS[arch] = lib
    return _LIBS[arch]


def _passes_self_test(lib: ctypes.CDLL, device: torch.device) -> bool:
    try:
        return _self_test(lib, device)
    except (RuntimeError, ValueError):  # a CUDA error is a failed self-test, not a crash
        return False


def _self_test(lib: ctypes.CDLL, device: torch.device) -> bool:
    """Run both kernels once against the torch/host path (random and tie-heavy chunks)."""
    g = torch.Generator().manual_seed(0)
    chunks = torch.cat(
        [torch.randn(2, 4096, generator=g), torch.randint(-2, 3, (2, 4096), generator=g).float()]
    )
    bits = chunks.to(torch.bfloat16).view(torch.int16)
    for k in (128, 5):
        idx, val = select_topk(bits, k, method="keys")
        moduli, coeffs = commit(idx.numpy(), val.numpy().view(np.uint16).astype(np.int64))
        g_idx, g_val, g_mod, g_coeffs, flags = _launch_commit(lib, bits.to(device), k)
        _, _, committed, eval_flags = _launch_evaluate(
            lib, bits.to(device), k, torch.from_numpy(moduli), torch.from_numpy(coeffs)
        )
        if not (
            torch.equal(g_idx.cpu(), idx)
            and torch.equal(g_val.cpu(), val)
            and np.array_equal(g_mod.cpu().numpy(), moduli)
            and np.array_equal(g_coeffs.cpu().numpy(), coeffs)
            and np.array_equal(committed.cpu().numpy(), val.numpy().view(np.uint16).astype(np.int64))
            and not bool(flags.any())
            and not bool(eval_flags.any())
        ):
            return False
    return True


def available(bits: torch.Tensor | None = None, k: int = 128) -> bool:
    """Whether the kernels can run for ``bits`` ``[C, n]`` (a CUDA tensor) and ``k``."""
    if os.environ.get("TOPLOC_CUDA", "1") == "0" or not torch.cuda.is_available():
        return False
    if bits is None:
        return _library(torch.device("cuda", torch.cuda.current_device())) is not None
    if bits.device.type != "cuda" or not 1 <= k <= min(MAX_K, bits.shape[1]) or bits.shape[1] >= 2**31:
        return False
    return _library(bits.device) is not None


def _inverse(device: torch.device) -> torch.Tensor:
    if device not in _INVERSE:
        table = INVERSE_SIGNED[P:].astype(np.int32)  # a^-1 mod P for a in [0, P)
        _INVERSE[device] = torch.from_numpy(table).to(device)
    return _INVERSE[device]


def _stream(device: torch.device) -> int:
    return int(torch.cuda.current_stream(device).cuda_stream)


def select_commit(
    bits: torch.Tensor, k: int
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """Prover kernel on ``[C, n]`` int16 CUDA bits → device tensors
    ``(indices [C, k] int64, values [C, k] int16, moduli [C] int64, coeffs [C, k] int64, flags [C] int32)``.

    Asynchronous on the current stream; ``flags`` is 1 for NaN/Inf, 2 for no modulus (check with ``raise_on_flags``).
    """
    lib = _library(bits.device)
    assert lib is not None
    return _launch_commit(lib, bits, k)


def _launch_commit(
    lib: ctypes.CDLL, bits: torch.Tensor, k: int
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    bits = bits.contiguous()
    chunks, n = bits.shape
    device = bits.device
    idx = torch.empty((chunks, k), dtype=torch.int64, device=device)
    val = torch.empty((chunks, k), dtype=torch.int16, device=device)
    mod = torch.empty(chunks, dtype=torch.int64, device=device)
    coeffs = torch.empty((chunks, k), dtype=torch.int64, device=device)
    flags = torch.zeros(chunks, dtype=torch.int32, device=device)
    status = lib.toploc_cuda_select_commit(
        bits.data_ptr(), chunks, n, k, _inverse(bits.device).data_ptr(), idx.data_ptr(), val.data_ptr(),
        mod.data_ptr(), coeffs.data_ptr(), flags.data_ptr(), _stream(bits.device),
    )  # fmt: skip
    if status:
        raise RuntimeError(f"toploc CUDA kernel launch failed (status {status})")
    return idx, val, mod, coeffs, flags


def select_evaluate(
    bits: torch.Tensor, k: int, moduli: torch.Tensor, coeffs: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """Verifier kernel → device tensors ``(indices, values, committed [C, k] int64, flags [C])``."""
    lib = _library(bits.device)
    assert lib is not None
    return _launch_evaluate(lib, bits, k, moduli, coeffs)


def _launch_evaluate(
    lib: ctypes.CDLL, bits: torch.Tensor, k: int, moduli: torch.Tensor, coeffs: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    bits = bits.contiguous()
    chunks, n = bits.shape
    device = bits.device
    moduli = moduli.to(bits.device, torch.int64).contiguous()
    coeffs = coeffs.to(bits.device, torch.int64).contiguous()
    idx = torch.empty((chunks, k), dtype=torch.int64, device=device)
    val = torch.empty((chunks, k), dtype=torch.int16, device=device)
    committed = torch.empty((chunks, k), dtype=torch.int64, device=device)
    flags = torch.zeros(chunks, dtype=torch.int32, device=device)
    status = lib.toploc_cuda_select_evaluate(
        bits.data_ptr(), chunks, n, k, moduli.data_ptr(), coeffs.data_ptr(), idx.data_ptr(), val.data_ptr(),
        committed.data_ptr(), flags.data_ptr(), _stream(bits.device),
    )  # fmt: skip
    if status:
        raise RuntimeError(f"toploc CUDA kernel launch failed (status {status})")
    return idx, val, committed, flags


def raise_on_flags(flags: torch.Tensor) -> None:
    """Host check of kernel flags (synchronises): ``ActivationError`` for NaN/Inf."""
    check_flags(flags.cpu())


def check_flags(values: torch.Tensor) -> None:
    """``raise_on_flags`` for flags already on the host."""
    if bool((values == 1).any()):
        raise ActivationError("activations contain NaN or Inf; TOPLOC commits to finite bf16 values only")
    if bool((values != 0).any()):
        raise ValueError("toploc CUDA kernel found no injective modulus")
