"""examples/intellect2.py takes its own flags only when spelled out: before, argparse's prefix
matching read `--keep-port` as `--keep-ports`; now it is a (malformed) config override and the run stops
before anything starts."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def test_abbreviated_flag_is_not_taken_for_keep_ports(tmp_path: Path):
    done = subprocess.run(
        [sys.executable, str(ROOT / "examples" / "intellect2.py"), "--config", str(ROOT / "configs" / "tiny-cpu.toml"),
         "--keep-port"],
        cwd=tmp_path, capture_output=True, text=True, timeout=180,
    )  # fmt: skip
    assert done.returncode != 0
    assert "--keep-port" in done.stderr  # named as the bad override it is
    assert not (tmp_path / "runs").exists()  # nothing was started
