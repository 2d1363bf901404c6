"""``[trainer]`` section (light: pydantic only, so non-torch processes can build ``RunConfig`` fast)."""

from __future__ import annotations

from typing import Literal

from pydantic import Field, model_validator

from prime_rl.config.base import Section


class TrainerConfig(Section):
    """[trainer]: optimisation, loss recipe, batch shape, checkpoints."""

    lr: float = Field(default=1e-5, gt=0, description="AdamW peak learning rate (INTELLECT-2: 3e-7 for QwQ-32B).")
    betas: tuple[float, float] = Field(default=(0.9, 0.99), description="AdamW betas (INTELLECT-2: 0.9, 0.99).")
    weight_decay: float = Field(default=0.01, ge=0, description="AdamW weight decay (INTELLECT-2: 0.01).")
    warmup_steps: int = Field(default=0, ge=0, description="Optimizer steps of linear LR warmup (INTELLECT-2: 25).")
    max_grad_norm: float = Field(default=1.0, gt=0, description="Gradient-norm clip (INTELLECT-2: 0.1).")
    recipe: str = Field(
        default="intellect2", description="grpo recipe: intellect2, grpo, dr_grpo, dapo, gspo, cispo."
    )
    eps_low: float | None = Field(default=None, description="Override the recipe's lower clip offset.")
    eps_high: float | None = Field(default=None, description="Override the recipe's upper clip offset.")
    delta: float | None = Field(default=None, description="Override the recipe's two-sided ratio cap δ.")
    entropy_coef: float | None = Field(default=None, description="Override the recipe's entropy bonus coefficient.")
    kl_coef: float | None = Field(default=None, description="Override the recipe's KL-to-initial-policy coefficient.")
    constant: float | None = Field(
        default=None,
        description="Per-sequence normaliser C of 'constant' aggregation (default sampling.max_new_tokens).",
    )
    old_logprobs: Literal["recompute", "inference"] = Field(
        default="recompute",
        description="Old log-probs: recomputed at the start of the step, or the behaviour log-probs μ "
        "(the generating policy's, recomputed by the validator; never a worker's claim).",
    )
    is_correction: Literal["token_truncate", "sequence_truncate", "token_mask", "sequence_mask"] | None = (
        Field(
            default=None,
            description="Importance-sampling correction π_old/μ, μ the validator-recomputed behaviour log-probs (None = off).",
        )
    )
    is_threshold: float = Field(default=2.0, gt=0, description="TIS cap, or the upper bound of the MIS band.")
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
    total_steps: int = Field(
        default=10, ge=0, description="Policy versions to train; the trainer exits after the last."
    )
    checkpoint_dir: str = Field(default="", description="Full training checkpoints (default <run_dir>/checkpoints).")
    checkpoint_every: int = Field(default=1, ge=1, description="Checkpoint every N steps (1 = every policy version).")
    keep_checkpoints: int = Field(default=2, ge=1, description="Checkpoints kept on disk.")
    resume: bool = Field(default=True, description="Resume from the newest complete checkpoint if one exists.")
    filter_zero_advantage: bool = Field(default=True, description="Skip groups whose advantages are all zero.")
    save_dtype: Literal["model", "float32", "bfloat16"] = Field(
        default="model", description="dtype of the published model.safetensors ('model' = the training dtype)."
    )
    serve_origin: bool = Field(
        default=True, description="Run the shardcast origin in-process; False = publish into shardcast.data_dir only."
    )
    device: Literal["auto", "cpu", "cuda"] = Field(default="auto", description="Training device.")
    num_threads: int = Field(default=1, ge=1, description="torch.set_num_threads for this process.")
    poll_interval_s: float = Field(default=0.5, gt=0, description="Seconds between claim attempts while waiting.")
    wait_log_every_s: float = Field(default=10.0, gt=0, description="Seconds between 'waiting for data' log lines.")

    @model_validator(mode="after")
    def _check(self) -> TrainerConfig:
        if self.is_correction is not None and self.old_logprobs == "inference":
            raise ValueError(
                "trainer.is_correction weights by π_old/μ, which is 1 when old_logprobs = 'inference'; "
                "use old_logprobs = 'recompute' with it, or drop is_correction"
            )
        return self
