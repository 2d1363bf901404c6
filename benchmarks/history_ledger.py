"""The ledger ``soak.py`` and ``retention.py`` build history through: one configuration, so that the
two benchmarks' figures describe the same control plane. 64 identities in a closed loop, a lease of
2 prompts x 4 samples (128-token prompts, 384-token completions), 128 samples a step, backpressure on
(``max_buffered_samples`` 512), probation and release off, and leases that never expire.

Also ``judgeable_off()``, which the control-plane benchmarks (these two, ``orchestrator_bench``,
``orchestrator_capacity``, ``tool_replay_bench``) add to their configuration."""

from __future__ import annotations

import functools
from pathlib import Path
from typing import Any

PROMPT, COMPLETION, GROUP, PROMPTS = 128, 384, 4, 2


@functools.cache
def judgeable_off() -> list[str]:
    """``--orchestrator.lease_judgeable false`` where the code under test has that setting, else nothing.

    The control-plane benchmarks' results were measured without the rule (on by default since issue
    45): their synthetic loops lease with no trainer pace to follow, which it would refuse. The rule
    has its own figures (``benchmarks/results/lease_judgeable.md``). The older checkouts these
    benchmarks compare against (``PYTHONPATH`` at another tree) predate the setting, and a config
    refuses an unknown key, so it is given only where it exists."""
    from prime_rl.config import load_config

    known = hasattr(load_config(None, []).orchestrator, "lease_judgeable")
    return ["--orchestrator.lease_judgeable", "false"] if known else []


def history_ledger(run_dir: Path, *extra: str) -> Any:
    """A real ``Ledger`` on ``run_dir`` (its store opened or created there); ``extra``: more
    ``--section.field value`` overrides (``retention.py``'s record switches)."""
    from prime_rl.config import load_config
    from prime_rl.orchestrator.ledger import Ledger
    from prime_rl.orchestrator.store import RolloutStore
    from prime_rl.tasks import TaskSet

    config = load_config(
        None,
        [
            "--run_dir", str(run_dir), "--orchestrator.prompts_per_batch", str(PROMPTS),
            "--sampling.group_size", str(GROUP), "--orchestrator.async_level", "2",
            "--orchestrator.task_timeout_s", "1e9", "--orchestrator.max_open_leases", "4",
            "--orchestrator.max_buffered_samples", "512", "--trainer.samples_per_step", "128",
            "--orchestrator.release_after_tokens", "0", "--orchestrator.probation_tokens", "0",
            "--orchestrator.max_workers", "100000", *judgeable_off(), *extra,
        ],
    )  # fmt: skip
    tasks = TaskSet([{"prompt": f"What is {i} + {i}?"} for i in range(5000)])
    return Ledger(config, tasks, RolloutStore(config.orchestrator_data_dir))
