"""The config's device and dtype names, resolved to torch objects in one place.

The config stays torch-free, so it names devices (``"auto"``, ``"cpu"``, ``"cuda"``) and dtypes
(``"float32"``, ``"bfloat16"``, ``"float16"``) as strings; every process that builds tensors turns
them into ``torch.device`` / ``torch.dtype`` here (trainer, workers, validator, evaluator, the
generation backend).
"""

from __future__ import annotations

import torch

__all__ = ["DTYPES", "choose_device", "torch_dtype"]

DTYPES: dict[str, torch.dtype] = {
    "float32": torch.float32,
    "bfloat16": torch.bfloat16,
    "float16": torch.float16,
}


def choose_device(setting: str) -> torch.device:
    """``"cpu"`` -> CPU; ``"cuda"`` -> the current CUDA device; ``"auto"`` -> CUDA when available.

    Raises ``ValueError`` for another name, and ``RuntimeError`` for ``"cuda"`` on a machine where
    torch sees no CUDA device (rather than failing later inside the first ``.to()``).
    """
    if setting not in ("auto", "cpu", "cuda"):
        raise ValueError(f"device must be 'auto', 'cpu' or 'cuda', got {setting!r}")
    if setting == "cpu" or (setting == "auto" and not torch.cuda.is_available()):
        return torch.device("cpu")
    if not torch.cuda.is_available():
        raise RuntimeError("device = 'cuda' but torch sees no CUDA device; use 'auto' or 'cpu'")
    return torch.device("cuda", torch.cuda.current_device())


def torch_dtype(name: str) -> torch.dtype:
    """The torch dtype of a config name (``"bfloat16"`` -> ``torch.bfloat16``); ``ValueError`` if unknown."""
    try:
        return DTYPES[name]
    except KeyError:
        raise ValueError(f"dtype must be one of {sorted(DTYPES)}, got {name!r}") from None
