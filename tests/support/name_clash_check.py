"""The one check of each package's import-time name-clash warning (``<package>/_name_clash.py``).

Every package carries its own copy of ``_name_clash.py`` (each installs and works alone, so none
can import another's); ``tests/test_name_clash_copies.py`` checks the copies are identical, and
each package's ``tests/test_name_clash.py`` runs this check on its own import.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path


def fake_distribution(root: Path, dist: str, version: str, top: str, *, declare: str = "record") -> None:
    """Install-like files for ``dist`` providing package ``top``: its code plus a .dist-info whose
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


def import_warns_in_one_line_naming_both(tmp_path: Path, package: str, ours: Path, *, other: str, version: str = "9.9") -> None:
    """A second distribution ``other`` (as pip would leave it) provides ``package`` beside ours (the
    sources under ``ours``): importing it runs our code and prints one warning naming both; without
    the other distribution nothing is printed."""
    fake_distribution(tmp_path, other, version, package)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ours), str(tmp_path)])}
    out = subprocess.run(
        [sys.executable, "-c", f"import {package}; print({package}.__file__)"],
        capture_output=True, text=True, env=env, timeout=300, check=True,
    )  # fmt: skip
    assert out.stdout.strip() == str(ours / package / "__init__.py")  # ours was imported
    lines = [line for line in out.stderr.splitlines() if "NameClashWarning" in line]
    assert len(lines) == 1, out.stderr
    ours_dist = "intellect2-" + package.replace("_", "-")
    assert f"{ours_dist} (this package)" in lines[0] and f"also by {other} " in lines[0]
    assert "separate virtual environments" in lines[0]
    clean = subprocess.run(
        [sys.executable, "-c", f"import {package}"],
        capture_output=True, text=True, timeout=300, check=True, env={**os.environ, "PYTHONPATH": str(ours)},
    )  # fmt: skip
    assert "NameClashWarning" not in clean.stderr
