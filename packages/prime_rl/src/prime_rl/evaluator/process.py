"""The evaluator process (``prime-rl evaluator``): follow the published policy versions and log one
``eval`` record per evaluated version (what is evaluated, and how: ``heldout.py``)."""

from __future__ import annotations

import logging
import time
from pathlib import Path
from typing import TYPE_CHECKING

import torch

from prime_rl.config import EvaluatorConfig
from prime_rl.devices import choose_device
from prime_rl.evaluator.heldout import EvaluatorError, evaluate, heldout_task_set, versions_to_evaluate
from prime_rl.inference.select import make_backend
from prime_rl.metrics import init_process
from prime_rl.tasks import load_tasks
from prime_rl.weights.store import LocalPolicies, PolicyStore, PolicyUnavailable

if TYPE_CHECKING:
    from prime_rl.config import RunConfig

__all__ = ["main"]

log = logging.getLogger(__name__)


def main(config: RunConfig, name: str = "evaluator") -> int:
    """Process entry of ``prime-rl evaluator``: evaluate versions until the final one; returns 0."""
    cfg: EvaluatorConfig = config.evaluator
    metrics = init_process("evaluator", name, config.run_dir)
    torch.set_num_threads(cfg.num_threads)
    training = load_tasks(config.tasks)
    seed = cfg.test_seed if cfg.split == "test" else cfg.seed
    try:
        heldout = heldout_task_set(
            config.tasks, cfg.num_problems, seed, training=training, overrides=cfg.tasks, split=cfg.split
        )
    except EvaluatorError as error:  # a small dataset must not stop the run it was meant to measure
        log.warning("no held-out evaluation: %s", error)
        metrics.log("eval_skipped", reason=str(error))
        return 0
    backend = make_backend(  # generates as the workers do, on their device
        config,
        backend=config.workers.backend,
        device=choose_device(config.workers.device),
        max_batch_size=cfg.batch_size,
    )
    max_new_tokens = cfg.max_new_tokens or config.sampling.max_new_tokens
    # Version 0 is the backend's own initial weights, so the cache holds only fetched versions.
    store = PolicyStore(
        config.shardcast.client_servers,
        Path(config.run_dir) / "evaluator" / "policies",
        None,
        keep=2,
        local=LocalPolicies.of_run(config),  # the trainer's own file when it runs on this machine
    )
    total_steps = int(config.trainer.total_steps)
    log.info(
        "held-out set: %d problems (seed %d, split %s); evaluating versions %s",
        len(heldout),
        seed,
        cfg.split,
        versions_to_evaluate(total_steps, cfg.every),
    )
    for wanted in versions_to_evaluate(total_steps, cfg.every):
        if wanted <= backend.policy_version and wanted != 0:
            continue  # an earlier wait already delivered a newer version
        if wanted > 0:
            waited = time.perf_counter()
            try:
                version = store.wait_for_published(
                    wanted, timeout_s=cfg.version_timeout_s, poll_s=cfg.poll_interval_s
                )
            except PolicyUnavailable as error:
                raise EvaluatorError(
                    f"policy version {wanted} did not appear within {cfg.version_timeout_s:.0f}s"
                ) from error
            backend.load_weights(store.path(version), version)
            metrics.log("weights_loaded", policy_version=version, wait_s=time.perf_counter() - waited)
        result = evaluate(
            backend,
            heldout,
            max_new_tokens=max_new_tokens,
            stop=config.sampling.stop,
            batch_size=cfg.batch_size,
        )
        metrics.log("eval", split=cfg.split, seed=seed, **result.__dict__)
        per_type = (f"{name} {c['num_correct']:.0f}/{c['num_problems']:.0f}" for name, c in result.by_type.items())
        log.info(
            "policy version %d: held-out accuracy %.3f (%d/%d; %s), length distance %s in %.1fs",
            result.policy_version,
            result.accuracy,
            result.num_correct,
            result.num_problems,
            ", ".join(per_type),
            "-" if result.mean_length_distance is None else f"{result.mean_length_distance:.1f}",
            result.seconds,
        )
    return 0
