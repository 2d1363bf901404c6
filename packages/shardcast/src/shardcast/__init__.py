"""Broadcast model checkpoints to many machines through an HTTP relay tree, verified shard by shard."""

__version__ = "0.4.0"

__all__ = ["__version__"]
