"""Weight copies are bounded (issue #44.3): the trainer keeps its newest versions only, processes on
one machine share one file of the initial weights, a killed run's leftovers go at the next start and
at every exit, and a run the disk cannot hold is refused before anything starts."""

from __future__ import annotations

import json
import stat
import sys
from pathlib import Path

import torch

from prime_rl.config import load_config
from prime_rl.launch.cleanup import check_free_space, disk_needed, remove_stale_copies
from prime_rl.launch.supervisor import ChildSpec, Supervisor
from prime_rl.metrics import MetricsWriter
from prime_rl.weights.layout import policy_file, prune_version_dirs, version_dirs
from prime_rl.weights.store import LocalPolicies, PolicyStore

UNREACHABLE = ["http://127.0.0.1:9"]


def _write(path: Path, size: int) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(b"\1" * size)
    return path


def test_the_trainer_keeps_only_its_newest_versions(tmp_path: Path) -> None:
    for version in range(1, 8):
        _write(policy_file(tmp_path / "policies", version), 10)
        prune_version_dirs(tmp_path / "policies", keep=3)  # after each publish, as the trainer does
    assert list(version_dirs(tmp_path / "policies")) == [5, 6, 7]


def test_processes_on_one_machine_share_one_file_of_the_initial_weights(tmp_path: Path) -> None:
    local = LocalPolicies(tmp_path / "policies", tmp_path / "shardcast" / "origin")
    initial = {"weight": torch.arange(64, dtype=torch.float32).reshape(8, 8)}
    caches = [tmp_path / name / "policies" for name in ("worker-0", "worker-1", "validator")]
    stores = [PolicyStore(UNREACHABLE, cache, initial, local=local) for cache in caches]
    inodes = {store.path(0).stat().st_ino for store in stores}
    assert len(inodes) == 1  # one file on disk, not one copy per process
    assert all(stat.S_IMODE(store.path(0).stat().st_mode) == 0o444 for store in stores)
    # another initial state (another dtype, another model) is never linked to it
    other = PolicyStore(UNREACHABLE, tmp_path / "hostile-0" / "policies", {"weight": torch.ones(8, 8)}, local=local)
    assert other.path(0).stat().st_ino not in inodes


def test_a_killed_runs_leftovers_go_and_what_a_resume_needs_stays(tmp_path: Path) -> None:
    config = load_config(None, ["--run_dir", str(tmp_path), "--shardcast.keep_versions", "2"])
    stale = [
        _write(tmp_path / "worker-0/policies/v3/model.safetensors", 100),
        _write(tmp_path / "validator/policies/v0/model.safetensors", 101),
        _write(tmp_path / "shardcast/relay-0/v3/shard_000000.bin", 102),
        _write(tmp_path / "policies/.shared/ab12", 103),
        _write(tmp_path / "policies/v1/model.safetensors", 104),
        _write(tmp_path / "policies/v3/.model.safetensors.tmp-0123456789abcdef", 105),  # killed mid-write
        _write(tmp_path / "checkpoints/step_4/.optimizer.pt.tmp-0123456789abcdef", 106),
    ]
    kept = [
        _write(tmp_path / "policies/v2/model.safetensors", 7),
        _write(tmp_path / "policies/v3/model.safetensors", 7),
        _write(tmp_path / "shardcast/origin/v2/shard_000000.bin", 7),  # a pending batch's version
        _write(tmp_path / "checkpoints/step_3/COMPLETE", 7),
        _write(tmp_path / "orchestrator/state.sqlite", 7),
    ]
    assert remove_stale_copies(config) == sum(range(100, 107))
    assert [p for p in stale if p.exists()] == [] and all(p.exists() for p in kept)


class _NeverStarts(Supervisor):
    """Every child would exit at once: the run must be refused before any is started."""

    def _argv(self, spec: ChildSpec) -> list[str]:
        return [sys.executable, "-c", "raise SystemExit(1)"]


def test_a_run_the_disk_cannot_hold_is_refused_before_anything_starts(tmp_path: Path) -> None:
    from prime_rl.launch.local import free_port

    model = tmp_path / "model"
    _write(model / "model.safetensors", 1 << 20)
    base = ["--run_dir", str(tmp_path / "run"), "--model.path", str(model), "--orchestrator.port", str(free_port())]
    overrides = [*base, "--shardcast.keep_versions", str(10**6)]  # a terabyte of 1 MiB versions
    config = load_config(None, overrides)
    need = disk_needed(config)
    assert need is not None and need.policy_bytes == 1 << 20
    problem = check_free_space(config)
    assert problem is not None and "not enough disk" in problem and "shardcast.keep_versions" in problem
    metrics_path = tmp_path / "run.jsonl"
    supervisor = _NeverStarts(config, None, overrides, MetricsWriter(metrics_path, role="run", name="run"),
                              on_progress=lambda line: None)  # fmt: skip
    try:
        assert supervisor.run() == 2
    finally:
        supervisor.stop_all()
    events = [json.loads(line) for line in metrics_path.read_text().splitlines()]
    assert not [e for e in events if e["event"] == "child_started"]
    (failed,) = [e for e in events if e["event"] == "failed"]
    assert "not enough disk" in failed["error"]
    assert check_free_space(load_config(None, base)) is None  # the default keep fits
