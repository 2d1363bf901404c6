"""Measure honest noise: decode with the run's model and settings, prefill as the validator does.

``prime-rl calibrate-noise --config run.toml [--validator.noise_profile FILE]`` generates honest
completions of the run's task prompts with the run's model, dtype, temperature and stop rules
(the workers' decode, ``HFBackend`` or their vLLM engine, at several batch sizes, so padding and
batch shapes vary), recomputes them with one prefill per batch, and writes the
:class:`toploc.NoiseProfile` of the differences (``toploc.NoiseProfile.calibrate``). If the file
exists, the new measurement is *merged* into it (worst case per threshold): run the command on
every kind of machine workers use (GPU models, vLLM, CPU) and point the validator at the one file.
The validator measures a profile the same way at start-up when ``validator.noise_profile`` is
empty (``validator.calibration_tokens``). Every measurement is cached per (model, dtype, engine,
machine, temperature and max_new_tokens, context-length bucket), not per environment, and paid once
(:mod:`prime_rl.validator.noise_cache`; ``validator.recalibrate = true`` measures again). A
measurement logs a rate line after every batch (tokens done, tokens per second, seconds left).

Pitfall: a profile measured on the validator's machine covers workers that compute the same way
(same hardware class, kernels and dtype). A worker on other hardware (a GPU with TF32 matmuls in
an fp32 run, another attention kernel) has other honest noise; measure it there and merge.
"""

from __future__ import annotations

import logging
import platform
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch

import toploc
from prime_rl.inference.backend import HFBackend, SamplingParams, token_logprobs, verify_proofs
from prime_rl.validator import noise_cache
from prime_rl.validator.checks import sampling_margins
from toploc.noise import calibration_floor, tokens_for_floor

if TYPE_CHECKING:
    from prime_rl.config import RunConfig

log = logging.getLogger(__name__)

CALIBRATION_SEED = 1 << 40
"""First sampling seed of calibration samples (far from anything a lease assigns; seeds are opaque)."""

FLOOR_WARNING = 1e-3
"""Warn when the calibration cannot bound an honest rate below this (13,800 tokens at the defaults)."""

BATCH_SIZES = (1, 4, 16)
"""Decode batch sizes cycled through, so that both padding and batch shapes vary."""


def measure(
    backend: HFBackend,
    prompts: Sequence[Sequence[int]],
    params: SamplingParams,
    *,
    tokens: int,
    batch_sizes: Sequence[int] = BATCH_SIZES,
    generator: Any = None,
) -> list[toploc.Observations]:
    """Honest observations of at least ``tokens`` generated tokens (or every prompt once, if fewer).

    Prompts are taken in order, ``batch_sizes`` cycled; each batch is decoded with ``generator``
    (any backend with the HF backend's ``generate`` contract, e.g. the workers' vLLM engine; default
    ``backend`` itself) and then prefilled by ``backend``, exactly as a worker's sample meets the
    validator.
    """
    generator = backend if generator is None else generator
    if not prompts:
        raise ValueError("calibration needs at least one prompt")
    observations: list[toploc.Observations] = []
    measured, start, round_index = 0, 0, 0
    started = time.monotonic()
    while measured < tokens and start < len(prompts):
        size = batch_sizes[round_index % len(batch_sizes)]
        batch = [list(p) for p in prompts[start : start + size]]
        seeds = [CALIBRATION_SEED + start + i for i in range(len(batch))]
        completions = generator.generate(batch, seeds, params)
        prefills = backend.prefill(batch, [c.completion_tokens for c in completions])
        for completion, pre in zip(completions, prefills, strict=True):
            ids = torch.tensor(completion.completion_tokens, dtype=torch.long)
            margins = sampling_margins(pre.logits, ids, completion.seed, params.temperature)
            recomputed = token_logprobs(pre.logits, ids, params.temperature)
            results = verify_proofs(pre.hidden, completion.proofs)
            observations.append(
                toploc.Observations.from_checks(margins.cpu(), completion.logprobs, recomputed.cpu(), results)
            )
            measured += ids.numel()
        start += len(batch)
        round_index += 1
        log_rate(measured, tokens, time.monotonic() - started)
    return observations


def log_rate(measured: int, tokens: int, seconds: float) -> None:
    """The calibration's rate line: tokens measured of those asked for, tokens per second, time left."""
    rate = measured / seconds if seconds > 0 else 0.0
    left = max(0, tokens - measured) / rate if rate > 0 else float("nan")
    log.info(
        "calibrating honest noise: %d/%d tokens (%.0f%%), %.1f tokens/s, ~%.0f s left",
        measured,
        tokens,
        100.0 * min(measured, tokens) / max(tokens, 1),
        rate,
        left,
    )


def describe(config: RunConfig, backend: HFBackend, generator: Any = None) -> dict[str, str]:
    """What a profile was measured on (kept in the file, merged with ' | ')."""
    return {
        "model": str(config.model.path),
        "dtype": config.model.dtype,
        "device": str(backend.device),
        "backend": f"decode {type(generator or backend).__name__}, prefill HFBackend (transformers)",
        "torch": torch.__version__,
        "machine": platform.machine(),
        "temperature": f"{config.sampling.temperature:g}",
        "threads": str(torch.get_num_threads()),
    }


def calibrate(
    config: RunConfig,
    backend: HFBackend,
    prompts: Sequence[Sequence[int]],
    tokens: int,
    generator: Any = None,
) -> toploc.NoiseProfile:
    """The honest noise profile of ``generator``'s decode (default ``backend``'s) against ``backend``'s
    prefill on ``prompts`` under the run's sampling settings."""
    params = SamplingParams(
        temperature=config.sampling.temperature,
        max_new_tokens=config.sampling.max_new_tokens,
        stop=tuple(config.sampling.stop),
    )
    observations = measure(backend, prompts, params, tokens=tokens, generator=generator)
    profile = toploc.NoiseProfile.calibrate(observations, description=describe(config, backend, generator))
    tokens = sum(o.num_tokens for o in observations)
    log.info("honest noise measured on %d samples (%d tokens)", len(observations), tokens)
    for statistic in profile.statistics:
        log.info("  %s", statistic.summary())
    if calibration_floor(tokens) > FLOOR_WARNING:
        log.warning(
            "%d honest tokens bound no honest rate below %.2g (the floor of the measurement, not the noise): "
            "deviations are seen slowly; measure >= %d tokens (`prime-rl calibrate-noise`, calibration_tokens)",
            tokens,
            calibration_floor(tokens),
            tokens_for_floor(FLOOR_WARNING),
        )
    return profile


def task_prompts(config: RunConfig, backend: HFBackend, count: int) -> list[tuple[int, ...]]:
    """The prompts of the first ``count`` tasks of the run (as workers feed them)."""
    from prime_rl.reward import run_tasks

    tasks = run_tasks(config, backend.tokenizer)
    return [tuple(tasks.prompt_tokens(i)) for i in range(min(count, tasks.num_tasks))]


def calibration_prompt_count(tokens: int) -> int:
    """How many task prompts a calibration of ``tokens`` may decode: enough even at one token each."""
    return max(16, tokens)


def context_tokens(config: RunConfig, prompts: Sequence[Sequence[int]]) -> int:
    """The longest context a calibration on ``prompts`` decodes: longest prompt + ``max_new_tokens``
    (what the profile's cache key buckets; :func:`prime_rl.validator.noise_cache.context_bucket`)."""
    return max((len(p) for p in prompts), default=0) + config.sampling.max_new_tokens


def calibrate_for_run(
    config: RunConfig, backend: HFBackend, tokens: int, generator: Any = None
) -> toploc.NoiseProfile:
    """Measure on the run's task prompts: enough prompts for ``tokens`` even at the shortest completion.

    The decode measured is the workers' own: ``generator`` (their engine, when it is not the HF
    backend) or else ``backend``. Only that decode: the noise a validator must tolerate is that of
    the engine its run's workers decode with (another engine is another profile, measured where it
    runs and merged: ``prime-rl calibrate-noise``), and measuring the HF decode as well in a vLLM run
    doubled the first run's calibration without widening the profile (the vLLM decode's gaps were
    the larger ones on every statistic).
    """
    prompts = task_prompts(config, backend, calibration_prompt_count(tokens))
    return calibrate(config, backend, prompts, tokens, generator=generator)


def calibrate_cached(
    config: RunConfig,
    tokens: int,
    decode_backend: str,
    measure_now: Callable[[], toploc.NoiseProfile],
    *,
    context: int = 0,
) -> toploc.NoiseProfile:
    """``measure_now()`` (a calibration decoding with ``decode_backend``), or the profile cached for
    this run's (model, dtype, engine, machine, temperature, ``context`` bucket: :func:`context_tokens`)
    by an earlier measurement (:mod:`prime_rl.validator.noise_cache`; ``validator.recalibrate``
    measures again). A model that is not a local directory is measured every time."""
    cache_dir = noise_cache.cache_dir_for(config.model.path)
    if cache_dir is None:
        log.info("model.path %r is not a local directory: no noise profile cache", config.model.path)
        return measure_now()
    key = noise_cache.key_for_run(config, decode_backend, context_tokens=context)
    return noise_cache.cached_profile(
        cache_dir, key, tokens, measure_now, refresh=config.validator.recalibrate
    )


def cached_only(
    config: RunConfig, tokens: int, decode_backend: str, *, context: int = 0
) -> toploc.NoiseProfile | None:
    """The cached profile of a calibration decoding with ``decode_backend``, or None (measures nothing)."""
    if config.validator.recalibrate:
        return None
    cache_dir = noise_cache.cache_dir_for(config.model.path)
    if cache_dir is None:
        return None
    key = noise_cache.key_for_run(config, decode_backend, context_tokens=context)
    return noise_cache.lookup(cache_dir, key, tokens)


def main(config: RunConfig, name: str = "calibrate-noise") -> int:
    """Entry point of ``prime-rl calibrate-noise``: measure, merge into the file, report."""
    from prime_rl.devices import choose_device
    from prime_rl.metrics import init_process

    torch.set_num_threads(config.validator.num_threads)
    init_process("validator", name, config.run_dir)
    path = Path(config.validator.noise_profile or Path(config.run_dir) / "validator" / "noise-profile.json")
    tokens = max(config.validator.calibration_tokens, 1)
    from transformers import AutoTokenizer

    from prime_rl.reward import run_tasks

    tasks = run_tasks(config, AutoTokenizer.from_pretrained(str(config.model.path)))
    count = min(calibration_prompt_count(tokens), tasks.num_tasks)
    context = context_tokens(config, [tasks.prompt_tokens(i) for i in range(count)])

    def measure_now() -> toploc.NoiseProfile:
        backend = HFBackend(
            config.model.path,
            dtype=config.model.dtype,
            device=choose_device(config.validator.device),
            max_batch_size=max(BATCH_SIZES),
        )
        generator = None
        if config.workers.backend != "hf":  # this process is the measurement's own: an engine may change it
            from prime_rl.inference.select import make_backend

            generator = make_backend(
                config, backend=config.workers.backend, device=backend.device, max_batch_size=max(BATCH_SIZES)
            )
        return calibrate_for_run(config, backend, tokens, generator)

    profile = calibrate_cached(config, tokens, config.workers.backend, measure_now, context=context)
    if path.exists():
        profile = toploc.NoiseProfile.merge(toploc.NoiseProfile.load(path), profile)
        log.info("merged into the existing profile %s", path)
    path.parent.mkdir(parents=True, exist_ok=True)
    profile.save(path)
    print(f"wrote {path}")
    for s in profile.statistics:
        print(f"  {s.summary()}")
    return 0
