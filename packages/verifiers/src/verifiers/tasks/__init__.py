"""Tasks to train on without a hub: procedural arithmetic, INTELLECT-2 files, HumanEval."""

from __future__ import annotations

from verifiers.tasks.arithmetic import arithmetic_tasks
from verifiers.tasks.humaneval import humaneval_tasks
from verifiers.tasks.loaders import load_tasks, save_tasks

__all__ = ["arithmetic_tasks", "humaneval_tasks", "load_tasks", "save_tasks"]
