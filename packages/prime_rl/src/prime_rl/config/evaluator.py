"""``[evaluator]`` section: held-out greedy evaluation of each policy version (``prime_rl.evaluator``)."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import Field, field_validator

from prime_rl.config.base import Section
from prime_rl.config.sections import TasksConfig

__all__ = ["EvaluatorConfig"]


class EvaluatorConfig(Section):
    """[evaluator]: held-out greedy accuracy, before training and every few policy versions."""

    enabled: bool = Field(default=True, description="Start the evaluator with `prime-rl run`.")
    every: int = Field(default=2, ge=1, description="Evaluate every N policy versions (plus version 0 and the last).")
    num_problems: int = Field(default=64, ge=1, description="Held-out problems (fixed, seeded).")
    seed: int = Field(default=1_000_003, ge=0, description="Seed of the held-out set (distinct from tasks.seed).")
    test_seed: int = Field(
        default=2_000_003,
        ge=0,
        description="Seed of the test split's draws (split = 'test'): its problems come from other draws than "
        "the dev set's (seed) as well as from a share of the problem space training never sees.",
    )
    split: Literal["all", "dev", "test"] = Field(
        default="all",
        description="Which held-out problems: 'all' = every generated problem training does not use; with "
        "tasks.test_share > 0, 'test' = only the problems kept out of training (choose nothing on them) and "
        "'dev' = the others training does not use (for choosing templates and hyperparameters).",
    )
    max_new_tokens: int = Field(default=0, ge=0, description="Completion limit (0 = sampling.max_new_tokens).")
    batch_size: int = Field(default=64, ge=1, description="Problems per greedy generation batch.")
    num_threads: int = Field(default=1, ge=1, description="torch.set_num_threads for this process.")
    poll_interval_s: float = Field(default=1.0, gt=0, description="Seconds between checks for a new policy version.")
    version_timeout_s: float = Field(
        default=3600.0, gt=0, description="Give up if the next version to evaluate does not appear within this time."
    )
    tasks: dict[str, Any] = Field(
        default_factory=dict,
        description="The held-out task set as [tasks] keys to change, e.g. {path = 'test.parquet'} (a separate "
        "file: its first rows) or {ops = ['*']}; {} = the [tasks] generator re-seeded, or a file's rows after "
        "the training slice.",
    )

    @field_validator("tasks")
    @classmethod
    def _known_task_keys(cls, value: dict[str, Any]) -> dict[str, Any]:
        unknown = set(value) - set(TasksConfig.model_fields)
        if unknown:
            raise ValueError(f"unknown [tasks] keys {sorted(unknown)}")
        return value
