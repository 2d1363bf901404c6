"""A second device on a CPU-only machine: catches the mixed-device bugs CUDA would raise.

On a GPU, ``logits.gather(-1, tokens)`` with CUDA logits and a CPU ``tokens`` tensor raises
"Expected all tensors to be on the same device". On a CPU-only machine everything is on the CPU,
so the same bug passes every test. :func:`simulated_device` runs real code on real data while
tracking which tensors live on the *compute device*, and raises that error where CUDA would:

- tensors handed to :meth:`SimulatedDevice.place` (a model's parameters and buffers, or a
  backend's outputs) are on the device;
- a factory call with an explicit ``device=`` (``torch.arange(n, device=logits.device)``) and
  ``.to(device)`` / ``.to(other_tensor)`` / ``.cuda()`` put a tensor on the device; ``.cpu()``
  and ``.to("cpu")`` take it off; a factory call without ``device=`` (``torch.tensor(ids)``)
  makes a host tensor, as on a GPU machine;
- an op with a device tensor and a host tensor of one or more dimensions raises
  :class:`MixedDevices` (0-dim host tensors are allowed, as CUDA allows CPU scalars);
  otherwise the op's tensor results are on the device when any input was.

Limits: a ``torch.device`` object is taken as the compute device (on this machine
``logits.device`` *is* ``torch.device("cpu")``); only the string ``"cpu"`` names the host. It guards
the Python-side tensor plumbing; kernels are not simulated.
"""

from __future__ import annotations

import weakref
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any
from unittest.mock import patch

import torch
from torch.overrides import TorchFunctionMode
from torch.utils._pytree import tree_leaves

_FACTORIES = {
    torch.tensor, torch.as_tensor, torch.zeros, torch.ones, torch.empty, torch.full, torch.arange,
    torch.randn, torch.rand, torch.randint, torch.linspace, torch.eye, torch.scalar_tensor,
}  # fmt: skip
_TO_HOST = {torch.Tensor.cpu, torch.Tensor.numpy}
_TO_DEVICE = {torch.Tensor.cuda}
# CUDA accepts host index tensors in indexing and copies across devices: never raised on.
_CROSS_DEVICE_OK = {torch.Tensor.__getitem__, torch.Tensor.__setitem__, torch.Tensor.copy_, torch.Tensor.to}


class MixedDevices(RuntimeError):
    """An op mixed a compute-device tensor with a host tensor (CUDA would raise here)."""


class SimulatedDevice(TorchFunctionMode):
    """The mode behind :func:`simulated_device`; ``place`` marks tensors as on the device."""

    def __init__(self) -> None:
        super().__init__()
        self._refs: dict[int, weakref.ref[torch.Tensor]] = {}  # id -> tensor (tensors compare by value)

    def place(self, obj: torch.nn.Module | torch.Tensor | Any) -> Any:
        """Mark a module's parameters and buffers, or a tensor (or a structure of them): on the device."""
        if isinstance(obj, torch.nn.Module):
            for t in [*obj.parameters(), *obj.buffers()]:
                self._add(t)
        else:
            for t in tree_leaves(obj):
                if isinstance(t, torch.Tensor):
                    self._add(t)
        return obj

    def on_device(self, tensor: torch.Tensor) -> bool:
        ref = self._refs.get(id(tensor))
        return ref is not None and ref() is tensor

    def _add(self, tensor: torch.Tensor) -> None:
        key = id(tensor)
        self._refs[key] = weakref.ref(tensor, lambda _, key=key: self._refs.pop(key, None))

    def __torch_function__(self, func, types, args=(), kwargs=None):  # type: ignore[override]
        kwargs = kwargs or {}
        tensors = [t for t in tree_leaves((args, kwargs)) if isinstance(t, torch.Tensor)]
        device_inputs = [t for t in tensors if self.on_device(t)]
        host_inputs = [t for t in tensors if not self.on_device(t) and t.dim() > 0]
        if device_inputs and host_inputs and func not in _CROSS_DEVICE_OK | _TO_DEVICE:
            shapes = [tuple(t.shape) for t in host_inputs[:3]]
            raise MixedDevices(
                f"Expected all tensors to be on the same device, but {_name(func)} got host tensors "
                f"{shapes} with compute-device ones"
            )
        result = func(*args, **kwargs)
        if (func in _TO_HOST or _is_to(func) or func in _TO_DEVICE) and result is args[0]:
            result = result.view_as(result)  # a no-op move on this machine: a new tensor to mark
        if func in _TO_HOST:
            return result
        if _is_to(func) and (target := _to_target(args, kwargs)) is not None:
            placed = self.on_device(target) if isinstance(target, torch.Tensor) else not _is_host(target)
        elif func in _FACTORIES and kwargs.get("device") is not None:
            placed = not _is_host(kwargs["device"])
        else:
            placed = bool(device_inputs) or func in _TO_DEVICE
        if placed:
            for t in tree_leaves(result):
                if isinstance(t, torch.Tensor):
                    self._add(t)
        return result


def _name(func: Any) -> str:
    return getattr(func, "__qualname__", None) or getattr(func, "__name__", repr(func))


def _is_to(func: Any) -> bool:
    return func is torch.Tensor.to


def _is_host(device: Any) -> bool:
    """A device argument naming the host: the string ``"cpu"`` (``torch.device`` objects such as
    ``logits.device`` count as the compute device; see the module's limits)."""
    return isinstance(device, str) and device.split(":")[0] == "cpu"


def _to_target(args: tuple, kwargs: dict) -> Any:
    if "device" in kwargs:
        return kwargs["device"]
    for a in args[1:]:
        if isinstance(a, (torch.device, str, torch.Tensor)):
            return a
    return None


@contextmanager
def simulated_device() -> Iterator[SimulatedDevice]:
    """``with simulated_device() as dev: dev.place(model); ...`` (see the module docstring).

    toploc's CPU-only native sampler is switched off inside: a compute device runs its torch path.
    """
    mode = SimulatedDevice()
    with patch("toploc.sampling._native_applies", return_value=False), mode:
        yield mode
