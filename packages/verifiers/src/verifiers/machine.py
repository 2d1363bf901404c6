"""Scores the machine limited: which wall-clock-limited checks may have lowered a reward, and a
collector that sees them through any reward built on `verify`.

A reward is normally the completion's merit. Some checks are limited by wall-clock time, so on a
loaded or broken machine a correct completion can score less than it deserves, and a second run
(another machine, or the same one later) can score it differently. `Score.machine_limit` names
such a cause when, and only when, it may have lowered the score:

| cause            | what happened                                                              |
|------------------|----------------------------------------------------------------------------|
| `sandbox_start`  | the code sandbox's runner never started, after its fresh-runner retries    |
| `test_timeout`   | a code test hit its wall-clock limit (or the sandbox its overall deadline) |
| `math_timeout`   | the symbolic comparison with a gold answer hit its time limit              |
| `deadline`       | `verify_batch`'s per-item deadline passed before the verifier returned     |
| `tool_timeout`   | a tool's sandboxed program hit its wall-clock or CPU limit (or was killed)  |
| `tool_output_limit` | a tool's program printed more than the sandbox keeps, and was killed     |
| `tool_memory`    | a tool's program hit its memory limit                                      |
| `tool_runner`    | a tool's sandbox runner failed (never started, died, or missed its deadline) |

The `tool_*` causes come from tool environments (`verifiers.envs.tools`), reported while an
environment answers a model turn: a validator re-running the tool calls of an episode uses them to
tell a tool output the machine may have cut short from a forged one.

Pitfall: a cause says the score *may* be the machine's, not that it is: a program that loops
forever times out on every machine. Only a re-run tells them apart, and only sometimes.

`machine_limits()` collects the causes of every `verify` call made inside it (in this thread, and
in `verify_batch`'s threads started inside it), for callers that see only a float, e.g. a reward
that adds a length term to `verify`'s reward.
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Iterator
from contextvars import ContextVar
from dataclasses import dataclass, field
from typing import Literal, get_args

MachineLimit = Literal[
    "sandbox_start",
    "test_timeout",
    "math_timeout",
    "deadline",
    "tool_timeout",
    "tool_output_limit",
    "tool_memory",
    "tool_runner",
]
MACHINE_LIMITS: tuple[str, ...] = get_args(MachineLimit)


@dataclass
class MachineLimits:
    """What `verify` calls inside one `machine_limits()` block reported (thread-safe).

    Attributes:
        causes: one `MachineLimit` per machine-limited score, in the order they were made.
        wall_clock_checks: scores whose verifier ran a wall-clock-limited check at all (a code
            sandbox run, a symbolic comparison), limited or not.
    """

    causes: list[str] = field(default_factory=list)
    wall_clock_checks: int = 0
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False, compare=False)

    @property
    def limited(self) -> bool:
        """True if any score made in the block may have been lowered by the machine."""
        return bool(self.causes)

    def add(self, cause: str | None, *, wall_clock: bool) -> None:
        with self._lock:
            self.wall_clock_checks += int(wall_clock or cause is not None)
            if cause is not None:
                self.causes.append(cause)


_CURRENT: ContextVar[MachineLimits | None] = ContextVar("verifiers_machine_limits", default=None)


@contextlib.contextmanager
def machine_limits() -> Iterator[MachineLimits]:
    """Collect the machine limits of every `verify` call made inside the block.

    >>> from verifiers import Task, machine_limits, verify
    >>> with machine_limits() as seen:
    ...     _ = verify(Task("1+1?", "arithmetic_exact", {"answer": 2}), "2")
    >>> seen.causes
    []

    Blocks nest: an inner block's scores are reported to it only.
    """
    collector = MachineLimits()
    token = _CURRENT.set(collector)
    try:
        yield collector
    finally:
        _CURRENT.reset(token)


def report(cause: str | None, *, wall_clock: bool) -> None:
    """Called by `verify` for every score it returns (no-op outside `machine_limits()`)."""
    collector = _CURRENT.get()
    if collector is not None:
        collector.add(cause, wall_clock=wall_clock)
