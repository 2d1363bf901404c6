"""Checks of tensor inputs shared by every module: shapes, dtypes, masks, advantages.

Each raises :class:`grpo.ShapeError` with a message that names the argument and says what
was expected.
"""

from __future__ import annotations

import torch

from grpo.errors import ShapeError

__all__ = ["as_bool_mask", "broadcast_advantages", "check_2d", "check_same_shape"]


def check_2d(name: str, tensor: torch.Tensor) -> None:
    """Raise unless ``tensor`` is a floating-point ``[B, T]`` tensor."""
    if not isinstance(tensor, torch.Tensor):
        raise ShapeError(f"{name} must be a torch.Tensor, got {type(tensor).__name__}")
    if tensor.dim() != 2:
        raise ShapeError(f"{name} must have shape [B, T], got {tuple(tensor.shape)}")
    if not tensor.is_floating_point():
        raise ShapeError(f"{name} must be a floating-point tensor, got {tensor.dtype}")


def as_bool_mask(mask: torch.Tensor | None, like: torch.Tensor, name: str = "mask") -> torch.Tensor:
    """Return ``mask`` as a bool tensor shaped like ``like`` (all True when ``mask`` is None).

    Accepts bool masks and numeric 0/1 masks; any other value is an error, because a
    fractional "mask" silently turns into a per-token weight.
    """
    if mask is None:
        return torch.ones(like.shape, dtype=torch.bool, device=like.device)
    if not isinstance(mask, torch.Tensor):
        raise ShapeError(f"{name} must be a torch.Tensor, got {type(mask).__name__}")
    if mask.shape != like.shape:
        raise ShapeError(f"{name} has shape {tuple(mask.shape)} but the log-probs have {tuple(like.shape)}")
    if mask.dtype == torch.bool:
        return mask
    if not bool(((mask == 0) | (mask == 1)).all()):
        raise ShapeError(
            f"{name} must contain only 0 and 1 (or be bool); use a separate weight for fractions"
        )
    return mask != 0


def check_same_shape(reference_name: str, reference: torch.Tensor, **others: torch.Tensor | None) -> None:
    """Raise unless every tensor in ``others`` has ``reference``'s shape."""
    for name, tensor in others.items():
        if tensor is None:
            continue
        if not isinstance(tensor, torch.Tensor):
            raise ShapeError(f"{name} must be a torch.Tensor, got {type(tensor).__name__}")
        if tensor.shape != reference.shape:
            raise ShapeError(
                f"{name} has shape {tuple(tensor.shape)} but {reference_name} has {tuple(reference.shape)}"
            )


def broadcast_advantages(advantages: torch.Tensor, like: torch.Tensor) -> torch.Tensor:
    """Return ``advantages`` (``[B]`` or ``[B, T]``) as ``[B, T]``, detached (advantages are data)."""
    if not isinstance(advantages, torch.Tensor):
        raise ShapeError(f"advantages must be a torch.Tensor, got {type(advantages).__name__}")
    if advantages.dim() == 1 and advantages.shape[0] == like.shape[0]:
        return advantages.detach()[:, None].expand_as(like)
    if advantages.shape == like.shape:
        return advantages.detach()
    raise ShapeError(
        f"advantages must have shape [B]={like.shape[0]} or [B, T]={tuple(like.shape)}, "
        f"got {tuple(advantages.shape)}"
    )
