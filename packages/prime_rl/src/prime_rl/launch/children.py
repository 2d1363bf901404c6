"""Which processes ``prime-rl run`` starts on this machine, in what order, and which of them restart.

The order: orchestrator -> shardcast origin -> relays -> trainer -> ``validator.count`` validators
(``validator``, ``validator-1``, ...) -> honest workers (``workers.count``) -> one hostile worker per
``workers.hostile`` entry -> evaluator (if enabled); with vLLM workers and no configured noise profile a
``calibrate-noise`` child takes the validator's place, and the validators start when it has written the
profile (:func:`worker_noise_path`). More than one validator needs an orchestrator that leases each
pending batch to one validator (:func:`check_validator_leases`). The supervisor that starts and
restarts them is ``launch/supervisor.py``.

What restarts (:func:`should_restart`), while the run goes on: the orchestrator, the shardcast origin and relays, whatever their
exit code (none ends on its own while the run goes on); the validator whatever its exit code too,
so a run never goes on without one (a validator stopped by a stray SIGTERM exits 0), unless it
finished its ``validator.max_batches``; the trainer and the workers when they fail (exit code 0 is a
trainer that finished, or a worker that was banned or did its ``workers.max_batches``). Each role
resumes from its durable state: the orchestrator from its store (``orchestrator/store.py``), the
validator from the run's evidence ledger in the orchestrator's store, the trainer from its last checkpoint, a worker under its saved identity
(``worker/identity.py``). The evaluator and ``calibrate-noise`` are not restarted.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from prime_rl.api.client import ApiError, OrchestratorClient
from prime_rl.api.protocol import host_validator_id
from prime_rl.config import RunConfig

__all__ = [
    "DROPPABLE_ROLES",
    "VALIDATOR_LEASES",
    "ChildSpec",
    "check_validator_leases",
    "plan_children",
    "should_restart",
    "validator_name",
    "worker_noise_path",
]

VALIDATOR_LEASES = "validator_leases"
"""The ``GET /status`` capability that lets a run start more than one validator (``validator.count``)."""

DROPPABLE_ROLES = ("worker", "redteam")
"""Roles whose child is dropped, not the run failed, past its restart budget: untrusted workers, one
of many (``redteam``: a hostile one); the run cannot go on without any trusted role."""


@dataclass(frozen=True)
class ChildSpec:
    """One process of the run: its name (logs/metrics), role and extra ``--key value`` overrides;
    ``after``: the name of a child that must first exit with code 0 (a preparation step)."""

    name: str
    role: str
    extra: tuple[str, ...] = ()
    after: str = ""


def _has_field(section: Any, name: str) -> bool:
    return name in type(section).model_fields


def worker_noise_path(config: RunConfig) -> Path | None:
    """Where ``run`` has the workers' honest noise measured before the validator starts, or None.

    Only for evidence with no configured profile and workers that do not decode with HF: the
    validator measures an HF decode itself, but an in-process vLLM engine would take its threads, so
    a ``calibrate-noise`` child measures their engine's decode (cached per model, engine and machine by
    ``prime_rl.validator.noise_cache``: after the first run it only reads the cache).
    """
    validator, workers = config.validator, config.workers
    if validator.count and validator.evidence and not validator.noise_profile and workers.backend != "hf":
        return Path(config.run_dir) / "validator" / "noise-profile.json"
    return None


def plan_children(config: RunConfig) -> list[ChildSpec]:
    """The processes ``run`` starts, in start order (a child with ``after`` once that one is done)."""
    children = [ChildSpec("orchestrator", "orchestrator"), ChildSpec("shardcast-origin", "origin")]
    for index in range(len(config.shardcast.relay_ports)):
        children.append(ChildSpec(f"shardcast-relay-{index}", "relay", ("--index", str(index))))
    trainer_extra: tuple[str, ...] = ()
    if _has_field(config.trainer, "serve_origin"):
        trainer_extra = ("--trainer.serve_origin", "false")  # the origin is its own process here
    children.append(ChildSpec("trainer", "trainer", trainer_extra))
    noise_path = worker_noise_path(config)
    validators = [validator_name(index) for index in range(config.validator.count)]
    if noise_path is None:
        children += [ChildSpec(name, "validator", _validator_id(config, name)) for name in validators]
    elif validators:
        profile = ("--validator.noise_profile", str(noise_path))
        children.append(ChildSpec("calibrate-noise", "calibrate-noise", profile))
        children += [
            ChildSpec(name, "validator", profile + _validator_id(config, name), after="calibrate-noise")
            for name in validators
        ]
    workers = config.workers
    # Hostile behaviours run as the red team's own role (prime_rl.redteam): the worker role is honest only.
    worker_role = "worker" if getattr(workers, "behaviour", "honest") == "honest" else "redteam"
    for index in range(int(getattr(workers, "count", 1))):
        children.append(ChildSpec(f"worker-{index}", worker_role))
    for index, behaviour in enumerate(getattr(workers, "hostile", []) or []):
        extra = ("--workers.behaviour", str(behaviour)) if _has_field(workers, "behaviour") else ()
        children.append(ChildSpec(f"hostile-{index}", "redteam", extra))
    evaluator = config.evaluator
    enabled = getattr(evaluator, "enabled", None)
    if enabled is None:
        enabled = int(getattr(evaluator, "every", 0) or 0) > 0
    if enabled:
        children.append(ChildSpec("evaluator", "evaluator"))
    return children


def validator_name(index: int) -> str:
    """``validator`` for the first validator (as before there were several), ``validator-<i>`` after."""
    return "validator" if index == 0 else f"validator-{index}"


def _validator_id(config: RunConfig, name: str) -> tuple[str, ...]:
    """The ``--validator.validator_id`` of the validator child ``name``: the same across its restarts,
    so that a restarted validator takes back at once the batches its killed predecessor held, instead
    of leaving them to wait out ``orchestrator.validator_lease_s``. ``<host>-<name>`` by default
    (``validator.validator_id`` unset: a hand-started validator is ``<host>-<pid>``); a configured
    id is kept for a lone validator and gets ``-<name>`` when there are several, which must not share
    one."""
    configured = config.validator.validator_id
    if configured and config.validator.count == 1:
        return ()
    return ("--validator.validator_id", f"{configured[:48]}-{name}" if configured else host_validator_id(name))


def check_validator_leases(config: RunConfig, client: OrchestratorClient) -> str | None:
    """Why this run must not start ``validator.count`` validators, or None (module docstring)."""
    if config.validator.count <= 1:
        return None
    try:
        capabilities = client.status().capabilities
    except ApiError as error:
        return f"cannot read the orchestrator's capabilities: {error}"
    if VALIDATOR_LEASES in capabilities:
        return None
    return (
        f"validator.count = {config.validator.count}, but this orchestrator does not lease pending batches to one "
        f"validator each ({VALIDATOR_LEASES!r} is not among its capabilities {capabilities}): every validator would "
        "judge the same batches. Run one validator per run (validator.count = 1) until it does"
    )


def should_restart(config: RunConfig, spec: ChildSpec, exit_code: int) -> bool:
    """Whether a child of ``spec`` that exited with ``exit_code`` while the run goes on is restarted
    (module docstring, "Restarts")."""
    if spec.role in ("orchestrator", "origin", "relay"):
        return True
    if spec.role == "validator":
        return exit_code != 0 or not int(getattr(config.validator, "max_batches", 0) or 0)
    if spec.role in ("trainer", *DROPPABLE_ROLES):
        return exit_code != 0
    return False
