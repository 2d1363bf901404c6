"""The INTELLECT-2 runtime: orchestrator, untrusted inference workers, validator and GRPO trainer.

The package root stays light (no torch import): the control plane's public names are here; the
compute roles live in ``prime_rl.worker``, ``prime_rl.validator`` and ``prime_rl.trainer``.
"""

__version__ = "0.1.0"

from prime_rl.client import ClientRequestError, OrchestratorClient, OrchestratorUnavailable
from prime_rl.config import ConfigError, RunConfig, load_config

__all__ = [
    "ClientRequestError",
    "ConfigError",
    "OrchestratorClient",
    "OrchestratorUnavailable",
    "RunConfig",
    "__version__",
    "load_config",
]
