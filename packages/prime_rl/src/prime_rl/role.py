"""The scaffold every long-running role process shares: threads, logging, reachability, SIGTERM, close.

:func:`run_role` is the ``main`` of ``prime-rl worker``, ``validator`` and ``trainer``; each passes
only what is its own (how to build its object, its loop, the errors that stop it as a
configuration problem). In order:

1. ``torch.set_num_threads`` and the process's logging and metrics (``metrics.init_process``);
2. the orchestrator must answer before the role loads a model (exit code 1 within
   ``orchestrator.connect_timeout_s``: a wrong URL is reported in seconds, not after the load);
3. ``start()`` builds the role's object, then ``loop(obj)`` runs with SIGTERM turned into
   ``SystemExit``: the role leaves at once (whatever it has not posted or committed is done again
   after a restart: batches stay pending, an incomplete checkpoint has no COMPLETE marker);
4. ``obj.close()`` always, then ``after(finished)`` (the trainer shuts its collectives down).

Exit codes: the loop's (0 if it returns None), 0 after SIGTERM, 1 when the orchestrator is
unreachable, 2 when ``start`` or ``loop`` raises one of ``refuse`` (a wrong admin token or
assignment key, unreadable secrets: judging or training on would be wrong).
"""

from __future__ import annotations

import logging
import signal
from collections.abc import Callable
from typing import TYPE_CHECKING, Protocol, TypeVar

import torch

from prime_rl.api.client import orchestrator_reachable
from prime_rl.metrics import CallTimes, init_process

if TYPE_CHECKING:
    from prime_rl.config import RunConfig

__all__ = ["orchestrator_call_times", "run_role"]

log = logging.getLogger(__name__)


class Closable(Protocol):
    def close(self) -> None: ...


R = TypeVar("R", bound=Closable)


def run_role(
    role: str,
    name: str,
    config: RunConfig,
    *,
    num_threads: int,
    start: Callable[[], R],
    loop: Callable[[R], int | None],
    refuse: tuple[type[Exception], ...] = (),
    log_to_run_dir: bool = True,
    after: Callable[[bool], None] | None = None,
    url: str | None = None,
) -> int:
    """Run one role process (see the module docstring); returns its exit code.

    ``log_to_run_dir=False`` keeps logs on stderr and drops metrics (a trainer rank other than 0).
    ``url``: the orchestrator address the role calls, checked before it starts (default
    ``orchestrator.url``; the trusted roles pass ``orchestrator.trusted_url``).
    """
    torch.set_num_threads(num_threads)
    init_process(role, name, config.run_dir if log_to_run_dir else None)
    finished = False
    try:
        if not orchestrator_reachable(url or config.orchestrator.url, config.orchestrator.connect_timeout_s):
            return 1
        try:
            instance = start()
        except refuse as error:
            log.error("%s cannot start: %s", name, error)
            return 2
        previous = signal.signal(signal.SIGTERM, _exit_on_signal)
        try:
            code = int(loop(instance) or 0)
            finished = True
            return code
        except SystemExit as stop:
            log.info("%s stopping (%s)", name, stop)
            return 0
        except refuse as error:
            log.error("%s stopping: %s", name, error)
            return 2
        finally:
            signal.signal(signal.SIGTERM, previous)
            instance.close()
    finally:
        orchestrator_call_times().flush()
        if after is not None:
            after(finished)


def _exit_on_signal(signum: int, frame: object) -> None:
    raise SystemExit(f"signal {signum}")


_CALL_TIMES = CallTimes("orchestrator_calls")


def orchestrator_call_times() -> CallTimes:
    """This process's ``CallTimes`` of its orchestrator calls (one per process: the role's clients
    share it; metrics event ``orchestrator_calls``, issue 44: the trusted roles' p99 under load)."""
    return _CALL_TIMES
