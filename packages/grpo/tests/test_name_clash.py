"""Name clash detection: another installed distribution that provides `grpo` is named on import."""

from __future__ import annotations

from pathlib import Path

from name_clash_check import import_warns_in_one_line_naming_both  # tests/support


def test_import_warns_in_one_line_naming_both(tmp_path):
    ours = Path(__file__).resolve().parents[1] / "src"
    import_warns_in_one_line_naming_both(tmp_path, "grpo", ours, other="grpo")
