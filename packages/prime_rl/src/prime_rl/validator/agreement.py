"""Agreed tolerances: one honest-noise profile per run, and each validator's check of its own noise.

Validators on different machines must judge a sample by the same rules, or a worker's lease would be
accepted by one and rejected by another. The rules (per-sample tolerances, ``tolerances.py``; the
evidence tests, ``toploc.evidence``) all derive from the honest-noise profile, so the run has one:

1. At start a validator asks the orchestrator for the run's profile (``GET /validator/noise-profile``).
2. If there is none yet, it obtains its own (``validator.noise_profile``, the run directory's copy,
   the calibration cache, or a measurement: ``noise.py``) and publishes it
   (``POST /validator/noise-profile/publish``). The first publication wins; a validator that loses
   the race gets the winner's profile back and goes on as in 3.
3. The run's profile must be of the same model (fingerprint) and dtype, else the validator refuses
   to judge (:class:`NoiseMismatch`, exit code 2). If it was measured under the validator's own
   calibration key (same model, dtype, engine, machine, threads, sampling settings, context bucket) the
   validator computes like the measurement and judges by it. Otherwise it checks its own honest
   noise against it (:func:`self_check`): its own cached profile if it has one, else a short
   measurement of ``validator.self_check_tokens`` tokens. Noise the run's profile does not cover
   (more honest exceedances at some threshold than the profile's rate bound allows, beyond a
   binomial tail of ``SELF_CHECK_FALSE_REFUSAL``) means this validator would reject honest work
   that the others accept: it refuses to judge, with the thresholds in its message.

Noise *below* the profile's passes: such a validator judges by the run's wider rules, exactly as
the others do (a cheater gains nothing from which validator judges it).

Pitfall: the self-check measures the validator's own decode against its own prefill. A worker's
decode on other hardware against this validator's prefill is measured by neither; workers on
other machines are covered only by profiles measured there and merged (``prime-rl calibrate-noise``).
Tokens of one sample are correlated, so the binomial tail understates how often an honest
validator exceeds a bound; the profile's safety factor (2x on every rate bound) covers that.
"""

from __future__ import annotations

import logging
import socket
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import toploc
from prime_rl.api.client import ClientRequestError, OrchestratorClient
from prime_rl.api.protocol import NoiseProfileRecord
from prime_rl.validator import noise, noise_cache
from prime_rl.validator.model_fingerprint import model_fingerprint
from prime_rl.validator.token_rule import binomial_allowance

if TYPE_CHECKING:
    from prime_rl.config import RunConfig
    from prime_rl.inference.backend import HFBackend

__all__ = [
    "SELF_CHECK_FALSE_REFUSAL",
    "NoiseMismatch",
    "SelfCheck",
    "agree",
    "self_check",
    "validator_profile",
]

log = logging.getLogger(__name__)

SELF_CHECK_FALSE_REFUSAL = 1e-6
"""Bound on P(an honest validator of the run's profile refuses), split over every checked threshold."""


class NoiseMismatch(RuntimeError):
    """This validator's honest noise (or model, or dtype) is out of line with the run's profile."""


@dataclass(frozen=True)
class SelfCheck:
    """What a validator's own noise showed against the run's profile.

    Attributes:
        tokens: the validator's own honest tokens compared.
        problems: one line per threshold where its exceedances pass the allowance ('' if none).
    """

    tokens: int
    problems: tuple[str, ...]

    @property
    def ok(self) -> bool:
        return not self.problems


def self_check(
    run: toploc.NoiseProfile, own: toploc.NoiseProfile, *, false_refusal: float = SELF_CHECK_FALSE_REFUSAL
) -> SelfCheck:
    """Whether ``own`` honest noise (its measured exceedance counts) stays within ``run``'s rate bounds.

    For each statistic and each threshold t of ``own``'s grid with n observations and k above t:
    ``k <= binomial_allowance(n, p0(t), false_refusal / thresholds)`` with p0 the run's bound at t
    (``StatisticNoise.bound_at``; thresholds with p0 >= 1 bound nothing and are skipped). A profile
    without exceedance counts (a merged one) cannot be checked: ``ValueError``.
    """
    checks = [(s, t, i) for s in own.statistics for i, t in enumerate(s.thresholds)]
    share = false_refusal / max(1, len(checks))
    problems = []
    for statistic, threshold, index in checks:
        if not statistic.exceedances:
            raise ValueError(f"{statistic.name}: this validator's own profile keeps no exceedance counts")
        bound = run.statistic(statistic.name).bound_at(threshold)
        if bound >= 1.0 or statistic.observations == 0:
            continue
        seen = statistic.exceedances[index]
        allowed = binomial_allowance(statistic.observations, bound, share)
        if seen > allowed:
            problems.append(
                f"{statistic.name} > {threshold:g}: {seen} of this validator's {statistic.observations} honest "
                f"values, where the run's profile allows at most {allowed} (rate bound {bound:.2g})"
            )
    return SelfCheck(tokens=own.statistic("sampling_margin").observations, problems=tuple(problems))


def _run_profile(client: OrchestratorClient) -> NoiseProfileRecord | bool | None:
    """The run's record, None if none was published, False if the orchestrator does not keep one."""
    try:
        return client.noise_profile()
    except ClientRequestError as error:
        if error.status == 404 and error.error == "not_found":
            return False
        raise


def agree(
    client: OrchestratorClient,
    *,
    model: str,
    dtype: str,
    key: str,
    tokens: int,
    own: Callable[[], toploc.NoiseProfile],
    own_cached: Callable[[], toploc.NoiseProfile | None],
    measure_short: Callable[[], toploc.NoiseProfile],
    name: str = "validator",
) -> toploc.NoiseProfile:
    """The profile this validator judges by: the run's (module docstring, steps 1-3).

    ``model``, ``dtype``, ``key``: this validator's model fingerprint, dtype and calibration-key
    digest; ``own()``: its own profile, measured if need be (published when the run has none);
    ``own_cached()``: its own profile if it can be had without measuring; ``measure_short()``: a
    short measurement of its own honest noise. Raises :class:`NoiseMismatch` when it must not judge.
    An orchestrator that keeps no run profile (an older one: 404) leaves the validator on ``own()``.
    """
    record = _run_profile(client)
    if record is False:
        log.warning("the orchestrator keeps no run noise profile (older version): judging by this validator's own")
        return own()
    if record is None:
        profile = own()
        mine = NoiseProfileRecord(
            profile=profile.to_json(),
            model=model,
            dtype=dtype,
            key=key,
            calibration_tokens=tokens,
            published_by=f"{name}@{socket.gethostname()}"[:128],
        )
        record = client.publish_noise_profile(mine)
        if record == mine:
            log.info("published this validator's noise profile as the run's (key %s)", key)
            return profile
        log.info("another validator published the run's noise profile first (%s)", record.published_by)
    assert isinstance(record, NoiseProfileRecord)
    if record.model != model or record.dtype != dtype:
        raise NoiseMismatch(
            f"the run's noise profile was measured on another model or dtype (model {record.model[:16]}, "
            f"dtype {record.dtype}; this validator: model {model[:16]}, dtype {dtype}): start it with the "
            "run's model.path and model.dtype"
        )
    try:
        run = toploc.NoiseProfile.from_json(record.profile)
    except toploc.EvidenceError as error:
        raise NoiseMismatch(f"the run's noise profile is unreadable: {error}") from error
    if record.key == key:
        log.info("the run's noise profile was measured under this validator's calibration key: judging by it")
        return run
    mine_cached = own_cached()
    if mine_cached is not None and not all(s.exceedances for s in mine_cached.statistics):
        mine_cached = None  # a merged profile keeps no counts to check
    ours = mine_cached if mine_cached is not None else measure_short()
    check = self_check(run, ours)
    source = "cached profile" if mine_cached is not None else "short measurement"
    if not check.ok:
        raise NoiseMismatch(
            f"this validator's honest noise is out of line with the run's noise profile (published by "
            f"{record.published_by or 'another validator'}; this validator's {source}, {check.tokens} tokens): "
            + "; ".join(check.problems[:4])
            + ". It would reject honest work the run's other validators accept, so it refuses to judge: run it "
            "on hardware, engine and dtype like the run's, or measure this machine with `prime-rl calibrate-noise` "
            "and start a run with the merged profile"
        )
    log.info(
        "own honest noise within the run's profile (%s, %d tokens): judging by the run's profile", source, check.tokens
    )
    return run



def validator_profile(
    config: RunConfig, client: OrchestratorClient, backend: HFBackend, tasks: Any, name: str = "validator"
) -> toploc.NoiseProfile:
    """The profile a validator process judges by (:func:`agree` with its own key, cache and backend),
    saved in ``<run_dir>/validator/noise-profile.json`` for reading. ``tasks``: the run's
    ``RunTasks`` (its prompts are the calibration's and set the context bucket)."""
    started = time.monotonic()
    cfg = config.validator
    count = min(noise.calibration_prompt_count(cfg.calibration_tokens), tasks.num_tasks)
    prompts = [tuple(tasks.prompt_tokens(i)) for i in range(count)]
    context = noise.context_tokens(config, prompts)
    model_path = Path(config.model.path)
    model = model_fingerprint(model_path) if model_path.is_dir() else f"hub:{config.model.path}"
    key = noise_cache.key_for_run(config, config.workers.backend, model, context_tokens=context)

    def own_cached() -> toploc.NoiseProfile | None:
        for decode in dict.fromkeys(("hf", config.workers.backend)):
            cached = noise.cached_only(config, cfg.self_check_tokens, decode, context=context)
            if cached is not None:
                return cached
        return None

    def measure_short() -> toploc.NoiseProfile:
        log.info("checking this validator's honest noise against the run's profile (%d tokens)", cfg.self_check_tokens)
        return noise.calibrate_cached(
            config, cfg.self_check_tokens, "hf",
            lambda: noise.calibrate(config, backend, prompts, cfg.self_check_tokens), context=context,
        )  # fmt: skip

    profile = agree(
        client, model=model, dtype=config.model.dtype, key=key.digest(), tokens=cfg.calibration_tokens,
        own=lambda: own_profile(config, backend, context), own_cached=own_cached, measure_short=measure_short,
        name=name,
    )  # fmt: skip
    path = Path(config.run_dir) / "validator" / "noise-profile.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    profile.save(path)
    log.info("honest noise profile ready in %.1fs: %s", time.monotonic() - started, path)
    return profile


def own_profile(config: RunConfig, backend: HFBackend, context: int) -> toploc.NoiseProfile:
    """This validator's own profile: ``validator.noise_profile`` if set, else the run directory's
    copy (a restart judges on with the tests its journalled evidence was built on), else the cached
    profile of the workers' engine, else cached or measured now with the HF decode."""
    cfg = config.validator
    if cfg.noise_profile:
        return toploc.NoiseProfile.load(cfg.noise_profile)
    path = Path(config.run_dir) / "validator" / "noise-profile.json"
    if path.exists():
        return toploc.NoiseProfile.load(path)
    tokens = cfg.calibration_tokens
    if config.workers.backend != "hf":
        # A profile of the workers' engine measured earlier on this machine (noise_cache.py).
        cached = noise.cached_only(config, tokens, config.workers.backend, context=context)
        if cached is not None:
            return cached
        # An in-process vLLM engine would take this process's threads; `prime-rl run` measures it
        # apart (a calibrate-noise child: launch.supervisor.worker_noise_path), a validator started alone says so.
        log.warning(
            "measuring honest noise with the HF decode only, but workers decode with %r (fp32 vLLM log-prob "
            "gaps run ~2x the HF decode's): run `prime-rl calibrate-noise --workers.backend %s` and set "
            "validator.noise_profile to its file",
            config.workers.backend,
            config.workers.backend,
        )
    return noise.calibrate_cached(
        config,
        tokens,
        "hf",  # this process decodes with HF only (the warning above)
        lambda: noise.calibrate_for_run(config, backend, tokens),
        context=context,
    )
