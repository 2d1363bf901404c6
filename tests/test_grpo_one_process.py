"""examples/grpo_one_process.py: the one-process GRPO loop on the tiny in-code Llama.

The loss of a fixed batch is recomputed here from first principles (plain torch: log-softmax,
entropy, z-scored advantages, the two-sided clipped ratio, the constant normaliser), in float64,
for both optimizer steps of a policy step, the second of which sees r ≠ 1 and clipping.
"""

from __future__ import annotations

import copy
import dataclasses
import sys
import threading
from argparse import Namespace
from collections import Counter
from pathlib import Path
from typing import Any

import pytest
import torch
from tiny_lm import make_tiny_lm, make_tiny_tokenizer

import grpo
import verifiers

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "examples"))
import grpo_one_process as example

EPS, DELTA, ENTROPY_COEF = 0.2, 4.0, 0.001  # the intellect2 recipe (grpo.RECIPES["intellect2"])


def tiny_policy() -> tuple[Any, Any]:
    return make_tiny_lm(seed=0, dtype=torch.float64), make_tiny_tokenizer()


def args_for(*extra: str) -> Namespace:
    return example.parse_args(
        ["--group-size", "4", "--max-new-tokens", "12", "--prompt-template", "{prompt}", *extra]
    )


def fixed_batch(model, tokenizer, args) -> tuple[example.Rollouts, torch.Tensor]:
    """Two prompts of different lengths x 4 samples; group 0 rewarded [1, 0, 0, 1], group 1 all 0."""
    tasks = verifiers.arithmetic_tasks(2, seed=3, digits=(1, 2), template="{expression} =")
    assert len({len(t.prompt) for t in tasks}) == 2  # so the batch has real left padding
    torch.manual_seed(1)
    rollouts = example.sample(model, tokenizer, tasks, args, group_size=4, temperature=1.0)
    return rollouts, torch.tensor([1.0, 0.0, 0.0, 1.0, 0.0, 0.0, 0.0, 0.0], dtype=torch.float64)


def reference_logprobs(model, rollouts, rows, temperature):
    """Per row: strip the left padding, run the model on prompt + completion alone, and read
    log softmax(z / T) of each completion token and the entropy there. No padding, no position ids."""
    width = rollouts.completion_mask.shape[1]
    logprobs, entropies = [], []
    for row in rows.tolist():
        ids = rollouts.input_ids[row][rollouts.attention_mask[row].bool()][None]
        logits = model(input_ids=ids).logits[0, -width - 1 : -1] / temperature
        logp = torch.log_softmax(logits, -1)
        logprobs.append(logp.gather(-1, ids[0, -width:, None]).squeeze(-1))
        entropies.append(-(logp.exp() * logp).sum(-1))
    return torch.stack(logprobs), torch.stack(entropies)


def test_training_logprobs_equal_an_unpadded_forward():
    """Left padding must not move positions: the loop's batched log-probs (and entropies) at a
    temperature ≠ 1 equal a per-row forward without any padding."""
    model, tokenizer = tiny_policy()
    args = args_for()
    rollouts, _ = fixed_batch(model, tokenizer, args)
    rows = torch.arange(8)
    with torch.no_grad():
        got, got_entropy = example.completion_logprobs(model, rollouts, rows, 0.7, entropy=True)
        want, want_entropy = reference_logprobs(model, rollouts, rows, 0.7)
    mask = rollouts.completion_mask
    assert got_entropy is not None
    torch.testing.assert_close(got[mask], want[mask], rtol=0, atol=1e-10)
    torch.testing.assert_close(got_entropy[mask], want_entropy[mask], rtol=0, atol=1e-10)


def test_completion_ends_at_its_first_stop_token():
    """Tokens after the first "\\n" (or EOS) are not the completion's: not in the mask, not in the text."""
    model, tokenizer = tiny_policy()
    args = args_for()
    rollouts, _ = fixed_batch(model, tokenizer, args)
    width = rollouts.completion_mask.shape[1]
    stopped = 0
    for row, keep, text in zip(
        rollouts.input_ids[:, -width:], rollouts.completion_mask, rollouts.texts, strict=True
    ):
        chars = tokenizer.convert_ids_to_tokens(row.tolist())
        end = next((i for i, c in enumerate(chars) if c in ("\n", "</s>")), width - 1)
        assert keep.tolist() == [i <= end for i in range(width)]
        assert text == tokenizer.decode(row[: end + 1], skip_special_tokens=True)
        stopped += end < width - 1
    assert stopped > 0  # the sample really contains stops (else this test checks nothing)


def test_one_policy_step_matches_the_hand_computed_loss():
    """Two optimizer steps on the fixed batch; every reported number against first principles.

    Group 0: r = [1, 0, 0, 1], mean 1/2, sample std sqrt(1/3), so Â = ±(1/2)/(sqrt(1/3) + 1e-6);
    group 1: all 0, so Â = 0 and its rows are dropped. Kept rows 0..3 split into minibatches [0, 1]
    and [2, 3]. Per token: ρ₁ = min(r, δ), ρ₂ = clip(ρ₁, 1 − ε, 1 + ε), L = max(−ρ₁Â, −ρ₂Â) − α·H;
    loss = Σ_valid L / (rows · C) with C = max_new_tokens. r = 1 on the first minibatch; the second
    comes after one large SGD step (SGD, not Adam: Adam's first step g/(|g| + ε) would amplify
    rounding differences near g = 0), so its ratios leave the clip band.
    """
    model, tokenizer = tiny_policy()
    args = args_for("--minibatches", "2", "--max-grad-norm", "1.0", "--temperature", "0.7")
    rollouts, rewards = fixed_batch(model, tokenizer, args)
    reference = copy.deepcopy(model)
    lr = 20.0
    updates = example.grpo_update(
        model, torch.optim.SGD(model.parameters(), lr=lr), grpo.Loss("intellect2"), rollouts, rewards, args
    )

    a = 0.5 / (3**-0.5 + 1e-6)
    advantages = torch.tensor([a, -a, -a, a], dtype=torch.float64)
    C = float(args.max_new_tokens)
    ref_optimizer = torch.optim.SGD(reference.parameters(), lr=lr)
    with torch.no_grad():
        old, _ = reference_logprobs(reference, rollouts, torch.arange(4), args.temperature)
    assert [u.samples for u in updates] == [2, 2]
    assert rollouts.completion_mask[:4].sum(1).tolist() == [
        12,
        12,
        5,
        12,
    ]  # row 2 stopped early: masking counts
    for k, rows in enumerate([torch.tensor([0, 1]), torch.tensor([2, 3])]):
        logprobs, entropy = reference_logprobs(reference, rollouts, rows, args.temperature)
        mask = rollouts.completion_mask[rows]
        ratio = torch.exp(logprobs - old[rows])
        rho1 = ratio.clamp(max=DELTA)
        rho2 = rho1.clamp(1 - EPS, 1 + EPS)
        adv = advantages[rows, None].expand_as(ratio)
        per_token = torch.maximum(-rho1 * adv, -rho2 * adv) - ENTROPY_COEF * entropy
        loss = torch.where(mask, per_token, 0.0).sum() / (len(rows) * C)
        r, signs = ratio.detach()[mask], adv[mask]
        clipped = ((r > 1 + EPS) & (signs > 0)) | ((r < 1 - EPS) & (signs < 0))
        x = (logprobs.detach() - old[rows])[mask]  # approx-KL: k3 = e^x − x − 1, x = ℓ − ℓ_old
        assert updates[k].loss == pytest.approx(loss.item(), rel=1e-9, abs=1e-12)
        assert updates[k].clip_fraction == pytest.approx(float(clipped.double().mean()), abs=1e-12)
        assert updates[k].capped_fraction == pytest.approx(float((r > DELTA).double().mean()), abs=1e-12)
        assert updates[k].approx_kl == pytest.approx(float((x.exp() - x - 1).mean()), rel=1e-9, abs=1e-15)
        assert updates[k].tokens == int(mask.sum())
        ref_optimizer.zero_grad()
        loss.backward()
        torch.nn.utils.clip_grad_norm_(reference.parameters(), args.max_grad_norm)
        ref_optimizer.step()
    assert updates[0].clip_fraction == 0 and updates[0].approx_kl == pytest.approx(0, abs=1e-15)  # r ≡ 1
    assert updates[1].clip_fraction > 0  # the oracle covered the clipped branch too
    for got, want in zip(model.parameters(), reference.parameters(), strict=True):
        torch.testing.assert_close(got, want, rtol=0, atol=1e-10)


def test_a_zero_advantage_group_contributes_nothing():
    """A policy step on both groups (group 1 all 0, so Â = 0) leaves exactly the weights of a step on
    group 0 alone: no gradient, no entropy bonus, no share of the normaliser."""
    model, tokenizer = tiny_policy()
    args = args_for("--minibatches", "1")
    rollouts, rewards = fixed_batch(model, tokenizer, args)
    group0 = dataclasses.replace(
        rollouts,
        input_ids=rollouts.input_ids[:4],
        attention_mask=rollouts.attention_mask[:4],
        completion_mask=rollouts.completion_mask[:4],
    )
    finals = []
    for batch, batch_rewards in ((rollouts, rewards), (group0, rewards[:4])):
        policy = copy.deepcopy(model)
        optimizer = torch.optim.AdamW(policy.parameters(), lr=1e-2)
        (update,) = example.grpo_update(
            policy, optimizer, grpo.Loss("intellect2"), batch, batch_rewards, args
        )
        finals.append((update, torch.cat([p.detach().flatten() for p in policy.parameters()])))
    (both, weights_both), (alone, weights_alone) = finals
    assert both.samples == alone.samples == 4 and both.tokens == alone.tokens
    assert both.loss == pytest.approx(alone.loss, rel=1e-12)
    torch.testing.assert_close(weights_both, weights_alone, rtol=0, atol=1e-12)
    assert not torch.equal(weights_alone, torch.cat([p.flatten() for p in model.parameters()]))


def test_the_loop_trains_on_rewards_from_the_verifier(capsys):
    """Three steps of `train`: every reward comes from verifiers' registry (a registered task type
    whose verifier records each call), the reported reward means are theirs, and the weights move."""
    calls: list[tuple[str, float]] = []
    lock = threading.Lock()

    def even_length(task: verifiers.Task, completion: str) -> verifiers.Score:
        reward = float(len(completion) % 2 == 0)  # a reward the random model earns about half the time
        with lock:
            calls.append((task.prompt, reward))
        return verifiers.Score(reward, {})

    verifiers.register_verifier("test_grpo_one_process_even", even_length, replace=True)
    tasks = [
        dataclasses.replace(task, task_type="test_grpo_one_process_even")
        for task in verifiers.arithmetic_tasks(20, seed=0, template="{expression} =")
    ]
    model, tokenizer = make_tiny_lm(seed=0), make_tiny_tokenizer()
    before = [p.detach().clone() for p in model.parameters()]
    args = example.parse_args(["--steps", "3", "--prompts", "2", "--group-size", "4", "--eval-every", "0"])
    logs = example.train(model, tokenizer, tasks, args, held_out=[])
    printed = capsys.readouterr().out

    assert [log.step for log in logs] == [1, 2, 3] and len(calls) == 3 * 2 * 4
    for log, start in zip(logs, range(0, len(calls), 8), strict=True):
        step_calls = calls[start : start + 8]  # verify_batch finishes before the update starts
        assert sorted(Counter(prompt for prompt, _ in step_calls).values()) == [4, 4]  # 2 groups of 4
        assert log.reward_mean == pytest.approx(sum(r for _, r in step_calls) / 8, abs=1e-7)
        assert f"step {log.step:3d} | reward {log.reward_mean:.3f} | kept {log.kept:3d}/8" in printed
    assert sum(log.kept for log in logs) > 0 and all(u.tokens > 0 for log in logs for u in log.updates)
    assert all(len(log.updates) == min(2, log.kept) for log in logs)  # --minibatches 2 by default
    assert any(not torch.equal(a, b) for a, b in zip(before, model.parameters(), strict=True))
