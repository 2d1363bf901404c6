"""Experiment trackers fed from the metrics events: what reaches W&B (offline) and TensorBoard is
exactly the numbers of the JSONL records, read back from the files each library writes."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from wandb_records import complete_wandb_records, read_wandb_history  # tests/support

from prime_rl import metrics
from prime_rl.config import load_config
from prime_rl.trackers import (
    TensorBoardTracker,
    TrackerUnavailable,
    WandbTracker,
    install_trackers,
    record_scalars,
    record_x,
)

EVENTS: list[tuple[str, dict[str, Any]]] = [
    ("train", {"step": 0, "loss": 0.5, "reward_mean": 0.25, "note": "text is skipped"}),
    ("train", {"step": 1, "loss": 0.25, "reward_mean": 0.75}),
    ("eval", {"policy_version": 2, "accuracy": 0.625, "num_correct": 40}),
    ("progress", {"workers": {"w1": {"accepted": 3, "banned": False}}}),
]


@pytest.fixture
def no_sinks() -> Any:
    saved = list(metrics._SINKS)
    metrics._SINKS.clear()
    yield
    metrics._close_sinks()
    metrics._SINKS.extend(saved)


def test_record_scalars_and_x_oracle():
    record = {"time": 5.0, "pid": 7, "role": "trainer", "name": "trainer", "event": "train", "step": 3,
              "loss": 0.5, "ok": True, "nan": "nan", "inf": float("inf"), "ids": [1, 2],
              "workers": {"w": {"accepted": 2}}}  # fmt: skip
    assert record_scalars(record) == {
        "train/step": 3.0,
        "train/loss": 0.5,
        "train/ok": 1.0,
        "train/workers/w/accepted": 2.0,
    }
    assert record_x({"step": 4, "policy_version": 9}, 0) == 4
    assert record_x({"policy_version": 9}, 0) == 9
    assert record_x({"step": True}, 6) == 6  # a bool is not a step


class _Recorder:
    def __init__(self) -> None:
        self.records: list[dict[str, Any]] = []
        self.closed = False

    def log(self, record: Any) -> None:
        self.records.append(dict(record))

    def close(self) -> None:
        self.closed = True


def test_sinks_get_every_record_the_jsonl_gets_and_a_broken_one_is_dropped(tmp_path: Path, no_sinks: Any):
    good = _Recorder()

    class Broken(_Recorder):
        def log(self, record: Any) -> None:
            raise RuntimeError("tracker down")

    metrics.add_sink(good)
    metrics.add_sink(Broken())
    writer = metrics.MetricsWriter(tmp_path / "m.jsonl", role="trainer", name="trainer")
    for event, fields in EVENTS:
        writer.log(event, **fields)
    writer.close()
    assert good.records == list(metrics.read_metrics(tmp_path / "m.jsonl"))
    assert len(metrics._SINKS) == 1  # the broken sink is gone, the run goes on
    metrics.MetricsWriter(None, role="x", name="x").log("dropped")  # a writer without a file forwards nothing
    assert len(good.records) == len(EVENTS)
    metrics._close_sinks()
    assert good.closed


def test_tensorboard_event_file_holds_the_scalars(tmp_path: Path):
    pytest.importorskip("tensorboard", reason="tensorboard not installed (pip install 'prime-rl[tensorboard]')")
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    tracker = TensorBoardTracker(tmp_path / "tb")
    for index, (event, fields) in enumerate(EVENTS):
        tracker.log({"time": 100.0 + index, "event": event, **fields})
    tracker.close()
    accumulator = EventAccumulator(str(tmp_path / "tb"))
    accumulator.Reload()
    scalars = {tag: [(e.step, e.value) for e in accumulator.Scalars(tag)] for tag in accumulator.Tags()["scalars"]}
    assert scalars["train/loss"] == [(0, 0.5), (1, 0.25)]
    assert scalars["train/reward_mean"] == [(0, 0.25), (1, 0.75)]
    assert scalars["eval/accuracy"] == [(2, 0.625)]  # x = policy_version when there is no step
    assert scalars["progress/workers/w1/accepted"] == [(0, 3.0)]  # x = count of earlier progress records
    assert "train/note" not in scalars
    assert accumulator.Scalars("train/loss")[0].wall_time == 100.0


def test_wandb_offline_writes_the_scalars_locally(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    pytest.importorskip("wandb", reason="wandb not installed (pip install 'prime-rl[wandb]')")
    # No network and no login: offline mode never needs either. Make sure no key leaks in.
    monkeypatch.delenv("WANDB_API_KEY", raising=False)
    monkeypatch.setenv("WANDB_SILENT", "true")
    tracker = WandbTracker(
        project="prime-rl-test", name="run/trainer", group="run", job_type="trainer",
        directory=tmp_path, mode="offline", hyperparameters={"trainer": {"lr": 1e-5}},
    )  # fmt: skip
    assert tracker.run_dir is None  # no run until the first record
    for event, fields in EVENTS:
        tracker.log({"time": 1.0, "event": event, **fields})
    run_dir = tracker.run_dir
    tracker.close()
    assert run_dir is not None and run_dir.name.startswith("offline-run-")
    assert run_dir.parent == tmp_path / "wandb"
    assert list(run_dir.glob("run-*.wandb"))  # the local run file `wandb sync` uploads
    (run_file,) = run_dir.glob("run-*.wandb")
    (run,) = [r.run for r in complete_wandb_records(run_file) if r.WhichOneof("record_type") == "run"]
    assert (run.display_name, run.run_group, run.job_type, run.project) == ("run/trainer", "run", "trainer", "prime-rl-test")
    config = {item.key: json.loads(item.value_json) for item in run.config.update}
    assert config["trainer"] == {"lr": 1e-5}
    name, history = read_wandb_history(run_dir)
    assert name == "run/trainer"
    assert history == [record_scalars({"event": event, **fields}) for event, fields in EVENTS]


def test_missing_library_names_the_extra(monkeypatch: pytest.MonkeyPatch):
    monkeypatch.setitem(sys.modules, "wandb", None)  # import wandb -> ImportError
    with pytest.raises(TrackerUnavailable, match=r"prime-rl\[wandb\]"):
        WandbTracker(project="p", name="n", group="g", job_type="j", directory=".")
    monkeypatch.setitem(sys.modules, "tensorboard.summary.writer.event_file_writer", None)
    with pytest.raises(TrackerUnavailable, match=r"prime-rl\[tensorboard\]"):
        TensorBoardTracker(".")


def test_install_follows_the_tracking_section(tmp_path: Path, no_sinks: Any):
    pytest.importorskip("tensorboard")
    off = load_config(None, ["--run_dir", str(tmp_path)])
    assert install_trackers(off, "trainer", "trainer") == []
    on = load_config(None, ["--run_dir", str(tmp_path), "--tracking.backends", '["tensorboard"]'])
    assert install_trackers(on, "orchestrator", "orchestrator") == []  # not in tracking.roles
    (tracker,) = install_trackers(on, "trainer", "trainer")
    assert isinstance(tracker, TensorBoardTracker) and tracker.logdir == tmp_path / "tracking" / "tensorboard" / "trainer"
    assert [tracker] == metrics._SINKS


def test_a_role_process_logs_to_tensorboard_through_the_cli(tmp_path: Path):
    """`prime-rl orchestrator` with [tracking]: its metrics events land in its TensorBoard folder."""
    pytest.importorskip("tensorboard")
    import signal
    import time

    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    command = [sys.executable, "-m", "prime_rl.cli", "orchestrator", "--run_dir", str(tmp_path),
               "--orchestrator.port", "0", "--tracking.backends", '["tensorboard"]',
               "--tracking.roles", '["orchestrator"]']  # fmt: skip
    process = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    jsonl = tmp_path / "metrics" / "orchestrator.jsonl"
    try:
        deadline = time.monotonic() + 90
        while time.monotonic() < deadline and not (jsonl.exists() and '"serving"' in jsonl.read_text()):
            time.sleep(0.2)
    finally:
        process.send_signal(signal.SIGTERM)
        output, _ = process.communicate(timeout=60)
    assert process.returncode == 0, output.decode()[-2000:]
    serving = [r for r in metrics.read_metrics(jsonl) if r["event"] == "serving"]
    assert serving
    accumulator = EventAccumulator(str(tmp_path / "tracking" / "tensorboard" / "orchestrator"))
    accumulator.Reload()
    tags = accumulator.Tags()["scalars"]
    assert "start/pid" not in tags  # bookkeeping is not a metric
    assert [(e.step, e.value) for e in accumulator.Scalars("serving/batches")] == [
        (serving[0]["step"], float(serving[0]["batches"]))
    ]
