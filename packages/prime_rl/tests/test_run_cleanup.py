"""remove_weight_copies: a finished run keeps its final policy, checkpoints, logs and metrics only."""

from __future__ import annotations

from pathlib import Path

from prime_rl.config import load_config
from prime_rl.launch.supervisor import remove_weight_copies


def _write(path: Path, size: int) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(b"\0" * size)
    return path


def test_removes_every_transient_weight_copy_and_keeps_the_rest(tmp_path):
    config = load_config(None, ["--run_dir", str(tmp_path)])
    transient = [
        tmp_path / "worker-0/policies/v0/model.safetensors",
        tmp_path / "worker-1/policies/v3/model.safetensors",
        tmp_path / "hostile-0/policies/v2/model.safetensors",
        tmp_path / "validator/policies/v1/model.safetensors",
        tmp_path / "shardcast/origin/v3/shard_000000.bin",
        tmp_path / "shardcast/relay-0/v3/manifest.json",
        tmp_path / "policies/v1/model.safetensors",
        tmp_path / "policies/v2/model.safetensors",
    ]
    kept = [
        tmp_path / "policies/v3/model.safetensors",  # the trainer's newest policy
        tmp_path / "checkpoints/step_3/COMPLETE",
        tmp_path / "metrics/trainer.jsonl",
        tmp_path / "logs/worker-0.log",
        tmp_path / "report.png",
    ]
    for index, path in enumerate(transient):
        _write(path, 100 + index)
    for path in kept:
        _write(path, 7)

    freed = remove_weight_copies(config)

    # 100 + 101 + ... + 107 bytes: the eight transient files above.
    assert freed == sum(range(100, 108))
    assert [p for p in transient if p.exists()] == []
    assert all(p.exists() for p in kept)
    assert not (tmp_path / "shardcast").exists()
    assert remove_weight_copies(config) == 0  # idempotent


def test_keeps_the_numerically_newest_trainer_policy_and_ignores_other_entries(tmp_path):
    config = load_config(None, ["--run_dir", str(tmp_path)])
    removed = [tmp_path / f"policies/v{v}/model.safetensors" for v in (1, 2, 9)]
    newest = tmp_path / "policies/v10/model.safetensors"  # "v10" < "v9" as strings
    others = [tmp_path / "policies/v01/model.safetensors", tmp_path / "policies/notes.txt"]
    for path in [*removed, newest, *others]:
        _write(path, 10)

    assert remove_weight_copies(config) == 30
    assert [p for p in removed if p.exists()] == []
    assert newest.exists() and all(p.exists() for p in others)


def test_hard_links_are_freed_once_and_only_when_every_name_goes(tmp_path):
    """Workers' caches hard-link the trainer's files (weights.store.LocalPolicies): a link of a
    removed trainer version frees its bytes once; a link of the kept newest policy frees nothing."""
    import os

    config = load_config(None, ["--run_dir", str(tmp_path)])
    old = _write(tmp_path / "policies/v1/model.safetensors", 1000)
    newest = _write(tmp_path / "policies/v2/model.safetensors", 2000)
    for cache in ("worker-0", "worker-1", "validator"):
        for version, source in ((1, old), (2, newest)):
            link = tmp_path / cache / f"policies/v{version}/model.safetensors"
            link.parent.mkdir(parents=True, exist_ok=True)
            os.link(source, link)
    assert remove_weight_copies(config) == 1000  # v1's one file, whatever its four names
    assert newest.exists() and newest.stat().st_nlink == 1 and not old.exists()
