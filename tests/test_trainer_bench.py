"""benchmarks/trainer_bench.py's ``dense`` variant runs the trainer's step under a real dense mask.

The variant stands in for what ``prime_rl.trainer.forward`` calls (issue #36: it once patched
``grpo.document_kwargs``, which the trainer no longer calls, so no ``grpo.block_causal_mask`` was
built and, for plain documents, transformers' own mask from the restarting position ids hid it).
Checked in fp64 on CPU with a tiny Qwen2: the dense step's loss and gradients equal the trainer's
own (document / shared-prefix attention: the same rule, another implementation) and differ from
plain causal attention over the packed row; SDPA receives the additive mask of the row's rule.
"""

from __future__ import annotations

import math
import sys
from contextlib import contextmanager, nullcontext
from pathlib import Path

import pytest
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))

import trainer_bench

import grpo
from prime_rl.api.protocol import TrainSample
from prime_rl.trainer.batching import make_micro_batches
from prime_rl.trainer.step import train_minibatch

SHAPE = {"hidden": 32, "layers": 2, "heads": 4, "kv_heads": 2, "intermediate": 64, "vocab": 97}
ROW_TOKENS = 4096  # every sample in one row


def _samples() -> list[TrainSample]:
    """Two GRPO groups (4 completions of a 12-token prompt, 3 of a 7-token one) and a lone sample."""
    g = torch.Generator().manual_seed(0)
    layout = [(12, (5, 9, 6, 8)), (7, (4, 7, 5)), (10, (6,))]
    samples: list[TrainSample] = []
    for task, (prompt_length, completion_lengths) in enumerate(layout):
        prompt = torch.randint(0, SHAPE["vocab"], (prompt_length,), generator=g).tolist()
        for member, length in enumerate(completion_lengths):
            samples.append(
                TrainSample(
                    sample_id=f"b/{len(samples)}", batch_id="b", worker_id="w", task_id=task,
                    group_index=member, policy_version=0, prompt_tokens=prompt,
                    completion_tokens=torch.randint(0, SHAPE["vocab"], (length,), generator=g).tolist(),
                    # near a random model's log-probs: ratios near 1, so no token is clipped to zero grad
                    behaviour_logprobs=[-math.log(SHAPE["vocab"])] * length, temperature=1.0,
                    reward=float(member % 2), advantage=(-1.0) ** member,
                )
            )  # fmt: skip
    return samples


@contextmanager
def _plain_causal():
    """The trainer's attention with the whole row as one segment: causal across the documents."""
    saved = grpo.shared_prefix_kwargs

    def one_segment(structure):
        return saved(grpo.SharedPrefixStructure((0, structure.length), (0,)))

    grpo.shared_prefix_kwargs = one_segment
    try:
        yield
    finally:
        grpo.shared_prefix_kwargs = saved


def _step(share_prompts: bool, context) -> tuple[float, list[torch.Tensor]]:
    """One trainer step (fp64, no update: lr 0) -> the loss and every parameter's gradient."""
    model = trainer_bench.qwen2_model(SHAPE, 256, torch.float64, "cpu")  # seeded: same weights each call
    micro = make_micro_batches(_samples(), ROW_TOKENS, share_prompts=share_prompts)
    assert len(micro) == 1
    assert micro[0].structure.has_suffixes == share_prompts
    with context:
        metrics = train_minibatch(
            model, torch.optim.SGD(model.parameters(), lr=0.0), micro, None, grpo.Loss("grpo", kl_coef=0.0),
            temperature=1.0, constant=None, max_grad_norm=1e9, device=torch.device("cpu"),
        )  # fmt: skip
    return metrics.loss, [p.grad.clone() for p in model.parameters()]


@pytest.mark.parametrize("share_prompts", [True, False], ids=["shared-prompts", "plain-documents"])
def test_dense_step_equals_the_trainer_step_and_not_causal(share_prompts: bool) -> None:
    document_loss, document_grads = _step(share_prompts, nullcontext())
    dense_loss, dense_grads = _step(share_prompts, trainer_bench.dense_mask_attention(torch.float64))
    causal_loss, causal_grads = _step(share_prompts, _plain_causal())

    assert dense_loss == pytest.approx(document_loss, rel=1e-12, abs=1e-14)
    for dense, document in zip(dense_grads, document_grads, strict=True):
        torch.testing.assert_close(dense, document, rtol=1e-10, atol=1e-13)
    # The rule matters here: attending across documents moves the loss and the gradients.
    assert abs(causal_loss - document_loss) > 1e-6 * abs(document_loss)
    largest = max(float((c - d).abs().max()) for c, d in zip(causal_grads, document_grads, strict=True))
    assert largest > 1e-4 * max(float(d.abs().max()) for d in document_grads)


def _rule(structure: grpo.SharedPrefixStructure) -> torch.Tensor:
    """``[L, L]`` bool, token by token from SharedPrefixStructure's docstring: ``i`` sees ``j`` iff
    ``j <= i`` and both lie in one segment or ``j`` lies in the prefix of ``i``'s group."""
    segment = [
        s
        for s in range(len(structure.prefix_of))
        for _ in range(structure.bounds[s], structure.bounds[s + 1])
    ]
    length = structure.length
    return torch.tensor(
        [
            [
                j <= i and (segment[i] == segment[j] or segment[j] == structure.prefix_of[segment[i]])
                for j in range(length)
            ]
            for i in range(length)
        ]
    )


@pytest.mark.parametrize("share_prompts", [True, False], ids=["shared-prompts", "plain-documents"])
def test_dense_step_builds_block_causal_mask_and_sdpa_gets_it(share_prompts: bool, monkeypatch) -> None:
    built, masks = [], []
    block_causal_mask, sdpa = grpo.block_causal_mask, torch.nn.functional.scaled_dot_product_attention

    def spy_mask(*args, **kwargs):
        built.append(args[0])
        return block_causal_mask(*args, **kwargs)

    def spy_sdpa(query, key, value, attn_mask=None, *args, **kwargs):
        masks.append(attn_mask)
        return sdpa(query, key, value, attn_mask, *args, **kwargs)

    monkeypatch.setattr(grpo, "block_causal_mask", spy_mask)
    monkeypatch.setattr(torch.nn.functional, "scaled_dot_product_attention", spy_sdpa)
    _step(share_prompts, trainer_bench.dense_mask_attention(torch.float64))

    structure = make_micro_batches(_samples(), ROW_TOKENS, share_prompts=share_prompts)[0].structure
    assert len(built) == 1  # one forward, one mask
    assert len(masks) == SHAPE["layers"]  # every layer's attention got it
    allowed = _rule(structure)
    for mask in masks:
        assert mask is not None
        assert mask.dtype == torch.float64 and mask.shape == (1, 1, structure.length, structure.length)
        assert torch.equal(mask[0, 0] == 0, allowed)
        assert bool((mask[0, 0][~allowed] == torch.finfo(torch.float64).min).all())
