"""Experiment trackers (W&B, TensorBoard) fed from the same events as the metrics JSONL files.

``prime-rl <role>`` calls :func:`install_trackers` before the role starts when ``[tracking]
backends`` is set and the role is in ``tracking.roles``; from then on every record the process's
:class:`~prime_rl.metrics.MetricsWriter` writes is also handed to each tracker. What a tracker
receives is exactly the JSONL record, reduced to its numbers:

* every numeric field (``bool`` counts as 0/1) becomes the scalar ``<event>/<field>``; nested
  tables are flattened with ``/`` (``progress/workers/w1/accepted``); strings, lists and the
  bookkeeping fields ``time`` and ``pid`` are left out;
* the x axis of an event is its own ``step`` field, else its ``policy_version``, else how many
  records of that event came before (TensorBoard's ``step``; W&B's ``define_metric`` step).

One tracker run per process, named ``<run_name>/<process>`` and grouped under ``run_name`` (W&B
``group``; TensorBoard sub-directory ``tensorboard/<process>/``), so the trainer's loss and the
evaluator's accuracy sit side by side. W&B defaults to ``mode = "offline"``: it writes
``<dir>/wandb/offline-run-*`` and needs neither network nor login (``wandb sync`` uploads later).
The libraries are optional extras (``pip install 'intellect2-prime-rl[wandb]'`` / ``'intellect2-prime-rl[tensorboard]'``);
a missing one is a ``TrackerUnavailable`` naming the extra. TensorBoard event files are written with
the ``tensorboard`` package's own writer (what ``torch.utils.tensorboard`` uses), so no torch import.
"""

from __future__ import annotations

import logging
import math
from collections import Counter
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from prime_rl.config import RunConfig
from prime_rl.metrics import MetricsSink, add_sink

__all__ = [
    "TensorBoardTracker",
    "TrackerUnavailable",
    "WandbTracker",
    "install_trackers",
    "record_scalars",
    "record_x",
]

log = logging.getLogger(__name__)

_BOOKKEEPING = {"time", "pid", "role", "name", "event"}


class TrackerUnavailable(RuntimeError):
    """A tracker's library is not installed (the message names the extra to install)."""


def _flatten(prefix: str, value: Any, out: dict[str, float]) -> None:
    if isinstance(value, bool):
        out[prefix] = float(value)
    elif isinstance(value, int | float):
        if math.isfinite(value):
            out[prefix] = float(value)
    elif isinstance(value, Mapping):
        for key, item in value.items():
            _flatten(f"{prefix}/{key}", item, out)


def record_scalars(record: Mapping[str, Any]) -> dict[str, float]:
    """``{"<event>/<field>": number}`` for every finite numeric (or bool) field of one metrics record.

    >>> record_scalars({"time": 1.0, "event": "train", "step": 3, "loss": 0.5, "ok": True, "reasons": "x"})
    {'train/step': 3.0, 'train/loss': 0.5, 'train/ok': 1.0}
    """
    event = str(record.get("event", "event"))
    out: dict[str, float] = {}
    for key, value in record.items():
        if key not in _BOOKKEEPING:
            _flatten(f"{event}/{key}", value, out)
    return out


def record_x(record: Mapping[str, Any], seen_before: int) -> int:
    """The x value of a record: its ``step``, else its ``policy_version``, else ``seen_before``."""
    for key in ("step", "policy_version"):
        value = record.get(key)
        if isinstance(value, int) and not isinstance(value, bool):
            return value
    return seen_before


class TensorBoardTracker:
    """Scalars into ``logdir/events.out.tfevents.*`` (read by TensorBoard, ``EventAccumulator``, tbparse),
    flushed per record."""

    def __init__(self, logdir: str | Path) -> None:
        try:
            from tensorboard.compat.proto import event_pb2, summary_pb2
            from tensorboard.summary.writer.event_file_writer import EventFileWriter
        except ImportError as error:
            raise TrackerUnavailable(
                "tracking.backends has 'tensorboard' but the tensorboard package is not installed: "
                "pip install 'intellect2-prime-rl[tensorboard]'"
            ) from error
        self._event_pb2 = event_pb2
        self._summary_pb2 = summary_pb2
        self._writer_type = EventFileWriter
        self.logdir = Path(logdir)
        self._writer: Any = None  # created with the first scalar: a process that logs none leaves no file
        self._counts: Counter[str] = Counter()

    def log(self, record: Mapping[str, Any]) -> None:
        scalars = record_scalars(record)
        event = str(record.get("event", "event"))
        step = record_x(record, self._counts[event])
        self._counts[event] += 1
        if not scalars:
            return
        values = [self._summary_pb2.Summary.Value(tag=tag, simple_value=value) for tag, value in scalars.items()]
        wall_time = float(record.get("time") or 0.0)
        if self._writer is None:
            self.logdir.mkdir(parents=True, exist_ok=True)
            self._writer = self._writer_type(str(self.logdir))
        self._writer.add_event(
            self._event_pb2.Event(wall_time=wall_time, step=step, summary=self._summary_pb2.Summary(value=values))
        )
        self._writer.flush()  # like the JSONL file: a killed process keeps every record it logged

    def close(self) -> None:
        if self._writer is not None:
            self._writer.close()
            self._writer = None


class WandbTracker:
    """One W&B run per process; created on the first record, so a process that logs nothing makes none.

    Each event's scalars are plotted against that event's own x axis (``define_metric``), so events
    with different step counters never fight over W&B's global step.
    """

    def __init__(
        self,
        *,
        project: str,
        name: str,
        group: str,
        job_type: str,
        directory: str | Path,
        mode: str = "offline",
        entity: str = "",
        hyperparameters: Mapping[str, Any] | None = None,
    ) -> None:
        try:
            import wandb
        except ImportError as error:
            raise TrackerUnavailable(
                "tracking.backends has 'wandb' but the wandb package is not installed: pip install 'intellect2-prime-rl[wandb]'"
            ) from error
        self._wandb = wandb
        self._init_kwargs: dict[str, Any] = dict(
            project=project,
            name=name,
            group=group,
            job_type=job_type,
            dir=str(directory),
            mode=mode,
            entity=entity or None,
            config=dict(hyperparameters or {}),
            reinit="create_new",
        )
        self.directory = Path(directory)
        self._run: Any = None
        self._axes: set[str] = set()

    def _ensure_run(self) -> Any:
        if self._run is None:
            self.directory.mkdir(parents=True, exist_ok=True)
            self._run = self._wandb.init(**self._init_kwargs)
        return self._run

    def log(self, record: Mapping[str, Any]) -> None:
        scalars = record_scalars(record)
        if not scalars:
            return
        run = self._ensure_run()
        event = str(record.get("event", "event"))
        if event not in self._axes:
            self._axes.add(event)
            for key in ("step", "policy_version"):
                if f"{event}/{key}" in scalars:
                    run.define_metric(f"{event}/{key}")
                    run.define_metric(f"{event}/*", step_metric=f"{event}/{key}")
                    break
        run.log(scalars)

    @property
    def run_dir(self) -> Path | None:
        """The run's local folder (``.../wandb/offline-run-*/``) once the run exists."""
        return None if self._run is None else Path(self._run.dir).parent

    def close(self) -> None:
        if self._run is not None:
            self._run.finish()
            self._run = None


def install_trackers(config: RunConfig, role: str, name: str) -> list[MetricsSink]:
    """Build the ``[tracking]`` trackers for process ``name`` of ``role`` and register them as metrics
    sinks; returns them ([] when tracking is off or the role is not tracked).

    Raises ``TrackerUnavailable`` when a configured tracker's library is missing.
    """
    tracking = config.tracking
    if not tracking.backends or role not in tracking.roles:
        return []
    run_name = tracking.run_name or Path(config.run_dir).resolve().name
    root = Path(tracking.dir) if tracking.dir else Path(config.run_dir) / "tracking"
    trackers: list[MetricsSink] = []
    for backend in dict.fromkeys(tracking.backends):
        if backend == "tensorboard":
            trackers.append(TensorBoardTracker(root / "tensorboard" / name))
        else:
            trackers.append(
                WandbTracker(
                    project=tracking.project,
                    name=f"{run_name}/{name}",
                    group=run_name,
                    job_type=role,
                    directory=root,
                    mode=tracking.wandb_mode,
                    entity=tracking.entity,
                    hyperparameters=config.model_dump(mode="json"),
                )
            )
    for tracker in trackers:
        add_sink(tracker)
    log.info("tracking %s to %s as %s/%s", ", ".join(tracking.backends), root, run_name, name)
    return trackers
