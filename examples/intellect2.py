"""The INTELLECT-2 recipe: GRPO with untrusted inference workers, composed from four libraries.

    python examples/intellect2.py --config configs/tiny-cpu.toml      # what `make run` does
    python examples/intellect2.py --config configs/tiny-cpu.toml --trainer.total_steps 4
    python examples/intellect2.py --config configs/tiny-cpu.toml --seed 1   # another training set

The algorithm is this file, read top to bottom as one policy step; the sizes (model, group size,
learning rate, ...) are in the config. `prime_rl` runs it as processes: an orchestrator leasing
tasks, untrusted workers sampling and proving, a trusted validator recomputing every claim, a
trainer stepping the loss, and a shardcast tree broadcasting each new policy.

To try another reward or loss, edit its line below. Every process imports `reward` and `loss`
from this file by the import paths the run puts in `[components] reward` and `[trainer.loss]`; a
process on another machine needs this file at the same path, or those keys set to an importable
`module:attribute`. A config that sets `[trainer.loss]` itself (configs/*.toml do, so the file
says which loss it was measured with) must name this loss: two different losses stop the run
before it starts, naming both.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import grpo
from prime_rl.config import ConfigError, load_config
from prime_rl.launch.local import run_local
from prime_rl.reward import default_reward, weighted

# 1. Tasks and their reward (verifiers) ------------------------------------------------------------
# The orchestrator leases each worker prompts chosen by a seeded hash of (worker, step, batch), so
# no worker picks its tasks. A task's `task_type` selects its verifier: "verifiable_math" (the last
# \boxed{} answer must equal the ground truth under sympy), "prime_rl_code" (the program runs
# against the task's tests in a sandbox; partial credit), "arithmetic_exact" (the demo's sums).
# With `[tasks] length_reward`, the prompt names a thinking budget and `default_reward` adds
# INTELLECT-2's length term. Workers claim this reward for each completion; the validator recomputes
# it and rejects a sample whose claim differs. The reward is a weighted sum of (term, weight) pairs,
# added in this order; another term is one more line, e.g. a format bonus:
#     (lambda task, completion, num_tokens, budget: float("\\boxed{" in completion), 0.1),
reward = weighted(
    (default_reward, 1.0),  # verifiers.verify's score, then the length term toward the budget
)


# 2. Sampling and proofs (toploc) ------------------------------------------------------------------
# A worker samples `group_size` completions per prompt with the policy it holds (at most
# `async_level` versions old), drawing every token with toploc's seeded sampler
# (`toploc.sample_tokens`) from seeds the orchestrator assigns, and commits to its hidden states
# with toploc proofs (`toploc.ProofBuilder`: the top 128 values per 32 tokens, 258 bytes). The
# validator re-runs one prefill per sample with the claimed policy, redraws every token
# (`toploc.check_sampling`) and checks the proofs (`toploc.verify_proofs_bytes`) against
# `toploc.Thresholds` set by `[validator]`. This is the wire protocol every worker and validator
# share, so it is not swapped here; `prime_rl.inference.backend` implements it.

# 3. The loss (grpo) -------------------------------------------------------------------------------
# Advantages are group z-scores, (r - mean) / (std + 1e-6), computed by workers and recomputed by
# the validator. The trainer waits for `samples_per_step` accepted samples from groups whose
# advantages are not all zero (INTELLECT-2's online filter, `[trainer] filter_zero_advantage`)
# and takes `optimizer_steps_per_version` steps of this loss. INTELLECT-2's: token-level PPO clip
# 0.2/0.2 with the two-sided cap delta = 4 on the ratio, entropy bonus 1e-3, and a constant
# normaliser (the loss's `constant`, default `max_new_tokens`). Another: grpo.Loss("dapo").
loss = grpo.Loss("intellect2")

# 4. Weight broadcast (shardcast) ------------------------------------------------------------------
# The trainer writes policy version v + 1 as one safetensors file and publishes it to a shardcast
# origin (`shardcast.Origin`); relays (`shardcast.Relay`) mirror it shard by shard, and workers
# fetch it with `shardcast.Client` (verified shards, atomic swap) and hot-reload it between
# batches while the trainer already computes the next step. Ports and relays: `[shardcast]`.

# 5. The runtime (prime_rl) ------------------------------------------------------------------------
COMPONENTS = {"reward": reward, "loss": loss}
"""What this file hands every process, by name (each one imports it as ``<this file>:<name>``)."""


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0], allow_abbrev=False)
    parser.add_argument("--config", default="configs/tiny-cpu.toml", help="run configuration (TOML)")
    parser.add_argument("--keep-ports", action="store_true", help="use the configured ports, not free ones")
    parser.add_argument(
        "--keep-weights",
        action="store_true",
        help="keep every process's policy copies (~20 GB), not just the last",
    )
    parser.add_argument(
        "--seed",
        type=int,
        default=None,
        help="the run's seed: tasks.seed (which problems train, in which order, with which budgets). The test "
        "split stays fixed (evaluator.seed); task leases and sampling seeds are keyed by the run's fresh "
        "assignment key, so they differ on every run anyway",
    )
    args, overrides = parser.parse_known_args(argv)
    if args.seed is not None:
        overrides = [*overrides, "--tasks.seed", str(args.seed)]
    try:
        config = load_config(args.config, overrides)
        here = Path(__file__).resolve()
        return run_local(
            config,
            args.config,
            overrides,
            components={name: f"{here}:{name}" for name in COMPONENTS},
            keep_ports=args.keep_ports,
            keep_weights=args.keep_weights,
        )
    except ConfigError as error:
        print(f"intellect2: {error}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
