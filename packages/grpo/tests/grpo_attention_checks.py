"""The checks that both packed layouts pass: documents end to end (``test_attention.py``) and
completions sharing their prompt (``test_shared_prefix.py``).

* :func:`assert_packed_equals_separate`: a packed forward equals one forward per sequence, in
  per-sequence log-probs and in the parameter gradients of a weighted sum of them (float64).
* :func:`assert_block_mask_tiles_exact`: a FlexAttention ``BlockMask`` lists exactly the tiles
  the dense rule allows, and marks as *full* exactly those it may skip the mask on.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch

import grpo


def sequence_logprobs(logits: torch.Tensor, tokens: torch.Tensor) -> torch.Tensor:
    return grpo.selective_log_softmax(logits[:-1], tokens[1:])


def assert_packed_equals_separate(
    model: torch.nn.Module,
    packed_logits: Sequence[torch.Tensor],
    sequences: Sequence[torch.Tensor],
    weights: Sequence[torch.Tensor],
) -> None:
    """``packed_logits[i]`` (sequence i's logits unpacked from the packed forward) against ``model(sequences[i])``.

    Log-probs must agree to 1e-12 absolute; the gradients of Σᵢ Σₜ wᵢₜ·ℓᵢₜ to rtol 1e-10.
    """

    def gradients(loss: torch.Tensor) -> dict[str, torch.Tensor]:
        model.zero_grad(set_to_none=True)
        loss.backward()
        return {name: p.grad.clone() for name, p in model.named_parameters()}

    ours = [sequence_logprobs(x, s) for x, s in zip(packed_logits, sequences, strict=True)]
    ours_grads = gradients(sum((lp * w).sum() for lp, w in zip(ours, weights, strict=True)))
    alone = [sequence_logprobs(model(input_ids=s[None]).logits[0], s) for s in sequences]
    alone_grads = gradients(sum((lp * w).sum() for lp, w in zip(alone, weights, strict=True)))
    for mine, reference in zip(ours, alone, strict=True):
        torch.testing.assert_close(mine, reference, rtol=0, atol=1e-12)
    for name, grad in alone_grads.items():
        torch.testing.assert_close(ours_grads[name], grad, rtol=1e-10, atol=1e-12, msg=name)


def assert_block_mask_tiles_exact(mask: Any, allowed: torch.Tensor, block: int) -> None:
    """``mask`` (a ``BlockMask``) against ``allowed`` (the dense ``[L, L]`` rule), tile by tile.

    Per (query tile, key tile): skipped iff no allowed pair; "full" iff the key tile precedes
    the query tile and every pair is allowed (FlexAttention then skips mask_mod); partial otherwise.
    """
    tiles = -(-allowed.shape[0] // block)
    for i in range(tiles):
        partial = set(mask.kv_indices[0, 0, i, : mask.kv_num_blocks[0, 0, i]].tolist())
        full = set(mask.full_kv_indices[0, 0, i, : mask.full_kv_num_blocks[0, 0, i]].tolist())
        assert not partial & full
        for j in range(tiles):
            pairs = allowed[i * block : (i + 1) * block, j * block : (j + 1) * block]
            if not pairs.any():
                assert j not in partial | full, (i, j)
            elif j < i and pairs.all():
                assert j in full, (i, j)
            else:
                assert j in partial, (i, j)
