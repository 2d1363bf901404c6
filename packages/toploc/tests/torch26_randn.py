"""Re-create torch 2.6's CPU ``randn(..., dtype=torch.bfloat16)`` to regenerate the golden activations.

The golden vectors (``toploc_golden.json``) were made with torch 2.6, whose CPU normal
sampler for bf16 (``normal_fill`` in ATen's DistributionTemplates.h) drew 8-bit uniforms
into bf16 storage and ran Box-Muller in bf16-rounded steps; newer torch samples in
fp32 and rounds, so the same seed gives different tensors. This module emulates the
old sampler from the raw mt19937 stream (numpy's legacy ``RandomState`` seeds
mt19937 exactly like ``torch.manual_seed``); ``act_sha256`` in the golden file
confirms the emulation bit for bit.
"""

from __future__ import annotations

import math

import numpy as np
import torch


class Torch26BF16Normal:
    """Stateful emulation of successive ``torch.randn(n, dtype=bf16)`` calls after ``manual_seed(seed)``."""

    def __init__(self, seed: int) -> None:
        self._bits = np.random.RandomState(seed)._bit_generator  # mt19937, init_genrand(seed)

    def _random32(self, n: int) -> np.ndarray:
        return self._bits.random_raw(n).astype(np.uint32)

    def randn(self, *shape: int) -> torch.Tensor:
        n = math.prod(shape)
        if n < 16 or n % 16:
            raise NotImplementedError("only sizes that are multiples of 16 are emulated")
        bf = _round_bf16
        uniform = bf((self._random32(n) & 0xFF).astype(np.float32) / np.float32(256.0))
        data = uniform.reshape(-1, 16)
        u1 = bf(np.float32(1.0) - data[:, :8])
        u2 = data[:, 8:]
        # c10::BFloat16 math: every operation computes in fp32 and rounds to bf16.
        # glibc's float log/cos/sin are (nearly) correctly rounded; numpy's float32 SIMD
        # versions are not, so evaluate in float64 and round.
        radius = bf(np.sqrt(bf(np.float32(-2.0) * bf(_f32(np.log, u1)))))
        theta = bf((2.0 * math.pi) * u2.astype(np.float64))
        first = bf(radius * bf(_f32(np.cos, theta)))
        second = bf(radius * bf(_f32(np.sin, theta)))
        out = np.concatenate([first, second], axis=1).reshape(shape)
        return torch.from_numpy(out.astype(np.float32)).to(torch.bfloat16)


def _f32(function, values: np.ndarray) -> np.ndarray:
    return function(np.asarray(values, dtype=np.float64)).astype(np.float32)


def _round_bf16(values: np.ndarray) -> np.ndarray:
    return torch.from_numpy(np.asarray(values, dtype=np.float32)).to(torch.bfloat16).float().numpy()
