"""Per-token policy objectives: (ℓ, ℓ_old, Â, mask) -> per-token loss ``[B, T]`` (minimised).

Shared contract of every function here:

* ``logprobs [B, T]`` = ℓ, the current policy's log-probs of the sampled tokens (with grad);
  ``old_logprobs [B, T]`` = ℓ_old (always detached here); ``advantages`` ``[B]`` (one per
  sequence, broadcast over tokens) or ``[B, T]`` (detached); ``mask [B, T]`` bool or 0/1,
  ``None`` meaning all tokens count.
* The returned per-token loss is exactly 0 at masked positions, and NaN/inf in masked
  positions of any input never reaches the loss or its gradient: inputs are *selected*
  with ``torch.where`` before any arithmetic, not multiplied by the mask.
* Token log-ratios ℓ − ℓ_old are clamped to ±20 before ``exp`` (verl does the same), so the
  ratio r = e^(ℓ − ℓ_old) stays finite; a token beyond the clamp gets zero gradient.
  GSPO's sequence ratio averages the *unclamped* token log-ratios and clamps the mean to
  <= 10, in the order of TRL and verl (see :func:`gspo`).
* Aggregate the result with :func:`grpo.aggregate`; objectives never reduce.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from grpo.errors import InvalidParameterError, check_clip, check_finite_param, check_weight_band
from grpo.tensor_checks import as_bool_mask, broadcast_advantages, check_2d, check_same_shape

__all__ = [
    "LOG_RATIO_CLAMP",
    "ClipStats",
    "cispo",
    "clip_stats",
    "dppo_tv_mask",
    "gspo",
    "ppo_clip",
    "sapo",
    "sequence_mean_log_ratio",
]

LOG_RATIO_CLAMP = 20.0
"""|ℓ − ℓ_old| is clamped to this before exp (e^20 ≈ 4.9e8), as verl."""

GSPO_LOG_RATIO_MAX = 10.0
"""GSPO's sequence log-ratio is clamped to <= 10 (verl ``compute_policy_loss_gspo``)."""


def _prepare(
    logprobs: torch.Tensor,
    old_logprobs: torch.Tensor,
    advantages: torch.Tensor,
    mask: torch.Tensor | None,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Validate inputs; return (valid [B,T] bool, clamped log-ratio [B,T], advantages [B,T]).

    Both the log-ratio and the advantages are 0 at masked positions (selected, not multiplied).
    """
    check_2d("logprobs", logprobs)
    check_2d("old_logprobs", old_logprobs)
    check_same_shape("logprobs", logprobs, old_logprobs=old_logprobs)
    valid = as_bool_mask(mask, logprobs)
    adv = broadcast_advantages(advantages, logprobs).to(logprobs.dtype)
    zero = torch.zeros((), dtype=logprobs.dtype, device=logprobs.device)
    log_ratio = _raw_log_ratio(logprobs, old_logprobs, valid).clamp(-LOG_RATIO_CLAMP, LOG_RATIO_CLAMP)
    return valid, log_ratio, torch.where(valid, adv, zero)


def _raw_log_ratio(logprobs: torch.Tensor, old_logprobs: torch.Tensor, valid: torch.Tensor) -> torch.Tensor:
    """ℓ − ℓ_old at valid positions, 0 elsewhere (selected, so masked NaN/inf never leaks); unclamped."""
    zero = torch.zeros((), dtype=logprobs.dtype, device=logprobs.device)
    return torch.where(valid, logprobs - old_logprobs.detach(), zero)


def _masked(valid: torch.Tensor, loss: torch.Tensor) -> torch.Tensor:
    return torch.where(valid, loss, torch.zeros((), dtype=loss.dtype, device=loss.device))


def ppo_clip(
    logprobs: torch.Tensor,
    old_logprobs: torch.Tensor,
    advantages: torch.Tensor,
    mask: torch.Tensor | None = None,
    *,
    eps_low: float = 0.2,
    eps_high: float = 0.2,
    delta: float | None = None,
) -> torch.Tensor:
    """PPO-clip / GRPO per-token loss, with clip-higher and INTELLECT-2's two-sided δ cap.

    Formula (r = e^(ℓ − ℓ_old)): ρ₁ = min(r, δ) (ρ₁ = r when ``delta`` is None);
    ρ₂ = clip(ρ₁, 1 − ε_low, 1 + ε_high); L = max(−ρ₁·Â, −ρ₂·Â).
    Without δ this is −min(r·Â, clip(r)·Â) (PPO, arXiv 1707.06347; GRPO, arXiv 2402.03300).
    With δ (INTELLECT-2, arXiv 2505.07291 §4.1) tokens with r > δ get L = −δ·Â and zero
    gradient; for Â > 0 the cap is inert (δ > 1 + ε_high), for Â < 0 it equals verl's
    dual-clip with c = δ.

    Shapes: ``logprobs``, ``old_logprobs``, ``mask`` ``[B, T]``; ``advantages`` ``[B]`` or
    ``[B, T]`` -> ``[B, T]``. Gradient ∂L/∂ℓ = −r·Â unless the token is clipped
    ((Â > 0, r > 1+ε_high) or (Â < 0, r < 1−ε_low)) or capped (r > δ): then 0.

    Defaults: ε_low = ε_high = 0.2 (TRL ``epsilon``, verl ``clip_ratio``, INTELLECT-2
    ``grpo_epsilon_low/high``); clip-higher uses ε_high = 0.28 (DAPO, arXiv 2503.14476);
    INTELLECT-2 used δ = 4 (prime-rl@4bb0ff01f ``clamp_log_prob_coef``).

    Pitfall: without δ the loss of a negative-advantage token grows without bound as
    r → ∞ (stale asynchronous data makes large r common); pass ``delta``.
    """
    check_clip(eps_low, eps_high, delta)
    valid, log_ratio, adv = _prepare(logprobs, old_logprobs, advantages, mask)
    ratio = torch.exp(log_ratio)  # [B, T]
    if delta is not None:
        ratio = ratio.clamp(max=delta)
    clipped = ratio.clamp(1.0 - eps_low, 1.0 + eps_high)
    return _masked(valid, torch.maximum(-ratio * adv, -clipped * adv))


def sequence_mean_log_ratio(
    logprobs: torch.Tensor, old_logprobs: torch.Tensor, mask: torch.Tensor | None = None
) -> torch.Tensor:
    """GSPO's length-normalised sequence log-ratio: log s_i = (1/|o_i|) Σ_t m·(ℓ − ℓ_old). ``[B]``.

    The token log-ratios are averaged unclamped, as TRL and verl do (:func:`gspo` clamps the
    mean). Rows without valid tokens give 0. Pitfall: this is the *mean* of the token
    log-ratios; a sequence-level importance weight between two policies uses the *sum*
    (see :mod:`grpo.correction`).
    """
    valid, _, _ = _prepare(logprobs, old_logprobs, torch.zeros_like(logprobs), mask)
    lengths = valid.sum(dim=-1).clamp(min=1).to(logprobs.dtype)
    return _raw_log_ratio(logprobs, old_logprobs, valid).sum(dim=-1) / lengths


def gspo(
    logprobs: torch.Tensor,
    old_logprobs: torch.Tensor,
    advantages: torch.Tensor,
    mask: torch.Tensor | None,
    *,
    eps_low: float = 3e-4,
    eps_high: float = 4e-4,
) -> torch.Tensor:
    """GSPO per-token loss with the sequence-level ratio (arXiv 2507.18071), token form.

    Formula: log s_i = (1/|o_i|) Σ_t m·(ℓ − ℓ_old) over the *unclamped* token log-ratios;
    per token s_{i,t} = exp(min(sg[log s_i] + ℓ_t − sg[ℓ_t], 10)) (value s_i, gradient s_i
    w.r.t. ℓ_t; a sequence with log s_i > 10 is capped at e^10 and gets zero gradient, as in
    verl ``compute_policy_loss_gspo``; TRL 1.16 does not cap);
    L_{i,t} = −min(s_{i,t}·Â_{i,t}, clip(s_{i,t}, 1 − ε_low, 1 + ε_high)·Â_{i,t}).
    With ``aggregate(..., "seq_mean_token_mean")`` and one advantage per sequence this is
    exactly GSPO's 𝓛 = mean_i L_i, gradient ∂𝓛/∂ℓ_t = −Â_i·s_i/(B·|o_i|) when unclipped.
    ``[B, T]`` advantages give verl's "GSPO-token".

    Shapes: ``[B, T]`` inputs, ``advantages`` ``[B]`` or ``[B, T]``; ``mask`` is required
    (the ratio averages over valid tokens) -> ``[B, T]``.

    Defaults: ε_low = 3e-4, ε_high = 4e-4 (GSPO v2 §5.1, via TRL's paper index).

    Order: the token log-ratios are averaged before any clamp, as TRL and verl do; clamping
    each token to ±20 first would change s_i for any sequence holding a token beyond ±20
    (the parity suite, ``tests/test_parity.py``, has such a case).

    Pitfall: GSPO's ε is ~1000× smaller than token-level PPO's; reusing 0.2 clips nothing.
    Aggregating with ``token_mean`` weights each sequence by its length.
    """
    check_clip(eps_low, eps_high)
    valid, _, adv = _prepare(logprobs, old_logprobs, advantages, mask)
    lengths = valid.sum(dim=-1, keepdim=True).clamp(min=1).to(logprobs.dtype)
    seq_log_ratio = (_raw_log_ratio(logprobs, old_logprobs, valid).sum(dim=-1, keepdim=True) / lengths).detach()
    zero = torch.zeros((), dtype=logprobs.dtype, device=logprobs.device)
    current = torch.where(valid, logprobs, zero)
    # [B, T], value s_i; the cap sits on the gradient-carrying sum, so a capped sequence has no gradient.
    token_ratio = torch.exp((seq_log_ratio + current - current.detach()).clamp(max=GSPO_LOG_RATIO_MAX))
    clipped = token_ratio.clamp(1.0 - eps_low, 1.0 + eps_high)
    return _masked(valid, torch.maximum(-token_ratio * adv, -clipped * adv))


def cispo(
    logprobs: torch.Tensor,
    old_logprobs: torch.Tensor,
    advantages: torch.Tensor,
    mask: torch.Tensor | None = None,
    *,
    is_cap: float = 5.0,
    is_floor: float = 0.0,
) -> torch.Tensor:
    """CISPO per-token loss (MiniMax-M1, arXiv 2506.13585): L = −sg[clamp(r, is_floor, is_cap)]·Â·ℓ.

    A REINFORCE term with a clipped, detached importance weight, so every token keeps a
    gradient −w·Â (no token is dropped, unlike PPO-clip). At r = 1 the gradient equals PPO's.

    Shapes: ``[B, T]`` inputs, ``advantages`` ``[B]`` or ``[B, T]`` -> ``[B, T]``.

    Defaults: ``is_cap = 5.0`` is an *absolute* cap on r (ScaleRL, arXiv 2510.13786; TRL
    ``cispo`` with ``epsilon_high=5``); ``is_floor = 0`` (one-sided; thinking-machines
    tinker-cookbook PR #763: a positive floor removes IS attenuation). verl's ``clip_ratio``
    form clip(r, 1 − ε, 1 + ε) is ``is_floor = 1 − ε, is_cap = 1 + ε``.

    Pitfall: the loss *value* is −w·Â·ℓ, which depends on the log-prob magnitude and is
    not 0 at r = 1; compare gradients, not loss values, with PPO-style objectives.
    """
    check_weight_band("is_floor", is_floor, "is_cap", is_cap)
    valid, log_ratio, adv = _prepare(logprobs, old_logprobs, advantages, mask)
    weight = torch.exp(log_ratio).clamp(is_floor, is_cap).detach()
    zero = torch.zeros((), dtype=logprobs.dtype, device=logprobs.device)
    current = torch.where(valid, logprobs, zero)
    return _masked(valid, -weight * adv * current)


def sapo(
    logprobs: torch.Tensor,
    old_logprobs: torch.Tensor,
    advantages: torch.Tensor,
    mask: torch.Tensor | None = None,
    *,
    tau_pos: float = 1.0,
    tau_neg: float = 1.05,
) -> torch.Tensor:
    """SAPO soft-gated per-token loss (arXiv 2511.20347): L = −Â·σ(τ·(r − 1))·4/τ.

    τ = ``tau_pos`` where Â > 0, else ``tau_neg``. At r = 1 the value is −2Â/τ and the slope
    ∂L/∂r is −Â, as PPO's. Shapes as :func:`ppo_clip`.

    Defaults: τ_pos = 1.0, τ_neg = 1.05 (TRL and verl ``sapo``).
    """
    check_finite_param("tau_pos", tau_pos)
    check_finite_param("tau_neg", tau_neg)
    if tau_pos <= 0 or tau_neg <= 0:
        raise InvalidParameterError(f"tau_pos and tau_neg must be > 0, got {tau_pos}, {tau_neg}")
    valid, log_ratio, adv = _prepare(logprobs, old_logprobs, advantages, mask)
    ratio = torch.exp(log_ratio)
    tau = torch.where(adv > 0, torch.full_like(adv, tau_pos), torch.full_like(adv, tau_neg))
    return _masked(valid, -adv * torch.sigmoid(tau * (ratio - 1.0)) * 4.0 / tau)


def dppo_tv_mask(
    logprobs: torch.Tensor,
    old_logprobs: torch.Tensor,
    advantages: torch.Tensor,
    mask: torch.Tensor | None = None,
    *,
    delta_low: float = 0.2,
    delta_high: float = 0.2,
) -> torch.Tensor:
    """DPPO binary total-variation trust region (arXiv 2602.04879): which tokens keep a gradient.

    With probabilities p = e^ℓ and p_old = e^ℓ_old, a token is kept if
    (Â > 0 and p − p_old <= δ_high) or (Â <= 0 and p − p_old >= −δ_low).
    Returns a bool ``[B, T]`` mask (False at masked positions); combine it with the loss
    mask before :func:`grpo.aggregate`.

    Defaults: δ_low = δ_high = 0.2 (prime-rl HEAD ``dppo_mask_low/high``).
    Pitfall: the band is on probabilities, not on the ratio.
    """
    check_finite_param("delta_low", delta_low)
    check_finite_param("delta_high", delta_high)
    valid, log_ratio, adv = _prepare(logprobs, old_logprobs, advantages, mask)
    zero = torch.zeros((), dtype=logprobs.dtype, device=logprobs.device)
    old = torch.where(valid, old_logprobs.detach(), zero)
    change = (torch.exp(old + log_ratio) - torch.exp(old)).detach()  # p − p_old
    keep = torch.where(adv > 0, change <= delta_high, change >= -delta_low)
    return keep & valid


@dataclass(frozen=True)
class ClipStats:
    """Fractions of valid tokens per clipping outcome (detached 0-dim tensors), TRL's names in brackets.

    ``low_fraction`` (clip_ratio/low_mean): r < 1 − ε_low and Â < 0; ``high_fraction``
    (clip_ratio/high_mean): r > 1 + ε_high and Â > 0 -- the tokens PPO-clip zeroes;
    ``delta_fraction``: r > δ (0 when δ is None); ``mean_ratio``: masked mean of r;
    ``num_tokens``: the number of valid tokens these fractions are over.
    """

    low_fraction: torch.Tensor
    high_fraction: torch.Tensor
    delta_fraction: torch.Tensor
    mean_ratio: torch.Tensor
    num_tokens: int


def clip_stats(
    ratio: torch.Tensor,
    advantages: torch.Tensor,
    mask: torch.Tensor | None = None,
    *,
    eps_low: float = 0.2,
    eps_high: float = 0.2,
    delta: float | None = None,
) -> ClipStats:
    """Clip diagnostics for a ratio tensor ``[B, T]`` (token ratios, or GSPO's s_i broadcast).

    Pass ``ratio = exp(logprobs − old_logprobs)`` (raw, uncapped). Fractions are over valid
    tokens; an all-masked batch gives zeros.
    """
    check_2d("ratio", ratio)
    valid = as_bool_mask(mask, ratio)
    adv = broadcast_advantages(advantages, ratio)
    ratio = ratio.detach()
    count = int(valid.sum())
    denominator = max(count, 1)

    def fraction(condition: torch.Tensor) -> torch.Tensor:
        return (condition & valid).sum().to(ratio.dtype) / denominator

    zero = torch.zeros((), dtype=ratio.dtype, device=ratio.device)
    return ClipStats(
        low_fraction=fraction((ratio < 1.0 - eps_low) & (adv < 0)),
        high_fraction=fraction((ratio > 1.0 + eps_high) & (adv > 0)),
        delta_fraction=fraction(ratio > delta) if delta is not None else zero,
        mean_ratio=torch.where(valid, ratio, zero).sum() / denominator,
        num_tokens=count,
    )
