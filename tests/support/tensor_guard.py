"""A test guard for O(L) memory: record every tensor an op returns, then assert none is ``L x L``."""

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
