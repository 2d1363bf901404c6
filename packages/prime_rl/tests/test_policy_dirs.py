"""prime_rl.weights.layout: the one way to name and parse ``v<N>`` policy folders, and its two users
(PolicyStore pruning its cache, the supervisor deleting weight copies) seeing the same folders."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

from prime_rl.weights.layout import parse_version_dir_name, version_dir, version_dirs
from prime_rl.weights.store import PolicyStore, PolicyUnavailable

JUNK_NAMES = [
    "",
    "v",
    "V2",
    "v-1",
    "v+1",
    "v 1",
    " v1",
    "v1 ",
    "v1\n",
    "v01",
    "v007",
    "v01x",
    "v1x",
    "vv2",
    "v1_0",
    "v1.0",
    "v²",  # str.isdigit() is True, int() rejects it
    "v١",  # ARABIC-INDIC DIGIT ONE: int() accepts it, the on-disk name is not ours
    "x1",
    "1",
    "latest",
]


@pytest.mark.parametrize(("name", "version"), [("v0", 0), ("v1", 1), ("v12", 12), ("v1000000", 1_000_000)])
def test_parse_canonical_names(name: str, version: int) -> None:
    assert parse_version_dir_name(name) == version


@pytest.mark.parametrize("name", JUNK_NAMES)
def test_parse_rejects_every_other_name(name: str) -> None:
    assert parse_version_dir_name(name) is None


@given(st.integers(min_value=0, max_value=10**30))
def test_version_dir_round_trips(version: int) -> None:
    path = version_dir("/cache", version)
    assert path.parent == Path("/cache") and path.name == f"v{version}"
    assert parse_version_dir_name(path.name) == version


def test_version_dir_rejects_negative_versions() -> None:
    with pytest.raises(ValueError, match=">= 0"):
        version_dir("/cache", -1)


def test_version_dirs_lists_only_version_folders_in_numeric_order(tmp_path: Path) -> None:
    for version in (10, 2, 9, 0):
        (tmp_path / f"v{version}").mkdir()
    for name in JUNK_NAMES:
        if name and "/" not in name:
            (tmp_path / name).mkdir(exist_ok=True)
    (tmp_path / "v3").write_bytes(b"a file named like a version")
    (tmp_path / "v2" / "v5").mkdir()  # nested: not directly under the root
    found = version_dirs(tmp_path)
    assert list(found) == [0, 2, 9, 10]  # 10 after 9: numeric, not lexicographic order
    assert found == {v: tmp_path / f"v{v}" for v in (0, 2, 9, 10)}
    assert version_dirs(str(tmp_path)) == found


def test_version_dirs_of_a_missing_or_file_root_is_empty(tmp_path: Path) -> None:
    assert version_dirs(tmp_path / "missing") == {}
    (tmp_path / "file").write_text("x")
    assert version_dirs(tmp_path / "file") == {}


def test_policy_dirs_and_run_import_without_torch() -> None:
    code = (
        "import sys\n"
        "class Block:\n"
        "    def find_spec(self, name, path=None, target=None):\n"
        "        if name.split('.')[0] == 'torch':\n"
        "            raise ImportError('torch is blocked')\n"
        "sys.meta_path.insert(0, Block())\n"
        "import prime_rl.weights.layout, prime_rl.launch.supervisor\n"
        "assert 'torch' not in sys.modules\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True, timeout=120)


def _store(cache: Path, keep: int) -> PolicyStore:
    return PolicyStore([], cache, {"w": torch.zeros(2)}, keep=keep)


def test_store_prunes_oldest_fetched_versions_and_ignores_junk(tmp_path: Path) -> None:
    store = _store(tmp_path, keep=2)  # writes v0 (the initial model)
    for version in (1, 2, 9, 10):
        store.path(version).parent.mkdir()
    (tmp_path / "v01").mkdir()  # not a version folder: never touched
    (tmp_path / "v3").write_text("a file")
    store._prune(10)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["v0", "v01", "v10", "v3", "v9"]
    assert store.path(0).is_file()  # version 0 is never pruned


def test_store_never_prunes_the_version_just_fetched(tmp_path: Path) -> None:
    store = _store(tmp_path, keep=1)
    for version in (1, 2, 3):
        store.path(version).parent.mkdir()
    store._prune(1)  # an old version fetched late (a validator checking an old batch)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["v0", "v1", "v3"]


def test_store_ensure_refuses_negative_versions(tmp_path: Path) -> None:
    with pytest.raises(PolicyUnavailable, match=">= 0") as info:
        _store(tmp_path, keep=2).ensure(-1)
    assert info.value.permanent
