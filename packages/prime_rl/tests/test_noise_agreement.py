"""Agreed tolerances (issues #45.3, #48.4): one noise profile per run and model, not per environment;
validators of a run judge by the one the orchestrator keeps; a validator whose own honest noise is out
of line with it refuses to judge (prime_rl.validator.agreement)."""

from __future__ import annotations

import dataclasses
import json
import logging
import socket
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

import toploc
from prime_rl.api.client import OrchestratorClient
from prime_rl.api.protocol import NoiseProfileRecord
from prime_rl.api.secrets import run_secrets
from prime_rl.config import RunConfig, load_config
from prime_rl.inference.backend import HFBackend
from prime_rl.orchestrator.server import OrchestratorServer
from prime_rl.tasks import load_tasks
from prime_rl.validator import agreement, noise, noise_cache
from prime_rl.validator import process as validator_process
from prime_rl.validator.agreement import NoiseMismatch, self_check
from prime_rl.validator.process import Validator


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def run_config(run_dir: Path, model: Path, *overrides: str) -> RunConfig:
    return load_config(
        None,
        [
            "--run_dir", str(run_dir), "--model.path", str(model), "--tasks.num_tasks", "24",
            "--orchestrator.port", str(free_port()), "--sampling.max_new_tokens", "12",
            "--validator.calibration_tokens", "96", "--validator.self_check_tokens", "96",
            *overrides,
        ],
    )  # fmt: skip


class CountingCalibration:
    """Wraps a noise.py measurement function and counts its calls."""

    def __init__(self, function: Any) -> None:
        self.function, self.calls = function, 0

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        self.calls += 1
        return self.function(*args, **kwargs)


def start_validator(config: RunConfig) -> tuple[Validator, toploc.NoiseProfile]:
    validator = Validator(config)
    validator.close()
    return validator, toploc.NoiseProfile.load(Path(config.run_dir) / "validator" / "noise-profile.json")


def test_a_new_environment_on_the_same_model_reads_the_cached_profile(
    tmp_path: Path, tiny_lm_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Run 1 measures; run 2 (another task set and prompt template, a new run directory and
    orchestrator) reads the cached profile: nothing is decoded for noise (on main the task section
    was part of the key, so every new environment cost a full calibration)."""
    monkeypatch.setenv(noise_cache.ENV_VAR, str(tmp_path / "cache"))
    full = CountingCalibration(noise.calibrate_for_run)
    short = CountingCalibration(noise.calibrate)
    monkeypatch.setattr(noise, "calibrate_for_run", full)
    first = run_config(tmp_path / "run1", tiny_lm_dir)
    with OrchestratorServer(first, load_tasks(first.tasks)):
        _, profile1 = start_validator(first)
    assert full.calls == 1
    monkeypatch.setattr(noise, "calibrate", short)
    second = run_config(
        tmp_path / "run2", tiny_lm_dir, "--tasks.ops", '["*", "-"]', "--tasks.seed", "7",
        "--tasks.prompt_template", "Q: {prompt}\nA:",
    )  # fmt: skip
    assert second.tasks != first.tasks
    with OrchestratorServer(second, load_tasks(second.tasks)):
        _, profile2 = start_validator(second)
    assert (full.calls, short.calls) == (1, 0)  # neither a calibration nor a self-check decoded anything
    assert profile2 == profile1
    # What does key the profile: the context bucket. Much longer prompts are another profile.
    key = noise_cache.key_for_run(first, "hf", context_tokens=40)
    assert noise_cache.key_for_run(second, "hf", context_tokens=60) == key
    assert noise_cache.key_for_run(second, "hf", context_tokens=600).digest() != key.digest()


def test_validators_of_a_run_judge_by_the_profile_published_first(
    tmp_path: Path, tiny_lm_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Validator A publishes its profile; validator B, on 'another machine' (another calibration
    key: its own run directory, its own cache, other threads), checks its own noise with a short
    measurement and judges by A's profile, not by a measurement of its own."""
    monkeypatch.setenv(noise_cache.ENV_VAR, str(tmp_path / "cache-a"))
    config_a = run_config(tmp_path / "run", tiny_lm_dir)
    with OrchestratorServer(config_a, load_tasks(config_a.tasks)) as server:
        _, profile_a = start_validator(config_a)
        with OrchestratorClient(server.url, admin_token=server.admin_token) as client:
            record = client.noise_profile()
            assert "noise_profile" in client.status().capabilities
        assert record is not None and toploc.NoiseProfile.from_json(record.profile) == profile_a
        monkeypatch.setenv(noise_cache.ENV_VAR, str(tmp_path / "cache-b"))
        short = CountingCalibration(noise.calibrate)
        full = CountingCalibration(noise.calibrate_for_run)
        monkeypatch.setattr(noise, "calibrate", short)
        monkeypatch.setattr(noise, "calibrate_for_run", full)
        secrets = run_secrets(config_a)
        config_b = load_config(
            None, ["--run_dir", str(tmp_path / "elsewhere"), "--model.path", str(tiny_lm_dir),
                   "--tasks.num_tasks", "24", "--orchestrator.port", str(config_a.orchestrator.port),
                   "--sampling.max_new_tokens", "12", "--validator.calibration_tokens", "96",
                   "--validator.self_check_tokens", "96", "--validator.num_threads", "2",
                   "--orchestrator.admin_token", secrets.admin_token,
                   "--orchestrator.assignment_secret", secrets.assignment_key.decode()],
        )  # fmt: skip
        _, profile_b = start_validator(config_b)
    assert (short.calls, full.calls) == (1, 0)
    assert profile_b == profile_a


def perturbed_prefill(scale: float) -> Any:
    """HFBackend.prefill with Gaussian noise of ``scale`` on the logits: a validator whose machine
    computes differently from the run's profile."""
    original = HFBackend.prefill
    generator = torch.Generator().manual_seed(0)

    def prefill(self: HFBackend, prompts: Any, completions: Any) -> Any:
        out = original(self, prompts, completions)
        return [
            dataclasses.replace(p, logits=p.logits + scale * torch.randn(p.logits.shape, generator=generator))
            for p in out
        ]

    return prefill


def publish(server: OrchestratorServer, profile: toploc.NoiseProfile, config: RunConfig, **fields: Any) -> None:
    key = noise_cache.key_for_run(config, "hf")
    record = NoiseProfileRecord(
        profile=profile.to_json(), model=key.model, dtype=config.model.dtype, key="another-machine",
        calibration_tokens=96, published_by="validator@elsewhere",
    )  # fmt: skip
    with OrchestratorClient(server.url, admin_token=server.admin_token) as client:
        client.publish_noise_profile(record.model_copy(update=fields))


def test_a_validator_with_out_of_line_noise_refuses_to_judge(
    tmp_path: Path, tiny_lm_dir: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """The run's fp32 profile (measured honestly here, published as another machine's) against a
    validator whose prefill adds noise of 1e-3 logits: its short self-check sees nonzero margins and
    log-prob gaps far above the profile's bounds, and ``prime-rl validator`` exits 2 with the reason,
    judging nothing."""
    monkeypatch.setenv(noise_cache.ENV_VAR, str(tmp_path / "cache"))
    config = run_config(tmp_path / "run", tiny_lm_dir, "--validator.max_batches", "1")
    backend = HFBackend(config.model.path)
    honest = noise.calibrate_for_run(config, backend, 256)
    assert honest.statistic("sampling_margin").maximum == 0.0  # fp32: decode and prefill agree exactly
    with OrchestratorServer(config, load_tasks(config.tasks)) as server:
        publish(server, honest, config)
        monkeypatch.setattr(HFBackend, "prefill", perturbed_prefill(1e-3))
        with caplog.at_level(logging.INFO):
            code = validator_process.main(config)
        assert code == 2
        with OrchestratorClient(server.url, admin_token=server.admin_token) as client:
            assert client.noise_profile() is not None
    refusal = [r.getMessage() for r in caplog.records if "out of line with the run's noise profile" in r.getMessage()]
    assert refusal, caplog.text
    assert "refuses to judge" in refusal[0] and "logprob_gap >" in refusal[0]


def test_a_profile_of_another_dtype_is_refused_before_any_measurement(
    tmp_path: Path, tiny_lm_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(noise_cache.ENV_VAR, str(tmp_path / "cache"))
    config = run_config(tmp_path / "run", tiny_lm_dir)
    short = CountingCalibration(noise.calibrate)
    monkeypatch.setattr(noise, "calibrate", short)
    profile = toploc.NoiseProfile.calibrate([toploc.Observations(np.zeros(64), np.zeros(64))])
    with OrchestratorServer(config, load_tasks(config.tasks)) as server:
        publish(server, profile, config, dtype="bfloat16")
        with pytest.raises(NoiseMismatch, match="another model or dtype"):
            Validator(config)
    assert short.calls == 0


def observations(rate: float, tokens: int, seed: int) -> toploc.Observations:
    """``tokens`` margins and gaps, a share ``rate`` of them 0.15 (above 0.1), the rest 0."""
    rng = np.random.default_rng(seed)
    values = np.where(rng.random(tokens) < rate, 0.15, 0.0)
    return toploc.Observations(values, values)


def test_self_check_passes_the_same_noise_and_flags_more() -> None:
    """Run profile: 1% of 20,000 honest tokens above 0.1 (bound p0 ~ 2 x 1.2%). A validator with the
    same 1% on 2,000 tokens passes; one with 5% fails, naming the statistic and threshold; one with
    none passes (less noise than the run's judges by the run's wider rules)."""
    run = toploc.NoiseProfile.calibrate([observations(0.01, 20_000, 0)])
    same = toploc.NoiseProfile.calibrate([observations(0.01, 2_000, 1)])
    quiet = toploc.NoiseProfile.calibrate([observations(0.0, 2_000, 2)])
    loud = toploc.NoiseProfile.calibrate([observations(0.05, 2_000, 3)])
    assert self_check(run, same).ok and self_check(run, quiet).ok
    check = self_check(run, loud)
    assert not check.ok and check.tokens == 2_000
    assert any(p.startswith("sampling_margin > 0.1:") for p in check.problems), check.problems
    uncounted = dataclasses.replace(  # a merged profile of different grids, or an old file: no counts
        same, statistics=tuple(dataclasses.replace(s, exceedances=()) for s in same.statistics)
    )
    with pytest.raises(ValueError, match="no exceedance counts"):
        self_check(run, uncounted)


def test_the_run_profile_is_kept_across_orchestrator_restarts_and_first_publication_wins(
    tmp_path: Path, tiny_lm_dir: Path
) -> None:
    config = run_config(tmp_path / "run", tiny_lm_dir)
    one = toploc.NoiseProfile.calibrate([toploc.Observations(np.zeros(64), np.zeros(64))])
    two = toploc.NoiseProfile.calibrate([toploc.Observations(np.full(64, 0.2), np.zeros(64))])
    with OrchestratorServer(config, load_tasks(config.tasks)) as server:
        publish(server, one, config)
        publish(server, two, config)
    with (
        OrchestratorServer(config, load_tasks(config.tasks)) as server,
        OrchestratorClient(server.url, admin_token=server.admin_token) as client,
    ):
        record = client.noise_profile()
    assert record is not None and toploc.NoiseProfile.from_json(record.profile) == one
    stored = json.loads((config.orchestrator_data_dir / "noise-profile.json").read_text())
    assert stored["published_by"] == "validator@elsewhere"
    assert agreement.SELF_CHECK_FALSE_REFUSAL == 1e-6


def test_a_profile_of_longer_contexts_serves_shorter_ones_not_longer(tmp_path: Path, tiny_lm_dir: Path) -> None:
    """An environment with shorter prompts reads the profile measured on longer contexts (honest
    noise does not shrink with the context); one with longer prompts than measured is measured."""
    config = run_config(tmp_path / "run", tiny_lm_dir)
    measured = toploc.NoiseProfile.calibrate([toploc.Observations(np.zeros(64), np.zeros(64))])
    key_256 = noise_cache.key_for_run(config, "hf", context_tokens=200)
    assert key_256.context == "<= 256 tokens"
    noise_cache.cached_profile(tmp_path, key_256, 16, lambda: measured)
    shorter = noise_cache.key_for_run(config, "hf", context_tokens=100)
    longer = noise_cache.key_for_run(config, "hf", context_tokens=300)
    assert noise_cache.lookup(tmp_path, shorter, 16) == measured
    assert noise_cache.lookup(tmp_path, longer, 16) is None
    assert noise_cache.lookup(tmp_path, shorter, 32) is None  # still: measured for >= the tokens asked
