"""Token log-probs (and entropy) straight from the last hidden states, never building ``[N, V]`` logits.

The LM head z = h·Wᵀ / T is applied tile by tile (rows × vocabulary columns). The forward
pass keeps an online log-sum-exp per row (running max m, Σ e^(z−m), Σ e^(z−m)·z), so the
output needs one pass over W. The backward pass recomputes each tile's logits and
accumulates ∂/∂h = G·W and ∂/∂W = Gᵀ·h, where G is the tile's gradient w.r.t. the logits.
Peak extra memory is one or two reused tiles plus the weight gradient, instead of several
full ``[N, V]`` tensors. The price is one extra matmul: forward + backward run four
``[N, H] × [H, V]``-sized GEMMs where the naive path runs three, so in the GEMM-bound regime
the time ratio tends to 4/3, partly offset by the naive path's multi-GiB memory traffic.
The upstream gradient of an RL loss is unknown during the forward pass, so the gradient
cannot be precomputed there (as fused cross-entropy kernels do).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal, overload

import torch

from grpo.errors import InvalidParameterError, ShapeError, check_finite_param

__all__ = ["LogprobsAndEntropy", "logprobs_from_hidden"]


@dataclass(frozen=True)
class LogprobsAndEntropy:
    """Result of ``logprobs_from_hidden(..., return_entropy=True)``: both fp32, shaped like ``tokens``."""

    logprobs: torch.Tensor
    entropy: torch.Tensor


def _tile_logits(hidden_rows: torch.Tensor, weight_cols: torch.Tensor, buffer: torch.Tensor) -> torch.Tensor:
    """The ``[rows, cols]`` logits tile h·Wᵀ in the softmax dtype, written into ``buffer``.

    Reusing one flat buffer per row chunk avoids a fresh multi-MiB allocation (and its page
    faults) for every tile. The matmul runs in the input dtype, like the model's lm_head.
    """
    rows, cols = hidden_rows.shape[0], weight_cols.shape[0]
    out = buffer[: rows * cols].view(rows, cols)
    if hidden_rows.dtype == out.dtype:
        torch.mm(hidden_rows, weight_cols.T, out=out)
    else:
        out.copy_(hidden_rows @ weight_cols.T)
    return out


class _HiddenStats(torch.autograd.Function):
    """(hidden [N, H], weight [V, H], tokens [N]) -> (log p(token) [N], entropy [N]), fp32.

    The temperature is folded into the hidden rows (z = (h/T)·Wᵀ), which saves one pass over
    every tile; ∂/∂h then picks up the 1/T once per row chunk.
    """

    @staticmethod
    def forward(  # type: ignore[override]
        ctx: Any,
        hidden: torch.Tensor,
        weight: torch.Tensor,
        tokens: torch.Tensor,
        temperature: float,
        chunk_size: int,
        row_chunk_size: int,
        want_entropy: bool,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        rows, vocab = hidden.shape[0], weight.shape[0]
        dev = hidden.device
        math_dtype = torch.promote_types(hidden.dtype, torch.float32)
        logsumexp = torch.empty(rows, dtype=math_dtype, device=dev)
        token_logit = torch.empty(rows, dtype=math_dtype, device=dev)
        expected_z = torch.zeros(rows, dtype=math_dtype, device=dev)
        tile_elements = min(rows, row_chunk_size) * min(vocab, chunk_size)
        z_buffer = torch.empty(tile_elements, dtype=math_dtype, device=dev)
        e_buffer = torch.empty(tile_elements, dtype=math_dtype, device=dev) if want_entropy else None
        for r0 in range(0, rows, row_chunk_size):
            h = hidden[r0 : r0 + row_chunk_size]
            h = h / temperature if temperature != 1.0 else h
            tok = tokens[r0 : r0 + row_chunk_size]
            n = h.shape[0]
            running_max = torch.full((n,), float("-inf"), dtype=math_dtype, device=dev)
            running_sum = torch.zeros(n, dtype=math_dtype, device=dev)
            running_zsum = torch.zeros(n, dtype=math_dtype, device=dev)
            target = torch.zeros(n, dtype=math_dtype, device=dev)
            for v0 in range(0, vocab, chunk_size):
                z = _tile_logits(h, weight[v0 : v0 + chunk_size], z_buffer)  # [n, c]
                inside = (tok >= v0) & (tok < v0 + z.shape[1])
                local = (tok - v0).clamp(0, z.shape[1] - 1)
                target = torch.where(inside, z.gather(-1, local[:, None])[:, 0], target)
                new_max = torch.maximum(running_max, z.amax(dim=-1))
                rescale = torch.exp(running_max - new_max)
                if e_buffer is not None:
                    e = torch.sub(z, new_max[:, None], out=e_buffer[: z.numel()].view_as(z)).exp_()
                    running_sum = running_sum * rescale + e.sum(dim=-1)
                    running_zsum = running_zsum * rescale + e.mul_(z).sum(dim=-1)
                else:
                    running_sum = running_sum * rescale + z.sub_(new_max[:, None]).exp_().sum(dim=-1)
                running_max = new_max
            lse = running_max + torch.log(running_sum)
            logsumexp[r0 : r0 + n] = lse
            token_logit[r0 : r0 + n] = target
            if want_entropy:
                expected_z[r0 : r0 + n] = running_zsum / running_sum
        ctx.save_for_backward(hidden, weight, tokens, logsumexp, expected_z)
        ctx.options = (temperature, chunk_size, row_chunk_size)
        ctx.set_materialize_grads(False)
        entropy = logsumexp - expected_z if want_entropy else torch.zeros_like(logsumexp)
        return token_logit - logsumexp, entropy

    @staticmethod
    def backward(  # type: ignore[override]
        ctx: Any, grad_logprob: torch.Tensor | None, grad_entropy: torch.Tensor | None
    ) -> tuple[torch.Tensor | None, torch.Tensor | None, None, None, None, None, None]:
        hidden, weight, tokens, logsumexp, expected_z = ctx.saved_tensors
        temperature, chunk_size, row_chunk_size = ctx.options
        need_hidden, need_weight = ctx.needs_input_grad[0], ctx.needs_input_grad[1]
        if (grad_logprob is None and grad_entropy is None) or not (need_hidden or need_weight):
            return None, None, None, None, None, None, None
        grad_hidden = torch.zeros_like(hidden) if need_hidden else None
        # Low-precision weights accumulate in fp32 (the sum runs over every row chunk); fp32/fp64
        # weights are written in place by the GEMMs (out= / addmm_), with no extra pass.
        acc_dtype = torch.promote_types(weight.dtype, torch.float32)
        # With zero rows the GEMM loop never runs: an `empty` buffer would return garbage.
        in_place = acc_dtype == weight.dtype and hidden.shape[0] > 0
        grad_weight = None
        if need_weight:
            grad_weight = (torch.empty if in_place else torch.zeros)(
                weight.shape, dtype=acc_dtype, device=weight.device
            )
        rows, vocab = hidden.shape[0], weight.shape[0]
        tile_elements = min(rows, row_chunk_size) * min(vocab, chunk_size)
        z_buffer = torch.empty(tile_elements, dtype=logsumexp.dtype, device=hidden.device)
        c_buffer = torch.empty_like(z_buffer) if grad_entropy is not None else None
        for r0 in range(0, rows, row_chunk_size):
            h = hidden[r0 : r0 + row_chunk_size]
            h = h / temperature if temperature != 1.0 else h
            n = h.shape[0]
            tok = tokens[r0 : r0 + n]
            lse = logsumexp[r0 : r0 + n, None]
            g_lp = grad_logprob[r0 : r0 + n].to(lse.dtype)[:, None] if grad_logprob is not None else None
            g_h = grad_entropy[r0 : r0 + n].to(lse.dtype)[:, None] if grad_entropy is not None else None
            for v0 in range(0, vocab, chunk_size):
                w = weight[v0 : v0 + chunk_size]
                z = _tile_logits(h, w, z_buffer)  # [n, c]
                centred = None
                if c_buffer is not None:
                    centred = torch.sub(
                        z, expected_z[r0 : r0 + n, None], out=c_buffer[: z.numel()].view_as(z)
                    )
                grad_z = z.sub_(lse).exp_()  # softmax p, in place
                if centred is not None and g_h is not None:
                    centred.mul_(grad_z).mul_(g_h)  # g_H ⊙ p ⊙ (z − E z); dH/dz = −p ⊙ (z − E z)
                if g_lp is not None:
                    grad_z.mul_(-g_lp)  # d log p_k / dz = onehot(k) − p
                    inside = (tok >= v0) & (tok < v0 + z.shape[1])
                    local = (tok - v0).clamp(0, z.shape[1] - 1)
                    grad_z.scatter_add_(-1, local[:, None], torch.where(inside[:, None], g_lp, 0.0))
                else:
                    grad_z.zero_()
                if centred is not None:
                    grad_z.sub_(centred)
                grad_z = grad_z.to(hidden.dtype)
                if grad_hidden is not None:
                    grad_hidden[r0 : r0 + n].addmm_(grad_z, w)
                if grad_weight is not None:
                    rows_of_w = grad_weight[v0 : v0 + chunk_size]
                    if not in_place:
                        rows_of_w += (grad_z.T @ h).to(acc_dtype)
                    elif r0 == 0:
                        torch.mm(grad_z.T, h, out=rows_of_w)
                    else:
                        rows_of_w.addmm_(grad_z.T, h)
            if grad_hidden is not None and temperature != 1.0:
                grad_hidden[r0 : r0 + n] /= temperature
        if grad_weight is not None:
            grad_weight = grad_weight.to(weight.dtype)
        return grad_hidden, grad_weight, None, None, None, None, None


@overload
def logprobs_from_hidden(
    hidden: torch.Tensor,
    lm_head_weight: torch.Tensor,
    tokens: torch.Tensor,
    temperature: float = ...,
    chunk_size: int = ...,
    *,
    row_chunk_size: int = ...,
    return_entropy: Literal[False] = ...,
) -> torch.Tensor: ...


@overload
def logprobs_from_hidden(
    hidden: torch.Tensor,
    lm_head_weight: torch.Tensor,
    tokens: torch.Tensor,
    temperature: float = ...,
    chunk_size: int = ...,
    *,
    row_chunk_size: int = ...,
    return_entropy: Literal[True],
) -> LogprobsAndEntropy: ...


def logprobs_from_hidden(
    hidden: torch.Tensor,
    lm_head_weight: torch.Tensor,
    tokens: torch.Tensor,
    temperature: float = 1.0,
    chunk_size: int = 8192,
    *,
    row_chunk_size: int = 4096,
    return_entropy: bool = False,
) -> torch.Tensor | LogprobsAndEntropy:
    """log softmax(h·Wᵀ / T)[token] (and optionally the entropy) without materialising logits.

    Formula: z = h·Wᵀ / T (matmul in the inputs' dtype, softmax math in fp32);
    ℓ = z_k − logsumexp(z); H = logsumexp(z) − Σ softmax(z)·z.
    Shapes: ``hidden [..., H]`` (e.g. ``[B, T, H]``, the final-norm output), ``lm_head_weight
    [V, H]`` (``model.lm_head.weight``; no bias), ``tokens [...]`` int -> ``[...]`` fp32
    (a :class:`LogprobsAndEntropy` with ``return_entropy=True``). Gradients flow to
    ``hidden`` and ``lm_head_weight`` and equal those of the naive full-logits computation.

    ``chunk_size`` = vocabulary columns per tile (default 8192), ``row_chunk_size`` = rows
    per tile (default 4096); one tile buffer (two with entropy) is reused for the whole pass,
    so peak extra memory ≈ 1–2 fp32 tiles + the weight gradient (fp32 while accumulating for
    bf16 weights). The defaults cap a tile at 128 MiB (64 MiB at 2048 rows) and keep the
    GEMMs large enough to be efficient.

    Pitfall: pass the hidden states *after* the final norm and shift them yourself
    (``hidden[:, :-1]`` predicts ``input_ids[:, 1:]``); T must be the sampling temperature.
    """
    if not isinstance(hidden, torch.Tensor) or hidden.dim() < 1 or not hidden.is_floating_point():
        raise ShapeError("hidden must be a floating-point tensor [..., H]")
    if not isinstance(lm_head_weight, torch.Tensor) or lm_head_weight.dim() != 2:
        raise ShapeError("lm_head_weight must be a [V, H] tensor")
    if lm_head_weight.shape[1] != hidden.shape[-1]:
        raise ShapeError(
            f"hidden size mismatch: hidden [..., {hidden.shape[-1]}] vs lm_head_weight {tuple(lm_head_weight.shape)}"
        )
    if lm_head_weight.dtype != hidden.dtype:
        raise ShapeError(f"hidden is {hidden.dtype} but lm_head_weight is {lm_head_weight.dtype}; cast one")
    if not isinstance(tokens, torch.Tensor) or tokens.shape != hidden.shape[:-1]:
        raise ShapeError(f"tokens must have shape {tuple(hidden.shape[:-1])} (hidden without H)")
    if tokens.dtype.is_floating_point or tokens.dtype == torch.bool:
        raise ShapeError(f"tokens must be an integer tensor, got {tokens.dtype}")
    check_finite_param("temperature", temperature)
    if temperature <= 0:
        raise InvalidParameterError(f"temperature must be > 0, got {temperature}")
    for name, value in (("chunk_size", chunk_size), ("row_chunk_size", row_chunk_size)):
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise InvalidParameterError(f"{name} must be an int >= 1, got {value!r}")
    vocab = lm_head_weight.shape[0]
    flat_tokens = tokens.reshape(-1).long()
    if flat_tokens.numel() and (int(flat_tokens.min()) < 0 or int(flat_tokens.max()) >= vocab):
        raise ShapeError(f"token ids must be in [0, {vocab}); mask padding with a valid id (e.g. 0)")
    flat_hidden = hidden.reshape(-1, hidden.shape[-1])
    logprobs, entropy = _HiddenStats.apply(
        flat_hidden,
        lm_head_weight,
        flat_tokens,
        float(temperature),
        chunk_size,
        row_chunk_size,
        return_entropy,
    )
    if return_entropy:
        return LogprobsAndEntropy(logprobs.view(tokens.shape), entropy.view(tokens.shape))
    return logprobs.view(tokens.shape)
