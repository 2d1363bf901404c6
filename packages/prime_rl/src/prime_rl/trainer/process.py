"""The trusted GRPO trainer process: claim validated rollouts, train, publish the next policy version.

Per step ``s`` (the weights are policy version ``s``):

1. ``POST /trainer/claim`` until the orchestrator has ``samples_per_step`` accepted samples in
   whole informative groups with ``policy_version >= s - max_off_policy_steps`` (default
   ``async_level``; it filters zero-advantage groups and stale samples); while waiting, one log line every ``wait_log_every_s`` says why
   (available vs needed, batches still awaiting validation, stale samples). The claim is
   persisted by the orchestrator, so a restarted trainer gets the same samples for ``s``.
2. Old log-probs recomputed with the current weights (``old_logprobs = "recompute"``,
   INTELLECT-2) or the behaviour log-probs μ (``"inference"``); with ``loss.is_correction`` the
   grpo loss also applies a truncated/masked importance weight π_old/μ and logs the mismatch KL.
   μ is always the validator's recomputation (``TrainSample.behaviour_logprobs``): a worker's
   claimed inference log-probs never reach the trainer, so it cannot steer the loss through them.
3. ``optimizer_steps_per_version`` AdamW steps, one per mini-batch of whole groups, each
   accumulating packed micro-batches of at most ``micro_batch_tokens`` tokens, with linear LR
   warmup and gradient-norm clipping.
4. Write ``<run_dir>/policies/v{s+1}/model.safetensors`` and publish it as shardcast version
   ``s + 1`` (version 0 is the initial model at ``model.path`` and is never published), save a
   full checkpoint (every ``checkpoint_every`` steps), then ``POST /trainer/commit`` so the step
   advances. Crash anywhere: resume from the newest checkpoint and replay; the orchestrator
   returns the same claim for a replayed step and commits are idempotent, so no rollout is lost
   or used twice.

Run with ``prime-rl trainer --config FILE`` or, data-parallel, ``torchrun --nproc_per_node N -m
prime_rl.cli trainer --config FILE`` (FSDP2; rank 0 talks to the orchestrator and publishes).
"""

from __future__ import annotations

import logging
import time
from pathlib import Path
from typing import TYPE_CHECKING

import torch
from transformers import AutoModelForCausalLM

import grpo
import shardcast
from prime_rl.api.client import OrchestratorClient, OrchestratorUnavailable
from prime_rl.api.protocol import TrainSample
from prime_rl.api.secrets import run_secrets
from prime_rl.api.staleness import claim_staleness
from prime_rl.config.loss import load_loss
from prime_rl.config.trainer import TrainerConfig
from prime_rl.devices import choose_device, torch_dtype
from prime_rl.metrics import get_metrics
from prime_rl.role import orchestrator_call_times, run_role
from prime_rl.trainer import distributed
from prime_rl.trainer.batching import make_micro_batches, split_minibatches
from prime_rl.trainer.checkpoint import TrainerState, latest_step, load_checkpoint, save_checkpoint
from prime_rl.trainer.step import old_logprobs_for, rank_share, train_minibatch, warmup_lambda
from prime_rl.trainer.waiting import ConstantRewardWatch, explain_wait
from prime_rl.weights.files import save_policy
from prime_rl.weights.layout import policy_file, prune_version_dirs

if TYPE_CHECKING:
    from prime_rl.config import RunConfig

log = logging.getLogger(__name__)


def build_loss(config: RunConfig) -> grpo.Loss:
    """The run's loss: the ``[trainer.loss]`` table's, or the object its import path names.

    Raises ``ComponentError`` for an import path that does not load or names a loss this runtime
    cannot train on (:func:`prime_rl.config.loss.load_loss`).
    """
    setting = config.trainer.loss
    loss = setting if isinstance(setting, grpo.LossConfig) else load_loss(setting, config.trainer.old_logprobs)
    return grpo.Loss(loss) if isinstance(loss, grpo.LossConfig) else loss


class Trainer:
    """The trainer's state and loop (construct in every rank; rank 0 does all I/O with peers)."""

    def __init__(self, config: RunConfig, loss_fn: grpo.Loss | None = None) -> None:
        """``loss_fn`` defaults to :func:`build_loss` (``main`` builds it first, to fail before waiting)."""
        self.run = config
        self.cfg: TrainerConfig = config.trainer
        self.device = choose_device(self.cfg.device)
        self.is_main = distributed.rank() == 0
        self.run_dir = Path(config.run_dir)
        self.checkpoint_dir = Path(self.cfg.checkpoint_dir or self.run_dir / "checkpoints")
        self.policy_dir = self.run_dir / "policies"
        self.loss_fn = loss_fn or build_loss(config)
        log.info("loss: %r", self.loss_fn.config)
        dtype = torch_dtype(config.model.dtype)
        self.model = AutoModelForCausalLM.from_pretrained(config.model.path, dtype=dtype)
        self.model.to(self.device)  # type: ignore[arg-type]
        self.model.train()
        if self.cfg.activation_checkpointing:  # guarded: a recompute must attend as its forward did
            grpo.enable_activation_checkpointing(self.model)
        self.reference = None
        if self.loss_fn.config.kl_coef > 0:  # frozen initial policy for the KL term
            self.reference = AutoModelForCausalLM.from_pretrained(config.model.path, dtype=dtype)
            self.reference.to(self.device)  # type: ignore[arg-type]
            self.reference.eval().requires_grad_(False)
            distributed.shard_model(self.reference)
        distributed.shard_model(self.model)
        self.save_dtype = None if self.cfg.save_dtype == "model" else torch_dtype(self.cfg.save_dtype)
        self.optimizer = torch.optim.AdamW(
            self.model.parameters(), lr=self.cfg.lr, betas=self.cfg.betas, weight_decay=self.cfg.weight_decay
        )
        self.scheduler = torch.optim.lr_scheduler.LambdaLR(
            self.optimizer, warmup_lambda(self.cfg.warmup_steps)
        )
        self.step = 0
        self._last_loss = float("nan")
        # A trusted process: the run's admin token (configured, or generated in the run dir).
        self.client = OrchestratorClient(
            config.orchestrator.trusted_url, admin_token=run_secrets(config).admin_token,  # its own listener, if any
            on_answer=orchestrator_call_times().record,  # per-window latencies (metrics: orchestrator_calls)
        )  # fmt: skip
        self.origin: shardcast.Origin | None = None
        self.constant_reward = ConstantRewardWatch(config.sampling.group_size)

    # -- setup --------------------------------------------------------------------------------
    def resume(self) -> None:
        """Load the newest complete checkpoint (if resuming) and re-commit its step (idempotent)."""
        if not self.cfg.resume or latest_step(self.checkpoint_dir) is None:
            return
        state = load_checkpoint(self.checkpoint_dir, self.model, self.optimizer)
        self.scheduler.load_state_dict(state.scheduler)
        self.step = state.step
        log.info("resumed from checkpoint step %d", state.step)
        get_metrics().log("resumed", step=state.step)
        if self.is_main and self.step > 0:
            self._publish(self.step)  # the version may have been lost with a crashed origin
            self._commit(self.step - 1, self.step)

    def start_origin(self) -> None:
        if self.is_main and self.cfg.serve_origin:
            sc = self.run.shardcast
            self.origin = shardcast.Origin(
                self.run.shardcast_data_dir / "origin",
                host=sc.host,
                port=sc.origin_port,
                keep=sc.keep_versions,
            ).start()
            log.info("shardcast origin serving %s", self.origin.url)

    # -- data ---------------------------------------------------------------------------------
    def wait_for_batch(self) -> list[TrainSample]:
        """Claim this step's samples, logging why while the orchestrator cannot serve them yet."""
        samples: list[TrainSample] | None = None
        if self.is_main:
            started = next_log = time.monotonic()
            while True:
                try:
                    claim = self.client.claim(
                        self.step,
                        self.cfg.samples_per_step,
                        filter_zero_advantage=self.cfg.filter_zero_advantage,
                    )
                except OrchestratorUnavailable as exc:
                    log.warning("step %d: orchestrator unavailable (%s); retrying", self.step, exc)
                    time.sleep(self.cfg.poll_interval_s)
                    continue
                if claim.ready:
                    samples = list(claim.samples)
                    break
                now = time.monotonic()
                filtering = self.cfg.filter_zero_advantage
                if (warning := self.constant_reward.check(claim, filter_zero_advantage=filtering)) is not None:
                    log.warning("step %d: %s", self.step, warning)
                    get_metrics().log("constant_reward", step=self.step, zero_advantage=claim.zero_advantage_samples)
                if now >= next_log:  # why, with every count, at a bounded interval (trainer/waiting.py)
                    next_log = now + self.cfg.wait_log_every_s
                    why = explain_wait(claim, self.cfg.samples_per_step, filter_zero_advantage=filtering)
                    log.info("step %d: waiting for data for %.0f s: %s", self.step, now - started, why.line)
                    get_metrics().log(
                        "wait",
                        step=self.step,
                        cause=why.cause,
                        reason=claim.reason,
                        waited_s=now - started,
                        available=claim.available_samples,
                        zero_advantage=claim.zero_advantage_samples,
                        held=claim.held_samples,
                        pending_batches=claim.pending_batches,
                        stale=claim.stale_samples,
                    )
                time.sleep(self.cfg.poll_interval_s)
            get_metrics().log(
                "batch",
                step=self.step,
                waited_s=time.monotonic() - started,
                samples=len(samples),
                **claim_staleness(samples, self.step).metrics(),
            )
        samples = distributed.broadcast_object(samples)  # type: ignore[assignment]
        assert samples is not None
        self._check_fresh(samples)
        return samples

    def _check_fresh(self, samples: list[TrainSample]) -> None:
        floor = self.step - self.run.orchestrator.off_policy_bound
        stale = [s.sample_id for s in samples if s.policy_version < floor]
        if stale:  # the orchestrator must never hand these out; refuse rather than train on them
            raise RuntimeError(
                f"step {self.step}: claim holds samples older than version {floor}: {stale[:5]}"
            )

    # -- one step -----------------------------------------------------------------------------
    def train_step(self, samples: list[TrainSample]) -> None:
        temperature = self.run.sampling.temperature
        constant = self.loss_fn.config.constant or float(self.run.sampling.max_new_tokens)
        group_size = self.run.sampling.group_size
        fused = self.cfg.fused_lm_head
        minibatches = split_minibatches(samples, self.cfg.optimizer_steps_per_version, group_size)
        shares = [rank_share(make_micro_batches(mb, self.cfg.micro_batch_tokens)) for mb in minibatches]
        olds = None
        if self.cfg.old_logprobs == "recompute":  # all before the first update: π_old = policy s
            self.model.eval()
            olds = [
                old_logprobs_for(self.model, share, temperature, self.device, fused_lm_head=fused)
                for share in shares
            ]
            self.model.train()
        for k, share in enumerate(shares):
            refs = (
                old_logprobs_for(self.reference, share, temperature, self.device, fused_lm_head=fused)
                if self.reference
                else None
            )
            metrics = train_minibatch(
                self.model,
                self.optimizer,
                share,
                olds[k] if olds is not None else None,
                self.loss_fn,
                temperature=temperature,
                constant=constant,
                max_grad_norm=self.cfg.max_grad_norm,
                device=self.device,
                ref_logprobs=refs,
                fused_lm_head=fused,
            )
            self.scheduler.step()
            self._last_loss = metrics.loss
            rewards = [s.reward for s in minibatches[k]]
            versions = [s.policy_version for s in minibatches[k]]
            record = metrics.as_dict() | {
                "step": self.step,
                "optimizer_step": k,
                "reward_mean": sum(rewards) / len(rewards),
                "min_policy_version": min(versions),
                "max_policy_version": max(versions),
                "async_gap_max": self.step - min(versions),
            }
            get_metrics().log("train", **record)
            log.info(
                "step %d.%d: loss %.4f grad_norm %.3f lr %.2e reward %.3f tokens %d versions %d..%d",
                self.step,
                k,
                metrics.loss,
                metrics.grad_norm,
                metrics.lr,
                record["reward_mean"],
                metrics.num_tokens,
                min(versions),
                max(versions),
            )

    def _publish(self, version: int) -> None:
        """Write and publish ``version`` (rank 0 writes; every rank joins the gather)."""
        state = distributed.full_state_dict(self.model)
        if not self.is_main:
            return
        path = save_policy(state, policy_file(self.policy_dir, version), dtype=self.save_dtype)
        data_dir = self.origin.data_dir if self.origin is not None else self.run.shardcast_data_dir / "origin"
        size = path.stat().st_size
        try:
            manifest = shardcast.publish_file(
                data_dir,
                path,
                version=version,
                keep=self.run.shardcast.keep_versions,
                delta=self.run.shardcast.delta,
            )
        except shardcast.AlreadyPublished:
            log.info("policy v%d is already published (replayed step)", version)
            get_metrics().log("published", policy_version=version, bytes=size, replayed=True)
            return
        delta = manifest.delta
        delta_bytes = sum(shard.stored_size for shard in delta.shards) if delta is not None else None
        get_metrics().log(
            "published",
            policy_version=version,
            bytes=size,
            delta_base=delta.base_version if delta is not None else None,
            delta_bytes=delta_bytes,
        )
        log.info(
            "published policy v%d (%d bytes%s)",
            version,
            size,
            f"; delta against v{delta.base_version}: {delta_bytes} bytes" if delta is not None else "",
        )

    def finish_step(self, samples: list[TrainSample]) -> None:
        version = self.step + 1
        self._publish(version)
        if self.is_main:  # the origin keeps as many: older files only fed links nobody makes now
            prune_version_dirs(self.policy_dir, self.run.shardcast.keep_versions)
        if version % self.cfg.checkpoint_every == 0 or version == self.cfg.total_steps:
            state = TrainerState(step=version, scheduler=self.scheduler.state_dict())
            save_checkpoint(
                self.checkpoint_dir, self.model, self.optimizer, state, keep=self.cfg.keep_checkpoints
            )
            get_metrics().log("checkpoint", step=version)
        if self.is_main:
            versions = [s.policy_version for s in samples]
            get_metrics().log(
                "step",
                step=self.step,
                policy_version=version,
                samples=len(samples),
                min_policy_version=max(0, self.step - self.run.orchestrator.off_policy_bound),
                sample_versions=versions,
                min_sample_version=min(versions),
                max_sample_version=max(versions),
                reward_mean=sum(s.reward for s in samples) / len(samples),
                loss=self._last_loss,
            )
            self._commit(self.step, version)
            get_metrics().log(
                "commit", step=self.step, policy_version=version, samples=[s.sample_id for s in samples]
            )
        self.step = version

    def _commit(self, step: int, version: int) -> None:
        """``POST /trainer/commit``, retried while the orchestrator is down (it is idempotent)."""
        while True:
            try:
                self.client.commit(step, version)
                return
            except OrchestratorUnavailable as exc:
                log.warning("commit of step %d: orchestrator unavailable (%s); retrying", step, exc)
                time.sleep(self.cfg.poll_interval_s)

    def run_loop(self) -> None:
        self.start_origin()
        self.resume()
        while self.step < self.cfg.total_steps:
            samples = self.wait_for_batch()
            self.train_step(samples)
            self.finish_step(samples)
        log.info("trained %d policy versions; done", self.step)

    def close(self) -> None:
        if self.origin is not None:
            self.origin.stop()
        self.client.close()


def main(config: RunConfig, name: str = "trainer") -> int:
    """Entry point of ``prime-rl trainer`` (:func:`prime_rl.role.run_role`; every rank asks whether the
    orchestrator is reachable, so all stop alike instead of some waiting on collectives). On SIGTERM
    it stops at once; resume continues from the last complete checkpoint."""
    loss_fn = build_loss(config)  # a config error (ComponentError) stops it before any wait
    distributed.init_distributed()
    rank = distributed.rank()
    return run_role(
        "trainer", name if rank == 0 else f"{name}-rank{rank}", config, num_threads=config.trainer.num_threads,
        start=lambda: Trainer(config, loss_fn), loop=Trainer.run_loop, log_to_run_dir=rank == 0,
        after=lambda finished: distributed.shutdown_distributed(barrier=finished), url=config.orchestrator.trusted_url,
    )  # fmt: skip
