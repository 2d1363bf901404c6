"""``[trainer]`` section, with its ``[trainer.loss]`` key (``config/loss.py``: a recipe table or an import path).

Light on purpose (pydantic and ``grpo.recipes``, which is plain data without torch), so processes
that never train build ``RunConfig`` fast and still reject a bad loss at start-up.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Literal

from pydantic import Field, model_validator

from grpo.recipes import RECIPES, LossConfig
from prime_rl.config.base import Section
from prime_rl.config.loss import (
    DEFAULT_RECIPE,
    LOSS_FIELDS,
    LossSetting,
    check_one_loss,
    load_loss,
    loss_problem,
)


class TrainerConfig(Section):
    """[trainer]: optimisation, the loss (``[trainer.loss]``), batch shape, checkpoints."""

    lr: float = Field(default=1e-5, gt=0, description="AdamW peak learning rate (INTELLECT-2: 3e-7 for QwQ-32B).")
    betas: tuple[float, float] = Field(default=(0.9, 0.99), description="AdamW betas (INTELLECT-2: 0.9, 0.99).")
    weight_decay: float = Field(default=0.01, ge=0, description="AdamW weight decay (INTELLECT-2: 0.01).")
    warmup_steps: int = Field(default=0, ge=0, description="Optimizer steps of linear LR warmup (INTELLECT-2: 25).")
    max_grad_norm: float = Field(default=1.0, gt=0, description="Gradient-norm clip (INTELLECT-2: 0.1).")
    loss: LossSetting = Field(
        default=RECIPES[DEFAULT_RECIPE],
        description="[trainer.loss]: a table, 'recipe' (a name in grpo.RECIPES) plus any grpo.LossConfig field "
        "(eps_low, eps_high, delta, entropy_coef, kl_coef, is_correction, is_threshold, ...; constant unset = "
        "sampling.max_new_tokens), or an import path 'module:attribute' / 'file.py:attribute' of a grpo.Loss "
        "or grpo.LossConfig, which the trainer imports when it starts. Either must use group z-score advantages.",
    )
    old_logprobs: Literal["recompute", "inference"] = Field(
        default="recompute",
        description="Old log-probs: recomputed at the start of the step, or the behaviour log-probs μ "
        "(the generating policy's, recomputed by the validator; never a worker's claim).",
    )
    samples_per_step: int = Field(default=32, ge=1, description="Accepted samples (whole groups) per policy version.")
    optimizer_steps_per_version: int = Field(
        default=1, ge=1, description="Optimizer steps per policy version (INTELLECT-2: 8)."
    )
    micro_batch_tokens: int = Field(default=2048, ge=16, description="Max tokens per packed micro-batch row.")
    fused_lm_head: bool = Field(
        default=True,
        description="Completion log-probs from the chunked LM head (no [L, V] logits; same gradients). "
        "Models that post-process logits (soft-capping, logit scale) always use full logits.",
    )
    activation_checkpointing: bool = Field(
        default=False,
        description="Recompute each decoder layer in backward instead of keeping its activations "
        "(grpo.enable_activation_checkpointing): a layer keeps only its input hidden states, for about one "
        "more forward per step; what lets INTELLECT-2's 32k-token rows fit. Same gradients.",
    )
    total_steps: int = Field(
        default=10, ge=0, description="Policy versions to train; the trainer exits after the last."
    )
    checkpoint_dir: str = Field(default="", description="Full training checkpoints (default <run_dir>/checkpoints).")
    checkpoint_every: int = Field(default=1, ge=1, description="Checkpoint every N steps (1 = every policy version).")
    keep_checkpoints: int = Field(default=2, ge=1, description="Checkpoints kept on disk.")
    resume: bool = Field(default=True, description="Resume from the newest complete checkpoint if one exists.")
    filter_zero_advantage: bool = Field(default=True, description="Skip groups whose advantages are all zero.")
    save_dtype: Literal["model", "float32", "bfloat16"] = Field(
        default="model",
        description="dtype of the published model.safetensors that workers and the validator load ('model' = "
        "model.dtype, so a bf16 policy publishes bf16 files and bf16 deltas). 'bfloat16' halves an fp32 run's "
        "files and makes its shardcast deltas 10-100x smaller (benchmarks/results/delta_dtype.md); the trainer "
        "keeps its own weights in model.dtype.",
    )
    serve_origin: bool = Field(
        default=True, description="Run the shardcast origin in-process; False = publish into shardcast.data_dir only."
    )
    device: Literal["auto", "cpu", "cuda"] = Field(default="auto", description="Training device.")
    num_threads: int = Field(default=1, ge=1, description="torch.set_num_threads for this process.")
    poll_interval_s: float = Field(default=0.5, gt=0, description="Seconds between claim attempts while waiting.")
    wait_log_every_s: float = Field(default=10.0, gt=0, description="Seconds between 'waiting for data' log lines.")

    @model_validator(mode="before")
    @classmethod
    def _loss_keys_live_in_the_loss_table(cls, data: Any) -> Any:
        misplaced = sorted(LOSS_FIELDS & set(data)) if isinstance(data, Mapping) else []
        if misplaced:
            raise ValueError(
                f"loss settings go in the [trainer.loss] table, not in [trainer]: {', '.join(misplaced)} "
                f"(e.g. --trainer.loss.{misplaced[0]})"
            )
        return data

    @model_validator(mode="after")
    def _trainable_loss(self) -> TrainerConfig:
        problem = loss_problem(self.loss, self.old_logprobs) if isinstance(self.loss, LossConfig) else None
        if problem:  # an import path passes the same guard when it is imported (load_loss)
            raise ValueError(f"[trainer.loss]: {problem}")
        return self

    def check_recipe_loss(self, path: str, source: str) -> None:
        """The loss a recipe hands over by import path: past the guard, and the same as ``[trainer.loss]``
        where this config (read from ``source``) sets one.

        Raises ``ComponentError`` naming both losses when they differ (never a warning: the two
        homes would otherwise have one of them silently ignored), or naming ``path`` when it
        cannot be imported or trained on.
        """
        recipe_loss = load_loss(path, self.old_logprobs)
        if "loss" in self.model_fields_set:
            check_one_loss(self.loss, path, recipe_loss, source)
