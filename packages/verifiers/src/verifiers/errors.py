"""Exception types raised by `verifiers` (all derive from `VerifierError`)."""

from __future__ import annotations


class VerifierError(Exception):
    """Base class of every error this package raises on purpose."""


class UnknownTaskTypeError(VerifierError, KeyError):
    """`verify` was given a task whose `task_type` has no registered verifier."""

    def __str__(self) -> str:  # KeyError would repr() the message
        return str(self.args[0]) if self.args else "unknown task type"


class TaskFormatError(VerifierError, ValueError):
    """A task row or its `verification_info` is malformed (missing key, bad JSON, wrong type)."""


class SandboxError(VerifierError, RuntimeError):
    """The code sandbox could not be started (no usable isolation, missing interpreter)."""


class WorkerError(VerifierError, RuntimeError):
    """The math worker process pool failed to start or answer (not a timeout)."""
