"""The README's example runs as written (docs must not drift from code)."""

from __future__ import annotations

import re
from pathlib import Path


def test_readme_example_runs(capsys):
    readme = (Path(__file__).resolve().parents[1] / "README.md").read_text()
    code = re.search(r"## Example\n\n```python\n(.*?)```", readme, re.DOTALL).group(1)
    assert len(code.strip().splitlines()) <= 12  # imports + 10 lines
    exec(compile(code, "README.md", "exec"), {})
    lines = capsys.readouterr().out.splitlines()
    assert lines[0] == "False" and lines[1] == "True True"
    assert lines[2].startswith("Score(reward=1.0")
    assert "passed=1, total=1" in lines[3]
    assert lines[4] == "[1.0, 0.0, 1.0]"
