"""prime_rl.durable (one atomic, durable write for every process) and prime_rl.devices (config
names to torch devices and dtypes)."""

from __future__ import annotations

import fnmatch
import os
import stat
from pathlib import Path

import pytest
import torch

from prime_rl import durable
from prime_rl.devices import choose_device, torch_dtype


def test_write_atomic_replaces_whole_files_with_ordinary_permissions(tmp_path: Path) -> None:
    target = tmp_path / "sub" / "state.json"  # the parent folder is created
    assert durable.write_atomic(target, "first") == target
    durable.write_atomic(target, b"\x00second")
    assert target.read_bytes() == b"\x00second"
    assert sorted(p.name for p in target.parent.iterdir()) == ["state.json"]  # no temporary left
    umask = os.umask(0)
    os.umask(umask)
    assert stat.S_IMODE(target.stat().st_mode) == 0o666 & ~umask  # as open() would create it


def test_a_failed_write_leaves_the_old_file_and_no_temporary(tmp_path: Path) -> None:
    target = tmp_path / "table.parquet"
    target.write_text("old")
    with pytest.raises(RuntimeError, match="writer failed"), durable.atomic_path(target) as temporary:
        temporary.write_text("half")
        raise RuntimeError("writer failed")
    assert target.read_text() == "old"
    assert [p.name for p in tmp_path.iterdir()] == ["table.parquet"]


def test_file_is_fsynced_before_the_rename_and_the_folder_after(tmp_path: Path, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    events: list[tuple[str, str]] = []
    real_fsync, real_replace = os.fsync, os.replace

    def fsync(fd: int) -> None:
        path = os.readlink(f"/proc/self/fd/{fd}")
        events.append(("fsync", "folder" if os.path.isdir(path) else Path(path).name))
        real_fsync(fd)

    def replace(source: str, destination: str) -> None:
        events.append(("replace", Path(destination).name))
        real_replace(source, destination)

    monkeypatch.setattr(durable.os, "fsync", fsync)
    monkeypatch.setattr(durable.os, "replace", replace)
    with durable.atomic_path(tmp_path / "weights.bin") as temporary:
        # a crash here leaves only a file that the store's start-up cleanup glob finds
        assert fnmatch.fnmatch(temporary.name, durable.TEMP_GLOB) and temporary.parent == tmp_path
        temporary.write_bytes(b"w")
    assert events == [("fsync", temporary.name), ("replace", "weights.bin"), ("fsync", "folder")]


def test_devices_and_dtypes_from_config_names() -> None:
    assert choose_device("cpu") == torch.device("cpu")
    expected = (
        torch.device("cuda", torch.cuda.current_device())
        if torch.cuda.is_available()
        else torch.device("cpu")
    )
    assert choose_device("auto") == expected
    if not torch.cuda.is_available():
        with pytest.raises(RuntimeError, match="sees no CUDA device"):
            choose_device("cuda")
    with pytest.raises(ValueError, match="'auto', 'cpu' or 'cuda'"):
        choose_device("gpu")
    assert (torch_dtype("float32"), torch_dtype("bfloat16"), torch_dtype("float16")) == (
        torch.float32,
        torch.bfloat16,
        torch.float16,
    )
    with pytest.raises(ValueError, match="dtype must be one of"):
        torch_dtype("fp8")
