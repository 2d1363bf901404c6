"""Token log-probs and entropy from logits, in fp32, without a second ``[B, T, V]`` tensor.

``log_softmax(logits).gather(...)`` allocates a full copy of the logits (and autograd keeps
it for backward); at V = 150k that copy is the trainer's memory peak. Here rows are
processed in chunks: the forward pass keeps only per-row scalars (log-sum-exp, E[z]) and
the backward pass recomputes softmax chunk by chunk, writing the gradient straight into
the one ``[B, T, V]`` gradient tensor autograd needs anyway.

Shifting is the caller's job: logits at position t predict token t + 1, so use
``selective_log_softmax(logits[:, :-1], input_ids[:, 1:])``.
"""

from __future__ import annotations

from typing import Any

import torch

from grpo.errors import InvalidParameterError, ShapeError, check_finite_param

__all__ = ["entropy_from_logits", "selective_log_softmax"]

CHUNK_ELEMENTS = 1 << 22
"""Elements per row chunk (16 MiB of fp32): the extra memory of one chunk's fp32 work."""


def _chunk_rows(vocab: int) -> int:
    return max(1, CHUNK_ELEMENTS // max(vocab, 1))


def _scaled_fp32(chunk: torch.Tensor, temperature: float) -> torch.Tensor:
    z = chunk.to(torch.promote_types(chunk.dtype, torch.float32))  # fp32 for bf16/fp16, fp64 stays fp64
    return z / temperature if temperature != 1.0 else z


class _LogitsStats(torch.autograd.Function):
    """(logits [N, V], tokens [N] | None) -> (log p(token) [N], entropy [N]) in fp32."""

    @staticmethod
    def forward(  # type: ignore[override]
        ctx: Any,
        logits: torch.Tensor,
        tokens: torch.Tensor | None,
        temperature: float,
        want_entropy: bool,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        rows, vocab = logits.shape
        math_dtype = torch.promote_types(logits.dtype, torch.float32)
        logsumexp = torch.empty(rows, dtype=math_dtype, device=logits.device)
        token_logprob = torch.zeros(rows, dtype=math_dtype, device=logits.device)
        expected_z = torch.zeros(rows, dtype=math_dtype, device=logits.device)
        step = _chunk_rows(vocab)
        for start in range(0, rows, step):
            z = _scaled_fp32(logits[start : start + step], temperature)  # [n, V]
            lse = torch.logsumexp(z, dim=-1)
            logsumexp[start : start + step] = lse
            if tokens is not None:
                token_logprob[start : start + step] = (
                    z.gather(-1, tokens[start : start + step, None])[:, 0] - lse
                )
            if want_entropy:
                expected_z[start : start + step] = (torch.softmax(z, dim=-1) * z).sum(-1)
        ctx.save_for_backward(logits, tokens, logsumexp, expected_z)
        ctx.temperature = temperature
        ctx.set_materialize_grads(False)
        entropy = logsumexp - expected_z if want_entropy else torch.zeros_like(logsumexp)
        return token_logprob, entropy

    @staticmethod
    def backward(  # type: ignore[override]
        ctx: Any, grad_logprob: torch.Tensor | None, grad_entropy: torch.Tensor | None
    ) -> tuple[torch.Tensor | None, None, None, None]:
        logits, tokens, logsumexp, expected_z = ctx.saved_tensors
        if not ctx.needs_input_grad[0] or (grad_logprob is None and grad_entropy is None):
            return None, None, None, None
        temperature = ctx.temperature
        grad_logits = torch.empty_like(logits)
        rows, vocab = logits.shape
        step = _chunk_rows(vocab)
        for start in range(0, rows, step):
            stop = min(start + step, rows)
            z = _scaled_fp32(logits[start:stop], temperature)
            out = grad_logits[start:stop]
            lse = logsumexp[start:stop, None]
            # Work directly in the gradient's rows when the dtypes agree: no temporaries.
            grad_z = torch.sub(z, lse, out=out) if out.dtype == z.dtype else z - lse
            probs = grad_z.exp_()  # [n, V] softmax; becomes the gradient in place below
            centred = None
            if grad_entropy is not None:
                # dH/dz = −p ⊙ (z − E_p[z])
                centred = (z - expected_z[start:stop, None]).mul_(probs)
                centred.mul_(grad_entropy[start:stop].to(z.dtype)[:, None])
            if grad_logprob is not None and tokens is not None:
                g = grad_logprob[start:stop].to(z.dtype)[:, None]
                # d log p_k / dz = onehot(k) − p
                grad_z.mul_(-g).scatter_add_(-1, tokens[start:stop, None], g)
            else:
                grad_z.zero_()
            if centred is not None:
                grad_z.sub_(centred)
            if temperature != 1.0:
                grad_z.div_(temperature)
            if grad_z.data_ptr() != out.data_ptr():
                out.copy_(grad_z)
        return grad_logits, None, None, None


def _flatten(
    logits: torch.Tensor, tokens: torch.Tensor | None, temperature: float
) -> tuple[torch.Tensor, ...]:
    if not isinstance(logits, torch.Tensor) or logits.dim() < 1 or not logits.is_floating_point():
        raise ShapeError("logits must be a floating-point tensor [..., V]")
    check_finite_param("temperature", temperature)
    if temperature <= 0:
        raise InvalidParameterError(f"temperature must be > 0 (the sampling temperature), got {temperature}")
    vocab = logits.shape[-1]
    flat = logits.reshape(-1, vocab)
    if tokens is None:
        return (flat,)
    if not isinstance(tokens, torch.Tensor) or tokens.shape != logits.shape[:-1]:
        got = tuple(tokens.shape) if isinstance(tokens, torch.Tensor) else type(tokens).__name__
        raise ShapeError(f"tokens must have shape {tuple(logits.shape[:-1])} (logits without V), got {got}")
    if tokens.dtype.is_floating_point or tokens.dtype == torch.bool:
        raise ShapeError(f"tokens must be an integer tensor, got {tokens.dtype}")
    flat_tokens = tokens.reshape(-1).long()
    if flat_tokens.numel() and (int(flat_tokens.min()) < 0 or int(flat_tokens.max()) >= vocab):
        raise ShapeError(f"token ids must be in [0, {vocab}); mask padding with a valid id (e.g. 0)")
    return flat, flat_tokens


def selective_log_softmax(
    logits: torch.Tensor, tokens: torch.Tensor, temperature: float = 1.0
) -> torch.Tensor:
    """log softmax(logits / T)[token] for every position, in fp32 (fp64 for fp64 logits).

    Formula: ℓ = z_k − logsumexp(z), z = logits / T (math in fp32 for bf16/fp16/fp32 input).
    Shapes: ``logits [..., V]`` (e.g. ``[B, T, V]``), ``tokens [...]`` int -> ``[...]`` fp32.
    Equal to ``torch.log_softmax(logits.float() / T, -1).gather(-1, tokens[..., None])``,
    with extra memory of one 16 MiB row chunk instead of a full logits copy, forward and
    backward (the backward recomputes the softmax per chunk).

    Default T = 1.0 (TRL's default; INTELLECT-2 sampled and trained at 0.6).
    Pitfall: T must be the *sampling* temperature, or the ratio is not 1 on fresh data.
    bf16 logits are upcast per chunk: the logsumexp trick is unstable in bf16 itself.
    """
    flat, flat_tokens = _flatten(logits, tokens, temperature)
    token_logprob, _ = _LogitsStats.apply(flat, flat_tokens, float(temperature), False)
    return token_logprob.view(tokens.shape)


def entropy_from_logits(logits: torch.Tensor, temperature: float = 1.0) -> torch.Tensor:
    """Entropy of softmax(logits / T) per position, fp32, chunked, differentiable.

    Formula: H = logsumexp(z) − Σ_v softmax(z)_v·z_v. Shapes: ``logits [..., V]`` -> ``[...]``.
    Uniform over V gives ln V; a near one-hot distribution gives ≈ 0.
    Pitfall: compute it at the sampling temperature to match the policy that generated.
    """
    (flat,) = _flatten(logits, None, temperature)
    _, entropy = _LogitsStats.apply(flat, None, float(temperature), True)
    return entropy.view(logits.shape[:-1])
