"""docs/byo.md, followed literally: its config and its `prime-rl` commands, on a tiny model (with a
chat template) and tiny parquet files built here, with W&B in offline mode.

Only what a tiny random model cannot do is overridden on the command line: one short policy step,
8-token completions, no zero-advantage filter (a random model's rewards are all 0) and free ports.
"""

from __future__ import annotations

import json
import os
import re
import shlex
import socket
import subprocess
import sys
import tomllib
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from prime_rl.config import load_config

ROOT = Path(__file__).resolve().parents[1]
PAGE = ROOT / "docs" / "byo.md"
CHAT = (
    "{% for m in messages %}{{ m['role'] }}: {{ m['content'] }}\n{% endfor %}"
    "{% if add_generation_prompt %}assistant:{% endif %}"
)


def _blocks(language: str) -> list[str]:
    return re.findall(rf"```{language}\n(.*?)```", PAGE.read_text(), flags=re.S)


def _commands() -> list[list[str]]:
    """The page's `prime-rl` command lines, as argv for this interpreter."""
    lines = [line.split("#")[0].strip() for block in _blocks("bash") for line in block.splitlines()]
    return [
        [sys.executable, "-m", "prime_rl.cli", *shlex.split(line)[1:]]
        for line in lines
        if line.startswith(".venv/bin/prime-rl ")
    ]


def _free_ports(count: int) -> list[int]:
    sockets = [socket.socket() for _ in range(count)]
    for probe in sockets:
        probe.bind(("127.0.0.1", 0))
    ports = [probe.getsockname()[1] for probe in sockets]
    for probe in sockets:
        probe.close()
    return ports


def _make_inputs(tmp_path: Path) -> dict[str, str]:
    sys.path.insert(0, str(ROOT / "tests" / "support"))
    from tiny_lm import save_tiny_lm
    from transformers import AutoTokenizer

    model = save_tiny_lm(tmp_path / "my-instruct-model")
    tokenizer = AutoTokenizer.from_pretrained(model)
    tokenizer.chat_template = CHAT  # an "instruct" tiny model
    tokenizer.save_pretrained(model)
    data = tmp_path / "data" / "math"
    data.mkdir(parents=True)
    problems = [{"question": f"What is {a} + {a}?", "answer": str(2 * a)} for a in range(9)]
    pq.write_table(pa.Table.from_pylist(problems[:6]), data / "train.parquet")
    pq.write_table(pa.Table.from_pylist(problems[6:]), data / "test.parquet")
    return {
        "/models/my-instruct-model": str(model),
        "data/math/train.parquet": str(data / "train.parquet"),
        "data/math/test.parquet": str(data / "test.parquet"),
        "runs/byo": str(tmp_path / "runs" / "byo"),
    }


def _write_config(tmp_path: Path, paths: dict[str, str]) -> Path:
    (text,) = _blocks("toml")
    for documented, real in paths.items():
        assert f'"{documented}"' in text, documented
        text = text.replace(f'"{documented}"', json.dumps(real))
    path = tmp_path / "byo.toml"
    path.write_text(text)
    return path


def test_the_documented_config_is_valid_and_means_what_the_page_says(tmp_path: Path):
    config = load_config(_write_config(tmp_path, {"runs/byo": "runs/byo"}))
    assert config.tasks.source == "parquet" and config.tasks.chat_template
    assert config.tasks.columns == {"prompt": "question", "answer": "answer"}
    assert config.evaluator.tasks == {"path": "data/math/test.parquet"}
    assert config.tracking.backends == ["wandb"] and config.tracking.wandb_mode == "offline"
    assert [argv[3:] for argv in _commands()] == [
        ["run", "--config", "byo.toml", "--print-config"],
        ["run", "--config", "byo.toml"],
    ]


@pytest.mark.slow
def test_the_page_runs_on_a_tiny_model_with_wandb_offline(tmp_path: Path):
    pytest.importorskip("wandb", reason="wandb not installed (pip install 'prime-rl[wandb]')")
    from wandb_records import read_wandb_history  # tests/support

    paths = _make_inputs(tmp_path)
    config_path = _write_config(tmp_path, paths)
    print_config, run = _commands()
    env = {k: v for k, v in os.environ.items() if not k.startswith("WANDB_")}  # no key, no settings
    env["WANDB_SILENT"] = "true"
    shown = subprocess.run(print_config, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120)
    assert shown.returncode == 0, shown.stderr
    assert json.loads(shown.stdout)["model"]["path"] == paths["/models/my-instruct-model"]

    orchestrator, origin, relay = _free_ports(3)
    tiny = ["--trainer.total_steps", "1", "--trainer.samples_per_step", "8", "--trainer.filter_zero_advantage",
            "false", "--sampling.max_new_tokens", "8", "--sampling.group_size", "4", "--workers.count", "1",
            "--evaluator.num_problems", "2", "--orchestrator.port", str(orchestrator),
            "--shardcast.origin_port", str(origin), "--shardcast.relay_ports", f"[{relay}]"]  # fmt: skip
    done = subprocess.run(run + tiny, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=420)
    run_dir = Path(paths["runs/byo"])
    logs = "\n".join(f"== {p.name}\n{p.read_text()[-1500:]}" for p in sorted((run_dir / "logs").glob("*.out")))
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:] + logs

    commits = [json.loads(line) for line in (run_dir / "metrics" / "trainer.jsonl").read_text().splitlines()]
    assert [r["policy_version"] for r in commits if r["event"] == "commit"] == [1]
    runs = {path.name: path for path in (run_dir / "tracking" / "wandb").glob("offline-run-*")}
    assert len(runs) == 2  # tracking.roles = ["trainer", "evaluator"]: one W&B run per process
    histories: dict[str, list[dict[str, Any]]] = {}
    for folder in runs.values():
        name, history = read_wandb_history(folder)
        histories[name] = history
    assert set(histories) == {"byo/trainer", "byo/evaluator"}
    assert any("train/loss" in row for row in histories["byo/trainer"])
    accuracies = [row["eval/accuracy"] for row in histories["byo/evaluator"] if "eval/accuracy" in row]
    evals = [json.loads(line) for line in (run_dir / "metrics" / "evaluator.jsonl").read_text().splitlines()]
    assert accuracies == [r["accuracy"] for r in evals if r["event"] == "eval"]  # same events as the JSONL
    assert all(r["num_problems"] == 2 for r in evals if r["event"] == "eval")  # from the held-out file
    assert tomllib.loads(config_path.read_text())["tracking"]["project"] == "my-rl-project"
