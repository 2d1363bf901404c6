"""Llama's and Qwen2's RMSNorm in the dtype of their input, for fp64 equality tests.

Both compute in fp32 even in an fp64 model, and their backward rounds the incoming gradient to
fp32. Where one computation sums a gradient before a norm and its reference sums after it (a
shared prompt token collects the gradients of all G completions; G separate forwards collect G
terms, each rounded), the two differ by ~1e-7 relatively: fp32 rounding, not an error. With this
patch both stay in fp64 and agree to ~1e-12.
"""

from __future__ import annotations

import pytest
import torch


def rms_norm_in_input_dtype(monkeypatch: pytest.MonkeyPatch) -> None:
    """Patch ``LlamaRMSNorm`` and ``Qwen2RMSNorm`` (same formula, no fp32 round trip)."""
    from transformers.models.llama.modeling_llama import LlamaRMSNorm
    from transformers.models.qwen2.modeling_qwen2 import Qwen2RMSNorm

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:
        return (
            self.weight * hidden * torch.rsqrt(hidden.pow(2).mean(-1, keepdim=True) + self.variance_epsilon)
        )

    for norm in (LlamaRMSNorm, Qwen2RMSNorm):
        monkeypatch.setattr(norm, "forward", forward)
