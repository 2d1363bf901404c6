"""Policy versions on local disk, fetched through shardcast (workers, validator, evaluator).

Version 0 is the initial model (``model.path``), written once into the cache from the loaded
model's state dict; version ``N >= 1`` is shardcast version ``N`` (file
:data:`~prime_rl.weights.layout.POLICY_FILENAME`), downloaded with a verified, atomic shardcast
fetch into ``<cache_dir>/v<N>/``. A partial download never appears at that path (shardcast writes a
temp file and renames), so a file there is always complete.

Three ways in, one cache:

* ``PolicyStore.ensure(version)`` blocks until that exact version is local (the validator checking
  a batch, a worker at its async-level gate);
* ``PolicyStore.wait_for_published(minimum)`` waits until some server holds a version >= minimum
  and fetches the oldest such (the evaluator, which scores chosen versions);
* a :class:`VersionFollower` (``shardcast.Follower`` underneath) fetches each new newest version in
  a background thread, so generation continues while weights travel; the worker swaps them in
  between batches (hot reload in place).
"""

from __future__ import annotations

import hashlib
import logging
import os
import shutil
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import torch

import shardcast
from prime_rl.metrics import WAIT_LOG_EVERY_S, WaitLog
from prime_rl.weights.files import save_policy
from prime_rl.weights.layout import policy_file, version_dirs

if TYPE_CHECKING:
    from prime_rl.config import RunConfig

__all__ = ["LocalPolicies", "PolicyStore", "PolicyUnavailable", "VersionFollower"]

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class LocalPolicies:
    """Where the run's trainer writes its policy files and its shardcast origin keeps its manifests,
    when they are on this machine (``prime-rl run``): a version found there whose size and sha256
    equal the published manifest's is hard-linked into the cache instead of downloaded.

    A hard link shares the trainer's file, so it is made read-only (mode 0444) for every name;
    nothing in the run rewrites a policy file in place (writes are atomic renames to a new file),
    so no process can change the weights another one loads.
    """

    policies_dir: Path
    origin_dir: Path

    @classmethod
    def of_run(cls, config: RunConfig) -> LocalPolicies:
        """The trainer's ``<run_dir>/policies`` and the origin's ``<shardcast data dir>/origin``."""
        return cls(Path(config.run_dir) / "policies", config.shardcast_data_dir / "origin")

    def link(self, version: int, target: Path) -> bool:
        """Hard-link ``version`` to ``target`` if the trainer's file matches the origin's manifest;
        False (nothing changed) when it is not here, differs, or cannot be linked (another disk)."""
        source = policy_file(self.policies_dir, version)
        if not self.origin_dir.is_dir() or not source.is_file():
            return False
        try:
            manifest = shardcast.parse_manifest(
                shardcast.DataDir(self.origin_dir).manifest_path(version).read_bytes()
            )
            if manifest.digest_algorithm != "sha256" or source.stat().st_size != manifest.file_size:
                return False
            digest = hashlib.sha256()
            with source.open("rb") as handle:
                while block := handle.read(1 << 22):
                    digest.update(block)
            if digest.hexdigest() != manifest.file_digest:
                log.warning(
                    "policy v%d: the trainer's file %s differs from its manifest; downloading",
                    version,
                    source,
                )
                return False
            temporary = target.with_name(f".{target.name}.link-{os.getpid()}")
            temporary.unlink(missing_ok=True)
            os.link(source, temporary)
            os.chmod(temporary, 0o444)
            os.replace(temporary, target)
        except (OSError, shardcast.ShardcastError) as exc:
            log.info("policy v%d: no local link (%s); downloading", version, exc)
            return False
        return True


class PolicyUnavailable(RuntimeError):
    """A policy version cannot be obtained (not published, or no server reachable)."""

    def __init__(self, version: int, message: str, *, permanent: bool) -> None:
        super().__init__(f"policy v{version}: {message}")
        self.version = version
        self.permanent = permanent


class PolicyStore:
    """Local cache of policy files; ``servers`` are shardcast origin/relay URLs.

    ``initial_state`` is written as version 0 unless already there; ``None`` leaves version 0 out
    (a process that keeps the initial weights in memory and never reads them back). The newest
    ``keep`` fetched versions are kept; version 0 and the version just fetched are never pruned.
    """

    def __init__(
        self,
        servers: Sequence[str],
        cache_dir: str | Path,
        initial_state: dict[str, torch.Tensor] | None,
        *,
        keep: int = 4,
        deadline_s: float = 600.0,
        local: LocalPolicies | None = None,
    ) -> None:
        self.local = local
        self.cache_dir = Path(cache_dir)
        self.servers = list(servers)
        self.client = shardcast.Client(self.servers) if servers else None
        self.keep = keep
        self.deadline_s = deadline_s
        self._lock = threading.Lock()
        if initial_state is not None and not self.path(0).is_file():
            save_policy(initial_state, self.path(0))

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
            if self.local is not None and self.local.link(version, target):
                log.info("linked policy v%d from the trainer's file on this machine", version)
                self._prune(version)
                return target
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

    def wait_for_published(
        self, minimum: int, *, timeout_s: float, poll_s: float, log_every_s: float = WAIT_LOG_EVERY_S
    ) -> int:
        """Block until a server holds a complete version >= ``minimum``; fetch the oldest such.

        Returns that version (its file is then :meth:`path`). A version retired between the listing
        and the fetch is skipped for the next one. Every ``log_every_s`` it logs (INFO) which version
        it waits for, for how long, and from which servers. Raises :class:`PolicyUnavailable`
        (permanent) when none appears within ``timeout_s``.
        """
        deadline = time.monotonic() + timeout_s
        progress = WaitLog(log_every_s)
        while True:
            if (waited := progress.due()) is not None:
                log.info(
                    "still waiting for policy >= v%d after %.0f s of %.0f s (newest listed: v%d; servers %s)",
                    minimum,
                    waited,
                    timeout_s,
                    self.newest_available(),
                    ", ".join(self.servers) or "none",
                )
            for version in self._complete_at_least(minimum):
                try:
                    self.ensure(version)
                    return version
                except PolicyUnavailable as exc:
                    log.debug("policy v%d listed but not fetched: %s", version, exc)
            if time.monotonic() > deadline:
                raise PolicyUnavailable(
                    minimum, f"no version >= {minimum} appeared within {timeout_s:.0f}s", permanent=True
                )
            time.sleep(poll_s)

    def _complete_at_least(self, minimum: int) -> list[int]:
        if self.client is None:
            return []
        try:
            complete = self.client.list_versions().complete
        except (shardcast.ShardcastError, OSError) as exc:  # servers may not be up yet
            log.debug("listing versions failed: %s", exc)
            return []
        return sorted(version for version in complete if version >= minimum)

    def adopt(self, result: shardcast.FetchResult) -> None:
        """Take a version another fetcher (the :class:`VersionFollower`) put into the cache folder."""
        with self._lock:
            target = self.path(result.version)
            if result.path != target:  # published under another file name
                os.replace(result.path, target)
            self._prune(result.version)

    def _prune(self, newest: int) -> None:
        # Version 0 (the initial model) is never pruned: it is written once, not fetched again.
        fetched = [(version, path) for version, path in version_dirs(self.cache_dir).items() if version > 0]
        for version, path in fetched[: max(0, len(fetched) - self.keep)]:
            if version != newest:
                shutil.rmtree(path, ignore_errors=True)


class _LinkingFollower(threading.Thread):
    """The follower of a store with :class:`LocalPolicies`: every ``poll_s`` it lists the servers and
    takes each new newest version through :meth:`PolicyStore.ensure` (a hard link when the trainer's
    file is on this machine, else a download), then calls ``arrived(version)``."""

    def __init__(self, store: PolicyStore, arrived: Callable[[int], None], poll_s: float) -> None:
        super().__init__(name="policy-follower", daemon=True)
        self.store, self.arrived, self.poll_s = store, arrived, poll_s
        self._stopped = threading.Event()

    def run(self) -> None:
        last = 0
        while not self._stopped.is_set():
            newest = self.store.newest_available()
            if newest > last:
                try:
                    self.store.ensure(newest)
                except PolicyUnavailable as exc:
                    log.warning("policy v%d not taken yet: %s", newest, exc)
                else:
                    last = newest
                    self.arrived(newest)
            self._stopped.wait(self.poll_s)

    def stop(self, timeout: float) -> None:
        self._stopped.set()
        if self.ident is not None:  # started (a follower may be stopped before it ever ran)
            self.join(timeout)


class VersionFollower:
    """Fetches each new newest policy version into a :class:`PolicyStore`, in a background thread.

    A ``shardcast.Follower`` does the work (with :class:`LocalPolicies`, a follower that links the
    trainer's file on this machine through :meth:`PolicyStore.ensure`): every ``poll_s`` seconds it lists the servers and, when
    a version newer than the last one it fetched is listed, downloads it into the store's cache
    folder (the previous version serving as delta base), after which the store prunes old versions
    and :attr:`newest_local` moves. Fetch errors are logged and retried at the next poll. With no
    servers configured there is nothing to follow and the follower stays idle.
    """

    def __init__(self, store: PolicyStore, poll_s: float = 1.0) -> None:
        self.store = store
        self._newest = 0
        self._arrived = threading.Condition()
        self._thread: shardcast.Follower | _LinkingFollower | None = None
        if store.client is not None and store.local is not None:  # link the trainer's file when it is here
            self._thread = _LinkingFollower(store, self._arrive, poll_s)
        elif store.client is not None:
            self._thread = store.client.follower(
                self._on_fetched,
                output_dir=store.cache_dir,
                poll_interval_s=poll_s,
                keep=None,  # the store prunes: it keeps version 0 and knows the version layout
                deadline_s=store.deadline_s,
            )

    @property
    def newest_local(self) -> int:
        """The newest version this follower has fetched (0 before the first)."""
        with self._arrived:
            return self._newest

    def start(self) -> VersionFollower:
        if self._thread is not None:
            self._thread.start()
        return self

    def is_alive(self) -> bool:
        return self._thread is not None and self._thread.is_alive()

    def stop(self) -> None:
        """Stop polling; a download in flight is abandoned after 2 s (a daemon thread)."""
        if self._thread is not None:
            self._thread.stop(timeout=2)

    def wait_newer(self, than: int, timeout_s: float) -> int:
        """Block up to ``timeout_s`` until a version newer than ``than`` has arrived; the newest."""
        with self._arrived:
            self._arrived.wait_for(lambda: self._newest > than, timeout=timeout_s)
            return self._newest

    def _on_fetched(self, result: shardcast.FetchResult) -> None:
        self.store.adopt(result)
        log.info("fetched policy v%d in the background (%.2fs)", result.version, result.seconds)
        self._arrive(result.version)

    def _arrive(self, version: int) -> None:
        with self._arrived:
            self._newest = max(self._newest, version)
            self._arrived.notify_all()
