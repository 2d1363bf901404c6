"""The GRPO-family RL objective for language models as small, exact, tested functions over tensors."""

__version__ = "0.1.0"

__all__ = ["__version__"]
