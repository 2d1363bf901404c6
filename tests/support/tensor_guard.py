"""Test guards for O(L) attention memory: no dense mask builder runs, and no op returns an ``L x L`` tensor."""

from __future__ import annotations

import torch
from torch.utils._python_dispatch import TorchDispatchMode


class LargestTensors(TorchDispatchMode):
    """Records the shape of every tensor an op returns (forward and backward)."""

    def __init__(self) -> None:
        super().__init__()
        self.shapes: list[tuple[int, ...]] = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        for value in out if isinstance(out, tuple | list) else (out,):
            if isinstance(value, torch.Tensor):
                self.shapes.append(tuple(value.shape))
        return out

    def assert_no_square(self, length: int) -> None:
        """No tensor with two dimensions of ``length`` and none of ``length²/4`` elements or more."""
        squares = [s for s in self.shapes if list(s).count(length) >= 2]
        largest = max(self.shapes, key=lambda s: torch.Size(s).numel())
        assert not squares, f"[L, L]-shaped tensors: {squares[:3]}"
        assert torch.Size(largest).numel() < length * length / 4, f"largest tensor {largest}"


def forbid_dense_masks(monkeypatch) -> None:
    """Make ``grpo.block_causal_mask`` and transformers' own ``[B, 1, L, L]`` mask builders raise."""
    from transformers.masking_utils import ALL_MASK_ATTENTION_FUNCTIONS

    import grpo

    def forbidden(*args, **kwargs):
        raise AssertionError("a dense attention mask was built")

    monkeypatch.setattr(grpo, "block_causal_mask", forbidden)
    monkeypatch.setattr(grpo.packing, "block_causal_mask", forbidden)
    for name in ("sdpa", "eager"):
        monkeypatch.setitem(ALL_MASK_ATTENTION_FUNCTIONS._global_mapping, name, forbidden)
