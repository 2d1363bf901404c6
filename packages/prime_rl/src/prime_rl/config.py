"""Typed run configuration: shared sections, the composed ``RunConfig`` and the TOML/CLI loader.

All processes of a run read the same TOML file::

    run_dir = "runs/demo"
    [model]        path, dtype
    [tasks]        source, path, num_tasks, seed, ops, digits, prompt_template
    [sampling]     group_size, temperature, max_new_tokens, stop
    [orchestrator] host, port, data_dir, async_level, prompts_per_batch, task_timeout_s, seed, ...
    [shardcast]    host, origin_port, relay_ports, data_dir, keep_versions
    [trainer]      TrainerConfig   (prime_rl.trainer)
    [validator]    ValidatorConfig (prime_rl.validator)
    [workers]      WorkerConfig    (prime_rl.worker)
    [evaluator]    EvaluatorConfig (prime_rl.evaluator)

and command-line overrides ``--section.key value`` (values parsed as TOML literals, falling back
to a bare string: ``--model.path /tmp/m`` and ``--sampling.stop '["\\n"]'`` both work).
Unknown keys anywhere are errors (``ConfigError``) naming the dotted key.

Role sections live in their role's module; ``RunConfig`` resolves them lazily (on first
instantiation), so importing this module never imports torch, and a role module may import
``RunConfig`` at its top. Pitfall: a role module that is missing (not written yet) gets an empty
placeholder section that rejects every key.
"""

from __future__ import annotations

import importlib
import tomllib
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal, TypeVar

from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

if TYPE_CHECKING:
    from prime_rl.evaluator import EvaluatorConfig
    from prime_rl.trainer import TrainerConfig
    from prime_rl.validator import ValidatorConfig
    from prime_rl.worker import WorkerConfig

__all__ = [
    "ConfigError",
    "ModelConfig",
    "OrchestratorConfig",
    "RunConfig",
    "SamplingConfig",
    "Section",
    "ShardcastConfig",
    "TasksConfig",
    "load_config",
    "parse_overrides",
]


class ConfigError(ValueError):
    """A config file or override is unreadable, has an unknown key, or a value of the wrong type."""


class Section(BaseModel):
    """Base of every config section: immutable, unknown keys are errors."""

    model_config = ConfigDict(extra="forbid", frozen=True, validate_default=True)


class ModelConfig(Section):
    """[model]: the policy's initial weights and tokenizer."""

    path: str = Field(
        default="", description="HF from_pretrained directory holding the model and its tokenizer."
    )
    dtype: Literal["float32", "bfloat16"] = Field(
        default="float32", description="Compute dtype of every process (fp32 is faster on CPUs without bf16)."
    )


class TasksConfig(Section):
    """[tasks]: the training task set (identical in every process; task ids index into it)."""

    source: Literal["arithmetic", "jsonl", "parquet"] = Field(
        default="arithmetic", description="Seeded arithmetic generator, or an INTELLECT-2-schema file."
    )
    path: str = Field(default="", description="File for source 'jsonl'/'parquet' (ignored for 'arithmetic').")
    num_tasks: int = Field(
        default=1000, ge=1, description="Number of tasks (arithmetic) or max rows to read (files)."
    )
    seed: int = Field(default=0, ge=0, description="Seed of the arithmetic generator.")
    ops: list[str] = Field(default_factory=lambda: ["+"], description="Arithmetic operators to draw from.")
    digits: int = Field(default=2, ge=1, le=18, description="Max digits per arithmetic operand.")
    min_digits: int = Field(default=1, ge=1, le=18, description="Min digits per arithmetic operand.")
    terms: int = Field(default=2, ge=2, le=8, description="Operands per arithmetic problem.")
    match: Literal["first_integer", "last_integer", "boxed"] = Field(
        default="first_integer", description="How the arithmetic verifier reads the answer in a completion."
    )
    arithmetic_template: str = Field(
        default="What is {expression}? Answer with the number only.",
        description="Text of one arithmetic task; '{expression}' is replaced by the problem (e.g. '3 + 4').",
    )
    prompt_template: str = Field(
        default="{prompt}",
        description="Prompt text sent to the model; '{prompt}' is replaced by the task's prompt.",
    )

    difficulty_key: str = Field(
        default="",
        description="Row field with a pass rate for the offline difficulty filter ('' = no filter).",
    )
    min_pass_rate: float = Field(default=0.0, ge=0, le=1, description="Keep tasks with pass rate >= this.")
    max_pass_rate: float = Field(default=1.0, ge=0, le=1, description="Keep tasks with pass rate <= this.")
    length_reward: Literal["none", "exact", "max", "clip"] = Field(
        default="none",
        description="Length reward mode toward a per-prompt thinking budget (verifiers.length).",
    )
    length_alpha: float = Field(
        default=3e-4, ge=0, description="Length reward slope per token (INTELLECT-2: 3e-4)."
    )
    target_lengths: list[int] = Field(
        default_factory=lambda: [2000, 4000, 6000, 8000, 10000],
        description="Thinking budgets T; one drawn per task, seeded by (tasks.seed, task id).",
    )

    @model_validator(mode="after")
    def _check(self) -> TasksConfig:
        if "{prompt}" not in self.prompt_template:
            raise ValueError("tasks.prompt_template must contain '{prompt}'")
        if self.min_pass_rate > self.max_pass_rate:
            raise ValueError("tasks.min_pass_rate must be <= tasks.max_pass_rate")
        if self.length_reward != "none" and (not self.target_lengths or min(self.target_lengths) <= 0):
            raise ValueError("tasks.target_lengths must be non-empty positive token counts")
        if self.min_digits > self.digits:
            raise ValueError("tasks.min_digits must be <= tasks.digits")
        if self.source != "arithmetic" and not self.path:
            raise ValueError(f"tasks.path is required for tasks.source = {self.source!r}")
        return self


class SamplingConfig(Section):
    """[sampling]: how workers sample (the validator checks samples against these)."""

    group_size: int = Field(default=8, ge=1, le=1024, description="Completions per prompt (GRPO group).")
    temperature: float = Field(default=1.0, gt=0.0, le=10.0, description="Sampling temperature.")
    max_new_tokens: int = Field(default=16, ge=1, description="Max completion tokens per sample.")
    stop: list[str] = Field(default_factory=list, description="Stop strings (the stop text is kept).")


class OrchestratorConfig(Section):
    """[orchestrator]: the HTTP service workers, validator and trainer talk to."""

    host: str = Field(default="127.0.0.1", description="Bind address (0.0.0.0 to accept remote workers).")
    port: int = Field(default=8700, ge=0, le=65535, description="HTTP port (0 = pick a free one).")
    public_url: str = Field(default="", description="URL others use to reach it (default http://host:port).")
    data_dir: str = Field(
        default="", description="Persistent store directory (default <run_dir>/orchestrator)."
    )
    async_level: int = Field(
        default=2, ge=0, description="Step-s rollouts must come from a policy >= s - async_level."
    )
    prompts_per_batch: int = Field(
        default=4, ge=1, description="Prompts per task lease (each sampled group_size times)."
    )
    task_timeout_s: float = Field(
        default=300.0, gt=0, description="A lease not submitted within this time is reassigned."
    )
    seed: int = Field(default=0, ge=0, description="Run seed of task assignment and sampling seeds.")
    admin_token: str = Field(
        default="",
        description="Bearer token required on validator/trainer endpoints ('' = no check; trusted LAN only).",
    )
    registration_token: str = Field(
        default="",
        description="Bearer token POST /workers/register requires ('' = anyone may register, like admin_token).",
    )
    register_rate_per_minute: float = Field(
        default=30.0,
        ge=0,
        allow_inf_nan=False,
        description="Registrations per minute one client address may sustain (429 beyond; 0 = no limit). "
        "30 lets a few restarting workers through; a registration flood fills the worker table slowly.",
    )
    register_burst: int = Field(
        default=30, ge=1, description="Registrations one client address may make at once (token bucket size)."
    )
    max_workers: int = Field(
        default=10_000, ge=1, description="Registered, unbanned workers at most (503 worker_limit beyond)."
    )
    max_buffered_samples: int = Field(
        default=0,
        ge=0,
        description="Refuse new leases (429 busy) while this many usable samples are buffered (0 = no limit).",
    )
    max_request_bytes: int = Field(default=64 * 2**20, ge=1024, description="Largest accepted request body.")
    max_samples_per_batch: int = Field(default=4096, ge=1, description="Largest accepted rollout batch.")
    max_tokens_per_sample: int = Field(
        default=1 << 17, ge=1, description="Max prompt + completion tokens per sample."
    )

    @property
    def url(self) -> str:
        """Base URL of the orchestrator (``public_url`` or ``http://host:port``)."""
        if self.public_url:
            return self.public_url.rstrip("/")
        host = "127.0.0.1" if self.host in ("0.0.0.0", "") else self.host
        return f"http://{host}:{self.port}"


class ShardcastConfig(Section):
    """[shardcast]: the weight broadcast tree (trainer -> origin -> relays -> workers)."""

    host: str = Field(default="127.0.0.1", description="Host the origin and relays bind and are reached at.")
    origin_port: int = Field(
        default=8701, ge=1, le=65535, description="Port of the origin the trainer publishes to."
    )
    relay_ports: list[int] = Field(
        default_factory=lambda: [8702], description="Ports of relays `run` starts."
    )
    servers: list[str] = Field(
        default_factory=list, description="URLs clients fetch from (default: the relays, then the origin)."
    )
    data_dir: str = Field(
        default="", description="Directory for origin/relay data (default <run_dir>/shardcast)."
    )
    keep_versions: int = Field(default=5, ge=1, description="Policy versions kept by the origin and relays.")

    @property
    def origin_url(self) -> str:
        return f"http://{self.host}:{self.origin_port}"

    @property
    def client_servers(self) -> list[str]:
        """Where clients fetch weights: ``servers`` if set, else every relay then the origin."""
        if self.servers:
            return list(self.servers)
        return [f"http://{self.host}:{port}" for port in self.relay_ports] + [self.origin_url]


# Role sections: (module, class name). Resolved lazily so importing config never imports torch.
# A light ``prime_rl.<role>_config`` module, when it exists, is preferred over the role module
# itself, so processes that do not run the role (orchestrator, shardcast, run) skip importing torch.
_ROLE_SECTIONS: dict[str, tuple[str, str]] = {
    "trainer": ("prime_rl.trainer", "TrainerConfig"),
    "validator": ("prime_rl.validator", "ValidatorConfig"),
    "workers": ("prime_rl.worker", "WorkerConfig"),
    "evaluator": ("prime_rl.evaluator", "EvaluatorConfig"),
}
_resolved: dict[str, type[BaseModel]] = {}


def _placeholder(class_name: str, module: str) -> type[BaseModel]:
    return type(
        class_name,
        (Section,),
        {"__doc__": f"Placeholder: {module} is not available, so this section accepts no keys."},
    )


def _import_optional(module_name: str) -> Any:
    try:
        return importlib.import_module(module_name)
    except ModuleNotFoundError as error:
        if error.name != module_name:
            raise
        return None


def _section_class(key: str) -> type[BaseModel]:
    if key not in _resolved:
        module_name, class_name = _ROLE_SECTIONS[key]
        section = None
        for candidate in (f"{module_name}_config", module_name):
            module = _import_optional(candidate)
            section = getattr(module, class_name, None) if module is not None else None
            if section is not None:
                break
        _resolved[key] = section if section is not None else _placeholder(class_name, module_name)
    return _resolved[key]


def _default(key: str) -> Callable[[], Any]:
    return lambda: _section_class(key)()


class RunConfig(BaseModel):
    """The whole run: every process reads this one model (and uses the sections it needs)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    run_dir: str = Field(
        default="runs/default", description="Directory for logs, metrics and data of this run."
    )
    model: ModelConfig = Field(
        default_factory=lambda: ModelConfig(), description="Policy weights and tokenizer."
    )
    tasks: TasksConfig = Field(default_factory=lambda: TasksConfig(), description="Training tasks.")
    sampling: SamplingConfig = Field(
        default_factory=lambda: SamplingConfig(), description="Sampling settings."
    )
    orchestrator: OrchestratorConfig = Field(
        default_factory=lambda: OrchestratorConfig(), description="Orchestrator."
    )
    shardcast: ShardcastConfig = Field(
        default_factory=lambda: ShardcastConfig(), description="Weight broadcast."
    )
    trainer: TrainerConfig = Field(
        default_factory=_default("trainer"), description="Trainer (prime_rl.trainer)."
    )
    validator: ValidatorConfig = Field(
        default_factory=_default("validator"), description="Validator (prime_rl.validator)."
    )
    workers: WorkerConfig = Field(
        default_factory=_default("workers"), description="Workers (prime_rl.worker)."
    )
    evaluator: EvaluatorConfig = Field(
        default_factory=_default("evaluator"), description="Held-out evaluator (prime_rl.evaluator)."
    )

    def __init__(self, **data: Any) -> None:
        _resolve_run_config()
        super().__init__(**data)

    @classmethod
    def resolve(cls) -> type[RunConfig]:
        """Import the role sections and finish the model; returns the class (idempotent)."""
        _resolve_run_config()
        return cls

    @property
    def orchestrator_data_dir(self) -> Path:
        return Path(self.orchestrator.data_dir or Path(self.run_dir) / "orchestrator")

    @property
    def shardcast_data_dir(self) -> Path:
        return Path(self.shardcast.data_dir or Path(self.run_dir) / "shardcast")


def _resolve_run_config() -> None:
    if RunConfig.__pydantic_complete__ and len(_resolved) == len(_ROLE_SECTIONS):
        return
    namespace = {cls_name: _section_class(key) for key, (_, cls_name) in _ROLE_SECTIONS.items()}
    globals().update(namespace)  # pydantic looks up the string annotations in this module
    RunConfig.model_rebuild(force=True, _types_namespace=namespace)


# ---------------------------------------------------------------- loader

M = TypeVar("M", bound=BaseModel)


def _parse_value(text: str) -> Any:
    try:
        return tomllib.loads(f"v = {text}")["v"]
    except tomllib.TOMLDecodeError:
        return text


def parse_overrides(overrides: Sequence[str]) -> dict[str, Any]:
    """``["--a.b", "1", "--c=x"]`` -> ``{"a": {"b": 1}, "c": "x"}`` (values as TOML literals).

    Raises ``ConfigError`` on a token that is not ``--key`` or lacks a value.
    """
    result: dict[str, Any] = {}
    index = 0
    tokens = list(overrides)
    while index < len(tokens):
        token = tokens[index]
        if not token.startswith("--") or len(token) <= 2:
            raise ConfigError(f"expected an override '--section.key value', got {token!r}")
        key = token[2:]
        if "=" in key:
            key, raw = key.split("=", 1)
            index += 1
        else:
            if index + 1 >= len(tokens):
                raise ConfigError(f"override --{key} has no value")
            raw = tokens[index + 1]
            index += 2
        parts = key.replace("-", "_").split(".")
        if any(not part for part in parts):
            raise ConfigError(f"malformed override key {key!r}")
        node = result
        for part in parts[:-1]:
            child = node.setdefault(part, {})
            if not isinstance(child, dict):
                raise ConfigError(f"override --{key} conflicts with an earlier override of {part!r}")
            node = child
        node[parts[-1]] = _parse_value(raw)
    return result


def _merge(base: dict[str, Any], update: dict[str, Any]) -> dict[str, Any]:
    merged = dict(base)
    for key, value in update.items():
        if isinstance(value, dict) and isinstance(merged.get(key), dict):
            merged[key] = _merge(merged[key], value)
        else:
            merged[key] = value
    return merged


def _format_validation_error(error: ValidationError, source: str) -> str:
    lines = [f"invalid configuration ({source}):"]
    for item in error.errors():
        key = ".".join(str(part) for part in item["loc"]) or "<root>"
        if item["type"] == "extra_forbidden":
            lines.append(f"  unknown key '{key}'")
        else:
            lines.append(f"  {key}: {item['msg']} (got {item.get('input')!r})")
    return "\n".join(lines)


def load_config(
    path: str | Path | None,
    overrides: Sequence[str] = (),
    model: type[M] = RunConfig,  # type: ignore[assignment]
) -> M:
    """Read TOML ``path`` (None = defaults only), apply ``overrides``, validate into ``model``.

    Raises ``ConfigError`` with every problem listed by dotted key (unknown keys included).
    """
    data: dict[str, Any] = {}
    source = "defaults"
    if path is not None:
        source = str(path)
        try:
            data = tomllib.loads(Path(path).read_text(encoding="utf-8"))
        except FileNotFoundError as error:
            raise ConfigError(f"config file not found: {path}") from error
        except (tomllib.TOMLDecodeError, UnicodeDecodeError) as error:
            raise ConfigError(f"{path}: not valid TOML: {error}") from error
    if overrides:
        data = _merge(data, parse_overrides(overrides))
        source += " + overrides"
    if model is RunConfig:
        _resolve_run_config()
    try:
        return model.model_validate(data)
    except ValidationError as error:
        raise ConfigError(_format_validation_error(error, source)) from None
