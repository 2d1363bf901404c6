"""Name clash detection: another distribution that provides `verifiers` is named on import."""

from __future__ import annotations

import importlib.metadata
import os
import subprocess
import sys
from pathlib import Path

import pytest

from verifiers._name_clash import NameClashWarning, clashing_distributions, warn_on_name_clash


def fake_distribution(root: Path, dist: str, version: str, top: str, *, declare: str) -> None:
    """Install-like files for `dist` providing package `top`: its code plus a .dist-info whose
    top-level names come from top_level.txt (setuptools) or only from RECORD (hatchling, uv)."""
    (root / top).mkdir(parents=True)
    (root / top / "__init__.py").write_text("")
    info = root / f"{dist.replace('-', '_')}-{version}.dist-info"
    info.mkdir()
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {dist}\nVersion: {version}\n")
    record = [f"{top}/__init__.py,,", f"{info.name}/METADATA,,", f"{info.name}/RECORD,,"]
    if declare == "top_level":
        (info / "top_level.txt").write_text(f"{top}\n")
        record.append(f"{info.name}/top_level.txt,,")
    (info / "RECORD").write_text("\n".join(record) + "\n")


@pytest.mark.parametrize("declare", ["top_level", "record"])
def test_agrees_with_packages_distributions(tmp_path, monkeypatch, declare):
    fake_distribution(tmp_path, "verifiers", "0.1.9", "verifiers", declare=declare)
    fake_distribution(tmp_path, "unrelated-thing", "1.0", "unrelated", declare=declare)
    monkeypatch.setattr(sys, "path", [str(tmp_path)])
    reference = importlib.metadata.packages_distributions()  # the slow full scan, as the oracle
    assert reference["verifiers"] == ["verifiers"]
    assert clashing_distributions("verifiers", "intellect2-verifiers") == ["verifiers"]
    assert clashing_distributions("unrelated", "intellect2-verifiers") == reference["unrelated"]
    assert clashing_distributions("verifiers", "verifiers") == []  # its own name is no clash
    assert clashing_distributions("absent", "intellect2-verifiers") == []


def test_own_distribution_alone_is_silent(tmp_path, monkeypatch, recwarn):
    fake_distribution(tmp_path, "intellect2-verifiers", "0.1.0", "verifiers", declare="record")
    monkeypatch.setattr(sys, "path", [str(tmp_path)])
    assert warn_on_name_clash("verifiers", "intellect2_verifiers", others_hint="x") == []
    assert not [w for w in recwarn if issubclass(w.category, NameClashWarning)]


def test_broken_metadata_never_breaks_import(tmp_path, monkeypatch):
    (tmp_path / "verifiers").mkdir()
    info = tmp_path / "broken-1.0.dist-info"
    info.mkdir()
    (info / "METADATA").write_bytes(b"\xff\xfe not metadata")
    monkeypatch.setattr(sys, "path", [str(tmp_path)])
    assert warn_on_name_clash("verifiers", "intellect2-verifiers", others_hint="x") == []


def test_import_warns_in_one_line_naming_both(tmp_path):
    fake_distribution(tmp_path, "verifiers", "0.1.9", "verifiers", declare="record")
    ours = Path(__file__).resolve().parents[1] / "src"
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ours), str(tmp_path)])}
    out = subprocess.run(
        [sys.executable, "-c", "import verifiers; print(verifiers.__file__)"],
        capture_output=True, text=True, env=env, timeout=120, check=True,
    )  # fmt: skip
    assert out.stdout.strip() == str(ours / "verifiers" / "__init__.py")  # ours was imported
    lines = [line for line in out.stderr.splitlines() if "NameClashWarning" in line]
    assert len(lines) == 1, out.stderr
    assert "intellect2-verifiers" in lines[0] and "also by verifiers" in lines[0]
    assert "separate virtual environments" in lines[0]
    clean = subprocess.run(
        [sys.executable, "-c", "import verifiers"],
        capture_output=True, text=True, timeout=120, check=True,
        env={**os.environ, "PYTHONPATH": str(ours)},
    )  # fmt: skip
    assert "NameClashWarning" not in clean.stderr
