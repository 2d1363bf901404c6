"""The INTELLECT-2 runtime: orchestrator, untrusted inference workers, validator and GRPO trainer.

The package root stays light (no torch import): the control plane's public names are here; the
compute roles live in ``prime_rl.worker.process``, ``prime_rl.validator.process`` and ``prime_rl.trainer.process``.
"""

__version__ = "0.1.0"

from prime_rl._name_clash import warn_on_name_clash as _warn_on_name_clash
from prime_rl.api.client import ClientRequestError, OrchestratorClient, OrchestratorUnavailable
from prime_rl.config import ConfigError, RunConfig, load_config

_warn_on_name_clash("prime_rl", "intellect2-prime-rl", others_hint="PrimeIntellect's `prime-rl`")

__all__ = [
    "ClientRequestError",
    "ConfigError",
    "OrchestratorClient",
    "OrchestratorUnavailable",
    "RunConfig",
    "__version__",
    "load_config",
]
