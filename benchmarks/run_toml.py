"""A run's TOML config from sections of plain values (the benchmarks that start real processes)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any


def write_run_toml(root: Path, sections: dict[str, dict[str, Any]]) -> Path:
    """``<root>/run.toml`` with ``run_dir = <root>/run`` and one table per section (values as JSON,
    which TOML reads for strings, numbers, booleans and lists); returns its path."""
    lines = [f"run_dir = {json.dumps(str(root / 'run'))}"]
    for name, section in sections.items():
        lines.append(f"\n[{name}]")
        lines += [f"{key} = {json.dumps(value)}" for key, value in section.items()]
    path = root / "run.toml"
    path.write_text("\n".join(lines) + "\n")
    return path
