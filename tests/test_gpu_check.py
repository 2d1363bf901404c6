"""benchmarks/gpu_check.py --smoke: the GPU check's one command runs end to end on the CPU."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parents[1] / "benchmarks" / "gpu_check.py"


@pytest.mark.slow
def test_smoke_run_writes_every_section(tmp_path: Path) -> None:
    out = tmp_path / "gpu_check.json"
    proc = subprocess.run(
        [sys.executable, str(SCRIPT), "--smoke", "--device", "cpu", "--out", str(out)],
        capture_output=True, text=True, timeout=280,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-4000:]
    result = json.loads(out.read_text())
    env = result["environment"]
    assert env["device"] and env["torch"] and env["transformers"] and "driver" in env
    assert result["toploc"]["cpu"]["build_ms"] > 0 and result["toploc"]["cpu"]["verify_ms"] > 0
    rows = {row["variant"]: row for row in result["trainer"]}
    assert set(rows) == {"document", "document_full", "document_ckpt", "dense", "plain"}
    assert all("error" not in row and row["tokens_per_s"] > 0 for row in rows.values())
    shared = {row["layout"]: row for row in result["shared_prompt"]}
    assert set(shared) == {"packed", "shared"} and all("error" not in row for row in shared.values())
    attention = result["attention"]["ms"]
    assert {"document_auto", "document_sdpa", "causal_sdpa"} <= set(attention)
    assert all("error" not in figures and figures["median"] > 0 for figures in attention.values())
    generation, validator = result["rollouts"]["generation"], result["rollouts"]["validator"]
    assert generation["worker_tokens_per_s"] > 0 and generation["generate_tokens_per_s"] > 0
    # The worker decodes with the dynamic step on the CPU; the static step draws the same tokens.
    assert generation["worker_decode"] == "dynamic" and generation["static_same_tokens_as_worker"]
    noise = result["noise"]
    assert noise["calibration"]["tokens"] > 0 and len(noise["rows"]) == 2
    for row in noise["rows"]:  # fp32 honest samples under the profile's rule: none rejected
        assert row["accepted"] == row["samples"] and row["rejected"] == {} and row["observed"] == row["samples"]
    # Honest fp32 rollouts judged by the same weights: every one accepted, with near-zero noise.
    assert validator["accepted"] == validator["samples"] == 4 and validator["rejected"] == {}
    assert validator["noise"]["mean_logprob_gap"]["max"] < 1e-4
    cost = result["validation_cost"]  # generation vs validation per sample (issue #45.6)
    assert cost["verdicts"] == {"ok": cost["samples"]} and cost["samples"] == 4
    assert cost["generation_s_per_sample"]["median"] > 0 and cost["validation_s_per_sample"]["median"] > 0
    assert cost["ratio_median"] > 0 and cost["case"]["new_tokens"] == 8
    assert "trainer" in proc.stdout and "validator" in proc.stdout  # the printed table
    assert "validation / generation" in proc.stdout
