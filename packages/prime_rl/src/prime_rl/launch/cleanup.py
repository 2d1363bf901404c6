"""Weight copies of a run on this machine: bounded while it runs, removed when it ends, and the disk
it needs checked before it starts (torch-free: the supervisor imports it).

Where a run's weights live (``B``: one policy file, e.g. 514 MB for the 135M demo in fp32):

- the trainer's ``policies/v*``: the newest ``shardcast.keep_versions`` (the trainer prunes after
  each publish, :func:`prime_rl.weights.layout.prune_version_dirs`);
- the shardcast origin: ``shardcast.keep_versions`` versions (full shards); a relay beside it
  hard-links the origin's shards (``local_sources``), so relays on this machine add nothing;
- the trainer's checkpoints: ``trainer.keep_checkpoints`` complete ones plus the one being written,
  each about ``3 B`` (weights and AdamW's two moments, in the model's dtype);
- each worker's, the validator's and the evaluator's ``policies/`` cache: hard links of the
  trainer's files on this machine, so no bytes of their own, except versions downloaded (a delta,
  another disk), and the initial weights, which the processes share as one file
  (:meth:`prime_rl.weights.store.LocalPolicies.share`).

:func:`disk_needed` adds these up; :func:`check_free_space` refuses a run the disk cannot hold.
:func:`remove_stale_copies` deletes what any process re-creates on demand (caches, relays' shards,
the trainer's versions past its window); ``prime-rl run`` calls it before it starts (the leftovers
of a run that was killed) and when it ends, however it ends. :func:`remove_weight_copies` deletes
every transient copy after a run (``make run``: ``launch/local.py``).
"""

from __future__ import annotations

import shutil
from dataclasses import dataclass
from pathlib import Path

from prime_rl.config import RunConfig
from prime_rl.weights.layout import version_dirs

__all__ = ["DiskNeed", "check_free_space", "disk_needed", "remove_stale_copies", "remove_weight_copies"]

WEIGHT_SUFFIXES = (".safetensors", ".bin", ".pt", ".gguf")
CHECKPOINT_FACTOR = 3
"""A checkpoint's size in policy files: the weights and AdamW's two moments."""
TEMP_GLOB = ".*.tmp-*"
"""The temporaries of an atomic write (``prime_rl.durable.TEMP_GLOB``; launch may not import durable)."""
MARGIN = 1.1
"""Head room over the estimate (logs, metrics, rollout batches, the store)."""


@dataclass(frozen=True)
class DiskNeed:
    """Bytes a run's weight copies can take at most: ``policy_bytes`` per version, by place."""

    policy_bytes: int
    places: dict[str, int]

    @property
    def total(self) -> int:
        return int(sum(self.places.values()) * MARGIN)

    def describe(self) -> str:
        parts = ", ".join(f"{name} {size / 2**30:.1f} GiB" for name, size in self.places.items() if size)
        return (
            f"{self.total / 2**30:.1f} GiB ({parts}; policy file {self.policy_bytes / 2**20:.0f} MiB, +10%)"
        )


def _model_bytes(config: RunConfig) -> int | None:
    path = Path(str(config.model.path or ""))
    if not str(config.model.path or "") or not path.is_dir():
        return None  # a hub name or the demo model not converted yet: nothing to measure here
    return (
        sum(f.stat().st_size for f in path.rglob("*") if f.is_file() and f.name.endswith(WEIGHT_SUFFIXES))
        or None
    )


def disk_needed(config: RunConfig, policy_bytes: int | None = None) -> DiskNeed | None:
    """The most the run's weight copies take on this machine (module docstring), or None when the
    policy's size is unknown. ``policy_bytes`` defaults to the weights files in ``model.path``."""
    size = policy_bytes if policy_bytes is not None else _model_bytes(config)
    if not size:
        return None
    keep = int(config.shardcast.keep_versions)
    checkpoints = int(getattr(config.trainer, "keep_checkpoints", 2)) + 1
    places = {
        "trainer policies": keep * size,
        "shardcast origin": keep * size,
        "checkpoints": checkpoints * CHECKPOINT_FACTOR * size,
        "initial weights": size,  # one file shared by every process
    }
    return DiskNeed(size, places)


def _existing(path: Path) -> Path:
    while not path.exists() and path != path.parent:
        path = path.parent
    return path


def check_free_space(config: RunConfig, policy_bytes: int | None = None) -> str | None:
    """Why the run's disk cannot hold it (a message for the operator), or None when it can (or when
    the policy's size is unknown). What the run directory holds already counts as available."""
    need = disk_needed(config, policy_bytes)
    if need is None:
        return None
    run_dir = Path(config.run_dir)
    free = shutil.disk_usage(_existing(run_dir)).free
    held = sum(f.stat().st_size for f in run_dir.rglob("*") if f.is_file()) if run_dir.is_dir() else 0
    if free + held >= need.total:
        return None
    return (
        f"not enough disk for the run's weight copies: it needs about {need.describe()}, and "
        f"{free / 2**30:.1f} GiB are free on the disk of {run_dir}. Free space there, choose another "
        "run_dir, or lower shardcast.keep_versions or trainer.keep_checkpoints."
    )


def remove_stale_copies(config: RunConfig) -> int:
    """Delete what the run's processes re-create on demand; return the bytes freed: every process's
    ``policies/`` cache, the shared initial weights, the relays' shards (they mirror the origin
    again), the trainer's versions past ``shardcast.keep_versions``, and the half-written
    temporaries a process killed mid-write left in the trainer's policies and checkpoints. Kept: the origin (a
    restarted validator may still need an older version to judge a pending batch), the trainer's
    newest versions and checkpoints, logs, metrics, the stores."""
    run_dir = Path(config.run_dir)
    doomed = [cache for cache in run_dir.glob("*/policies") if cache.is_dir()]
    doomed += [run_dir / "policies" / ".shared"]
    doomed += [relay for relay in config.shardcast_data_dir.glob("relay-*") if relay.is_dir()]
    trainer_versions = list(version_dirs(run_dir / "policies").values())
    doomed += trainer_versions[: max(0, len(trainer_versions) - int(config.shardcast.keep_versions))]
    # half-written files of a process killed mid-write (prime_rl.durable's temporaries: a whole
    # policy file each), where nothing deletes them: the trainer's policies and checkpoints
    checkpoints = Path(getattr(config.trainer, "checkpoint_dir", "") or run_dir / "checkpoints")
    for folder in (run_dir / "policies", checkpoints):
        doomed += [stale for stale in folder.rglob(TEMP_GLOB) if stale.is_file()] if folder.is_dir() else []
    return _remove(doomed)


def _remove(doomed: list[Path]) -> int:
    doomed_files = [path for path in doomed if path.is_file()]
    freed_files = sum(path.stat().st_size for path in doomed_files if path.stat().st_nlink == 1)
    for path in doomed_files:
        path.unlink(missing_ok=True)
    doomed = [path for path in doomed if path not in doomed_files]
    # A hard link (a local run's policy caches link the trainer's files) frees its bytes only when
    # every name of the file goes: count each file once, and only if all its names are doomed.
    files: dict[tuple[int, int], tuple[int, int, int]] = {}  # (dev, inode) -> (names seen, links, size)
    for path in doomed:
        for file in path.rglob("*") if path.exists() else ():
            if file.is_file() and not file.is_symlink():
                info = file.stat()
                seen, _, _ = files.get((info.st_dev, info.st_ino), (0, 0, 0))
                files[(info.st_dev, info.st_ino)] = (seen + 1, info.st_nlink, info.st_size)
    for path in doomed:
        shutil.rmtree(path, ignore_errors=True)
    return freed_files + sum(size for seen, links, size in files.values() if seen >= links)


def remove_weight_copies(config: RunConfig) -> int:
    """Delete the transient copies of policy weights a finished run leaves behind; return bytes freed.

    Recent policy versions live in several places: the workers', the validator's and the
    evaluator's ``policies/`` caches (hard links of the trainer's files in a local run, copies when
    a version had to be downloaded), the shardcast origin's and relays' shards, the trainer's older
    ``policies/v*``. The bytes returned are those actually freed (a file still linked from a kept
    path, such as the trainer's newest policy, frees nothing).
    Kept: the trainer's newest policy file, its training checkpoints (to resume), and every log,
    metrics file and report. Call it when a run has ended (``make run`` does, however it ended).
    """
    run_dir = Path(config.run_dir)
    doomed = [config.shardcast_data_dir, run_dir / "policies" / ".shared"]
    doomed += [cache for cache in run_dir.glob("*/policies") if cache.is_dir()]
    trainer_versions = list(version_dirs(run_dir / "policies").values())  # ascending by version
    doomed += trainer_versions[:-1]
    return _remove(doomed)
