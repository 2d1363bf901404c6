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


class RewardError(VerifierError, ValueError):
    """A reward function returned something that is not a finite real number (a string, a bool,
    None, NaN or inf). It names the function and, once known, the environment and the task id;
    :meth:`at` adds them as the error travels up (rubric -> environment -> the runtime's task)."""

    def __init__(self, value: object, *, function: str, environment: str = "", task_id: int | None = None) -> None:
        self.value = value
        self.function = function
        self.environment = environment
        self.task_id = task_id
        super().__init__(str(self))

    def at(self, *, environment: str | None = None, task_id: int | None = None) -> RewardError:
        """This error with ``environment`` and ``task_id`` filled in (those already set are kept)."""
        return RewardError(
            self.value,
            function=self.function,
            environment=self.environment or environment or "",
            task_id=self.task_id if self.task_id is not None else task_id,
        )

    def __str__(self) -> str:
        where = [f"environment {self.environment}"] if self.environment else []
        where.append(f"reward function {self.function!r}")
        if self.task_id is not None:
            where.append(f"task {self.task_id}")
        return (
            f"{', '.join(where)}: returned {self.value!r:.80} ({type(self.value).__name__}); a reward must be a "
            "finite real number (an int or a float; not a str, bool, None, NaN or inf)"
        )


class EnvironmentSpecError(VerifierError, TypeError):
    """An environment breaks the contract before any episode is played: it names where the
    environment is defined, the attribute and the rule (``verifiers.envs.check_environment``)."""

    def __init__(self, where: str, attribute: str, rule: str) -> None:
        self.where = where
        self.attribute = attribute
        self.rule = rule
        super().__init__(f"{where}: {attribute}: {rule}")
