"""The Loss recipe helper: each recipe equals its hand composition of the three axes, micro-batching
with global normalisers reproduces the full batch, metrics match hand counts, bad use raises."""

from __future__ import annotations

import dataclasses
import itertools
import math

import pytest
import torch

import grpo

F64 = torch.float64


def batch(seed: int = 0, rows: int = 6, cols: int = 5):
    g = torch.Generator().manual_seed(seed)
    logprobs = (-torch.rand(rows, cols, generator=g, dtype=F64) * 2).requires_grad_(True)
    old = logprobs.detach() + torch.randn(rows, cols, generator=g, dtype=F64) * 0.4
    adv = torch.randn(rows, generator=g, dtype=F64)
    mask = torch.rand(rows, cols, generator=g) < 0.8
    mask[:, 0] = True
    entropy = torch.rand(rows, cols, generator=g, dtype=F64).requires_grad_(True)
    ref = logprobs.detach() + torch.randn(rows, cols, generator=g, dtype=F64) * 0.1
    inference = old + torch.randn(rows, cols, generator=g, dtype=F64) * 0.3
    return logprobs, old, adv, mask, entropy, ref, inference


def test_recipe_table() -> None:
    # The defaults and their sources (reference §2.3-2.5); a change here is a behaviour change.
    i2 = grpo.RECIPES["intellect2"]
    assert (i2.advantage, i2.objective, i2.eps_low, i2.eps_high, i2.delta) == (
        "group_zscore",
        "ppo_clip",
        0.2,
        0.2,
        4.0,
    )
    assert (i2.aggregation, i2.entropy_coef, i2.kl_coef, i2.std_eps) == ("constant", 0.001, 0.0, 1e-6)
    assert grpo.RECIPES["dapo"].eps_high == 0.28 and grpo.RECIPES["dapo"].aggregation == "token_mean"
    assert (
        grpo.RECIPES["dr_grpo"].advantage == "group_center"
        and grpo.RECIPES["dr_grpo"].aggregation == "constant"
    )
    gspo = grpo.RECIPES["gspo"]
    assert (gspo.objective, gspo.eps_low, gspo.eps_high, gspo.aggregation) == (
        "gspo",
        3e-4,
        4e-4,
        "seq_mean_token_mean",
    )
    assert grpo.RECIPES["grpo"].kl_coef == 0.04 and grpo.RECIPES["cispo"].is_cap == 5.0


def manual(recipe: str, logprobs, old, adv, mask, entropy, ref, constant=None, **norm):
    """Hand composition of each recipe from the public pure functions."""
    if recipe == "intellect2":
        per_token = grpo.ppo_clip(logprobs, old, adv, mask, delta=4.0) + grpo.entropy_bonus(
            entropy, mask, coef=0.001
        )
        return grpo.aggregate(per_token, mask, "constant", constant=constant, **norm)
    if recipe == "grpo":
        per_token = grpo.ppo_clip(logprobs, old, adv, mask) + 0.04 * grpo.kl_k3(logprobs, ref, mask)
        return grpo.aggregate(per_token, mask, "seq_mean_token_mean", **norm)
    if recipe == "dr_grpo":
        return grpo.aggregate(
            grpo.ppo_clip(logprobs, old, adv, mask), mask, "constant", constant=constant, **norm
        )
    if recipe == "dapo":
        return grpo.aggregate(
            grpo.ppo_clip(logprobs, old, adv, mask, eps_high=0.28), mask, "token_mean", **norm
        )
    if recipe == "gspo":
        per_token = grpo.gspo(logprobs, old, adv, mask, eps_low=3e-4, eps_high=4e-4)
        return grpo.aggregate(per_token, mask, "seq_mean_token_mean", **norm)
    if recipe == "sapo":
        per_token = grpo.sapo(logprobs, old, adv, mask, tau_pos=1.0, tau_neg=1.05)
        return grpo.aggregate(per_token, mask, "seq_mean_token_mean", **norm)
    assert recipe == "cispo", recipe
    return grpo.aggregate(grpo.cispo(logprobs, old, adv, mask, is_cap=5.0), mask, "token_mean", **norm)


@pytest.mark.parametrize("recipe", sorted(grpo.RECIPES))
def test_recipe_equals_hand_composition(recipe: str) -> None:
    logprobs, old, adv, mask, entropy, ref, _ = batch()
    loss_fn = grpo.Loss(recipe, constant=16)
    out = loss_fn(logprobs, old, adv, mask, entropy=entropy, ref_logprobs=ref)
    expected = manual(recipe, logprobs, old, adv, mask, entropy, ref, constant=16)
    torch.testing.assert_close(out.loss, expected, rtol=0, atol=1e-12)
    got = torch.autograd.grad(out.loss, (logprobs, entropy), allow_unused=True, materialize_grads=True)
    want = torch.autograd.grad(expected, (logprobs, entropy), allow_unused=True, materialize_grads=True)
    for a, b in zip(got, want, strict=True):
        torch.testing.assert_close(a, b, rtol=0, atol=1e-12)
    assert not any(torch.equal(g, torch.zeros_like(g)) for g in got[:1])  # the policy gets a gradient


@pytest.mark.parametrize("recipe", sorted(grpo.RECIPES))
@pytest.mark.parametrize("cuts", [(2,), (1, 3, 4), (5,)])
def test_micro_batches_sum_to_the_full_batch(recipe: str, cuts: tuple[int, ...]) -> None:
    # The trainer's contract: per micro-batch call with the step's global normalisers, summed
    # losses and accumulated gradients equal one call on the whole batch.
    logprobs, old, adv, mask, entropy, ref, _ = batch(seed=1)
    loss_fn = grpo.Loss(recipe)
    norm = {"num_tokens": int(mask.sum()), "num_seqs": int((mask.sum(1) > 0).sum()), "constant": 8}
    full = loss_fn(logprobs, old, adv, mask, entropy=entropy, ref_logprobs=ref, **norm).loss
    full_grads = torch.autograd.grad(full, (logprobs, entropy), allow_unused=True, materialize_grads=True)
    total = torch.zeros((), dtype=F64)
    grads = [torch.zeros_like(logprobs), torch.zeros_like(entropy)]
    bounds = [0, *cuts, logprobs.shape[0]]
    for start, stop in itertools.pairwise(bounds):
        lp = logprobs.detach()[start:stop].requires_grad_(True)
        ent = entropy.detach()[start:stop].requires_grad_(True)
        part = loss_fn(
            lp,
            old[start:stop],
            adv[start:stop],
            mask[start:stop],
            entropy=ent,
            ref_logprobs=ref[start:stop],
            **norm,
        ).loss
        g = torch.autograd.grad(part, (lp, ent), allow_unused=True, materialize_grads=True)
        total = total + part.detach()
        grads[0][start:stop] += g[0]
        grads[1][start:stop] += g[1]
    torch.testing.assert_close(total, full.detach(), rtol=0, atol=1e-12)
    for a, b in zip(grads, full_grads, strict=True):
        torch.testing.assert_close(a, b, rtol=0, atol=1e-12)


def test_metrics_hand_counts() -> None:
    # Four valid tokens (one pad): r = e^0.5 with Â > 0 (high-clipped), e^−0.5 with Â < 0 (low-clipped),
    # e^2 with Â < 0 (δ-capped, δ = 4 < 7.39), 1 with Â > 0 (untouched).
    logprobs = torch.tensor([[0.5, -0.5, 2.0, 0.0, 9.0]], dtype=F64, requires_grad=True)
    old = torch.zeros(1, 5, dtype=F64)
    adv = torch.tensor([[1.0, -1.0, -1.0, 1.0, 1.0]], dtype=F64)
    mask = torch.tensor([[1, 1, 1, 1, 0]], dtype=torch.bool)
    inference = torch.tensor([[0.0, 0.0, 0.0, math.log(2), 0.0]], dtype=F64)
    out = grpo.Loss("intellect2", entropy_coef=0.0)(
        logprobs, old, adv, mask, inference_logprobs=inference, constant=5
    )
    m = out.metrics
    assert (m.clip_low_fraction, m.clip_high_fraction, m.delta_capped_fraction) == (0.25, 0.25, 0.25)
    assert m.num_tokens == 4
    assert math.isclose(m.mean_ratio, (math.exp(0.5) + math.exp(-0.5) + math.exp(2) + 1) / 4, abs_tol=1e-12)
    # Per-token L: −1.2, +0.8, +4, −1 -> S = 2.6; constant: S/(1 row · 5) = 0.52.
    assert math.isclose(out.loss.item(), 0.52, abs_tol=1e-12) and math.isclose(
        m.policy_loss, 0.52, abs_tol=1e-12
    )
    # mismatch KL: k3 with x = ℓ_old − ℓ^μ = −ln 2 on one token: 0.5 + ln 2 − 1 = 0.19315, mean over 4.
    assert math.isclose(m.mismatch_kl, (0.5 + math.log(2) - 1) / 4, abs_tol=1e-12)
    assert m.kl is None and m.entropy is None and m.is_masked_fraction is None
    assert m.as_dict()["clip_ratio/high_mean"] == 0.25 and "kl" not in m.as_dict()
    with pytest.raises(dataclasses.FrozenInstanceError):
        out.loss = torch.zeros(())  # type: ignore[misc]


@pytest.mark.parametrize("mode", ["token_truncate", "sequence_truncate", "token_mask", "sequence_mask"])
def test_is_correction_multiplies_detached_weights(mode: str) -> None:
    logprobs, old, adv, mask, _, _, inference = batch(seed=2)
    level = mode.split("_")[0]
    if mode.endswith("truncate"):
        weights = grpo.truncated_is_weights(old, inference, mask, cap=2.0, level=level)  # type: ignore[arg-type]
    else:
        weights = grpo.masked_is_weights(old, inference, mask, low=0.5, high=2.0, level=level)  # type: ignore[arg-type]
    out = grpo.Loss("dapo", is_correction=mode)(logprobs, old, adv, mask, inference_logprobs=inference)
    expected = grpo.aggregate(
        weights * grpo.ppo_clip(logprobs, old, adv, mask, eps_high=0.28), mask, "token_mean"
    )
    torch.testing.assert_close(out.loss, expected, rtol=0, atol=1e-12)
    if mode.endswith("mask"):
        assert out.metrics.is_masked_fraction == float(((weights == 0) & mask).sum()) / int(mask.sum())


def test_advantages_follow_the_recipe() -> None:
    rewards = torch.tensor([1.0, 0.0, 0.0, 0.0], dtype=F64)
    torch.testing.assert_close(grpo.Loss("dr_grpo").advantages(rewards, 4), grpo.group_center(rewards, 4))
    torch.testing.assert_close(grpo.Loss("intellect2").advantages(rewards, 4), grpo.group_zscore(rewards, 4))
    torch.testing.assert_close(
        grpo.Loss("dapo", advantage="rloo").advantages(rewards, 4), grpo.rloo(rewards, 4)
    )


@pytest.mark.parametrize(
    ("make", "message"),
    [
        (lambda: grpo.Loss("ppo"), "unknown recipe"),
        (lambda: grpo.Loss("dapo", epsilon_high=0.3), "unknown LossConfig fields"),
        (lambda: grpo.Loss("intellect2", delta=1.1), "delta must be > 1 \\+ eps_high"),
        (lambda: grpo.Loss("gspo", delta=4.0), "ppo_clip objective only"),
        (lambda: grpo.Loss("dapo", aggregation="mean"), "unknown aggregation"),
        (lambda: grpo.Loss("dapo", eps_low=1.5), "eps_low"),
        (lambda: grpo.Loss("cispo", is_cap=-1.0), "is_floor < is_cap"),
        (lambda: grpo.Loss("dapo", is_correction="token_mask", is_low=3.0), "low < high"),
        (lambda: grpo.Loss("dapo", is_correction="sequence_truncate", is_threshold=0.0), "cap"),
        (lambda: grpo.Loss("dapo", is_correction="bogus"), "is_correction"),
    ],
)
def test_bad_configs_raise_at_construction(make, message: str) -> None:
    with pytest.raises(grpo.GrpoError, match=message):
        make()


def test_missing_inputs_raise_instead_of_dropping_terms() -> None:
    logprobs, old, adv, mask, entropy, _, _ = batch()
    with pytest.raises(grpo.GrpoError, match="needs entropy"):
        grpo.Loss("intellect2", constant=8)(logprobs, old, adv, mask)
    with pytest.raises(grpo.GrpoError, match="needs constant"):
        grpo.Loss("intellect2")(logprobs, old, adv, mask, entropy=entropy)
    with pytest.raises(grpo.GrpoError, match="needs ref_logprobs"):
        grpo.Loss("grpo")(logprobs, old, adv, mask)
    with pytest.raises(grpo.GrpoError, match="needs inference_logprobs"):
        grpo.Loss("dapo", is_correction="token_truncate")(logprobs, old, adv, mask)
    with pytest.raises(grpo.GrpoError, match="shape"):
        grpo.Loss("dapo")(logprobs, old[:, :2], adv, mask)
    with pytest.raises(grpo.GrpoError, match="0 and 1"):
        grpo.Loss("dapo")(logprobs, old, adv, mask.to(F64) * 0.5)
    with pytest.raises(grpo.GrpoError, match="num_tokens"):
        grpo.Loss("dapo")(logprobs, old, adv, mask, num_tokens=0)
