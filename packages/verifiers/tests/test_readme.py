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


def test_the_write_your_own_environment_example_runs_as_printed(tmp_path):
    """The "Write your own environment" file, saved as units_env.py and run, prints what the README says."""
    import os
    import subprocess
    import sys

    readme = (Path(__file__).resolve().parents[1] / "README.md").read_text()
    found = re.search(r"<!-- env-example[^>]*-->\n```python\n(.*?)```\n\n[^\n]*\n\n```text\n(.*?)```", readme, re.S)
    assert found, "packages/verifiers/README.md has no env-example block followed by its output"
    code, printed = found.groups()
    (tmp_path / "units_env.py").write_text(code)
    same_imports = dict(os.environ, PYTHONPATH=os.pathsep.join(p for p in sys.path if p))  # this checkout's verifiers
    run = subprocess.run(
        [sys.executable, "units_env.py"], cwd=tmp_path, env=same_imports, capture_output=True, text=True, timeout=120
    )
    assert run.returncode == 0, run.stderr
    assert run.stdout == printed
