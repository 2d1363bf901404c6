"""Keep a validator's batch leases alive while it judges them (``POST /validator/leases``, renew).

A validator takes a few batches at a time (``orchestrator/validator_leases.py``): each is its own
for ``lease_s`` seconds. Judging one batch may take longer than that (a large model, tool
replays), so a background thread renews the leases of the batches not yet judged every
``lease_s / 3`` seconds, on a client of its own. A batch the orchestrator reports ``lost`` (its
lease passed to another validator, or it was expired meanwhile) is skipped: its verdicts would be
refused (409 ``lease_lost``). A renewal that fails (orchestrator unreachable) is retried on the
next tick; if the lease runs out meanwhile, the batch goes back to the pool, which is what a dead
validator's batches do too.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Iterable

from prime_rl.api.client import ApiError, OrchestratorClient
from prime_rl.role import orchestrator_call_times

log = logging.getLogger(__name__)

__all__ = ["LeaseKeeper"]


class LeaseKeeper:
    """Renews ``batch_ids`` for ``validator_id`` until each is ``done`` (use as a context manager)."""

    def __init__(self, url: str, admin_token: str, validator_id: str, batch_ids: Iterable[str], lease_s: float) -> None:
        self._client = OrchestratorClient(url, admin_token=admin_token, on_answer=orchestrator_call_times().record)
        self._validator_id = validator_id
        self._open = list(dict.fromkeys(batch_ids))
        self._lost: set[str] = set()
        self._every = max(0.05, lease_s / 3)
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="lease-keeper", daemon=True)
        self.renewals = 0

    def __enter__(self) -> LeaseKeeper:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(30)
        self._client.close()

    def done(self, batch_id: str) -> None:
        """Stop renewing ``batch_id`` (its verdicts were posted, or it is given up)."""
        with self._lock:
            if batch_id in self._open:
                self._open.remove(batch_id)

    def lost(self, batch_id: str) -> bool:
        """Whether the orchestrator said ``batch_id`` is no longer this validator's."""
        with self._lock:
            return batch_id in self._lost

    def renew_now(self) -> None:
        """One renewal of the batches still open (the thread's tick; tests call it directly)."""
        with self._lock:
            renew = list(self._open)
        if not renew:
            return
        try:
            answer = self._client.take_batches(self._validator_id, limit=0, renew=renew)
        except ApiError as error:
            log.warning("could not renew %d batch leases: %s", len(renew), error)
            return
        self.renewals += 1
        with self._lock:
            self._lost.update(answer.lost)
            self._open = [batch_id for batch_id in self._open if batch_id not in self._lost]
        if answer.lost:
            log.warning("batch leases lost (passed on, judged or expired): %s", ", ".join(answer.lost))

    def _run(self) -> None:
        while not self._stop.wait(self._every):
            self.renew_now()
