"""benchmarks/gpu_prep.py: the GPU check's one command, with the wheels the GPU machine lacks."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))
import gpu_prep


def test_check_prints_the_command_with_every_package_source(capsys: pytest.CaptureFixture[str]) -> None:
    assert gpu_prep.main(["--check", "--budget", "300"]) == 0  # the tree travels: under 64 MiB
    out = capsys.readouterr().out
    command = next(line for line in out.splitlines() if line.startswith("command:"))
    assert all(f"packages/{name}/src" in command for name in gpu_prep.PACKAGES)
    assert "--target /tmp/site .whl/*.whl" in command and "timeout 300 python3 benchmarks/gpu_check.py" in command
    assert "MiB of 64 MiB" in out


def test_the_wheels_cover_what_the_gpu_machine_lacks() -> None:
    # pydantic pins its core exactly: the two must move together.
    pins = dict(r.split("==") for r in gpu_prep.REQUIREMENTS)
    assert {"pydantic", "pydantic-core", "zstandard", "typing-extensions"} <= set(pins)
