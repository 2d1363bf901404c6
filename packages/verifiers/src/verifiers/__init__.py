"""Math and code rewards for RL: symbolic answer checking and sandboxed test execution."""

__version__ = "0.1.0"

__all__ = ["__version__"]
