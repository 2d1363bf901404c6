"""``prime-rl <role> --config FILE [--name NAME] [--section.key value ...]``.

Roles (each a process; their code is imported only when chosen, so ``prime-rl orchestrator``
never imports torch):

  orchestrator  the HTTP API (prime_rl.orchestrator.server)
  worker        an inference worker (prime_rl.worker.process)
  redteam       a hostile worker playing workers.behaviour (prime_rl.redteam.process; tests and demos)
  validator     the trusted validator (prime_rl.validator.process)
  trainer       the GRPO trainer (prime_rl.trainer.process; under torchrun: ``torchrun ... -m prime_rl.cli trainer``)
  evaluator     held-out evaluation of new policy versions (prime_rl.evaluator)
  origin        the shardcast origin serving published policy versions (prime_rl.weights.broadcast)
  relay         a shardcast relay (``--index i`` picks shardcast.relay_ports[i])
  run           all of the above on this machine (prime_rl.launch.supervisor)
  calibrate-noise  measure honest decode-vs-prefill noise for validator.noise_profile (prime_rl.validator.noise)

``prime-rl <role> --help`` lists the keys that role reads (type, default, description), generated
from the config models; ``--print-config`` prints the resolved configuration as JSON and exits.
A role that loads the policy and finds ``model.path = ""`` uses the embedded demo model
(:func:`prime_rl.launch.model_cache.resolve_model_path`); ``run`` resolves it once and hands the
path to its children. Selected roles feed their metrics events to the experiment trackers of
``[tracking]``. Exit codes: the role's own, 2 for a bad command line, configuration (including a
component import path (``[components] reward``, ``[trainer.loss]``) the role cannot import, found when the role starts, and
an environment that breaks the contract, found before ``worker``, ``validator``, ``calibrate-noise`` or ``run`` does anything
else: :func:`check_environment_first`) or missing demo model,
141 when the reader of ``--help``/``--print-config`` output went away (``| head``).
"""

from __future__ import annotations

import argparse
import importlib
import inspect
import os
import sys
from collections.abc import Sequence
from typing import Any

from prime_rl.config import ConfigError, RunConfig, load_config
from prime_rl.config.help import describe_config
from prime_rl.episodes import load_environment
from prime_rl.launch.model_cache import ModelSourceError, resolve_model_path
from prime_rl.metrics import setup_logging
from prime_rl.trackers import TrackerUnavailable, install_trackers

__all__ = ["MODEL_ROLES", "ROLES", "ROLE_SECTIONS", "main", "role_help"]

ROLES: dict[str, tuple[str, str]] = {
    "orchestrator": ("prime_rl.orchestrator.server", "main"),
    "worker": ("prime_rl.worker.process", "main"),
    "redteam": ("prime_rl.redteam.process", "main"),
    "validator": ("prime_rl.validator.process", "main"),
    "trainer": ("prime_rl.trainer.process", "main"),
    "evaluator": ("prime_rl.evaluator.process", "main"),
    "origin": ("prime_rl.weights.broadcast", "origin_main"),
    "relay": ("prime_rl.weights.broadcast", "relay_main"),
    "run": ("prime_rl.launch.supervisor", "main"),
    "calibrate-noise": ("prime_rl.validator.noise", "main"),
}

ROLE_SUMMARY = {
    "orchestrator": "the HTTP API every other process talks to",
    "worker": "an untrusted inference worker: generates rollouts with toploc proofs",
    "redteam": "a hostile worker playing workers.behaviour (an attack of prime_rl.redteam), for tests and demos",
    "validator": "the trusted validator: re-runs one prefill per sample, posts verdicts",
    "trainer": "the GRPO trainer (under torchrun: torchrun --nproc-per-node N -m prime_rl.cli trainer ...)",
    "evaluator": "held-out greedy accuracy of new policy versions",
    "origin": "the shardcast origin serving published policy versions",
    "relay": "a shardcast relay (--index i picks shardcast.relay_ports[i])",
    "run": "every process of a run on this machine, supervised",
    "calibrate-noise": "measure honest decode-vs-prefill noise (the workers' backend) into validator.noise_profile",
}

# The sections each role reads (the top-level keys, e.g. run_dir, come with every role).
_SHARED = ["orchestrator", "shardcast", "tracking"]
ROLE_SECTIONS: dict[str, list[str]] = {
    "orchestrator": ["orchestrator", "tasks", "sampling", "trainer", "tracking"],
    "worker": ["model", "tasks", "workers", *_SHARED],
    "redteam": ["model", "tasks", "workers", *_SHARED],
    "validator": ["model", "tasks", "sampling", "validator", *_SHARED],
    "trainer": ["model", "sampling", "trainer", *_SHARED],
    "evaluator": ["model", "tasks", "sampling", "evaluator", "trainer", *_SHARED],
    "origin": ["shardcast"],
    "relay": ["shardcast"],
    "run": [name for name in RunConfig.model_fields if name != "run_dir"],
    "calibrate-noise": ["model", "tasks", "sampling", "validator", "workers"],
}
ENVIRONMENT_ROLES = frozenset({"worker", "redteam", "validator", "run", "calibrate-noise"})
"""Roles that check ``[tasks.environment]`` before anything else (:func:`check_environment_first`)."""
MODEL_ROLES = frozenset({"worker", "redteam", "validator", "trainer", "evaluator", "run", "calibrate-noise"})
"""Roles that load the policy, so an empty ``model.path`` is resolved to the demo model for them."""

_EPILOG = (
    "Any --section.key value pair overrides the config file (values are TOML literals; a bare word is "
    "a string). `prime-rl ROLE --help` lists the keys ROLE reads."
)


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="prime-rl",
        description="INTELLECT-2-style decentralized RL: run one process of a run, or the whole run.",
        epilog=_EPILOG,
        allow_abbrev=False,  # `--conf` must not silently mean --config (it is an unknown override)
        add_help=False,  # -h/--help is ours: it lists the config keys of the chosen role
    )
    parser.add_argument("role", nargs="?", choices=sorted(ROLES), help="which process to run")
    parser.add_argument("-h", "--help", action="store_true", help="show the keys the role reads and exit")
    parser.add_argument("--config", default=None, help="TOML config file (default: built-in defaults)")
    parser.add_argument("--name", default=None, help="process name for logs and metrics (default: the role)")
    parser.add_argument("--index", type=int, default=0, help="relay index (role relay only)")
    parser.add_argument(
        "--print-config", action="store_true", help="print the resolved config as JSON and exit"
    )
    return parser


def _joined_overrides(parser: argparse.ArgumentParser, argv: Sequence[str]) -> list[str]:
    """``argv`` with each override ``--section.key value`` written ``--section.key=value``, so that a
    value beginning with ``-`` is read as the value: argparse took the generated admin token
    ``-h6LjK...`` for ``-h`` and stopped the validator with a usage error. Every ``--key`` that is
    not one of ``parser``'s own options is an override and takes the next argument."""
    own = {option for action in parser._actions for option in action.option_strings}
    joined, index = [], 0
    while index < len(argv):
        token = argv[index]
        override = token.startswith("--") and len(token) > 2 and "=" not in token and token not in own
        if override and index + 1 < len(argv):
            joined.append(f"{token}={argv[index + 1]}")
            index += 2
        else:
            joined.append(token)
            index += 1
    return joined


def role_help(role: str | None) -> str:
    """The text of ``prime-rl [ROLE] --help``: usage, roles, options, then ROLE's config keys."""
    parser = _parser()
    lines = [parser.format_usage().rstrip(), ""]
    if role is None:
        lines.append(parser.description or "")
        lines += ["", "roles:"]
        lines += [f"  {name:<13} {ROLE_SUMMARY[name]}" for name in ROLES]
    else:
        lines.append(f"prime-rl {role}: {ROLE_SUMMARY[role]}")
    lines += ["", "options:"]
    for action in parser._actions:
        if action.option_strings:
            flag = ", ".join(action.option_strings)
            if action.nargs != 0:  # an option with a value: show its placeholder
                flag += f" {action.metavar or action.dest.upper()}"
            lines.append(f"  {flag:<20} {action.help}")
    sections = ROLE_SECTIONS["run" if role is None else role]
    title = "every configuration key" if role is None else f"configuration keys {role} reads"
    lines += ["", f"{title} (TOML section [x] key k = --x.k on the command line):", ""]
    lines.append(describe_config(RunConfig, sections))
    lines += ["", _EPILOG]
    return "\n".join(lines)


def _emit(text: str) -> int:
    """Print ``text``; 141 (like a process killed by SIGPIPE) when the reader has gone (``| head``)."""
    try:
        sys.stdout.write(text + "\n")
        sys.stdout.flush()
    except BrokenPipeError:
        # Point stdout at /dev/null so the interpreter's final flush does not raise again.
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        return 141
    return 0


def role_entry(role: str) -> Any:
    """Import and return the main function of ``role``."""
    module_name, function = ROLES[role]
    return getattr(importlib.import_module(module_name), function)


def check_environment_first(role: str, config: RunConfig) -> str | None:
    """The error of the run's environment for ``role``, or None: imported, constructed and checked
    (``prime_rl.episodes.load_environment``: the contract and replayability) before the role
    calibrates, loads a model, takes a lease or starts children, so an environment author's mistake
    costs seconds, not a calibration. A torch-free import of the author's file."""
    if role not in ENVIRONMENT_ROLES or config.tasks.environment.name == "single_turn":
        return None
    try:
        load_environment(config.tasks.environment)
    except ConfigError as error:
        return str(error)
    return None


def main(argv: Sequence[str] | None = None) -> int:
    parser = _parser()
    args, overrides = parser.parse_known_args(_joined_overrides(parser, sys.argv[1:] if argv is None else argv))
    overrides = list(overrides)
    if args.help:
        return _emit(role_help(args.role))
    if args.role is None:
        print(
            f"{parser.format_usage().rstrip()}\nprime-rl: error: choose a role ({', '.join(ROLES)})",
            file=sys.stderr,
        )
        return 2
    try:
        config: RunConfig = load_config(args.config, overrides)
    except ConfigError as error:
        print(f"prime-rl: {error}", file=sys.stderr)
        return 2
    if args.print_config:
        return _emit(config.model_dump_json(indent=2))
    if args.role == "worker" and config.workers.behaviour != "honest":
        # Deprecated for one release: hostile behaviours moved to their own role (prime_rl.redteam).
        print(
            f"prime-rl worker: warning: workers.behaviour {config.workers.behaviour!r} is a red-team behaviour; "
            "`prime-rl worker` running it is deprecated and ends in the next release: use `prime-rl redteam`",
            file=sys.stderr,
        )
        args.role = "redteam"
        args.name = args.name or "worker"
    if (problem := check_environment_first(args.role, config)) is not None:
        print(f"prime-rl {args.role}: {problem}", file=sys.stderr)
        return 2
    if args.role in ("run", "trainer") and (warning := config.broadcast_warning()) is not None:
        print(f"prime-rl {args.role}: warning: {warning}", file=sys.stderr)
    name = args.name or args.role
    # stderr only until the role's init_process adds its log file: the demo model's one-time
    # conversion below must not look like a hang
    setup_logging(name, level=os.environ.get("PRIME_RL_LOG_LEVEL", "INFO"))
    if args.role in MODEL_ROLES:
        try:
            path = resolve_model_path(config.model.path, config.model.dtype)
        except ModelSourceError as error:
            print(f"prime-rl {args.role}: {error}", file=sys.stderr)
            return 2
        if path != config.model.path:
            config = config.model_copy(update={"model": config.model.model_copy(update={"path": path})})
            overrides += ["--model.path", path]  # `run` hands the resolved path to its children
    try:
        install_trackers(config, args.role, name)
    except TrackerUnavailable as error:
        print(f"prime-rl {args.role}: {error}", file=sys.stderr)
        return 2
    entry = role_entry(args.role)
    parameters = inspect.signature(entry).parameters
    kwargs: dict[str, Any] = {}
    if "name" in parameters:
        kwargs["name"] = name
    if "index" in parameters:
        kwargs["index"] = args.index
    if "config_path" in parameters:
        kwargs["config_path"] = args.config
    if "overrides" in parameters:
        kwargs["overrides"] = overrides
    try:
        code = entry(config, **kwargs)
    except ConfigError as error:  # e.g. a component import path the role cannot import
        print(f"prime-rl {args.role}: {error}", file=sys.stderr)
        return 2
    return int(code or 0)


if __name__ == "__main__":
    sys.exit(main())
