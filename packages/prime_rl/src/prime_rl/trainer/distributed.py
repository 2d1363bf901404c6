"""Data parallelism for the trainer: FSDP2 (``torch.distributed.fsdp.fully_shard``) under torchrun.

``init_distributed()`` joins the process group that ``torchrun`` describes through its
environment (``RANK``, ``WORLD_SIZE``, ``MASTER_ADDR``...; gloo on CPU, nccl on CUDA) and is a no-op
in a plain single process. ``shard_model`` applies ``fully_shard`` to every decoder layer and then
to the root, as INTELLECT-2 did, so parameters, gradients and optimizer state are sharded.

Gradient scaling: FSDP2 averages gradients over ranks. The trainer normalises the loss by a
*global* count (tokens of the whole mini-batch, over all ranks), so each rank's loss is a partial
sum of the global loss and the average must be undone: :func:`world_size` times the loss
(``loss_scale``). A rank with fewer micro-batches runs padding micro-batches with an all-zero loss
mask, which add exactly nothing (INTELLECT-2 trained on duplicated micro-batches instead, defect 1).
"""

from __future__ import annotations

import os
from datetime import timedelta

import torch
import torch.distributed as dist
from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard
from torch.distributed.tensor import DTensor


def is_distributed() -> bool:
    return dist.is_available() and dist.is_initialized()


def rank() -> int:
    return dist.get_rank() if is_distributed() else 0


def world_size() -> int:
    return dist.get_world_size() if is_distributed() else 1


def init_distributed(timeout_s: float = 600.0) -> bool:
    """Join torchrun's process group if the environment describes one; True if distributed."""
    if is_distributed():
        return True
    if int(os.environ.get("WORLD_SIZE", "1")) <= 1:
        return False
    backend = "nccl" if torch.cuda.is_available() else "gloo"
    if backend == "nccl":
        torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", "0")))
    dist.init_process_group(backend, timeout=timedelta(seconds=timeout_s))
    return True


def shutdown_distributed(*, barrier: bool = True) -> None:
    """Leave the process group. After a clean finish, a barrier first, so that no rank tears down
    its gloo connections while a peer still reads from them (that race aborted both ranks with
    "terminate called without an active exception" in one CI run); ``barrier=False`` on error
    paths, where a peer may never arrive."""
    if is_distributed():
        if barrier:
            dist.barrier()
        dist.destroy_process_group()


def shard_model(model: torch.nn.Module, *, param_dtype: torch.dtype | None = None) -> torch.nn.Module:
    """Apply FSDP2 per decoder layer and at the root (no-op without a process group).

    ``param_dtype`` (e.g. bf16) sets FSDP's mixed precision for compute, with fp32 gradient reduction.
    """
    if not is_distributed():
        return model
    policy = MixedPrecisionPolicy(param_dtype=param_dtype, reduce_dtype=torch.float32)
    layers = getattr(model.get_decoder(), "layers", None)  # type: ignore[operator]
    for layer in layers or []:
        fully_shard(layer, mp_policy=policy)
    fully_shard(model, mp_policy=policy)
    return model


def full_tensor(value: torch.Tensor) -> torch.Tensor:
    """Gather a DTensor to a plain tensor (collective); plain tensors pass through."""
    return value.full_tensor() if isinstance(value, DTensor) else value


def full_state_dict(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    """The unsharded state dict on CPU (collective over ranks; every rank gets it)."""
    return {name: full_tensor(t.detach()).cpu() for name, t in model.state_dict().items()}


def collective_device() -> torch.device:
    """Where a tensor handed to a collective must live: the rank's GPU under NCCL (which has no
    CPU transport), else the CPU (gloo, or no process group)."""
    if is_distributed() and dist.get_backend() == "nccl":
        return torch.device("cuda", torch.cuda.current_device())
    return torch.device("cpu")


def all_reduce_sum(value: float | int) -> float:
    """Sum a Python number over ranks (identity when not distributed)."""
    if not is_distributed():
        return float(value)
    tensor = torch.tensor([float(value)], dtype=torch.float64, device=collective_device())
    dist.all_reduce(tensor)
    return float(tensor.item())


def barrier() -> None:
    if is_distributed():
        dist.barrier()


def broadcast_object(obj: object, src: int = 0) -> object:
    """Rank ``src``'s Python object on every rank (identity when not distributed)."""
    if not is_distributed():
        return obj
    box = [obj]
    dist.broadcast_object_list(box, src=src)
    return box[0]
