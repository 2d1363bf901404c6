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
* a :class:`VersionFollower` fetches each new newest version in a background thread (through
  ``ensure``), so generation continues while weights travel; the worker swaps them in between
  batches (hot reload in place).

Every download passes the newest cached older version as shardcast's delta base: when the trainer
published the version as a delta against exactly that file (``[shardcast] delta``; shardcast checks
the base's digest), only the xor-zstd delta shards travel, else the full shards do. Each version
brought in logs one ``policy_fetched`` metrics record (:class:`PolicyFetch`: bytes on the wire,
delta or full, linked or downloaded).

Pitfall: a delta is written against the previous *published* version only, so a store that skipped a
version (or lost its cache) downloads the next one in full.
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
from prime_rl.metrics import WAIT_LOG_EVERY_S, WaitLog, get_metrics
from prime_rl.weights.files import save_policy
from prime_rl.weights.layout import policy_file, version_dirs

if TYPE_CHECKING:
    from prime_rl.config import RunConfig

__all__ = ["LocalPolicies", "PolicyFetch", "PolicyStore", "PolicyUnavailable", "VersionFollower"]

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

    def share(self, path: Path) -> bool:
        """Make ``path`` (a process's own copy of the initial weights) one file on this machine:
        replaced by a hard link of an identical file another process of the run wrote first (same
        size and sha256), or offered as that file to the next one. Read-only (0444) like every link.
        Pool: ``<policies>/.shared/<sha256>``. False (nothing changed) when it cannot link."""
        pool = self.policies_dir / ".shared"
        try:
            digest = hashlib.sha256()
            with path.open("rb") as handle:
                while block := handle.read(1 << 22):
                    digest.update(block)
            pool.mkdir(parents=True, exist_ok=True)
            shared = pool / digest.hexdigest()
            temporary = path.with_name(f".{path.name}.share-{os.getpid()}")
            temporary.unlink(missing_ok=True)
            if shared.is_file() and shared.stat().st_size == path.stat().st_size:
                os.link(shared, temporary)
                os.replace(temporary, path)  # this process's copy goes: one file for every process
            else:
                os.chmod(path, 0o444)
                os.link(path, temporary)
                os.replace(temporary, shared)
            os.chmod(path, 0o444)
        except OSError as exc:
            log.info("initial weights %s: not shared (%s); keeping this process's copy", path, exc)
            return False
        return True


@dataclass(frozen=True)
class PolicyFetch:
    """One policy version brought into a store's cache, and what it cost on the wire.

    ``bytes_downloaded`` counts shard bytes received in this fetch (delta shards when
    ``delta_base`` is set; 0 when ``linked``); ``bytes_resumed`` those a resumed download already
    held; ``file_bytes`` the policy file's size; ``delta_base`` the cached version the delta was
    applied to (``None``: full shards, or a link); ``linked``: hard-linked from the trainer's file
    on this machine (:class:`LocalPolicies`), nothing downloaded.
    """

    version: int
    file_bytes: int
    bytes_downloaded: int
    bytes_resumed: int
    delta_base: int | None
    linked: bool
    seconds: float

    @property
    def used_delta(self) -> bool:
        return self.delta_base is not None


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
    ``on_fetch`` is called (on the fetching thread) with each version's :class:`PolicyFetch`, after
    the ``policy_fetched`` metrics record.
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
        on_fetch: Callable[[PolicyFetch], None] | None = None,
    ) -> None:
        self.local = local
        self.on_fetch = on_fetch
        self.cache_dir = Path(cache_dir)
        self.servers = list(servers)
        self.client = shardcast.Client(self.servers) if servers else None
        self.keep = keep
        self.deadline_s = deadline_s
        self._lock = threading.Lock()
        if initial_state is not None and not self.path(0).is_file():
            save_policy(initial_state, self.path(0))
            if local is not None:  # one machine, several roles: one file of the initial weights
                local.share(self.path(0))

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
            started = time.monotonic()
            if self.local is not None and self.local.link(version, target):
                size = target.stat().st_size
                self._fetched(PolicyFetch(version, size, 0, 0, None, True, time.monotonic() - started))
                return target
            base = self.delta_base(version)
            try:
                result = self.client.fetch(
                    version,
                    target,
                    deadline_s=self.deadline_s,
                    base=self.path(base) if base is not None else None,
                )
            except (shardcast.VersionNotFoundError, shardcast.VersionGoneError) as exc:
                # Versions are published before the orchestrator announces them, so a version no
                # server lists was never published or has been retired: asking again cannot help.
                raise PolicyUnavailable(version, f"not available: {exc}", permanent=True) from exc
            except (shardcast.ShardcastError, OSError) as exc:
                raise PolicyUnavailable(version, str(exc), permanent=False) from exc
            self._fetched(
                PolicyFetch(
                    version,
                    result.manifest.file_size,
                    result.bytes_downloaded,
                    result.bytes_resumed,
                    base if result.used_delta else None,
                    False,
                    result.seconds,
                )
            )
        return target

    def delta_base(self, version: int) -> int | None:
        """The newest cached version older than ``version`` (the delta base offered to shardcast)."""
        older = [cached for cached in version_dirs(self.cache_dir) if cached < version]
        return next((cached for cached in sorted(older, reverse=True) if self.path(cached).is_file()), None)

    def _fetched(self, fetch: PolicyFetch) -> None:
        """Record one version brought in (log line, metrics record, ``on_fetch``), then prune."""
        if fetch.linked:
            how = "linked from the trainer's file on this machine"
        elif fetch.used_delta:
            how = f"delta against v{fetch.delta_base}"
        else:
            how = "full"
        log.info(
            "fetched policy v%d (%s): %d of %d bytes downloaded in %.2fs",
            fetch.version,
            how,
            fetch.bytes_downloaded,
            fetch.file_bytes,
            fetch.seconds,
        )
        get_metrics().log(
            "policy_fetched",
            policy_version=fetch.version,
            bytes_downloaded=fetch.bytes_downloaded,
            bytes_resumed=fetch.bytes_resumed,
            file_bytes=fetch.file_bytes,
            delta=fetch.used_delta,
            delta_base=fetch.delta_base,
            linked=fetch.linked,
            seconds=round(fetch.seconds, 4),
        )
        if self.on_fetch is not None:
            self.on_fetch(fetch)
        self._prune(fetch.version)

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

    def _prune(self, newest: int) -> None:
        # Version 0 (the initial model) is never pruned: it is written once, not fetched again.
        fetched = [(version, path) for version, path in version_dirs(self.cache_dir).items() if version > 0]
        for version, path in fetched[: max(0, len(fetched) - self.keep)]:
            if version != newest:
                shutil.rmtree(path, ignore_errors=True)


class _StoreFollower(threading.Thread):
    """Every ``poll_s`` it lists the servers and takes each new newest version through
    :meth:`PolicyStore.ensure` (a hard link when the trainer's file is on this machine, else a
    download against the newest cached version as delta base), then calls ``arrived(version)``."""

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

    Every ``poll_s`` seconds it lists the servers and, when a version newer than the last one it
    took is listed, brings it in through :meth:`PolicyStore.ensure` (so with the store's delta base,
    link, pruning and ``policy_fetched`` record, and under its lock: a gate waiting in ``ensure``
    for the same version never downloads it a second time), after which :attr:`newest_local`
    moves. Fetch errors are logged and retried at the next poll. With no servers configured there
    is nothing to follow and the follower stays idle.

    (Not ``shardcast.Follower``: its first download after a restart has no delta base, and its
    downloads bypass the store's lock.)
    """

    def __init__(self, store: PolicyStore, poll_s: float = 1.0) -> None:
        self.store = store
        self._newest = 0
        self._arrived = threading.Condition()
        self._thread = _StoreFollower(store, self._arrive, poll_s) if store.client is not None else None

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

    def _arrive(self, version: int) -> None:
        with self._arrived:
            self._newest = max(self._newest, version)
            self._arrived.notify_all()
