"""A worker's identity kept in its state directory: a restarted worker resumes under the same id.

Without it every worker start registered a new identity, so the batches its old identity held back
(``orchestrator/release.py``: a batch is released only by its worker's later accepted work) were
never trained, and its earned lease allowance was lost. The file is
``<run_dir>/<worker name>/identity.json``: ``{"worker_id", "token", "orchestrator"}`` (the
orchestrator URL it was registered with), written atomically and durably with mode 0600 (the token
is a bearer credential). A worker that finds the file reuses the id and token instead of
registering; if the orchestrator does not know them (another run's data, a wiped store: HTTP 401, or
404 ``unknown worker_id``) it registers anew and overwrites the file.

Pitfall: two worker processes must never share a state directory; they would answer each other's
leases under one identity.
"""

from __future__ import annotations

import json
import logging
import os
from dataclasses import asdict, dataclass
from pathlib import Path

from prime_rl.durable import atomic_path

__all__ = ["IDENTITY_FILE", "Identity", "load_identity", "save_identity"]

log = logging.getLogger(__name__)

IDENTITY_FILE = "identity.json"


@dataclass(frozen=True)
class Identity:
    """What a worker needs to resume: its id, its bearer token and the orchestrator that issued them."""

    worker_id: str
    token: str
    orchestrator: str


def load_identity(path: Path, orchestrator: str) -> Identity | None:
    """The identity saved at ``path`` for ``orchestrator`` (None: absent, unreadable, or another
    orchestrator's; logged)."""
    if not path.exists():
        return None
    try:
        identity = Identity(**json.loads(path.read_text(encoding="utf-8")))
    except (OSError, ValueError, TypeError) as error:
        log.warning("ignoring the unreadable worker identity %s: %s", path, error)
        return None
    if identity.orchestrator != orchestrator:
        log.info("the identity in %s belongs to %s, not %s: registering anew", path, identity.orchestrator, orchestrator)
        return None
    return identity


def save_identity(path: Path, identity: Identity) -> None:
    """Write ``identity`` to ``path`` atomically and durably, readable by its owner only."""
    with atomic_path(path) as temporary:
        os.chmod(temporary, 0o600)
        temporary.write_text(json.dumps(asdict(identity)), encoding="utf-8")
