"""Issue 48 item 5: broadcast defaults. A policy trained in bf16 is published, and its deltas
taken, in bf16; ``shardcast.delta = true`` with fp32 policy files is warned about (its deltas are a
third to a half of the file: benchmarks/results/delta_dtype.md)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch
from safetensors import safe_open

from prime_rl import cli
from prime_rl.config import load_config
from prime_rl.weights.files import save_policy


def test_the_published_dtype_follows_the_training_dtype_unless_set() -> None:
    assert load_config(None, ["--model.dtype", "bfloat16"]).published_dtype == "bfloat16"
    assert load_config(None, ["--model.dtype", "float32"]).published_dtype == "float32"
    assert load_config(None, ["--trainer.save_dtype", "bfloat16"]).published_dtype == "bfloat16"


def test_delta_with_fp32_policy_files_is_warned_about() -> None:
    warning = load_config(None, ["--model.dtype", "float32"]).broadcast_warning()
    assert warning is not None and warning.startswith("shardcast.delta = true with float32 policy files")
    assert 'set trainer.save_dtype = "bfloat16"' in warning and "benchmarks/results/delta_dtype.md" in warning
    for quiet in (["--model.dtype", "bfloat16"], ["--trainer.save_dtype", "bfloat16"], ["--shardcast.delta", "false"]):
        assert load_config(None, quiet).broadcast_warning() is None, quiet


def test_prime_rl_run_and_trainer_print_the_warning_first(tmp_path: Path, capsys: Any) -> None:
    assert cli.main(["trainer", "--run_dir", str(tmp_path), "--model.path", str(tmp_path / "none")]) == 2
    assert "prime-rl trainer: warning: shardcast.delta = true with float32 policy files" in capsys.readouterr().err
    argv = ["trainer", "--run_dir", str(tmp_path), "--model.path", str(tmp_path / "none"), "--model.dtype", "bfloat16"]
    assert cli.main(argv) == 2
    assert "warning" not in capsys.readouterr().err


def test_a_bf16_policy_is_published_in_bf16(tmp_path: Path) -> None:
    """``trainer.save_dtype = "model"`` is ``dtype=None`` (trainer/process.py): the tensors' own dtype."""
    state = {"w": torch.randn(4, 4, dtype=torch.bfloat16)}
    path = save_policy(state, tmp_path / "v1" / "model.safetensors", dtype=None)
    with safe_open(str(path), "pt") as handle:
        assert handle.get_tensor("w").dtype == torch.bfloat16
