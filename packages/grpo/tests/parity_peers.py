"""The peers of the parity suite (test_parity.py): fixed inputs, TRL's loss code, verl's loss code.

* TRL: its own ``GRPOTrainer._compute_loss`` (TRL 1.16), on a real trainer built around the tiny
  model of tests/support, with the log-prob computation replaced by the fixed inputs.
* verl: its own ``verl.trainer.ppo.core_algos`` functions where verl is importable; otherwise a
  line-by-line transcription of those functions from verl 0.9.1 (``compute_policy_loss_vanilla``,
  ``_gspo``, ``_sapo``, ``_cispo``, ``agg_loss``, ``kl_penalty_forward``), because verl 0.9.1 pins
  ``transformers<5.11`` and cannot be installed next to this workspace's transformers 5.19.0.
  The transcription was checked equal to verl's code in a separate environment holding verl
  (``benchmarks/results/verl_trl_parity.txt``).
"""

from __future__ import annotations

import functools
import math
import tempfile
from dataclasses import dataclass
from typing import Any

import torch

F64 = torch.float64
B, T = 4, 6
LENGTHS = (6, 4, 5, 3)  # valid completion tokens per row (right padding)
ADVANTAGES = (1.2, -0.8, 0.5, -0.9)

# Token log-ratios ℓ − ℓ_old. "extreme" holds tokens beyond ±20 (where grpo and verl clamp, TRL
# does not) and a last row whose mean log-ratio is 27.7 (beyond GSPO's cap of 10 in verl).
EXTREME = (
    (25.0, -30.0, 0.1, 3.0, -0.2, 22.0),
    (24.0, -25.0, 2.0, 0.3),
    (-21.0, 0.05, 1.5, -0.4, 23.0),
    (30.0, 28.0, 25.0),
)


@dataclass(frozen=True)
class Batch:
    """One fixed batch: ℓ (leaf, float64), ℓ_old, ℓ_ref, Â ``[B]``, bool mask, all ``[B, T]``."""

    logprobs: torch.Tensor
    old: torch.Tensor
    ref: torch.Tensor
    advantages: torch.Tensor
    mask: torch.Tensor

    def fresh(self) -> torch.Tensor:
        """A new leaf holding ℓ, so each computation gets its own gradient."""
        return self.logprobs.detach().clone().requires_grad_(True)

    def rows(self, stop: int) -> Batch:
        """The first ``stop`` rows."""
        return Batch(self.fresh()[:stop].detach().requires_grad_(True), self.old[:stop], self.ref[:stop],
                     self.advantages[:stop], self.mask[:stop])


def make_batch(spread: str) -> Batch:
    """The fixed batch of a log-ratio spread: "normal" (N(0, 0.3²)) or "extreme" (:data:`EXTREME`).

    Every log-prob is <= 0: a positive log-ratio Δ lowers ℓ_old (ℓ_old = −Δ − u), a negative one
    lowers ℓ (ℓ = Δ − u), u ~ U(0.05, 2). Padding holds finite values (the peers multiply by the
    mask, so NaN there would poison them, unlike grpo).
    """
    gen = torch.Generator().manual_seed(27)
    mask = torch.zeros(B, T, dtype=torch.bool)
    for row, length in enumerate(LENGTHS):
        mask[row, :length] = True
    if spread == "normal":
        delta = 0.3 * torch.randn(B, T, generator=gen, dtype=F64)
    elif spread == "extreme":
        delta = torch.zeros(B, T, dtype=F64)
        for row, values in enumerate(EXTREME):
            delta[row, : len(values)] = torch.tensor(values, dtype=F64)
    else:
        raise ValueError(spread)
    u = 0.05 + 1.95 * torch.rand(B, T, generator=gen, dtype=F64)
    old = torch.where(delta > 0, -delta - u, -u)
    logprobs = old + delta
    ref = old - 0.2 * torch.randn(B, T, generator=gen, dtype=F64).abs()
    return Batch(logprobs.requires_grad_(True), old, ref, torch.tensor(ADVANTAGES, dtype=F64), mask)


# ---- TRL ---------------------------------------------------------------------------------------


def trl_version() -> str:
    import trl

    return str(trl.__version__)


_SCRATCH = tempfile.TemporaryDirectory(prefix="grpo-parity-")
"""The peers' files (the tiny model, TRL's output folders), removed when the test process exits."""


@functools.cache
def _tiny_lm_dir() -> str:
    """The tiny model as a local directory: TRL loads its reference model from the model's path."""
    from tiny_lm import save_tiny_lm

    return str(save_tiny_lm(tempfile.mkdtemp(prefix="lm-", dir=_SCRATCH.name)))


@functools.cache
def _trl_trainer(settings: tuple[tuple[str, Any], ...]) -> Any:
    from datasets import Dataset
    from tiny_lm import make_tiny_tokenizer
    from trl import GRPOConfig, GRPOTrainer

    args = GRPOConfig(
        output_dir=tempfile.mkdtemp(prefix="trl-", dir=_SCRATCH.name),
        per_device_train_batch_size=B,
        num_generations=2,
        report_to="none",
        use_cpu=True,
        save_strategy="no",
        **dict(settings),
    )
    trainer = GRPOTrainer(
        model=_tiny_lm_dir(),
        reward_funcs=lambda completions, **_: [0.0] * len(completions),
        args=args,
        train_dataset=Dataset.from_dict({"prompt": ["1+1="] * B}),
        processing_class=make_tiny_tokenizer(),
    )
    trainer.model.train()
    trainer.current_gradient_accumulation_steps = 1
    return trainer


def trl_fixed_inputs(trainer: Any, batch: Batch, accumulation: int = 1) -> tuple[torch.Tensor, dict[str, Any]]:
    """(ℓ, inputs): make ``trainer`` see ``batch``'s fresh log-probs ℓ and build ``_compute_loss``'s inputs.

    The one replaced step: the model's log-probs are the fixed inputs (entropy only feeds a
    metric). ``num_items_in_batch`` counts the tokens of the whole accumulation window, as TRL does.
    """
    logprobs = batch.fresh()
    trainer._get_per_token_logps_and_entropies = lambda *args, **kwargs: (
        logprobs,
        torch.zeros_like(logprobs),
        None,
    )
    rows, cols = batch.mask.shape
    inputs = {
        "prompt_ids": torch.zeros(rows, 1, dtype=torch.long),
        "prompt_mask": torch.ones(rows, 1, dtype=torch.long),
        "completion_ids": torch.zeros(rows, cols, dtype=torch.long),
        "completion_mask": batch.mask.long(),
        "advantages": batch.advantages,
        "old_per_token_logps": batch.old,
        "ref_per_token_logps": batch.ref,
        "num_items_in_batch": batch.mask.sum() * accumulation,
    }
    return logprobs, inputs


def trl_loss(batch: Batch, **settings: Any) -> tuple[torch.Tensor, torch.Tensor]:
    """(loss, ∂loss/∂ℓ) of TRL's own ``GRPOTrainer._compute_loss`` under ``GRPOConfig(**settings)``."""
    trainer = _trl_trainer(tuple(sorted(settings.items())))
    logprobs, inputs = trl_fixed_inputs(trainer, batch)
    loss = trainer._compute_loss(trainer.model, inputs)
    (grad,) = torch.autograd.grad(loss, logprobs)
    return loss.detach(), grad


# ---- verl --------------------------------------------------------------------------------------

VERL_VERSION = "0.9.1"


def verl_installed() -> bool:
    try:
        import verl.trainer.ppo.core_algos  # noqa: F401
    except ImportError:
        return False
    return True


@dataclass(frozen=True)
class VerlActor:
    """The ``actor_rollout_ref.actor`` fields verl's policy losses read, with verl 0.9.1's defaults."""

    clip_ratio: float = 0.2
    clip_ratio_low: float = 0.2
    clip_ratio_high: float = 0.2
    clip_ratio_c: float = 3.0
    tau_pos: float = 1.0
    tau_neg: float = 1.05
    loss_scale_factor: int | None = None


def _real_verl(loss_mode: str, actor: VerlActor, old, logprobs, adv, mask, loss_agg_mode) -> torch.Tensor:
    from verl.trainer.ppo.core_algos import get_policy_loss_fn
    from verl.workers.config import FSDPActorConfig

    config = FSDPActorConfig(
        strategy="fsdp",
        rollout_n=1,
        ppo_micro_batch_size_per_gpu=1,
        clip_ratio=actor.clip_ratio,
        clip_ratio_low=actor.clip_ratio_low,
        clip_ratio_high=actor.clip_ratio_high,
        clip_ratio_c=actor.clip_ratio_c,
        tau_pos=actor.tau_pos,
        tau_neg=actor.tau_neg,
        loss_agg_mode=loss_agg_mode,
    )
    config.global_batch_info["loss_scale_factor"] = actor.loss_scale_factor
    loss, _ = get_policy_loss_fn(loss_mode)(
        old_log_prob=old,
        log_prob=logprobs,
        advantages=adv,
        response_mask=mask,
        loss_agg_mode=loss_agg_mode,
        config=config,
    )
    return loss


# Transcription of verl 0.9.1 verl/trainer/ppo/core_algos.py (names and order of operations kept).


def verl_agg_loss(loss_mat, loss_mask, loss_agg_mode, loss_scale_factor=None) -> torch.Tensor:
    """``agg_loss`` with ``dp_size = 1`` and local batch sizes (``loss_mask`` bool, as verl's)."""
    if loss_agg_mode == "token-mean":
        return (loss_mat * loss_mask).sum() / loss_mask.sum()
    if loss_agg_mode in ("seq-mean-token-sum", "seq-mean-token-sum-norm"):
        seq_losses = torch.sum(loss_mat * loss_mask, dim=-1)
        seq_mask = (torch.sum(loss_mask, dim=-1) > 0).float()
        loss = (seq_losses * seq_mask).sum() / seq_mask.sum()
        if loss_agg_mode == "seq-mean-token-sum-norm":
            loss = loss / (loss_scale_factor if loss_scale_factor is not None else loss_mask.shape[-1])
        return loss
    if loss_agg_mode == "seq-mean-token-mean":
        seq_mask = torch.sum(loss_mask, dim=-1)
        seq_losses = torch.sum(loss_mat * loss_mask, dim=-1) / (seq_mask + 1e-8)
        seq_mask = (seq_mask > 0).float()
        return (seq_losses * seq_mask).sum() / seq_mask.sum()
    raise ValueError(loss_agg_mode)


def _transcribed_verl(loss_mode: str, actor: VerlActor, old, log_prob, adv, mask, loss_agg_mode) -> torch.Tensor:
    # ``mask`` stays bool, as verl passes it: its integer sums then keep verl's ``+ 1e-8`` in
    # float32, where 6 + 1e-8 == 6 (a float64 mask would change the result by ~1e-9).
    low = actor.clip_ratio_low if actor.clip_ratio_low is not None else actor.clip_ratio
    high = actor.clip_ratio_high if actor.clip_ratio_high is not None else actor.clip_ratio
    negative_approx_kl = log_prob - old
    if loss_mode == "vanilla":
        negative_approx_kl = torch.clamp(negative_approx_kl, min=-20.0, max=20.0)
        ratio = torch.exp(negative_approx_kl)
        pg_losses1 = -adv * ratio
        pg_losses2 = -adv * torch.clamp(ratio, 1 - low, 1 + high)
        clip_pg_losses1 = torch.maximum(pg_losses1, pg_losses2)
        pg_losses3 = -adv * actor.clip_ratio_c
        clip_pg_losses2 = torch.min(pg_losses3, clip_pg_losses1)
        pg_losses = torch.where(adv < 0, clip_pg_losses2, clip_pg_losses1)
    elif loss_mode == "gspo":
        seq_lengths = torch.sum(mask, dim=-1).clamp(min=1)
        negative_approx_kl_seq = torch.sum(negative_approx_kl * mask, dim=-1) / seq_lengths
        log_seq_importance_ratio = log_prob - log_prob.detach() + negative_approx_kl_seq.detach().unsqueeze(-1)
        log_seq_importance_ratio = torch.clamp(log_seq_importance_ratio, max=10.0)
        seq_importance_ratio = torch.exp(log_seq_importance_ratio)
        pg_losses1 = -adv * seq_importance_ratio
        pg_losses2 = -adv * torch.clamp(seq_importance_ratio, 1 - low, 1 + high)
        pg_losses = torch.maximum(pg_losses1, pg_losses2)
    elif loss_mode == "sapo":
        tau_pos = torch.as_tensor(actor.tau_pos, dtype=adv.dtype)
        tau_neg = torch.as_tensor(actor.tau_neg, dtype=adv.dtype)
        ratio = torch.exp(torch.clamp(negative_approx_kl, min=-20.0, max=20.0))
        taus = torch.where(adv > 0, tau_pos, tau_neg)
        pg_losses = -(torch.sigmoid(taus * (ratio - 1.0)) * (4.0 / taus)) * adv
        loss_agg_mode = "seq-mean-token-mean"  # verl's SAPO ignores loss_agg_mode
    elif loss_mode == "cispo":
        ratio = torch.exp(torch.clamp(negative_approx_kl, min=-20.0, max=20.0))
        clipped_ratio_sg = torch.clamp(ratio, 1 - low, 1 + high).detach()
        pg_losses = -clipped_ratio_sg * adv * log_prob
    else:
        raise ValueError(loss_mode)
    return verl_agg_loss(pg_losses, mask, loss_agg_mode, actor.loss_scale_factor)


def verl_kl_penalty(logprob: torch.Tensor, ref_logprob: torch.Tensor, kl_penalty: str) -> torch.Tensor:
    """``kl_penalty_forward`` for the k1/k2/k3 names (verl's own where installed)."""
    if verl_installed():
        from verl.trainer.ppo.core_algos import kl_penalty as real

        return real(logprob, ref_logprob, kl_penalty)
    if kl_penalty in ("kl", "k1"):
        return logprob - ref_logprob
    if kl_penalty in ("mse", "k2"):
        return 0.5 * (logprob - ref_logprob).square()
    if kl_penalty in ("low_var_kl", "k3"):
        kl = torch.clamp(ref_logprob - logprob, min=-20, max=20)
        return torch.clamp(torch.exp(kl) - kl - 1, min=-10, max=10)
    raise ValueError(kl_penalty)


def verl_loss(
    batch: Batch,
    loss_mode: str,
    loss_agg_mode: str,
    actor: VerlActor = VerlActor(),
    *,
    kl_loss_coef: float = 0.0,
    kl_loss_type: str = "low_var_kl",
) -> tuple[torch.Tensor, torch.Tensor]:
    """(loss, ∂loss/∂ℓ) of verl's policy loss ``loss_mode`` plus, with ``kl_loss_coef``, its KL loss
    (``workers/utils/losses.py``: ``policy_loss += agg_loss(kl_penalty(...)) * kl_loss_coef``)."""
    logprobs = batch.fresh()
    adv = batch.advantages[:, None].expand_as(batch.old)  # verl's advantages are [B, T]
    policy = _real_verl if verl_installed() else _transcribed_verl
    loss = policy(loss_mode, actor, batch.old, logprobs, adv, batch.mask, loss_agg_mode)
    if kl_loss_coef:
        kld = verl_kl_penalty(logprobs, batch.ref, kl_loss_type)
        loss = loss + verl_agg_loss(kld, batch.mask, loss_agg_mode, actor.loss_scale_factor) * kl_loss_coef
    (grad,) = torch.autograd.grad(loss, logprobs)
    return loss.detach(), grad


def transcription_matches_verl(batch: Batch) -> list[str]:
    """Where verl is installed: the modes whose transcription differs from verl's code (want [])."""
    actor = VerlActor(clip_ratio_c=4.0, clip_ratio_high=0.28, loss_scale_factor=T)
    differing = []
    for mode in ("vanilla", "gspo", "sapo", "cispo"):
        for agg in ("token-mean", "seq-mean-token-mean", "seq-mean-token-sum", "seq-mean-token-sum-norm"):
            adv = batch.advantages[:, None].expand(B, T)
            real = _real_verl(mode, actor, batch.old, batch.logprobs, adv, batch.mask, agg)
            ours = _transcribed_verl(mode, actor, batch.old, batch.logprobs, adv, batch.mask, agg)
            if not math.isclose(float(real), float(ours), rel_tol=1e-12, abs_tol=1e-12):
                differing.append(f"{mode}/{agg}: verl {float(real)!r}, transcription {float(ours)!r}")
    return differing
