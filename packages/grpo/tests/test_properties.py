"""Hypothesis properties: permutation, padding, micro-batch and group invariances, mask robustness,
and pure-Python loop references equal to the vectorised code. All float64 on CPU."""

from __future__ import annotations

import itertools
import math
import statistics
from collections.abc import Callable

import torch
from hypothesis import given, settings
from hypothesis import strategies as st

import grpo

F64 = torch.float64
SETTINGS = settings(max_examples=40, deadline=None)


def make_batch(seed: int, rows: int, cols: int, scale: float = 0.5, per_token_adv: bool = False):
    """Random (ℓ leaf, ℓ_old, Â, mask); some rows may be fully masked."""
    g = torch.Generator().manual_seed(seed)
    logprobs = (-torch.rand(rows, cols, generator=g, dtype=F64) * 3).requires_grad_(True)
    old = logprobs.detach() + torch.randn(rows, cols, generator=g, dtype=F64) * scale
    shape = (rows, cols) if per_token_adv else (rows,)
    adv = torch.randn(*shape, generator=g, dtype=F64)
    mask = torch.rand(rows, cols, generator=g) < 0.75
    return logprobs, old, adv, mask


OBJECTIVES: dict[str, Callable[..., torch.Tensor]] = {
    "ppo_clip": lambda lp, old, adv, m: grpo.ppo_clip(lp, old, adv, m),
    "ppo_clip_delta": lambda lp, old, adv, m: grpo.ppo_clip(lp, old, adv, m, eps_high=0.28, delta=4.0),
    "gspo": lambda lp, old, adv, m: grpo.gspo(lp, old, adv, m, eps_low=0.2, eps_high=0.2),
    "cispo": lambda lp, old, adv, m: grpo.cispo(lp, old, adv, m),
    "sapo": lambda lp, old, adv, m: grpo.sapo(lp, old, adv, m),
}
MODES = [
    ("token_mean", {}),
    ("seq_mean_token_mean", {}),
    ("seq_mean_token_sum", {}),
    ("constant", {"constant": 7.0}),
]

shapes = st.tuples(st.integers(0, 2**31 - 1), st.integers(1, 6), st.integers(1, 7))
objective_names = st.sampled_from(sorted(OBJECTIVES))
modes = st.sampled_from(MODES)


def loss_and_grad(name: str, mode: tuple[str, dict], lp, old, adv, mask, **norm):
    loss = grpo.aggregate(OBJECTIVES[name](lp, old, adv, mask), mask, mode[0], **mode[1], **norm)  # type: ignore[arg-type]
    (grad,) = torch.autograd.grad(loss, lp)
    return loss.detach(), grad


@SETTINGS
@given(shapes, objective_names, modes, st.booleans())
def test_batch_permutation_invariance(shape, name, mode, per_token_adv) -> None:
    seed, rows, cols = shape
    lp, old, adv, mask = make_batch(seed, rows, cols, per_token_adv=per_token_adv)
    perm = torch.randperm(rows, generator=torch.Generator().manual_seed(seed))
    loss, grad = loss_and_grad(name, mode, lp, old, adv, mask)
    lp_p = lp.detach()[perm].requires_grad_(True)
    loss_p, grad_p = loss_and_grad(name, mode, lp_p, old[perm], adv[perm], mask[perm])
    torch.testing.assert_close(loss_p, loss, rtol=0, atol=1e-12)
    torch.testing.assert_close(grad_p, grad[perm], rtol=0, atol=1e-12)


@SETTINGS
@given(shapes, objective_names, modes, st.integers(1, 5), st.sampled_from([0.0, float("nan"), float("inf")]))
def test_padding_invariance(shape, name, mode, pad, garbage) -> None:
    # Extra masked columns holding anything (0, NaN, inf) change neither the loss nor the gradient.
    seed, rows, cols = shape
    lp, old, adv, mask = make_batch(seed, rows, cols, per_token_adv=True)
    loss, grad = loss_and_grad(name, mode, lp, old, adv, mask)
    fill = torch.full((rows, pad), garbage, dtype=F64)
    lp_pad = torch.cat([lp.detach(), fill], 1).requires_grad_(True)
    old_pad = torch.cat([old, fill], 1)
    adv_pad = torch.cat([adv, fill], 1)
    mask_pad = torch.cat([mask, torch.zeros(rows, pad, dtype=torch.bool)], 1)
    loss_pad, grad_pad = loss_and_grad(name, mode, lp_pad, old_pad, adv_pad, mask_pad)
    torch.testing.assert_close(loss_pad, loss, rtol=0, atol=1e-12)
    torch.testing.assert_close(grad_pad[:, :cols], grad, rtol=0, atol=1e-12)
    assert torch.equal(grad_pad[:, cols:], torch.zeros(rows, pad, dtype=F64))


@SETTINGS
@given(shapes, objective_names, modes, st.data())
def test_micro_batch_invariance_with_global_normalisers(shape, name, mode, data) -> None:
    # Σ over micro-batches of aggregate(..., global normalisers) == full-batch loss; same for gradients.
    seed, rows, cols = shape
    lp, old, adv, mask = make_batch(seed, rows, cols)
    loss, grad = loss_and_grad(name, mode, lp, old, adv, mask)
    norm = {"num_tokens": max(int(mask.sum()), 1), "num_seqs": max(int((mask.sum(1) > 0).sum()), 1)}
    cuts = sorted(data.draw(st.sets(st.integers(1, max(rows - 1, 1)), max_size=3)))
    bounds = [0, *[c for c in cuts if c < rows], rows]
    total = torch.zeros((), dtype=F64)
    grad_sum = torch.zeros_like(grad)
    for start, stop in itertools.pairwise(bounds):
        mb_lp = lp.detach()[start:stop].requires_grad_(True)
        mb_loss, mb_grad = loss_and_grad(
            name, mode, mb_lp, old[start:stop], adv[start:stop], mask[start:stop], **norm
        )
        total = total + mb_loss
        grad_sum[start:stop] += mb_grad
    torch.testing.assert_close(total, loss, rtol=0, atol=1e-12)
    torch.testing.assert_close(grad_sum, grad, rtol=0, atol=1e-12)


@SETTINGS
@given(
    st.integers(0, 2**31 - 1),
    st.integers(1, 5),
    st.integers(1, 6),
    st.sampled_from(["group_zscore", "group_center", "rloo"]),
)
def test_group_independence(seed, groups, group_size, estimator) -> None:
    # Changing one group's rewards never changes another group's advantages.
    fn = getattr(grpo, estimator)
    g = torch.Generator().manual_seed(seed)
    rewards = torch.randint(0, 3, (groups * group_size,), generator=g).to(F64)
    before = fn(rewards, group_size)
    changed = rewards.clone()
    k = int(torch.randint(0, groups, (1,), generator=g))
    changed[k * group_size : (k + 1) * group_size] = torch.randn(group_size, generator=g, dtype=F64)
    after = fn(changed, group_size)
    others = torch.ones(groups * group_size, dtype=torch.bool)
    others[k * group_size : (k + 1) * group_size] = False
    assert torch.equal(after[others], before[others])


@SETTINGS
@given(shapes, objective_names, modes, st.sampled_from([float("nan"), float("inf"), float("-inf"), 1e30]))
def test_masked_garbage_never_leaks(shape, name, mode, garbage) -> None:
    seed, rows, cols = shape
    lp, old, adv, mask = make_batch(seed, rows, cols, per_token_adv=True)
    loss, grad = loss_and_grad(name, mode, lp, old, adv, mask)
    dirty = ~mask
    lp_d = torch.where(dirty, garbage, lp.detach()).requires_grad_(True)
    old_d = torch.where(dirty, -garbage, old)
    adv_d = torch.where(dirty, garbage, adv)
    loss_d, grad_d = loss_and_grad(name, mode, lp_d, old_d, adv_d, mask)
    assert torch.isfinite(loss_d) and torch.isfinite(grad_d).all()
    torch.testing.assert_close(loss_d, loss, rtol=0, atol=1e-12)
    torch.testing.assert_close(grad_d, grad, rtol=0, atol=1e-12)


# ---- loop references ---------------------------------------------------------------------


def ppo_clip_loop(lp, old, adv, mask, eps_low, eps_high, delta):
    """Element-by-element PPO-clip with δ, and its gradient from the case analysis."""
    rows, cols = len(lp), len(lp[0])
    loss = [[0.0] * cols for _ in range(rows)]
    grad = [[0.0] * cols for _ in range(rows)]
    for i in range(rows):
        for t in range(cols):
            if not mask[i][t]:
                continue
            a = adv[i][t]
            r = math.exp(max(-20.0, min(20.0, lp[i][t] - old[i][t])))
            capped = min(r, delta) if delta is not None else r
            clipped = min(max(capped, 1 - eps_low), 1 + eps_high)
            loss[i][t] = max(-capped * a, -clipped * a)
            inactive = (a > 0 and r > 1 + eps_high) or (a < 0 and r < 1 - eps_low)
            inactive = inactive or (delta is not None and r > delta)
            grad[i][t] = 0.0 if inactive else -r * a
    return loss, grad


def aggregate_loop(loss, mask, mode, constant=None):
    rows = [[loss[i][t] for t in range(len(loss[i])) if mask[i][t]] for i in range(len(loss))]
    nonempty = [row for row in rows if row]
    tokens = sum(len(row) for row in rows)
    if mode == "token_mean":
        return sum(map(sum, rows)) / max(tokens, 1)
    if mode == "seq_mean_token_mean":
        return sum(sum(row) / len(row) for row in nonempty) / max(len(nonempty), 1)
    if mode == "seq_mean_token_sum":
        return sum(map(sum, rows)) / max(len(nonempty), 1)
    return sum(map(sum, rows)) / (max(len(nonempty), 1) * constant)


@SETTINGS
@given(
    shapes,
    st.floats(0.0, 0.5),
    st.floats(0.0, 0.5),
    st.one_of(st.none(), st.floats(2.0, 6.0)),
    modes,
)
def test_ppo_clip_loop_reference(shape, eps_low, eps_high, delta, mode) -> None:
    seed, rows, cols = shape
    lp, old, adv, mask = make_batch(seed, rows, cols, scale=0.8, per_token_adv=True)
    per_token = grpo.ppo_clip(lp, old, adv, mask, eps_low=eps_low, eps_high=eps_high, delta=delta)
    ref_loss, ref_grad = ppo_clip_loop(
        lp.tolist(), old.tolist(), adv.tolist(), mask.tolist(), eps_low, eps_high, delta
    )
    torch.testing.assert_close(per_token.detach(), torch.tensor(ref_loss, dtype=F64), rtol=0, atol=1e-12)
    (grad,) = torch.autograd.grad(per_token.sum(), lp)
    torch.testing.assert_close(grad, torch.tensor(ref_grad, dtype=F64), rtol=0, atol=1e-12)
    scalar = grpo.aggregate(per_token.detach(), mask, mode[0], **mode[1])  # type: ignore[arg-type]
    expected = aggregate_loop(ref_loss, mask.tolist(), mode[0], mode[1].get("constant"))
    assert abs(float(scalar) - expected) <= 1e-12


@SETTINGS
@given(shapes, st.floats(1.5, 6.0))
def test_delta_equals_verl_dual_clip(shape, c) -> None:
    # verl dual-clip: Â < 0 -> min(−Â·c, max(−r·Â, −clip(r)·Â)); Â >= 0 -> plain clip. Equal to ppo_clip(δ = c).
    seed, rows, cols = shape
    lp, old, adv, _mask = make_batch(seed, rows, cols, scale=1.5, per_token_adv=True)
    ratio = torch.exp(lp - old)
    plain = torch.maximum(-ratio * adv, -ratio.clamp(0.8, 1.2) * adv)
    dual = torch.where(adv < 0, torch.minimum(-adv * c, plain), plain)
    ours = grpo.ppo_clip(lp, old, adv, None, delta=c)
    torch.testing.assert_close(ours, dual, rtol=0, atol=1e-12)
    g_ours = torch.autograd.grad(ours.sum(), lp)[0]
    g_dual = torch.autograd.grad(dual.sum(), lp)[0]
    torch.testing.assert_close(g_ours, g_dual, rtol=0, atol=1e-12)


@SETTINGS
@given(shapes)
def test_gspo_loop_reference(shape) -> None:
    # Loop GSPO: s_i = exp(mean_t log-ratio), L_i = max(−s·Â, −clip(s)·Â); 𝓛 = mean over non-empty rows.
    seed, rows, cols = shape
    lp, old, adv, mask = make_batch(seed, rows, cols, scale=0.2)
    loss = grpo.aggregate(
        grpo.gspo(lp, old, adv, mask, eps_low=0.1, eps_high=0.1), mask, "seq_mean_token_mean"
    )
    seq_losses = []
    for i in range(rows):
        ratios = [float(lp.detach()[i, t] - old[i, t]) for t in range(cols) if mask[i, t]]
        if not ratios:
            continue
        s = math.exp(statistics.fmean(ratios))
        a = float(adv[i])
        seq_losses.append(max(-s * a, -min(max(s, 0.9), 1.1) * a))
    expected = statistics.fmean(seq_losses) if seq_losses else 0.0
    assert abs(float(loss.detach()) - expected) <= 1e-12


@SETTINGS
@given(st.integers(0, 2**31 - 1), st.integers(1, 5), st.integers(2, 6), st.floats(0.0, 1e-3))
def test_group_zscore_loop_reference(seed, groups, group_size, eps) -> None:
    g = torch.Generator().manual_seed(seed)
    rewards = torch.randint(0, 4, (groups * group_size,), generator=g).to(F64) / 4
    ours = grpo.group_zscore(rewards, group_size, eps=eps).tolist()
    values = rewards.tolist()
    for k in range(groups):
        group = values[k * group_size : (k + 1) * group_size]
        mean, std = statistics.fmean(group), statistics.stdev(group)
        for j, r in enumerate(group):
            expected = 0.0 if std == 0 else (r - mean) / (std + eps)
            assert abs(ours[k * group_size + j] - expected) <= 1e-12
