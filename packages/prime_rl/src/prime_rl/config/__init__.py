"""The run's configuration: the torch-free ground floor every process stands on.

Owns: the typed sections (``sections.py`` for the shared ones, one module per role's section),
``RunConfig`` composed from them by plain imports (``run.py``), the TOML + ``--section.key
value`` loader (``loader.py``), the components' import paths with their loader
(``components.py``; a component is imported only when the role that uses it asks) and the loss's
one key, a recipe table or an import path, with its guard (``loss.py``).
May import: pydantic, the standard library and ``grpo.recipes`` (the loss as torch-free plain
data) only; never a role room, never torch. Every other room may import it.
"""

from prime_rl.config.base import ConfigError, Section
from prime_rl.config.components import ComponentError, ComponentsConfig, load_component
from prime_rl.config.evaluator import EvaluatorConfig
from prime_rl.config.loader import load_config, parse_overrides, with_overrides
from prime_rl.config.run import RunConfig
from prime_rl.config.sections import (
    GENERATED_SOURCES,
    CodeTasksConfig,
    EnvironmentConfig,
    ModelConfig,
    OrchestratorConfig,
    SamplingConfig,
    ShardcastConfig,
    TasksConfig,
)
from prime_rl.config.tracking import TrackingConfig
from prime_rl.config.trainer import TrainerConfig
from prime_rl.config.validator import ValidatorConfig
from prime_rl.config.worker import WorkerConfig

__all__ = [
    "GENERATED_SOURCES",
    "CodeTasksConfig",
    "ComponentError",
    "ComponentsConfig",
    "ConfigError",
    "EnvironmentConfig",
    "EvaluatorConfig",
    "ModelConfig",
    "OrchestratorConfig",
    "RunConfig",
    "SamplingConfig",
    "Section",
    "ShardcastConfig",
    "TasksConfig",
    "TrackingConfig",
    "TrainerConfig",
    "ValidatorConfig",
    "WorkerConfig",
    "load_component",
    "load_config",
    "parse_overrides",
    "with_overrides",
]
