"""CUDA kernels: compile check (needs nvcc only) and CPU/GPU equality (needs a device; skipped here)."""

from __future__ import annotations

import ctypes
import shutil

import pytest
import torch

from toploc import ActivationError, build_proofs_bytes, cuda, verify_proofs_bytes

needs_device = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")


@pytest.mark.skipif(shutil.which("nvcc") is None and cuda._nvcc() is None, reason="needs nvcc")
def test_kernels_compile_with_nvcc(tmp_path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TOPLOC_CACHE_DIR", str(tmp_path))
    library = cuda.compile_library("sm_80")
    assert library is not None and library.exists()
    lib = ctypes.CDLL(str(library))  # loads without a GPU: only the CUDA runtime is needed
    assert hasattr(lib, "toploc_cuda_select_commit") and hasattr(lib, "toploc_cuda_select_evaluate")


@needs_device
@pytest.mark.cuda
@pytest.mark.parametrize("levels", [0, 3])
def test_gpu_proofs_equal_cpu_proofs(levels: int) -> None:
    g = torch.Generator().manual_seed(levels)
    acts = torch.randn(200, 5120, generator=g)
    if levels:  # massive ties at the top-k boundary
        acts = torch.randint(-levels, levels + 1, acts.shape, generator=g).float()
    acts = acts.to(torch.bfloat16)
    assert cuda.available(acts.cuda().view(torch.int16).reshape(1, -1), 128)
    cpu = build_proofs_bytes(acts, 32, 128, False)
    assert build_proofs_bytes(acts.cuda(), 32, 128, False) == cpu
    drifted = acts.float() * 1.01
    assert verify_proofs_bytes(drifted.cuda(), cpu, 32, 128, False) == verify_proofs_bytes(
        drifted, cpu, 32, 128, False
    )


@needs_device
@pytest.mark.cuda
def test_gpu_rejects_non_finite() -> None:
    acts = torch.randn(64, 256, device="cuda")
    acts[40, 3] = float("nan")
    with pytest.raises(ActivationError, match="NaN"):
        build_proofs_bytes(acts, 32, 128, True)


@needs_device
@pytest.mark.cuda
def test_gpu_verify_rejects_non_finite() -> None:
    # verify reads the kernel's flags with the comparison's counts (one synchronisation): a NaN
    # must still raise, not judge the chunk.
    acts = torch.randn(64, 256)
    proofs = build_proofs_bytes(acts, 32, 128, True)
    acts[40, 3] = float("nan")
    with pytest.raises(ActivationError, match="NaN"):
        verify_proofs_bytes(acts.to("cuda"), proofs, 32, 128, True)
