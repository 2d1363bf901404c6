"""Build and verify proofs: the reference 0.1.x API, vectorised over all chunks.

::

    build_proofs(activations, decode_batching_size=32, topk=128, skip_prefill=False) -> list[ProofPoly]
    verify_proofs(activations, proofs, decode_batching_size=32, topk=128, skip_prefill=False)
        -> list[VerificationResult]

plus ``*_bytes`` and ``*_base64`` variants. Per chunk (see ``chunking``): select the
top-k by (|value| desc, index asc), find the injective modulus m, interpolate
f(idx mod m) = bf16 bits over GF(65497). Verification re-selects the verifier's
top-k, evaluates f there and compares sign, exponent and mantissa.

All chunks of equal size are processed in one batched call; there is no per-chunk
Python loop. On CPU, ``selection`` and ``commitment`` run the C kernels of
``toploc.native`` where they compiled (GIL released), else numpy/torch; results are
identical. On CUDA the fused kernels of ``toploc.cuda`` run where nvcc compiled them,
else selection runs on the device (``torch.topk`` on int64 keys) and the rest on the host.
Nothing here changes global state (thread counts, OpenMP).
"""

from __future__ import annotations

import base64

import numpy as np
import torch

from toploc import cuda, native
from toploc.chunking import Activations, ChunkGroup, num_chunks, split_chunks
from toploc.commitment import commit, evaluate_at
from toploc.errors import ProofFormatError
from toploc.results import VerificationResult
from toploc.selection import check_finite, select_topk
from toploc.wire import ProofPoly, decode_proofs, encode_proofs, strict_b64decode

DEFAULT_DECODE_BATCHING_SIZE = 32
DEFAULT_TOPK = 128


def _select_group(group: ChunkGroup, topk: int) -> tuple[np.ndarray, np.ndarray]:
    """Top-k of a group's chunks: ``(indices [C, k] int64, uint16 patterns [C, k] int64)`` on the host."""
    if not (group.bits.device.type == "cpu" and native.available()):
        check_finite(group.bits & 0x7FFF, "activations")  # the native kernel checks as it selects
    idx, val = select_topk(group.bits, topk)
    return idx.cpu().numpy(), val.cpu().numpy().view(np.uint16).astype(np.int64)


def _commit_groups(groups: list[ChunkGroup], topk: int) -> tuple[np.ndarray, np.ndarray]:
    """``([C] moduli, [C, k] coefficients)`` for every chunk, in proof order."""
    moduli, coeffs = [np.zeros(0, np.int64)], [np.zeros((0, topk), np.int64)]
    for group in groups:  # at most 3 groups: prefill, full decode chunks, short tail
        if cuda.available(group.bits, topk):
            *_, group_moduli, group_coeffs, flags = cuda.select_commit(group.bits, topk)
            cuda.raise_on_flags(flags)
            moduli.append(group_moduli.cpu().numpy())
            coeffs.append(group_coeffs.cpu().numpy())
        else:
            group_moduli_np, group_coeffs_np = commit(*_select_group(group, topk))
            moduli.append(group_moduli_np)
            coeffs.append(group_coeffs_np)
    return np.concatenate(moduli), np.concatenate(coeffs)


def _evaluate_groups(
    groups: list[ChunkGroup], moduli: np.ndarray, coeffs: np.ndarray, topk: int
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]:
    """``(committed, values, flags)``: the first two ``[C, k]`` 16-bit patterns in an integer dtype, f_c at
    the verifier's top-k and its own patterns, on the activations' device where the CUDA kernel ran (no
    copy back); ``flags`` the kernel's flags, not yet checked (``None`` where no kernel ran). The caller
    reads them with the comparison's counts: one synchronisation instead of two."""
    committed, values, flags = [], [], []
    first = 0
    for group in groups:
        last = first + group.bits.shape[0]
        group_moduli, group_coeffs = moduli[first:last], coeffs[first:last]
        if cuda.available(group.bits, topk):
            _, val, evaluated, group_flags = cuda.select_evaluate(
                group.bits, topk, torch.from_numpy(group_moduli), torch.from_numpy(group_coeffs)
            )
            flags.append(group_flags)
            committed.append(evaluated.long())
            values.append(val.long() & 0xFFFF)  # int16 bits -> the unsigned pattern
        else:
            idx, val_np = _select_group(group, topk)
            committed.append(torch.from_numpy(evaluate_at(group_coeffs, group_moduli, idx)))
            values.append(torch.from_numpy(val_np))
        first = last
    device = committed[0].device
    return (
        torch.cat([c.to(device) for c in committed]),
        torch.cat([v.to(device) for v in values]),
        torch.cat(flags) if flags else None,
    )


def build_proofs_bytes(
    activations: Activations,
    decode_batching_size: int = DEFAULT_DECODE_BATCHING_SIZE,
    topk: int = DEFAULT_TOPK,
    skip_prefill: bool = False,
) -> list[bytes]:
    """One ``2 + 2·topk``-byte proof per chunk (258 B for topk = 128).

    Raises:
        ActivationError: non-float dtype, NaN/Inf, wrong rank, ragged list, or a chunk
            with fewer than ``topk`` elements. Never returns null proofs (defect 5).
    """
    groups = split_chunks(activations, decode_batching_size, skip_prefill)
    return encode_proofs(*_commit_groups(groups, topk))


def build_proofs(
    activations: Activations,
    decode_batching_size: int = DEFAULT_DECODE_BATCHING_SIZE,
    topk: int = DEFAULT_TOPK,
    skip_prefill: bool = False,
) -> list[ProofPoly]:
    """Like ``build_proofs_bytes`` but returns ``ProofPoly`` objects."""
    groups = split_chunks(activations, decode_batching_size, skip_prefill)
    moduli, coeffs = _commit_groups(groups, topk)
    return [ProofPoly(int(m), tuple(int(c) for c in row)) for m, row in zip(moduli, coeffs, strict=True)]


def build_proofs_base64(
    activations: Activations,
    decode_batching_size: int = DEFAULT_DECODE_BATCHING_SIZE,
    topk: int = DEFAULT_TOPK,
    skip_prefill: bool = False,
) -> list[str]:
    """Like ``build_proofs_bytes``, each proof as standard padded base64 (344 chars for k = 128)."""
    proofs = build_proofs_bytes(activations, decode_batching_size, topk, skip_prefill)
    return [base64.b64encode(p).decode("ascii") for p in proofs]


def compare(committed: np.ndarray | torch.Tensor, values: np.ndarray | torch.Tensor) -> list[VerificationResult]:
    """Compare committed patterns ``u`` with the verifier's patterns ``v``, both ``[C, k]`` integers in 0..65535.

    exponent = (p & 0x7F80) >> 7, mantissa = p & 0x7F, sign = p >> 15 (16-bit p).
    Mantissa errors and sign mismatches count only where exponents match; the median
    is the upper median (element ⌊n/2⌋ of the sorted errors). Tensors are compared on their
    own device (CUDA after the fused kernel) and only five ``[C]`` counts come back to the host.
    """
    counts = _compare_counts(committed, values)
    return _results(counts.cpu().tolist(), int(values.shape[1]))


def _compare_counts(committed: np.ndarray | torch.Tensor, values: np.ndarray | torch.Tensor) -> torch.Tensor:
    """``[5, C]`` int32 on the patterns' device: exponent matches, mantissa error sums, upper medians,
    sign mismatches, index agreement (see ``compare``)."""
    u = torch.as_tensor(committed).to(torch.int32)
    v = torch.as_tensor(values).to(device=u.device, dtype=torch.int32)
    k = v.shape[1]
    exp_u, exp_v = (u >> 7) & 0xFF, (v >> 7) & 0xFF
    same_sign = ((u ^ v) & 0x8000) == 0
    matched = exp_u == exp_v
    # Errors are 0..127 where exponents match; 128 marks the other positions. The upper median
    # (element n//2 of the sorted errors) is the smallest e whose cumulative count exceeds n//2.
    mant_err = torch.where(matched, ((u & 0x7F) - (v & 0x7F)).abs(), 128)
    n_matched = matched.sum(dim=1, dtype=torch.int32)
    sums = mant_err.sum(dim=1, dtype=torch.int32) - 128 * (k - n_matched)
    histogram = torch.zeros((u.shape[0], 129), dtype=torch.int32, device=u.device)
    histogram.scatter_add_(1, mant_err.long(), torch.ones_like(mant_err))
    median = (histogram.cumsum(dim=1, dtype=torch.int32) <= (n_matched // 2).unsqueeze(1)).sum(dim=1, dtype=torch.int32)
    sign_mismatches = (matched & ~same_sign).sum(dim=1, dtype=torch.int32)
    agreement = (same_sign & ((exp_u - exp_v).abs() <= 1)).sum(dim=1, dtype=torch.int32)
    return torch.stack([n_matched, sums, median, sign_mismatches, agreement])


_new = object.__new__
_set = object.__setattr__


def _results(counts: list[list[int]], k: int) -> list[VerificationResult]:
    """One ``VerificationResult`` per column of the five count rows.

    Built without the frozen dataclass's ``__init__`` (six ``object.__setattr__`` calls each): one
    ``__dict__`` per result, a fraction of the time, and this was the largest part of verify's host
    work (``benchmarks/results/toploc_verify_host.md``). Equality, hashing and immutability stay the dataclass's own (``test_compare.py``).
    """
    inf = float("inf")
    out = []
    for n, total, middle, signs, agree in zip(*counts, strict=True):
        result = _new(VerificationResult)
        _set(result, "__dict__", {
            "exp_mismatches": k - n,
            "mant_err_mean": total / n if n else inf,
            "mant_err_median": float(middle) if n else inf,
            "sign_mismatches": signs,
            "index_agreement": agree,
            "topk": k,
        })  # fmt: skip
        out.append(result)
    return out


def _verify_parsed(
    activations: Activations,
    moduli: np.ndarray,
    coeffs: np.ndarray,
    decode_batching_size: int,
    topk: int,
    skip_prefill: bool,
) -> list[VerificationResult]:
    groups = split_chunks(activations, decode_batching_size, skip_prefill)
    expected = num_chunks(groups)
    if expected != len(moduli):
        raise ProofFormatError(
            f"got {len(moduli)} proofs for activations that make {expected} chunks "
            f"(decode_batching_size={decode_batching_size}, skip_prefill={skip_prefill})"
        )
    if expected == 0:
        return []
    committed, values, flags = _evaluate_groups(groups, moduli, coeffs, topk)
    counts = _compare_counts(committed, values)
    if flags is None:
        return _results(counts.cpu().tolist(), topk)
    # The kernel's flags travel with the counts: the host waits for the device once.
    host = torch.cat([counts.flatten(), flags.to(torch.int32)]).cpu()
    cuda.check_flags(host[counts.numel() :])
    return _results(host[: counts.numel()].view(5, -1).tolist(), topk)


def verify_proofs_bytes(
    activations: Activations,
    proofs: list[bytes],
    decode_batching_size: int = DEFAULT_DECODE_BATCHING_SIZE,
    topk: int = DEFAULT_TOPK,
    skip_prefill: bool = False,
) -> list[VerificationResult]:
    """One ``VerificationResult`` per proof; judge them with ``Thresholds().check``.

    Raises:
        ProofFormatError: a malformed proof, or a proof count different from the
            number of chunks the activations make.
        ActivationError: as for ``build_proofs_bytes``.
    """
    if not isinstance(proofs, list | tuple):
        raise ProofFormatError(f"proofs must be a list of bytes, got {type(proofs).__name__}")
    moduli, coeffs = decode_proofs(list(proofs), topk=topk)
    return _verify_parsed(activations, moduli, coeffs, decode_batching_size, topk, skip_prefill)


def verify_proofs(
    activations: Activations,
    proofs: list[ProofPoly],
    decode_batching_size: int = DEFAULT_DECODE_BATCHING_SIZE,
    topk: int = DEFAULT_TOPK,
    skip_prefill: bool = False,
) -> list[VerificationResult]:
    """Like ``verify_proofs_bytes`` for ``ProofPoly`` objects (each must have ``topk`` coefficients)."""
    for position, proof in enumerate(proofs):
        if not isinstance(proof, ProofPoly) or len(proof.coeffs) != topk:
            raise ProofFormatError(f"proof {position} is not a ProofPoly with {topk} coefficients")
    moduli = np.array([p.modulus for p in proofs], dtype=np.int64)
    coeffs = np.array([p.coeffs for p in proofs], dtype=np.int64).reshape(len(proofs), topk)
    return _verify_parsed(activations, moduli, coeffs, decode_batching_size, topk, skip_prefill)


def verify_proofs_base64(
    activations: Activations,
    proofs: list[str],
    decode_batching_size: int = DEFAULT_DECODE_BATCHING_SIZE,
    topk: int = DEFAULT_TOPK,
    skip_prefill: bool = False,
) -> list[VerificationResult]:
    """Like ``verify_proofs_bytes`` for canonical padded base64 strings."""
    if not isinstance(proofs, list | tuple):
        raise ProofFormatError(f"proofs must be a list of base64 strings, got {type(proofs).__name__}")
    raw = [strict_b64decode(p) for p in proofs]
    return verify_proofs_bytes(activations, raw, decode_batching_size, topk, skip_prefill)
