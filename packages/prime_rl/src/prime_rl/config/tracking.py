"""``[tracking]`` section: experiment trackers fed from the same events as the metrics JSONL files."""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from prime_rl.config.base import Section

__all__ = ["TrackingConfig"]

Role = Literal["orchestrator", "worker", "validator", "trainer", "evaluator", "origin", "relay", "run"]
_DEFAULT_ROLES: tuple[Role, ...] = ("trainer", "evaluator", "validator", "worker", "run")


class TrackingConfig(Section):
    """[tracking]: W&B and TensorBoard, fed from every selected process's metrics events."""

    backends: list[Literal["wandb", "tensorboard"]] = Field(
        default_factory=list,
        description="Trackers besides the JSONL files: 'wandb' (pip install 'intellect2-prime-rl[wandb]') and/or "
        "'tensorboard' (pip install 'intellect2-prime-rl[tensorboard]'); [] = JSONL files only.",
    )
    project: str = Field(default="prime-rl", description="W&B project.")
    entity: str = Field(default="", description="W&B entity, a team or user ('' = your default entity).")
    run_name: str = Field(
        default="",
        description="Run name in the trackers ('' = the last folder of run_dir); each process logs as "
        "'<run_name>/<process>', grouped under run_name.",
    )
    dir: str = Field(
        default="", description="Local tracker files ('' = <run_dir>/tracking): wandb/ and tensorboard/<process>/."
    )
    wandb_mode: Literal["offline", "online", "disabled"] = Field(
        default="offline",
        description="'offline': local files only, no network or login (upload later with `wandb sync "
        "<dir>/wandb/offline-run-*`); 'online': stream to the W&B server (needs `wandb login`).",
    )
    roles: list[Role] = Field(
        default_factory=lambda: list(_DEFAULT_ROLES),
        description="Roles whose processes log to the trackers (each process is one tracker run).",
    )
