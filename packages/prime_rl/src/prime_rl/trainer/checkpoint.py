"""Full training-state checkpoints: model, optimizer, LR scheduler and step.

Layout (one directory per trainer step, written by every rank, complete only when marked)::

    {checkpoint_dir}/step_{N}/            model + optimizer state via torch.distributed.checkpoint (DCP),
        __0_0.distcp ...                  one file per *global* rank (fixes INTELLECT-2's local-rank keys)
        trainer_state.json                step and scheduler state (rank 0)
        COMPLETE                          written last; a directory without it is ignored and removed

DCP stores sharded (FSDP2 DTensor) and plain tensors alike and reshards on load, so a checkpoint
from N ranks resumes on M ranks. The step is the whole data position: the orchestrator persists the
claim of every step and commits are idempotent, so a trainer resumed at step ``N`` re-commits
``N - 1`` and, claiming ``N`` and the steps after it again, receives the same samples; a crash at
any point neither loses nor repeats a rollout.

Pitfall: call :func:`save_checkpoint` and :func:`load_checkpoint` on every rank (they are collective).
"""

from __future__ import annotations

import json
import re
import shutil
import warnings
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint.state_dict import get_state_dict, set_state_dict

from prime_rl.durable import write_atomic

STATE_FILE = "trainer_state.json"
COMPLETE_MARKER = "COMPLETE"
_STEP_DIR = re.compile(r"^step_(\d+)$")


class CheckpointError(RuntimeError):
    """A checkpoint is missing, incomplete or does not match the model."""


@dataclass(frozen=True)
class TrainerState:
    """The non-tensor part of a checkpoint. ``step`` = policy version the weights represent."""

    step: int
    scheduler: dict[str, Any] = field(default_factory=dict)


def _distributed() -> bool:
    return dist.is_available() and dist.is_initialized()


def _rank() -> int:
    return dist.get_rank() if _distributed() else 0


def _barrier() -> None:
    if dist.is_available() and dist.is_initialized():
        dist.barrier()


def step_dir(checkpoint_dir: str | Path, step: int) -> Path:
    return Path(checkpoint_dir) / f"step_{step}"


def complete_steps(checkpoint_dir: str | Path) -> list[int]:
    """Steps with a complete checkpoint, ascending."""
    root = Path(checkpoint_dir)
    if not root.is_dir():
        return []
    steps = []
    for child in root.iterdir():
        match = _STEP_DIR.match(child.name)
        if match and (child / COMPLETE_MARKER).is_file():
            steps.append(int(match.group(1)))
    return sorted(steps)


def latest_step(checkpoint_dir: str | Path) -> int | None:
    steps = complete_steps(checkpoint_dir)
    return steps[-1] if steps else None


def save_checkpoint(
    checkpoint_dir: str | Path,
    model: torch.nn.Module,
    optimizer: torch.optim.Optimizer,
    state: TrainerState,
    *,
    keep: int = 2,
) -> Path:
    """Write a complete checkpoint of ``state.step`` (collective), then prune to the newest ``keep``."""
    target = step_dir(checkpoint_dir, state.step)
    if _rank() == 0 and target.exists():
        shutil.rmtree(target)  # an incomplete leftover of a crash, or a re-run of the same step
    _barrier()
    model_state, optim_state = get_state_dict(model, optimizer)
    dcp.save(
        {"model": model_state, "optimizer": optim_state},
        checkpoint_id=str(target),
        no_dist=not _distributed(),
    )
    _barrier()
    if _rank() == 0:
        write_atomic(target / STATE_FILE, json.dumps({"step": state.step, "scheduler": state.scheduler}))
        write_atomic(target / COMPLETE_MARKER, "ok\n")
        for old in complete_steps(checkpoint_dir)[:-keep] if keep > 0 else []:
            shutil.rmtree(step_dir(checkpoint_dir, old), ignore_errors=True)
    _barrier()
    return target


def load_checkpoint(
    checkpoint_dir: str | Path,
    model: torch.nn.Module,
    optimizer: torch.optim.Optimizer,
    *,
    step: int | None = None,
) -> TrainerState:
    """Load the newest complete checkpoint (or ``step``) into ``model`` and ``optimizer`` (collective)."""
    chosen = latest_step(checkpoint_dir) if step is None else step
    if chosen is None:
        raise CheckpointError(f"no complete checkpoint under {checkpoint_dir}")
    source = step_dir(checkpoint_dir, chosen)
    if not (source / COMPLETE_MARKER).is_file():
        raise CheckpointError(f"{source} is not a complete checkpoint")
    model_state, optim_state = get_state_dict(model, optimizer)
    bundle: dict[str, Any] = {"model": model_state, "optimizer": optim_state}
    try:
        with warnings.catch_warnings():
            warnings.filterwarnings("ignore", message="torch.distributed is disabled")
            dcp.load(bundle, checkpoint_id=str(source), no_dist=not _distributed())
    except Exception as exc:  # DCP raises a variety of types for mismatched plans
        raise CheckpointError(f"cannot load {source} into this model: {exc}") from exc
    set_state_dict(model, optimizer, model_state_dict=bundle["model"], optim_state_dict=bundle["optimizer"])
    payload = json.loads((source / STATE_FILE).read_text())
    return TrainerState(step=int(payload["step"]), scheduler=dict(payload.get("scheduler", {})))
