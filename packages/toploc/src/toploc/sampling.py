"""Verifiable sampling: a seeded Gumbel-max sampler and its checker.

TOPLOC proofs bind hidden states to (model, prompt, tokens) but not to *sampling*:
anyone with the weights can "prove" a made-up completion with one prefill (reference
defect 16). Here the worker samples with noise that the validator can recompute:

    token_t = argmax_v ( logits[t, v] / T + g(seed, sequence_id, position_t, v) )

with Gumbel noise g = -log(-log u) and u in (0, 1) from a counter-based hash of
(seed, sequence, position, vocabulary index): splitmix64's finaliser on int64 tensor
ops (wrapping multiply, logical shifts), so u is bit-identical on every device and
needs no generator state. T = 0 means greedy (argmax of the logits; no noise).

``check_sampling`` recomputes the scores from the validator's logits and measures, per
position, the margin (in logit units) by which the claimed token falls short of the
best-scoring token: 0 when the claim is what the sampler draws. A margin above
``tolerance`` is a mismatch. Honest recomputation differs only by numeric drift of the
logits (bf16 logits of magnitude 16-32 have a spacing of 0.125), hence the tolerance.
Speed: on CPU, ``sample_tokens`` draws with a fused C kernel (``native/toploc_sampling.c``:
one pass per row, integer hashing, and the two logs only for the few entries whose integer
upper bound of the noise can reach the best score); its tokens equal the torch reference
(``_best_and_claimed``, also what ``check_sampling`` uses) bit for bit, because rows where the
last bit of ``log`` could matter are redrawn by the reference. Across devices (CPU vs CUDA log)
the noise may differ in the last bit of a float64; a token can only differ at a near-tie
within ~1e-14 logits, far inside ``check_sampling``'s tolerance.
Pitfall: a large tolerance lets a cheater substitute near-tied tokens; the margin of a
random substitute is usually several logits at T = 1, but grows weaker as T grows.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

_MASK64 = (1 << 64) - 1


def _signed(value: int) -> int:
    value &= _MASK64
    return value - (1 << 64) if value >= 1 << 63 else value


_GAMMA = _signed(0x9E3779B97F4A7C15)
_MIX1 = _signed(0xBF58476D1CE4E5B9)
_MIX2 = _signed(0x94D049BB133111EB)


def _shift_right(z: torch.Tensor, bits: int) -> torch.Tensor:
    """Logical (unsigned) right shift of int64 bit patterns."""
    return (z >> bits) & ((1 << (64 - bits)) - 1)


def _mix(z: torch.Tensor) -> torch.Tensor:
    """splitmix64 finaliser: a bijection of 64-bit patterns with full avalanche."""
    z = (z ^ _shift_right(z, 30)) * _MIX1
    z = (z ^ _shift_right(z, 27)) * _MIX2
    return z ^ _shift_right(z, 31)


def uniform_noise(
    seed: int,
    sequence_ids: torch.Tensor,
    positions: torch.Tensor,
    vocab_size: int,
    device: torch.device | None = None,
) -> torch.Tensor:
    """u[b, v] in (0, 1), float64, a pure function of (seed, sequence_ids[b], positions[b], v).

    u = ((h >> 11) + 0.5) / 2^53 with h = mix(mix(mix(mix(seed) + seq) + pos) + (v + 1)·γ),
    γ = 0x9E3779B97F4A7C15; every + and · wraps modulo 2^64.
    """
    device = device if device is not None else sequence_ids.device
    seq = torch.as_tensor(sequence_ids, dtype=torch.int64, device=device).reshape(-1, 1)
    pos = torch.as_tensor(positions, dtype=torch.int64, device=device).reshape(-1, 1)
    base = _mix(torch.tensor(_signed(seed), dtype=torch.int64, device=device) + _GAMMA)
    key = _mix(_mix(base + seq * _GAMMA) + pos * _GAMMA)
    vocab = torch.arange(1, vocab_size + 1, dtype=torch.int64, device=device) * _GAMMA
    bits = _shift_right(_mix(key + vocab), 11)
    return (bits.to(torch.float64) + 0.5) * (2.0**-53)


def gumbel_noise(
    seed: int,
    sequence_ids: torch.Tensor,
    positions: torch.Tensor,
    vocab_size: int,
    device: torch.device | None = None,
) -> torch.Tensor:
    """Standard Gumbel noise ``-log(-log u)``, ``[B, vocab_size]`` float64 (see ``uniform_noise``)."""
    return -torch.log(-torch.log(uniform_noise(seed, sequence_ids, positions, vocab_size, device)))


def _scores(
    logits: torch.Tensor, seed: int, sequence_ids: torch.Tensor, positions: torch.Tensor, temperature: float
) -> torch.Tensor:
    """Scores in logit units: ``logits + T·g`` (argmax-equivalent to ``logits/T + g``)."""
    scores = logits.detach().to(torch.float64)
    if temperature == 0:
        return scores
    noise = gumbel_noise(seed, sequence_ids, positions, logits.shape[-1], device=logits.device)
    return scores + temperature * noise


#: Rows per block so that the int64/float64 temporaries stay near 2^24 elements (128 MiB each).
_BLOCK_ELEMENTS = 1 << 24


def _best_and_claimed(
    logits: torch.Tensor,
    seed: int,
    sequence_ids: torch.Tensor,
    positions: torch.Tensor,
    temperature: float,
    tokens: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]:
    """Per row: (argmax token, best score, score of ``tokens``), computed in row blocks."""
    if temperature < 0:
        raise ValueError(f"temperature must be >= 0, got {temperature}")
    rows = max(1, _BLOCK_ELEMENTS // max(1, logits.shape[1]))
    best_tokens, best_scores, claimed = [], [], []
    for start in range(0, logits.shape[0], rows):
        block = slice(start, start + rows)
        scores = _scores(logits[block], seed, sequence_ids[block], positions[block], temperature)
        best = scores.max(dim=-1)
        best_tokens.append(best.indices)
        best_scores.append(best.values)
        if tokens is not None:
            claimed.append(scores.gather(1, tokens[block, None])[:, 0])
    if not best_tokens:
        empty = torch.zeros(0, dtype=torch.float64, device=logits.device)
        return (
            torch.zeros(0, dtype=torch.int64, device=logits.device),
            empty,
            empty if tokens is not None else None,
        )
    return torch.cat(best_tokens), torch.cat(best_scores), torch.cat(claimed) if tokens is not None else None


def sample_tokens(
    logits: torch.Tensor,
    seed: int,
    sequence_ids: torch.Tensor,
    positions: torch.Tensor,
    temperature: float = 1.0,
) -> torch.Tensor:
    """Draw one token per row with seeded Gumbel-max.

    Args:
        logits: ``[B, V]`` any float dtype, any device.
        seed: the run's sampling seed (an int, any size; reduced mod 2^64).
        sequence_ids: ``[B]`` ints identifying each sequence (e.g. its index in the rollout batch).
        positions: ``[B]`` ints, each row's position (e.g. the index of the generated token).
        temperature: T >= 0; 0 is greedy.
    Returns:
        ``[B]`` int64 tokens on ``logits.device``; exactly a sample of softmax(logits / T).
    """
    seq = torch.as_tensor(sequence_ids, device=logits.device).reshape(-1)
    pos = torch.as_tensor(positions, device=logits.device).reshape(-1)
    if logits.dim() != 2 or seq.numel() != logits.shape[0] or pos.numel() != logits.shape[0]:
        raise ValueError("logits must be [B, V] with B sequence_ids and B positions")
    if temperature < 0:
        raise ValueError(f"temperature must be >= 0, got {temperature}")
    if _native_applies(logits):
        return _native_sample(logits, seed, seq, pos, temperature)
    return _best_and_claimed(logits, seed, seq, pos, temperature)[0]


#: Rows whose runner-up is within this (relative) distance of the best are redrawn by the
#: reference: C's log and torch's may differ in the last bit (~1e-14 here), nothing more.
_NATIVE_MARGIN = 1e-9


def _native_applies(logits: torch.Tensor) -> bool:
    from toploc import native  # local: native compiles its kernels on first use

    return (
        logits.device.type == "cpu"
        and logits.dtype in (torch.float32, torch.bfloat16, torch.float16)  # exact in float32
        and logits.shape[0] > 0
        and logits.shape[1] > 0
        and native.available()
    )


def _native_sample(
    logits: torch.Tensor, seed: int, seq: torch.Tensor, pos: torch.Tensor, temperature: float
) -> torch.Tensor:
    """The fused C draw (``native/toploc_sampling.c``): one pass per row, no [B, V] temporaries.

    Its tokens are the reference's (``_best_and_claimed``) on this device bit for bit: the hash
    is the same integer arithmetic and the scores the same float64 operations; the rows where
    the last bit of ``log`` could matter (a runner-up within ``_NATIVE_MARGIN``, or a non-finite
    logit) are redrawn by the reference itself.
    """
    from toploc import native

    array = logits.detach().to(torch.float32).contiguous().numpy()
    margin = _NATIVE_MARGIN * max(1.0, temperature)
    drawn, ambiguous = native.gumbel_argmax(
        array, seed, seq.to(torch.int64).numpy(), pos.to(torch.int64).numpy(), temperature, margin
    )
    tokens = torch.from_numpy(drawn)
    if ambiguous.any():
        rows = torch.from_numpy(ambiguous.nonzero()[0])
        tokens[rows] = _best_and_claimed(logits[rows], seed, seq[rows], pos[rows], temperature)[0]
    return tokens


@dataclass(frozen=True)
class SamplingCheck:
    """Outcome of ``check_sampling``.

    Attributes:
        passed: ``num_mismatches <= max_mismatches``.
        num_tokens: positions checked.
        num_mismatches: positions whose claimed token falls short by more than ``tolerance``.
        mismatch_positions: indices (into ``tokens``) of those positions.
        max_margin: the largest shortfall in logit units (0.0 if every token is the argmax).
        exact_matches: positions where the claimed token is exactly the recomputed argmax.
    """

    passed: bool
    num_tokens: int
    num_mismatches: int
    mismatch_positions: tuple[int, ...]
    max_margin: float
    exact_matches: int


def check_sampling(
    logits: torch.Tensor,
    tokens: torch.Tensor,
    seed: int,
    sequence_id: int,
    positions: torch.Tensor,
    temperature: float = 1.0,
    *,
    tolerance: float = 0.25,
    max_mismatches: int = 0,
) -> SamplingCheck:
    """Are ``tokens`` what ``sample_tokens`` draws from (the validator's) ``logits``?

    Args:
        logits: ``[T, V]`` recomputed logits at the positions that produced ``tokens``.
        tokens: ``[T]`` claimed tokens.
        seed, sequence_id, positions, temperature: as given to ``sample_tokens``.
        tolerance: allowed shortfall (logit units) of the claimed token's score below
            the best score; absorbs numeric drift between prover and verifier.
        max_mismatches: positions allowed to exceed ``tolerance`` (0 by default).
    Margin_t = max_v s[t, v] - s[t, token_t] with s = logits + T·g; NaN logits count as mismatches.
    """
    tokens = torch.as_tensor(tokens, device=logits.device).reshape(-1).to(torch.int64)
    best_tokens, margin = _claimed_margins(logits, tokens, seed, sequence_id, positions, temperature)
    bad = torch.nonzero(margin > tolerance).flatten().tolist()
    return SamplingCheck(
        passed=len(bad) <= max_mismatches,
        num_tokens=int(tokens.numel()),
        num_mismatches=len(bad),
        mismatch_positions=tuple(int(i) for i in bad),
        max_margin=float(margin.max()) if margin.numel() else 0.0,
        exact_matches=int((best_tokens == tokens).sum()),
    )


def sampling_margins(
    logits: torch.Tensor,
    tokens: torch.Tensor,
    seed: int,
    sequence_id: int,
    positions: torch.Tensor,
    temperature: float = 1.0,
) -> torch.Tensor:
    """Per-token shortfall of the claimed token below the seeded sampler's best score.

    Same computation as :func:`check_sampling` (``margin_t = max_v s[t, v] - s[t, token_t]``
    with ``s = logits + T·g``), but returned per token so that a validator can both apply its
    per-sample tolerance (``margins.max()``) and accumulate evidence from one pass.

    Args:
        logits: ``[T, V]`` recomputed logits at the positions that produced ``tokens``.
        tokens: ``[T]`` claimed tokens, each in ``[0, V)``.
        seed, sequence_id, positions, temperature: as given to :func:`sample_tokens`.
    Returns:
        ``[T]`` float64 margins >= 0 on ``logits.device``; ``inf`` where the logits are NaN.
    """
    tokens = torch.as_tensor(tokens, device=logits.device).reshape(-1).to(torch.int64)
    return _claimed_margins(logits, tokens, seed, sequence_id, positions, temperature)[1]


def _claimed_margins(
    logits: torch.Tensor,
    tokens: torch.Tensor,
    seed: int,
    sequence_id: int,
    positions: torch.Tensor,
    temperature: float,
) -> tuple[torch.Tensor, torch.Tensor]:
    """``(best tokens, margins)`` of int64 ``tokens`` against ``logits`` (shapes and range checked)."""
    positions = torch.as_tensor(positions, device=logits.device).reshape(-1)
    if logits.dim() != 2 or tokens.numel() != logits.shape[0] or positions.numel() != logits.shape[0]:
        raise ValueError("logits must be [T, V] with T tokens and T positions")
    if tokens.numel() and (int(tokens.min()) < 0 or int(tokens.max()) >= logits.shape[1]):
        raise ValueError(f"tokens must lie in [0, {logits.shape[1]})")
    sequence_ids = torch.full_like(positions, sequence_id, dtype=torch.int64)
    best_tokens, best_scores, claimed = _best_and_claimed(
        logits, seed, sequence_ids, positions, temperature, tokens
    )
    assert claimed is not None
    return best_tokens, torch.nan_to_num(best_scores - claimed, nan=float("inf"))
