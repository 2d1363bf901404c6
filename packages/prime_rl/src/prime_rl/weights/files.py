"""Policy weights as one safetensors file: written by the trainer, loaded in place elsewhere.

The file (:data:`prime_rl.weights.layout.POLICY_FILENAME` in a version folder) holds the model's
full state dict (no optimizer state) in the dtype the caller asks for; it is the unit that
shardcast publishes as a policy version. Loading copies tensors into the existing parameters (``Tensor.copy_``), so a generation backend keeps its module objects, device
placement and any compiled graphs across versions (hot reload).

Pitfall: ``safetensors`` refuses tensors that share storage (tied embeddings). ``save_policy``
writes each storage once under its first name and ``load_policy_into`` restores tied names from it.
"""

from __future__ import annotations

from pathlib import Path

import torch
from safetensors import SafetensorError
from safetensors.torch import load_file, save_file

from prime_rl.durable import atomic_path

__all__ = ["WeightsMismatchError", "load_policy_into", "save_policy"]


class WeightsMismatchError(ValueError):
    """The safetensors file does not match the model (missing/unexpected names, shape or dtype kind)."""


def _unique_state(state: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """Drop names whose tensor shares storage with an earlier name (tied weights)."""
    seen: set[tuple[int, int, tuple[int, ...]]] = set()
    unique: dict[str, torch.Tensor] = {}
    for name, tensor in state.items():
        key = (tensor.untyped_storage().data_ptr(), int(tensor.storage_offset()), tuple(tensor.shape))
        if key in seen:
            continue
        seen.add(key)
        unique[name] = tensor
    return unique


def save_policy(
    state: dict[str, torch.Tensor],
    path: str | Path,
    *,
    dtype: torch.dtype | None = None,
    metadata: dict[str, str] | None = None,
) -> Path:
    """Write ``state`` (a full, unsharded state dict) to ``path`` atomically.

    ``dtype`` casts floating tensors (e.g. ``torch.bfloat16`` for the INTELLECT-2 broadcast);
    ``None`` keeps each tensor's dtype. The file appears only complete, and durably
    (:func:`prime_rl.durable.atomic_path`).
    """
    path = Path(path)
    tensors = {}
    for name, tensor in _unique_state(state).items():
        tensor = tensor.detach().to("cpu")
        if dtype is not None and tensor.is_floating_point():
            tensor = tensor.to(dtype)
        tensors[name] = tensor.contiguous()
    with atomic_path(path) as temporary:
        save_file(tensors, temporary, metadata=metadata)
    return path


@torch.no_grad()
def load_policy_into(model: torch.nn.Module, path: str | Path) -> None:
    """Copy the tensors of a safetensors file into ``model``'s parameters and buffers in place.

    Values are cast to each parameter's dtype and device. Every parameter must be covered (tied
    parameters may be covered by their first name); unknown names or shape differences raise
    :class:`WeightsMismatchError` before any parameter is touched.
    """
    try:
        loaded = load_file(str(path), device="cpu")
    except (SafetensorError, OSError, ValueError) as exc:
        raise WeightsMismatchError(f"cannot read policy weights {path}: {exc}") from exc
    target = model.state_dict(keep_vars=True)
    unique = _unique_state({k: v.data for k, v in target.items()})
    unexpected = sorted(set(loaded) - set(target))
    missing = sorted(set(unique) - set(loaded))
    if unexpected or missing:
        raise WeightsMismatchError(
            f"{path} does not match the model: missing {missing[:5]} unexpected {unexpected[:5]}"
        )
    for name, tensor in loaded.items():
        if tuple(tensor.shape) != tuple(target[name].shape):
            raise WeightsMismatchError(
                f"{path}: {name} has shape {tuple(tensor.shape)}, model has {tuple(target[name].shape)}"
            )
    for name, tensor in loaded.items():
        target[name].data.copy_(tensor)
