"""The README's TRL example runs as printed on this CPU machine (docs must not drift from code).

The snippet is the fenced block after the ``trl-example`` marker. The one line a user changes
(``model = "..."``, a hub name) becomes the tiny Qwen2 model and tokenizer written to a local
directory by tests/support/tiny_lm.py, so nothing comes from a hub; every other line runs as printed.
"""

from __future__ import annotations

import os
import re
from pathlib import Path

import pytest

pytest.importorskip("trl")
from tiny_lm import save_tiny_lm

README = Path(__file__).resolve().parents[1] / "README.md"
MODEL_LINE = re.compile(r'^model = "[^"]+"  # <- your model.*$', re.M)


def trl_example() -> str:
    found = re.search(r"<!-- trl-example[^>]*-->\n```python\n(.*?)```", README.read_text(), re.S)
    assert found, "packages/grpo/README.md has no fenced python block after <!-- trl-example ... -->"
    return found.group(1)


def test_the_trl_example_runs_as_printed(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    code = trl_example()
    assert len(MODEL_LINE.findall(code)) == 1, "the example must mark its one model line '# <- your model'"
    tiny = save_tiny_lm(tmp_path / "tiny-lm")
    code = MODEL_LINE.sub(f"model = {str(tiny)!r}", code)
    monkeypatch.chdir(tmp_path)  # output_dir="out" lands here
    namespace: dict[str, object] = {}
    exec(compile(code, str(README), "exec"), namespace)
    trainer = namespace["trainer"]
    state = trainer.state  # type: ignore[attr-defined]
    assert state.global_step == 1, "the example's trainer.train() took no optimiser step"
    assert os.path.isdir(tmp_path / "out")
