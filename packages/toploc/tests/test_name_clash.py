"""Name clash detection: another installed distribution that provides `toploc` is named on import."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path


def test_import_warns_in_one_line_naming_both(tmp_path):
    # A second distribution ("toploc" 9.9, as pip would leave it) providing the same package.
    (tmp_path / "toploc").mkdir()
    (tmp_path / "toploc" / "__init__.py").write_text("")
    info = tmp_path / "toploc-9.9.dist-info"
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: toploc\nVersion: 9.9\n")
    (info / "RECORD").write_text("toploc/__init__.py,,\n")
    ours = Path(__file__).resolve().parents[1] / "src"
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ours), str(tmp_path)])}
    out = subprocess.run(
        [sys.executable, "-c", "import toploc; print(toploc.__file__)"],
        capture_output=True, text=True, env=env, timeout=300, check=True,
    )  # fmt: skip
    assert out.stdout.strip() == str(ours / "toploc" / "__init__.py")  # ours was imported
    lines = [line for line in out.stderr.splitlines() if "NameClashWarning" in line]
    assert len(lines) == 1, out.stderr
    assert "intellect2-toploc (this package)" in lines[0] and "also by toploc " in lines[0]
    assert "separate virtual environments" in lines[0]
