"""The honest-noise profile cache: a hit skips the calibration, any key change misses, a damaged
file is measured again (prime_rl.validator.noise_cache)."""

from __future__ import annotations

import dataclasses
import json
import logging
import shutil
from pathlib import Path

import pytest
from tiny_lm import make_tiny_lm, make_tiny_tokenizer

import toploc
from prime_rl.config import RunConfig, load_config
from prime_rl.inference.backend import HFBackend
from prime_rl.validator import noise, noise_cache
from prime_rl.validator.model_fingerprint import model_fingerprint
from prime_rl.validator.noise_cache import CalibrationKey, cached_profile, key_for_run

CPUINFO = "processor\t: 0\nmodel name\t: Example CPU 9000\nflags\t\t: sse avx2 fma\n"


def honest_profile(scale: float = 0.0) -> toploc.NoiseProfile:
    """A profile from one honest 4-token sample (``scale``: its log-prob gaps)."""
    observation = toploc.Observations(
        sampling_margin=[0.0, 0.0, 0.0, 0.0],  # type: ignore[arg-type]
        logprob_gap=[scale] * 4,  # type: ignore[arg-type]
        proof_exp_mismatches=[0],  # type: ignore[arg-type]
        proof_mant_err_mean=[0.0],  # type: ignore[arg-type]
    )
    return toploc.NoiseProfile.calibrate([observation], description={"test": "yes"})


class Counter:
    """A measurement that counts how often it ran."""

    def __init__(self, profile: toploc.NoiseProfile) -> None:
        self.profile, self.calls = profile, 0

    def __call__(self) -> toploc.NoiseProfile:
        self.calls += 1
        return self.profile


@pytest.fixture
def model_dir(tmp_path: Path, tiny_lm_dir: Path) -> Path:
    copy = tmp_path / "model"
    shutil.copytree(tiny_lm_dir, copy)
    return copy


@pytest.fixture
def config(tmp_path: Path, model_dir: Path) -> RunConfig:
    return load_config(None, ["--run_dir", str(tmp_path / "run"), "--model.path", str(model_dir)])


def with_overrides(config: RunConfig, *overrides: str) -> RunConfig:
    return load_config(None, ["--run_dir", config.run_dir, "--model.path", config.model.path, *overrides])


def test_a_hit_skips_the_real_calibration(tmp_path: Path, config: RunConfig) -> None:
    """First call: the real calibration (tiny model decode + prefill); second: read back, equal."""
    tokenizer = make_tiny_tokenizer()
    backend = HFBackend(config.model.path, model=make_tiny_lm(), tokenizer=tokenizer)
    prompts = [tuple(tokenizer.encode(f"{a}+{a}=")) for a in range(8)]
    runs: list[int] = []

    def measure() -> toploc.NoiseProfile:
        runs.append(1)
        return noise.calibrate(config, backend, prompts, 64)

    first = noise.calibrate_cached(config, 64, "hf", measure)
    second = noise.calibrate_cached(config, 64, "hf", measure)
    assert len(runs) == 1
    assert second == first
    assert first.statistic("sampling_margin").observations >= 64
    # A larger request than the entry was measured for is measured again; a smaller one is served.
    assert noise.calibrate_cached(config, 32, "hf", measure) == first and len(runs) == 1
    noise.calibrate_cached(config, 128, "hf", measure)
    assert len(runs) == 2


def test_recalibrate_measures_again_and_replaces_the_entry(tmp_path: Path, config: RunConfig) -> None:
    key = key_for_run(config, "hf")
    old, new = Counter(honest_profile(0.0)), Counter(honest_profile(0.5))
    cached_profile(tmp_path, key, 16, old)
    assert cached_profile(tmp_path, key, 16, new, refresh=True) == new.profile and new.calls == 1
    assert cached_profile(tmp_path, key, 16, old) == new.profile and old.calls == 1
    forced = with_overrides(config, "--validator.recalibrate", "true")
    assert forced.validator.recalibrate


def test_every_key_component_misses(
    tmp_path: Path, config: RunConfig, model_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(noise_cache, "machine_identity", lambda c: noise_cache._cpu_identity(CPUINFO))
    base = key_for_run(config, "hf")
    assert key_for_run(config, "hf") == base  # stable
    changed: dict[str, CalibrationKey] = {
        "dtype": key_for_run(with_overrides(config, "--model.dtype", "bfloat16"), "hf"),
        "engine": key_for_run(config, "vllm"),
        "settings": key_for_run(with_overrides(config, "--sampling.temperature", "0.7"), "hf"),
    }
    monkeypatch.setattr(noise_cache, "_version", lambda name: "9.9" if name == "torch" else "1.0")
    changed["engine version"] = key_for_run(config, "hf")
    monkeypatch.undo()
    monkeypatch.setattr(
        noise_cache,
        "machine_identity",
        lambda c: noise_cache._cpu_identity(CPUINFO.replace("fma", "avx512f")),
    )
    changed["machine"] = key_for_run(config, "hf")
    monkeypatch.setattr(noise_cache, "machine_identity", lambda c: noise_cache._cpu_identity(CPUINFO))
    weights = next(model_dir.glob("*.safetensors"))
    data = bytearray(weights.read_bytes())
    data[-1] ^= 1  # one bit of one weight
    weights.write_bytes(bytes(data))
    changed["model"] = key_for_run(config, "hf")
    assert base.digest() not in {key.digest() for key in changed.values()}
    for name, key in changed.items():
        differing = [f.name for f in dataclasses.fields(key) if getattr(key, f.name) != getattr(base, f.name)]
        assert differing == [name.split()[0]], name
    measure = Counter(honest_profile())
    cached_profile(tmp_path, base, 16, measure)
    for key in changed.values():
        cached_profile(tmp_path, key, 16, measure)
    assert measure.calls == 1 + len(changed)
    cached_profile(tmp_path, base, 16, measure)
    assert measure.calls == 1 + len(changed)  # the others did not overwrite it


def test_machine_identity_reads_cpu_flags_gpus_and_threads(tmp_path: Path, config: RunConfig) -> None:
    cpuinfo = tmp_path / "cpuinfo"
    cpuinfo.write_text(CPUINFO)
    first = noise_cache.machine_identity(config, cpuinfo)
    assert "Example CPU 9000" in first and "threads validator 1" in first
    cpuinfo.write_text(CPUINFO.replace("avx2", "avx2 avx512f"))
    assert noise_cache.machine_identity(config, cpuinfo) != first
    assert (
        noise_cache.machine_identity(with_overrides(config, "--validator.num_threads", "2"), cpuinfo) != first
    )
    nvidia = tmp_path / "nvidia"
    (nvidia / "gpus" / "0000:01:00.0").mkdir(parents=True)
    (nvidia / "gpus" / "0000:01:00.0" / "information").write_text(
        "Model: \t\t NVIDIA H100 80GB HBM3\nIRQ: 1\n"
    )
    (nvidia / "version").write_text("NVRM version: NVIDIA UNIX x86_64 Kernel Module  550.54.15\n")
    gpu = noise_cache._gpu_identity(nvidia)
    assert "NVIDIA H100 80GB HBM3" in gpu and "550.54.15" in gpu
    (nvidia / "version").write_text("NVRM version: NVIDIA UNIX x86_64 Kernel Module  560.28.03\n")
    assert noise_cache._gpu_identity(nvidia) != gpu
    assert noise_cache._gpu_identity(tmp_path / "absent") == ""


@pytest.mark.parametrize(
    "damage",
    [
        lambda text: text[: len(text) // 2],  # a torn write
        lambda text: "",
        lambda text: "\x00\xff not json",
        lambda text: json.dumps({**json.loads(text), "format": "other/1"}),
        lambda text: json.dumps({**json.loads(text), "profile": {"format": "toploc-noise-profile/1"}}),
        lambda text: json.dumps({**json.loads(text), "calibration_tokens": "many"}),
        lambda text: json.dumps([1, 2]),
    ],
)
def test_a_damaged_entry_is_measured_again_with_a_warning(
    tmp_path: Path, config: RunConfig, damage, caplog: pytest.LogCaptureFixture
) -> None:  # type: ignore[no-untyped-def]
    key = key_for_run(config, "hf")
    measure = Counter(honest_profile())
    cached_profile(tmp_path, key, 16, measure)
    (entry,) = tmp_path.glob("noise-*.json")
    entry.write_text(damage(entry.read_text()), errors="surrogateescape")
    with caplog.at_level(logging.INFO, logger=noise_cache.__name__):
        assert cached_profile(tmp_path, key, 16, measure) == measure.profile
    assert measure.calls == 2
    assert "measuring again" in caplog.text
    assert cached_profile(tmp_path, key, 16, measure) == measure.profile and measure.calls == 2  # repaired


def test_an_entry_of_another_key_under_the_same_name_is_not_used(tmp_path: Path, config: RunConfig) -> None:
    key = key_for_run(config, "hf")
    measure = Counter(honest_profile())
    cached_profile(tmp_path, key, 16, measure)
    other = dataclasses.replace(key, dtype="bfloat16")
    (entry,) = tmp_path.glob("noise-*.json")
    data = json.loads(entry.read_text())
    data["key"] = dataclasses.asdict(other)
    entry.write_text(json.dumps(data))
    cached_profile(tmp_path, key, 16, measure)
    assert measure.calls == 2


def test_where_profiles_are_cached(tmp_path: Path, model_dir: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(noise_cache.ENV_VAR, raising=False)
    assert (
        noise_cache.cache_dir_for(str(model_dir), tmp_path / "root") == tmp_path / "root" / "noise-profiles"
    )
    (model_dir / "prime_rl_source.json").write_text("{}")  # a directory prime_rl converted
    assert noise_cache.cache_dir_for(str(model_dir), tmp_path / "root") == model_dir / "noise-profiles"
    assert noise_cache.cache_dir_for("HuggingFaceTB/SmolLM2-135M") is None  # a hub id: nothing to hash
    monkeypatch.setenv(noise_cache.ENV_VAR, str(tmp_path / "elsewhere"))
    assert noise_cache.cache_dir_for(str(model_dir)) == tmp_path / "elsewhere"
    monkeypatch.setenv(noise_cache.ENV_VAR, "off")
    assert noise_cache.cache_dir_for(str(model_dir)) is None


def test_the_cache_folder_and_provenance_do_not_change_the_model_hash(model_dir: Path) -> None:
    before = model_fingerprint(model_dir)
    (model_dir / "noise-profiles").mkdir()
    (model_dir / "noise-profiles" / "noise-0.json").write_text("{}")
    (model_dir / "prime_rl_source.json").write_text("{}")
    assert model_fingerprint(model_dir) == before
    (model_dir / "config.json").write_text((model_dir / "config.json").read_text() + " ")
    assert model_fingerprint(model_dir) != before


def test_an_unwritable_cache_still_returns_the_measurement(tmp_path: Path, config: RunConfig) -> None:
    blocker = tmp_path / "file"
    blocker.write_text("not a folder")
    measure = Counter(honest_profile())
    assert cached_profile(blocker / "sub", key_for_run(config, "hf"), 16, measure) == measure.profile


def test_a_validator_reads_the_workers_engine_profile_without_measuring(
    tmp_path: Path, config: RunConfig, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``noise.cached_only``: what a validator started with vLLM workers uses before it would measure
    an HF decode only: the cached vLLM-decode profile, never the HF one, and nothing with recalibrate."""
    monkeypatch.setenv(noise_cache.ENV_VAR, str(tmp_path / "cache"))
    vllm = with_overrides(config, "--workers.backend", "vllm")
    assert noise.cached_only(vllm, 16, "vllm") is None
    noise.calibrate_cached(vllm, 16, "hf", Counter(honest_profile(0.1)))  # an HF-only measurement
    assert noise.cached_only(vllm, 16, "vllm") is None
    measured = noise.calibrate_cached(vllm, 16, "vllm", Counter(honest_profile(0.2)))
    assert noise.cached_only(vllm, 16, "vllm") == measured
    assert noise.cached_only(vllm, 32, "vllm") is None  # measured for fewer tokens than asked
    assert noise.cached_only(with_overrides(vllm, "--validator.recalibrate", "true"), 16, "vllm") is None
