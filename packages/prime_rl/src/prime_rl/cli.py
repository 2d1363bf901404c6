"""``prime-rl <role> --config FILE [--name NAME] [--section.key value ...]``.

Roles (each a process; their code is imported only when chosen, so ``prime-rl orchestrator``
never imports torch):

  orchestrator  the HTTP API (prime_rl.orchestrator.server)
  worker        an inference worker (prime_rl.worker.process)
  validator     the trusted validator (prime_rl.validator.process)
  trainer       the GRPO trainer (prime_rl.trainer.process; under torchrun: ``torchrun ... -m prime_rl.cli trainer``)
  evaluator     held-out evaluation of new policy versions (prime_rl.evaluator)
  origin        the shardcast origin serving published policy versions (prime_rl.weights.broadcast)
  relay         a shardcast relay (``--index i`` picks shardcast.relay_ports[i])
  run           all of the above on this machine (prime_rl.launch.supervisor)
  calibrate-noise  measure honest decode-vs-prefill noise for validator.noise_profile (prime_rl.validator.noise)

``--print-config`` prints the resolved configuration as JSON and exits. Exit codes: the role's
own, 2 for a bad command line or configuration.
"""

from __future__ import annotations

import argparse
import importlib
import inspect
import sys
from collections.abc import Sequence
from typing import Any

from prime_rl.config import ConfigError, RunConfig, load_config

__all__ = ["ROLES", "main"]

ROLES: dict[str, tuple[str, str]] = {
    "orchestrator": ("prime_rl.orchestrator.server", "main"),
    "worker": ("prime_rl.worker.process", "main"),
    "validator": ("prime_rl.validator.process", "main"),
    "trainer": ("prime_rl.trainer.process", "main"),
    "evaluator": ("prime_rl.evaluator", "main"),
    "origin": ("prime_rl.weights.broadcast", "origin_main"),
    "relay": ("prime_rl.weights.broadcast", "relay_main"),
    "run": ("prime_rl.launch.supervisor", "main"),
    "calibrate-noise": ("prime_rl.validator.noise", "main"),
}


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="prime-rl",
        description="INTELLECT-2-style decentralized RL: run one process of a run, or the whole run.",
        epilog="Any other --section.key value pair overrides the config file (values are TOML literals).",
    )
    parser.add_argument("role", choices=sorted(ROLES), help="which process to run")
    parser.add_argument("--config", default=None, help="TOML config file (default: built-in defaults)")
    parser.add_argument("--name", default=None, help="process name for logs and metrics (default: the role)")
    parser.add_argument("--index", type=int, default=0, help="relay index (role relay only)")
    parser.add_argument(
        "--print-config", action="store_true", help="print the resolved config as JSON and exit"
    )
    return parser


def role_entry(role: str) -> Any:
    """Import and return the main function of ``role``."""
    module_name, function = ROLES[role]
    return getattr(importlib.import_module(module_name), function)


def main(argv: Sequence[str] | None = None) -> int:
    args, overrides = _parser().parse_known_args(argv)
    try:
        config: RunConfig = load_config(args.config, overrides)
    except ConfigError as error:
        print(f"prime-rl: {error}", file=sys.stderr)
        return 2
    if args.print_config:
        print(config.model_dump_json(indent=2))
        return 0
    entry = role_entry(args.role)
    parameters = inspect.signature(entry).parameters
    kwargs: dict[str, Any] = {}
    if "name" in parameters:
        kwargs["name"] = args.name or args.role
    if "index" in parameters:
        kwargs["index"] = args.index
    if "config_path" in parameters:
        kwargs["config_path"] = args.config
    if "overrides" in parameters:
        kwargs["overrides"] = list(overrides)
    code = entry(config, **kwargs)
    return int(code or 0)


if __name__ == "__main__":
    sys.exit(main())
