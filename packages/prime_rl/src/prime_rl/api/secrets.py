"""The run's two secrets, held by the trusted processes only: the admin token and the assignment key.

* ``admin_token``: the bearer token every trusted endpoint requires (``/validator/*``,
  ``/trainer/*``, ``POST /workers/ban``). There is no "no token" mode: a worker can reach the
  orchestrator, so anything it could call without a token it could abuse.
* ``assignment_key``: the HMAC key of task assignment and sampling seeds (``assignment.py``), so a
  worker cannot compute which tasks and seeds an identity will get before it holds the lease.

Each is the configured value (``orchestrator.admin_token``, ``orchestrator.assignment_secret``)
when set, else the value generated for this run and kept in ``<run_dir>/secrets/run.json``: created
on first use by whichever trusted process comes first (``prime-rl run`` creates it before it starts
any child), atomically, mode 0600 in a 0700 folder, and refused when another user owns it or
others may read it. The orchestrator, the validator, the trainer and the supervisor read it;
workers never do. Processes on other machines need the configured values, which is why an
orchestrator bound to a non-loopback address refuses to start without a configured admin token
(:func:`check_bind_address`).

Pitfall: the local demo workers of ``prime-rl run`` run as the same user and *could* read the file;
real untrusted workers run on other machines (or as another user), which is the threat model.
"""

from __future__ import annotations

import contextlib
import ipaddress
import json
import os
import secrets
from dataclasses import dataclass, field
from pathlib import Path

from prime_rl.config import RunConfig

__all__ = [
    "MIN_SECRET_CHARS",
    "SECRETS_FILE",
    "RunSecrets",
    "SecretsError",
    "check_bind_address",
    "is_loopback",
    "run_secrets",
    "secrets_path",
]

SECRETS_FILE = Path("secrets") / "run.json"
"""Where a run's generated secrets live, relative to ``run_dir``."""

MIN_SECRET_CHARS = 16
"""Shortest configured secret accepted: a short one can be guessed (the token) or recovered offline
from a single lease by trying candidates (the assignment key)."""


class SecretsError(RuntimeError):
    """The run's secrets cannot be read or created safely, or a setting would expose the run."""


@dataclass(frozen=True)
class RunSecrets:
    """The trusted processes' secrets (never printed: ``repr`` hides them)."""

    admin_token: str = field(repr=False)
    assignment_key: bytes = field(repr=False)


def secrets_path(run_dir: str | Path) -> Path:
    """``<run_dir>/secrets/run.json``."""
    return Path(run_dir) / SECRETS_FILE


def run_secrets(config: RunConfig) -> RunSecrets:
    """The configured secrets, completed from the run's secrets file (created if missing).

    Raises ``SecretsError`` when the file is owned by another user, readable by others, or corrupt.
    """
    orch = config.orchestrator
    token, assignment = orch.admin_token, orch.assignment_secret
    if not token or not assignment:
        stored = _load_or_create(secrets_path(config.run_dir))
        token = token or stored["admin_token"]
        assignment = assignment or stored["assignment_secret"]
    return RunSecrets(admin_token=token, assignment_key=assignment.encode("utf-8"))


def is_loopback(host: str) -> bool:
    """True for ``localhost`` and loopback IP literals (``127.0.0.0/8``, ``::1``); False otherwise,
    including ``0.0.0.0``, ``::`` and any other name (it may resolve anywhere)."""
    if host.strip().lower() == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


def check_bind_address(host: str, admin_token: str) -> None:
    """``SecretsError`` when the orchestrator would listen beyond loopback without a configured token.

    Off loopback, trusted processes on other machines need the token, and a generated one lives
    only in this machine's run directory: the operator must choose it (and keep it from workers).
    """
    if not is_loopback(host) and not admin_token:
        raise SecretsError(
            f"orchestrator.host = {host!r} accepts connections from other machines, so "
            "orchestrator.admin_token must be set (at least "
            f"{MIN_SECRET_CHARS} characters, e.g. from `python -c 'import secrets; print(secrets.token_urlsafe(32))'`) "
            "and given to the validators and the trainer, never to workers"
        )


def _load_or_create(path: Path) -> dict[str, str]:
    if not path.exists():
        _create(path)
    try:
        status = path.stat()
    except OSError as error:
        raise SecretsError(f"cannot read the run's secrets {path}: {error}") from error
    if status.st_uid != os.getuid():
        raise SecretsError(f"{path} belongs to another user (uid {status.st_uid}); refusing to use it")
    if status.st_mode & 0o077:
        raise SecretsError(
            f"{path} may be read by other users (mode {oct(status.st_mode & 0o777)}); run `chmod 600 {path}`"
        )
    try:
        stored = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as error:
        raise SecretsError(
            f"the run's secrets {path} are unreadable: {error}; delete the file to regenerate"
        ) from error
    if not isinstance(stored, dict) or not all(
        isinstance(stored.get(key), str) and len(stored[key]) >= MIN_SECRET_CHARS
        for key in ("admin_token", "assignment_secret")
    ):
        raise SecretsError(f"the run's secrets {path} are incomplete; delete the file to regenerate")
    return stored


def _create(path: Path) -> None:
    """Write fresh secrets to ``path`` unless another process wins the race (then keep theirs)."""
    path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
    body = json.dumps(
        {"admin_token": secrets.token_urlsafe(32), "assignment_secret": secrets.token_hex(32)}
    ).encode()
    tmp = path.with_name(f".{path.name}.{os.getpid()}.{secrets.token_hex(4)}")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    try:
        with os.fdopen(fd, "wb") as handle:
            handle.write(body)
            handle.flush()
            os.fsync(handle.fileno())
        with contextlib.suppress(FileExistsError):  # another process was first: its secrets win
            os.link(tmp, path)  # atomic, and never replaces an existing file
    finally:
        tmp.unlink(missing_ok=True)
