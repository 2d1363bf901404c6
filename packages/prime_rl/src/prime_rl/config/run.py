"""``RunConfig``: the whole run, composed from the shared sections and one section per role.

Every process of a run reads the same TOML file and uses the sections it needs. The role sections
live beside this module (``config/trainer.py``, ...) and import only pydantic (and grpo's
torch-free loss config), so building a ``RunConfig`` never imports torch or any role.
"""

from __future__ import annotations

from pathlib import Path

from pydantic import BaseModel, ConfigDict, Field

from prime_rl.config.components import ComponentsConfig
from prime_rl.config.evaluator import EvaluatorConfig
from prime_rl.config.sections import (
    ModelConfig,
    OrchestratorConfig,
    SamplingConfig,
    ShardcastConfig,
    TasksConfig,
)
from prime_rl.config.tracking import TrackingConfig
from prime_rl.config.trainer import TrainerConfig
from prime_rl.config.validator import ValidatorConfig
from prime_rl.config.worker import WorkerConfig

__all__ = ["RunConfig"]


class RunConfig(BaseModel):
    """The whole run: every process reads this one model (and uses the sections it needs)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    run_dir: str = Field(
        default="runs/default", description="Directory for logs, metrics and data of this run."
    )
    model: ModelConfig = Field(
        default_factory=ModelConfig, description="Policy weights and tokenizer."
    )
    tasks: TasksConfig = Field(default_factory=TasksConfig, description="Training tasks.")
    sampling: SamplingConfig = Field(
        default_factory=SamplingConfig, description="Sampling settings."
    )
    orchestrator: OrchestratorConfig = Field(
        default_factory=OrchestratorConfig, description="Orchestrator."
    )
    shardcast: ShardcastConfig = Field(
        default_factory=ShardcastConfig, description="Weight broadcast."
    )
    trainer: TrainerConfig = Field(
        default_factory=lambda: TrainerConfig(), description="Trainer (prime_rl.trainer.process)."
    )
    validator: ValidatorConfig = Field(
        default_factory=lambda: ValidatorConfig(), description="Validator (prime_rl.validator.process)."
    )
    workers: WorkerConfig = Field(
        default_factory=lambda: WorkerConfig(), description="Workers (prime_rl.worker.process)."
    )
    evaluator: EvaluatorConfig = Field(
        default_factory=lambda: EvaluatorConfig(), description="Held-out evaluator (prime_rl.evaluator)."
    )
    tracking: TrackingConfig = Field(
        default_factory=TrackingConfig, description="Experiment trackers (prime_rl.trackers)."
    )

    components: ComponentsConfig = Field(
        default_factory=lambda: ComponentsConfig(),
        description="The reward and the loss by import path (examples/intellect2.py sets both).",
    )

    @property
    def orchestrator_data_dir(self) -> Path:
        return Path(self.orchestrator.data_dir or Path(self.run_dir) / "orchestrator")

    @property
    def shardcast_data_dir(self) -> Path:
        return Path(self.shardcast.data_dir or Path(self.run_dir) / "shardcast")

    @property
    def published_dtype(self) -> str:
        """The dtype of the policy files the trainer publishes: ``trainer.save_dtype``, where "model"
        is ``model.dtype`` (so a policy trained in bf16 is published, and its deltas taken, in bf16)."""
        return self.model.dtype if self.trainer.save_dtype == "model" else self.trainer.save_dtype

    def broadcast_warning(self) -> str | None:
        """A warning when ``shardcast.delta`` meets fp32 policy files, whose deltas are not worth it:
        an fp32 step changes most low mantissa bits, so its delta is a third to a half of the file,
        where a bf16 one is 10-100x smaller (benchmarks/results/delta_dtype.md); None otherwise."""
        if not self.shardcast.delta or self.published_dtype != "float32":
            return None
        return (
            "shardcast.delta = true with float32 policy files (trainer.save_dtype = "
            f"{self.trainer.save_dtype!r}, model.dtype = {self.model.dtype!r}): each delta will be about a third "
            "to a half of the file, where a bfloat16 file's delta is 10-100x smaller at lr 1e-6 to 1e-5 "
            "(benchmarks/results/delta_dtype.md); set trainer.save_dtype = \"bfloat16\" to publish bf16 "
            "weights (workers and the validator then compute on those), or shardcast.delta = false"
        )
