"""The run's honest-noise profile, kept by the orchestrator for every validator of the run.

Validators on different machines must judge a sample by the same rules, so the run has one
profile: the first validator that publishes one (``POST /validator/noise-profile/publish``) sets it, a later
publication gets the stored one back, and every validator reads it with ``GET`` (the validator's
side: ``prime_rl.validator.agreement``). It is a small JSON file beside the orchestrator's store
(``<orchestrator data dir>/noise-profile.json``), written atomically, so a restarted orchestrator
and restarted validators keep judging by the profile their evidence was built on.

Pitfall: the file is trusted (only the admin token's holders publish); one that cannot be read
(a damaged disk) answers 500, never silently a new profile, since the journalled evidence was
computed against the old one.
"""

from __future__ import annotations

import logging
import threading
from pathlib import Path

from pydantic import ValidationError

from prime_rl.api.errors import ApiFailure
from prime_rl.api.protocol import NoiseProfileRecord
from prime_rl.durable import write_atomic

__all__ = ["FILENAME", "RunNoiseProfile"]

log = logging.getLogger(__name__)

FILENAME = "noise-profile.json"


class RunNoiseProfile:
    """First-publication-wins storage of the run's :class:`NoiseProfileRecord` in ``directory``."""

    def __init__(self, directory: str | Path) -> None:
        self.path = Path(directory) / FILENAME
        self._lock = threading.Lock()

    def get(self) -> NoiseProfileRecord | None:
        """The stored record, None before the first publication; ApiFailure 500 if it is unreadable."""
        if not self.path.exists():
            return None
        try:
            return NoiseProfileRecord.model_validate_json(self.path.read_bytes())
        except (OSError, ValidationError) as error:
            log.error("the run's noise profile %s is unreadable: %s", self.path, error)
            raise ApiFailure(
                500, "internal", f"the run's noise profile {self.path} is unreadable; restore or delete it"
            ) from None

    def publish(self, record: NoiseProfileRecord) -> NoiseProfileRecord:
        """Store ``record`` unless the run already has a profile; return the run's profile."""
        with self._lock:
            stored = self.get()
            if stored is not None:
                return stored
            self.path.parent.mkdir(parents=True, exist_ok=True)
            write_atomic(self.path, record.model_dump_json() + "\n")
            log.info("the run's noise profile published by %r (key %s)", record.published_by, record.key)
            return record
