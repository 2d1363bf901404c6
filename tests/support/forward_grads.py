"""The trainer-forward tests' probe: values and every parameter gradient of ``completion_forward``
under a loss that weighs each log-prob and entropy differently, so that two ways of computing the
forward agree only if every value and every gradient does.

``test_policy_forward.py`` (packed rows, the fused head) and ``test_trainer_shared_prompt.py``
(shared-prompt rows) compare with it, on the CPU and on a CUDA device.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from prime_rl.trainer.forward import completion_forward

CPU = torch.device("cpu")


def loss_weights(logprobs: torch.Tensor) -> torch.Tensor:
    """The probe loss's weights: seeded normal fp64 values of ``logprobs``' shape (drawn on the CPU,
    so every device gets the same ones); the entropies are weighed by their flip along rows."""
    return torch.randn(logprobs.shape, generator=torch.Generator().manual_seed(1), dtype=torch.float64)


def weighted_backward(out: Any) -> None:
    """Backward of the probe loss of a ``completion_forward`` output (log-probs and entropy)."""
    weights = loss_weights(out.logprobs).to(out.logprobs.device)
    (out.logprobs * weights).sum().add((out.entropy * weights.flip(0)).sum()).backward()


def values_and_grads(model: torch.nn.Module, micro: Any, *, fused: bool, temperature: float) -> tuple[Any, dict]:
    """The CPU forward of ``micro`` (with entropy) and the probe loss's gradient of each parameter
    that gets one, by name."""
    model.zero_grad(set_to_none=True)
    out = completion_forward(model, micro, CPU, temperature, entropy=True, fused=fused)
    weighted_backward(out)
    return out, {name: p.grad.clone() for name, p in model.named_parameters() if p.grad is not None}


def assert_cuda_forward_equals_cpu(
    make_model: Callable[[], torch.nn.Module], micro: Any, *, fused: bool, temperature: float = 0.7
) -> None:
    """A model from ``make_model`` (fp32) gives on the CUDA device the values, entropies and parameter
    gradients that its twin gives on the CPU, within fp32 kernel noise."""
    cpu_out, cpu_grads = values_and_grads(make_model(), micro, fused=fused, temperature=temperature)
    model = make_model().cuda()
    model.zero_grad(set_to_none=True)
    out = completion_forward(model, micro, torch.device("cuda"), temperature, entropy=True, fused=fused)
    assert out.logprobs.device.type == "cuda" and out.entropy is not None
    weighted_backward(out)
    torch.testing.assert_close(out.logprobs.cpu(), cpu_out.logprobs, rtol=0, atol=1e-4)
    torch.testing.assert_close(out.entropy.cpu(), cpu_out.entropy, rtol=0, atol=1e-4)
    for name, param in model.named_parameters():
        torch.testing.assert_close(param.grad.cpu(), cpu_grads[name], rtol=1e-3, atol=1e-4, msg=name)
