"""Policy versions on local disk, fetched through shardcast (workers, validator, evaluator).

Version 0 is the initial model (``model.path``), written once into the cache from the loaded
model's state dict; version ``N >= 1`` is shardcast version ``N`` (file ``model.safetensors``),
downloaded with a verified, atomic :class:`shardcast.Client` fetch into
``<cache_dir>/v<N>/model.safetensors``. A partial download never appears at that path
(shardcast writes a temp file and renames), so a file there is always complete.

``PolicyStore.ensure(version)`` blocks until the file is local; ``newest_available`` asks the
servers what the newest version is. A :class:`VersionFollower` downloads each new newest version
in a background thread so generation continues while weights travel; the worker swaps them in
between batches (hot reload in place).
"""

from __future__ import annotations

import logging
import shutil
import threading
from collections.abc import Sequence
from pathlib import Path

import torch

import shardcast
from prime_rl.weights.files import save_policy
from prime_rl.weights.layout import policy_file, version_dirs

log = logging.getLogger(__name__)


class PolicyUnavailable(RuntimeError):
    """A policy version cannot be obtained (not published, or no server reachable)."""

    def __init__(self, version: int, message: str, *, permanent: bool) -> None:
        super().__init__(f"policy v{version}: {message}")
        self.version = version
        self.permanent = permanent


class PolicyStore:
    """Local cache of policy files; ``servers`` are shardcast origin/relay URLs."""

    def __init__(
        self,
        servers: Sequence[str],
        cache_dir: str | Path,
        initial_state: dict[str, torch.Tensor],
        *,
        keep: int = 4,
        deadline_s: float = 600.0,
    ) -> None:
        self.cache_dir = Path(cache_dir)
        self.client = shardcast.Client(list(servers)) if servers else None
        self.keep = keep
        self.deadline_s = deadline_s
        self._lock = threading.Lock()
        initial = self.path(0)
        if not initial.is_file():
            save_policy(initial_state, initial)

    def path(self, version: int) -> Path:
        return policy_file(self.cache_dir, version)

    def newest_available(self) -> int:
        """Newest version the servers list (0 if none or unreachable)."""
        if self.client is None:
            return 0
        try:
            return self.client.list_versions().latest() or 0
        except (shardcast.ShardcastError, OSError) as exc:
            log.warning("cannot list policy versions: %s", exc)
            return 0

    def ensure(self, version: int) -> Path:
        """The local file of ``version``, downloading it if needed (raises :class:`PolicyUnavailable`)."""
        if version < 0:
            raise PolicyUnavailable(version, "policy versions are >= 0", permanent=True)
        target = self.path(version)
        if target.is_file():
            return target
        if self.client is None:
            raise PolicyUnavailable(version, "no shardcast servers configured", permanent=True)
        with self._lock:
            if target.is_file():
                return target
            target.parent.mkdir(parents=True, exist_ok=True)
            try:
                result = self.client.fetch(version, target, deadline_s=self.deadline_s)
            except (shardcast.VersionNotFoundError, shardcast.VersionGoneError) as exc:
                # Versions are published before the orchestrator announces them, so a version no
                # server lists was never published or has been retired: asking again cannot help.
                raise PolicyUnavailable(version, f"not available: {exc}", permanent=True) from exc
            except (shardcast.ShardcastError, OSError) as exc:
                raise PolicyUnavailable(version, str(exc), permanent=False) from exc
            log.info(
                "fetched policy v%d (%d bytes in %.2fs)", version, result.manifest.file_size, result.seconds
            )
            self._prune(version)
        return target

    def _prune(self, newest: int) -> None:
        # Version 0 (the initial model) is never pruned: it is written once, not fetched again.
        fetched = [(version, path) for version, path in version_dirs(self.cache_dir).items() if version > 0]
        for version, path in fetched[: max(0, len(fetched) - self.keep)]:
            if version != newest:
                shutil.rmtree(path, ignore_errors=True)


class VersionFollower(threading.Thread):
    """Background thread: every ``poll_s`` seconds, download the newest version if it is new."""

    def __init__(self, store: PolicyStore, poll_s: float = 1.0) -> None:
        super().__init__(name="policy-follower", daemon=True)
        self.store = store
        self.poll_s = poll_s
        self.newest_local = 0
        self._stop_event = threading.Event()

    def run(self) -> None:
        while not self._stop_event.is_set():
            newest = self.store.newest_available()
            if newest > self.newest_local:
                try:
                    self.store.ensure(newest)
                    self.newest_local = newest
                except PolicyUnavailable as exc:
                    log.warning("follower: %s", exc)
            self._stop_event.wait(self.poll_s)

    def stop(self) -> None:
        self._stop_event.set()
        if self.is_alive() and threading.current_thread() is not self:
            self.join(timeout=2)  # a daemon thread: a download in flight is simply abandoned
