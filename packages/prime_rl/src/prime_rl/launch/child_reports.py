"""What the supervisor tells the operator about its children: the error a child died of (read from
its output, in a few lines), a failure, a refused configuration, and why a run no one feeds stops."""

from __future__ import annotations

import logging
import re
from pathlib import Path

from prime_rl.api.client import ApiError, OrchestratorClient
from prime_rl.api.fields import printable
from prime_rl.launch.progress import TOP_WORKERS
from prime_rl.metrics import MetricsWriter

__all__ = ["CONFIG_ERROR_EXIT", "first_error", "report_config_error", "report_failure", "report_workers_gone"]

log = logging.getLogger(__name__)

CONFIG_ERROR_EXIT = 2
"""The exit code of a role that refused its configuration (``prime-rl`` CLI, ``role.run_role``): a wrong
environment, component, secret or model path. Not a crash: the run stops with this code and the
child's message, at once, rather than restart it (:func:`report_config_error`)."""

_TRACEBACK = "Traceback (most recent call last):"
_CLI_ERROR = re.compile(r"^prime-rl [a-z-]+: ")  # the CLI's one-line configuration error (prime_rl.cli.main)
_CHAINED = ("During handling of the above exception", "The above exception was the direct cause")
_MAX_ERROR_LINES = 6


def first_error(output: str) -> str | None:
    """The error a process died of, from its combined stdout/stderr: a few lines, or None.

    The exception of the last traceback (the one that ended the process; for chained exceptions
    the outermost, whose message is the one written for people), with the continuation lines of a
    multi-line message; else the CLI's last configuration error (``prime-rl <role>: ...``); else the
    last line logged at ERROR or CRITICAL level; else None.
    """
    lines = output.splitlines()
    starts = [index for index, line in enumerate(lines) if line.startswith(_TRACEBACK)]
    if starts:
        index = starts[-1] + 1
        while index < len(lines) and (lines[index].startswith((" ", "\t")) or not lines[index].strip()):
            index += 1
        message: list[str] = []
        for line in lines[index:]:
            if line.startswith(_TRACEBACK) or line.startswith(_CHAINED) or len(message) == _MAX_ERROR_LINES:
                break
            if message and (not line.strip() or line[:2].isdigit()):  # blank, or a timestamped log line
                break
            message.append(line.rstrip())
        if message:
            return "\n".join(message)
    refused = [line for line in lines if _CLI_ERROR.match(line)]
    if refused:
        return refused[-1].strip()
    logged = [line for line in lines if "[ERROR]" in line or "[CRITICAL]" in line]
    return logged[-1].strip() if logged else None


def report_failure(
    metrics: MetricsWriter, name: str, code: int | None, error: str | None, path: Path, *, restarting: bool = False
) -> None:
    """Log that child ``name`` failed, with the error read from its output, and where its log is
    (``restarting``: a warning and a ``child_died`` metrics line; the run goes on)."""
    log.log(
        logging.WARNING if restarting else logging.ERROR,
        "%s %s with exit code %s: %s\n  (full output: %s)",
        name, "died" if restarting else "failed", code, error or "it printed no error", path,
    )  # fmt: skip
    metrics.log("child_died" if restarting else "failed", child=name, code=code, error=error)


def report_config_error(metrics: MetricsWriter, name: str, code: int | None, error: str | None, path: Path) -> None:
    """Log that child ``name`` refused its configuration (exit code 2) with its message: the run stops,
    since a wrong environment or setting does not heal by restarting."""
    log.error(
        "%s refused its configuration (exit code %d), so the run stops (a configuration error is not restarted): "
        "%s\n  (full output: %s)",
        name, CONFIG_ERROR_EXIT, error or "it printed no error", path,
    )  # fmt: skip
    metrics.log("failed", child=name, code=code, error=error, config_error=True)


def report_workers_gone(metrics: MetricsWriter, client: OrchestratorClient, dropped: dict[str, str | None]) -> None:
    """Log why the run stops: every honest worker stopped, the bans the orchestrator knows, and the
    workers ``dropped`` past their restart budget (name: error)."""
    try:
        banned = client.workers(limit=TOP_WORKERS, banned_only=True)
        bans = [f"{printable(w.name or w.worker_id)}: {printable(w.ban_reason)}" for w in banned.workers]
        if banned.total > len(bans):
            bans.append(f"and {banned.total - len(bans)} more")
    except ApiError as error:
        bans = [f"(the orchestrator did not answer: {error})"]
    log.error(
        "every honest worker stopped before the trainer finished, so no more samples will come; "
        "banned workers: %s; dropped past their restart budget: %s",
        "; ".join(bans) or "none",
        "; ".join(f"{name} ({error})" for name, error in dropped.items()) or "none",
    )
    metrics.log("failed", child="workers", code=0, error="every honest worker stopped", bans=bans)
