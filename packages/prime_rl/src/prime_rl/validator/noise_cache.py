"""Honest-noise calibration paid once per (model, precision, engine, machine): an on-disk cache.

Measuring honest noise (:mod:`prime_rl.validator.noise`) decodes thousands of tokens with the
workers' engine and prefills them with the validator's; on 2 CPU cores that is minutes. The result
depends only on what computes the numbers, so it is cached under a :class:`CalibrationKey`, and
*not* under the environment or task set (a new environment on the same model reads the cached
profile; issue #48):

* **model**: :func:`~prime_rl.validator.model_fingerprint.model_fingerprint` of the model
  directory: names and sizes of its top-level files, config and tokenizer files whole, and of
  large weight files their safetensors headers and the two ends of every tensor (a few MiB read,
  not the whole model; what it does not see is said there);
* **dtype**: ``model.dtype``;
* **engine**: the workers' decode backend (``hf``/``vllm``) and the versions of torch,
  transformers, vLLM (for a vLLM decode), toploc and prime_rl;
* **machine**: CPU architecture, model name and flags (``/proc/cpuinfo``), the NVIDIA GPU models
  and driver (``/proc/driver/nvidia``) unless the validator runs on the CPU, ``CUDA_VISIBLE_DEVICES``
  and the thread counts (a CPU matmul's reduction order depends on them);
* **settings**: the sampling temperature (margins and log-probs are taken of ``logits / T``: the same
  rounding noise is another margin at another temperature) and ``max_new_tokens`` (completions
  shorter than a 32-token chunk measure no proof statistic at all, and a profile of 4-token
  completions leaves the proof evidence without bounds: seen in the test suite, where it delayed a
  steering worker's evidence ban);
* **context**: the power-of-two bucket of the longest context the measurement decodes (longest
  calibration prompt + ``sampling.max_new_tokens``; :func:`context_bucket`). This is the one way an
  environment changes honest noise: rounding differences in attention and in the KV cache grow with
  the positions they sum over, so a profile measured on 100-token contexts says nothing certain about
  8,000-token ones. A profile serves every run whose contexts fall in its bucket or a smaller one
  (:func:`covering_keys`: noise measured on longer contexts bounds shorter ones'); the prompts'
  words, the reward, the tools and the task types do not enter.

A cached profile measured with at least ``validator.calibration_tokens`` tokens asked for (per
decode backend) is a hit; anything
else (a missing, corrupt, partial or foreign file, another key) is a miss and is measured again.
Files live next to a converted model (``<model_dir>/noise-profiles/``, the demo model's cache
directory) or, for any other model directory, in ``<cache_dir>/noise-profiles/`` (never inside a
user's model folder); ``$PRIME_RL_NOISE_CACHE`` overrides the folder (``off``: no cache). Each
entry is written atomically (:func:`prime_rl.durable.write_atomic`). ``validator.recalibrate =
true`` (``--validator.recalibrate true``) measures again and replaces the entry.

Pitfall: the key covers what is known to change kernels' numerics, not everything that could (a
BLAS library swapped under the same torch wheel, a GPU clock mode). A stale profile that is too
narrow rejects honest workers (false rejections and, over many tokens, false bans); one that is
too wide lets a cheater deviate further before the evidence sees it. Recalibrate after changing
the machine's software outside Python packages.
"""

from __future__ import annotations

import dataclasses
import hashlib
import importlib.metadata
import json
import logging
import os
import platform
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import toploc
from prime_rl.durable import write_atomic
from prime_rl.validator.model_fingerprint import PROVENANCE, model_fingerprint

if TYPE_CHECKING:
    from prime_rl.config import RunConfig

__all__ = [
    "CACHE_DIRNAME",
    "ENV_VAR",
    "CalibrationKey",
    "cache_dir_for",
    "cached_profile",
    "context_bucket",
    "covering_keys",
    "key_for_run",
    "lookup",
]

log = logging.getLogger(__name__)

CACHE_DIRNAME = "noise-profiles"
ENV_VAR = "PRIME_RL_NOISE_CACHE"
"""Environment variable: the cache folder, or ``off``."""
FORMAT = "prime-rl-noise-cache/1"


@dataclass(frozen=True)
class CalibrationKey:
    """What a honest-noise profile depends on; any field that differs is a cache miss.

    Attributes:
        model: :func:`~prime_rl.validator.model_fingerprint.model_fingerprint` of the model directory.
        dtype: the model's dtype (``float32``, ``bfloat16``).
        engine: decode and prefill backends with their package versions.
        machine: CPU model/flags, GPU models and driver, visible devices and thread counts.
        settings: sampling temperature and max_new_tokens of the measurement (``temperature 0.6, max_new_tokens 96``).
        context: :func:`context_bucket` of the longest context measured (``<= 256 tokens``).
    """

    model: str
    dtype: str
    engine: str
    machine: str
    settings: str
    context: str = "any"

    def digest(self) -> str:
        """A short stable name for the entry (sha256 of the fields, 16 hex digits)."""
        text = json.dumps(dataclasses.asdict(self), sort_keys=True)
        return hashlib.sha256(text.encode()).hexdigest()[:16]


def _version(distribution: str) -> str:
    try:
        return importlib.metadata.version(distribution)
    except importlib.metadata.PackageNotFoundError:
        return "absent"


def _cpu_identity(cpuinfo: str) -> str:
    """The first processor's model name and sorted flags (x86 ``flags``, ARM ``Features``)."""
    model, flags = "", ""
    for line in cpuinfo.splitlines():
        name, _, value = line.partition(":")
        name = name.strip().lower()
        if name in ("model name", "cpu model", "hardware") and not model:
            model = value.strip()
        elif name in ("flags", "features") and not flags:
            flags = " ".join(sorted(value.split()))
    return f"{model}; flags sha256 {hashlib.sha256(flags.encode()).hexdigest()[:16]}"


def _gpu_identity(proc_root: Path = Path("/proc/driver/nvidia")) -> str:
    """NVIDIA GPU models and driver version read from the driver's /proc files ('' without one)."""
    if not proc_root.is_dir():
        return ""
    models = []
    for info in sorted(proc_root.glob("gpus/*/information")):
        for line in info.read_text(errors="replace").splitlines():
            if line.startswith("Model:"):
                models.append(line.partition(":")[2].strip())
    version_file = proc_root / "version"
    driver = version_file.read_text(errors="replace").splitlines()[0] if version_file.is_file() else ""
    return f"gpus {models}; driver {driver.strip()}"


def machine_identity(config: RunConfig, cpuinfo_path: Path = Path("/proc/cpuinfo")) -> str:
    """What on this machine changes kernels' numerics (module docstring); torch-free."""
    try:
        cpuinfo = cpuinfo_path.read_text(errors="replace")
    except OSError:
        cpuinfo = ""
    parts = [platform.machine(), _cpu_identity(cpuinfo) if cpuinfo else platform.processor()]
    if config.validator.device != "cpu":
        parts.append(_gpu_identity())
        parts.append(f"CUDA_VISIBLE_DEVICES={os.environ.get('CUDA_VISIBLE_DEVICES', '')}")
    parts.append(f"threads validator {config.validator.num_threads} workers {config.workers.num_threads}")
    return " | ".join(parts)


CONTEXT_BUCKET_MIN = 64
"""The smallest context bucket (tokens): contexts up to it share one."""


def context_bucket(context_tokens: int) -> str:
    """``'<= 2^k tokens'``, the smallest power of two (at least :data:`CONTEXT_BUCKET_MIN`) holding
    ``context_tokens``; ``'any'`` for 0 (not known: a key that matches only other unknown contexts)."""
    if context_tokens <= 0:
        return "any"
    bucket = CONTEXT_BUCKET_MIN
    while bucket < context_tokens:
        bucket *= 2
    return f"<= {bucket} tokens"


def key_for_run(
    config: RunConfig, decode_backend: str, model_hash: str | None = None, *, context_tokens: int = 0
) -> CalibrationKey:
    """The key of a calibration of ``config`` whose decode runs on ``decode_backend`` (``hf`` alone, or
    ``vllm`` merged with ``hf``); ``model_hash``: the model directory's :func:`model_fingerprint`,
    computed when not given (``config.model.path`` must then be a local directory);
    ``context_tokens``: the longest context the measurement decodes (:func:`context_bucket`)."""
    backend = decode_backend
    versions = {
        name: _version(name) for name in ("torch", "transformers", "intellect2-toploc", "intellect2-prime-rl")
    }
    if backend == "vllm":
        versions["vllm"] = _version("vllm")
    engine = f"decode {backend}, prefill hf; " + ", ".join(f"{k} {v}" for k, v in sorted(versions.items()))
    return CalibrationKey(
        model=model_hash if model_hash is not None else model_fingerprint(config.model.path),
        dtype=config.model.dtype,
        engine=engine,
        machine=machine_identity(config),
        settings=f"temperature {config.sampling.temperature:g}, max_new_tokens {config.sampling.max_new_tokens}",
        context=context_bucket(context_tokens),
    )


def cache_dir_for(model_path: str, cache_root: str | os.PathLike[str] | None = None) -> Path | None:
    """Where profiles of ``model_path`` are cached, or None for no cache.

    ``$PRIME_RL_NOISE_CACHE`` names the folder outright (``off``: no cache; the test suite points it
    at a temporary folder). Otherwise: ``<model_dir>/noise-profiles`` for a directory prime_rl
    converted (it has a provenance record), else ``<cache_root>/noise-profiles`` (default: the rule
    of :func:`prime_rl.launch.model_cache.default_cache_dir`). None as well when ``model_path`` is
    not a local directory (a hub id: no file to hash).
    """
    override = os.environ.get(ENV_VAR, "")
    directory = Path(model_path).expanduser()
    if override == "off" or not directory.is_dir():
        return None
    if override:
        return Path(override).expanduser()
    if (directory / PROVENANCE).is_file():
        return directory / CACHE_DIRNAME
    if cache_root is None:
        env = os.environ.get("PRIME_RL_CACHE")
        base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
        cache_root = Path(env).expanduser() if env else Path(base).expanduser() / "prime_rl"
    return Path(cache_root) / CACHE_DIRNAME


def _read_entry(path: Path, key: CalibrationKey, tokens: int) -> toploc.NoiseProfile | None:
    """The profile in ``path`` if it is a complete entry for ``key`` measured with >= ``tokens`` asked for."""
    if not path.is_file():
        return None
    try:
        data = json.loads(path.read_text())
        if data.get("format") != FORMAT:
            raise ValueError(f"format {data.get('format')!r}")
        if data.get("key") != dataclasses.asdict(key):
            log.warning("noise profile cache %s belongs to another key; measuring again", path)
            return None
        profile = toploc.NoiseProfile.from_json(json.dumps(data["profile"]))
    except (OSError, ValueError, KeyError, TypeError, AttributeError, toploc.EvidenceError) as error:
        log.warning("ignoring the unreadable noise profile cache %s (%s); measuring again", path, error)
        return None
    measured = data.get("calibration_tokens")
    if not isinstance(measured, int) or measured < tokens:
        log.info(
            "cached noise profile %s was measured for %s tokens, %d asked for; measuring again",
            path,
            measured,
            tokens,
        )
        return None
    return profile


CONTEXT_BUCKET_MAX = 1 << 20
"""The largest context bucket a lookup climbs to (tokens)."""


def covering_keys(key: CalibrationKey) -> list[CalibrationKey]:
    """``key``, then the same key with every larger context bucket up to :data:`CONTEXT_BUCKET_MAX`:
    a profile measured on longer contexts covers shorter ones (honest rounding noise does not shrink
    as contexts grow, so its bounds are at least as wide as a shorter context's own)."""
    keys = [key]
    if not key.context.startswith("<= "):
        return keys
    bucket = int(key.context.split()[1]) * 2
    while bucket <= CONTEXT_BUCKET_MAX:
        keys.append(dataclasses.replace(key, context=f"<= {bucket} tokens"))
        bucket *= 2
    return keys


def lookup(cache_dir: Path | None, key: CalibrationKey, tokens: int) -> toploc.NoiseProfile | None:
    """The cached profile for ``key`` (or, failing that, for the smallest larger context bucket:
    :func:`covering_keys`) measured with >= ``tokens`` asked for, or None (nothing measured)."""
    if cache_dir is None:
        return None
    for candidate in covering_keys(key):
        path = cache_dir / f"noise-{candidate.digest()}.json"
        if path.is_file():
            profile = _read_entry(path, candidate, tokens)
            if profile is not None:
                if candidate != key:
                    log.info("cached noise profile of longer contexts (%s) covers this run's (%s)", candidate.context, key.context)
                return profile
    return None


def cached_profile(
    cache_dir: Path | None,
    key: CalibrationKey,
    tokens: int,
    measure: Callable[[], toploc.NoiseProfile],
    *,
    refresh: bool = False,
) -> toploc.NoiseProfile:
    """The cached profile for ``key`` (measured with >= ``tokens`` asked for), else ``measure()`` stored.

    ``cache_dir=None`` measures without caching; ``refresh`` measures and replaces the entry. A
    cache that cannot be written is reported and the measured profile returned all the same.
    """
    if cache_dir is None:
        return measure()
    path = cache_dir / f"noise-{key.digest()}.json"
    if not refresh:
        cached = lookup(cache_dir, key, tokens)
        if cached is not None:
            log.info(
                "honest noise profile from the cache: %s (validator.recalibrate=true measures again)", path
            )
            return cached
    profile = measure()
    entry = {
        "format": FORMAT,
        "key": dataclasses.asdict(key),
        "calibration_tokens": tokens,
        "profile": json.loads(profile.to_json()),
    }
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        write_atomic(path, json.dumps(entry, indent=1) + "\n")
        log.info("honest noise profile cached in %s", path)
    except OSError as error:
        log.warning("could not cache the noise profile in %s: %s", path, error)
    return profile
