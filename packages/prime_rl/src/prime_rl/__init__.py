"""The INTELLECT-2 runtime: orchestrator, untrusted inference workers, validator and GRPO trainer."""

__version__ = "0.1.0"

__all__ = ["__version__"]
