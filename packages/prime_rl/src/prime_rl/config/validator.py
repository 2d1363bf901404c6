"""``[validator]`` section (light: pydantic only, so non-torch processes can build ``RunConfig`` fast)."""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from prime_rl.config.base import Section


class ValidatorConfig(Section):
    """[validator]: proof/sampling tolerances, banning, polling."""

    exp_mismatches_per_128: float = Field(
        default=38.0, ge=0, description="toploc: allowed exponent mismatches per 128 values."
    )
    max_mant_err_mean: float = Field(
        default=10.0, ge=0, description="toploc: allowed mean mantissa error (bf16 ULPs)."
    )
    max_mant_err_median: float = Field(default=8.0, ge=0, description="toploc: allowed median mantissa error.")
    sign_mismatches_per_128: float = Field(default=8.0, ge=0, description="toploc: allowed sign mismatches per 128.")
    sampling_tolerance: float = Field(
        default=0.25,
        ge=0,
        description="bf16: logit margin a sampled token may fall short by as often as honest noise does (with "
        "evidence: none beyond 3x the profile's largest honest margin). fp32 is exact: any swap beyond 1e-3 "
        "is rejected (validator/tolerances.py).",
    )
    sampling_max_mismatch_fraction: float = Field(
        default=0.0, ge=0, le=1, description="Share of tokens allowed beyond the sampling tolerance."
    )
    logprob_atol: float = Field(
        default=0.05,
        gt=0,
        description="Max mean |claimed - recomputed| inference log-prob (widened to 3x the largest honest "
        "per-token gap of the noise profile when evidence is on).",
    )
    max_repeated_tokens: int = Field(
        default=0,
        ge=0,
        description="Reject a completion that repeats one token on more than this many consecutive positions "
        "(repeated_token); 0 = no limit. A small model's honest samples can loop, so set it above them.",
    )
    reward_atol: float = Field(default=1e-6, ge=0, description="Tolerance on the claimed reward.")
    reward_rescores: int = Field(
        default=4,
        ge=0,
        description="Re-scorings per batch of samples whose reward differs from the claim while the validator's "
        "scoring was limited by the machine (sandbox start, timeouts); 0 = none (reward_unverifiable at once).",
    )
    tool_seconds_per_lease: float = Field(
        default=120.0,
        gt=0,
        description="Seconds of tool runs (episode replays) one lease may cost the validator; a lease past it is "
        "rejected as tool_unverifiable (no ban). Replays run only after every model turn's proofs passed.",
    )
    tool_seconds_per_identity: float = Field(
        default=300.0,
        ge=0,
        allow_inf_nan=False,
        description="Seconds of tool runs one identity may cost the validator per tool_budget_window_s (a bucket; "
        "a lease past it replays no tool: tool_unverifiable, no ban). 0 = no per-identity budget.",
    )
    tool_seconds_per_address: float = Field(
        default=300.0,
        ge=0,
        allow_inf_nan=False,
        description="Seconds of tool runs the identities without accepted samples at one client address (IPv6: "
        "/64) may cost together per tool_budget_window_s; established identities are not charged. 0 = none.",
    )
    tool_budget_window_s: float = Field(
        default=600.0, gt=0, allow_inf_nan=False, description="The period that refills a tool-time bucket."
    )
    advantage_atol: float = Field(default=1e-4, ge=0, description="Tolerance on the claimed advantage.")
    ban_failure_rate: float = Field(
        default=0.5, gt=0, le=1, description="Ban a worker once this share of its samples fails."
    )
    ban_min_samples: int = Field(
        default=16,
        ge=1,
        description="Samples seen before a worker can be banned; a lease rejected before any model check (wrong "
        "tasks, seeds, prompts, version, termination), or any rejected lease of an identity with no accepted "
        "sample yet, counts at least this many rejections, whatever its size.",
    )
    evidence: bool = Field(
        default=True,
        description="Accumulate per-worker evidence (sampling margins, log-prob gaps, proof mismatches) "
        "against measured honest noise and ban at a bounded false-ban rate.",
    )
    noise_profile: str = Field(
        default="",
        description="Honest-noise profile JSON (prime-rl calibrate-noise writes it); '' = measure at start.",
    )
    calibration_tokens: int = Field(
        default=1024, ge=1, description="Tokens decoded to measure honest noise (at start, or by calibrate-noise)."
    )
    self_check_tokens: int = Field(
        default=256,
        ge=1,
        description="Tokens a validator decodes at start to check its own honest noise against the run's profile "
        "when that was measured under another calibration key (another machine, engine or thread count); "
        "noise out of line with it: the validator refuses to judge (exit code 2; validator/agreement.py).",
    )
    count: int = Field(
        default=1,
        ge=0,
        description="Validators `prime-rl run` starts and restarts (0: none here, they join from other machines "
        "with `prime-rl validator`). More than 1 needs an orchestrator that leases pending batches to one "
        "validator each ('validator_leases' in GET /status capabilities); until then run refuses it.",
    )
    recalibrate: bool = Field(
        default=False,
        description="Measure honest noise again even when a cached profile for this (model, dtype, engine, "
        "machine) exists, and replace it (validator/noise_cache.py).",
    )
    false_ban_rate: float = Field(
        default=1e-6, gt=0, lt=1, description="Bound on P(an honest worker is ever banned by evidence)."
    )
    evidence_horizon_samples: int = Field(
        default=1_000_000, ge=1, description="Samples per worker that false_ban_rate covers."
    )
    batches_per_poll: int = Field(default=8, ge=1, le=256, description="Pending batches fetched per poll.")
    validator_id: str = Field(
        default="",
        pattern=r"^[A-Za-z0-9._:@-]{0,64}$",
        description="This validator's name in its batch leases and verdicts (POST /validator/leases); '' = "
        "<host>-<pid>, and <host>-<child name> for the validators `prime-rl run` starts (the same across a "
        "restart, so a restarted validator takes back its predecessor's batches at once). Two validators of one "
        "run must not share it.",
    )
    poll_interval_s: float = Field(default=0.5, gt=0, description="Seconds between polls when nothing is pending.")
    max_batch_size: int = Field(default=64, ge=1, description="Sequences per prefill batch.")
    cache_dir: str = Field(default="", description="Policy cache (default <run_dir>/validator/policies).")
    device: Literal["auto", "cpu", "cuda"] = Field(default="auto", description="Device of the prefill model.")
    num_threads: int = Field(default=1, ge=1, description="torch.set_num_threads for this process.")
    max_batches: int = Field(default=0, ge=0, description="Stop after this many batches (0 = run until killed).")
    emulated_prefill_s_per_token: float = Field(
        default=0.0,
        ge=0,
        description="BENCHMARK EMULATION only, never for a real run (0 = off): every prefill while judging takes at "
        "least this many seconds per prompt + completion token (a sleep after the real prefill), a declared "
        "GPU-like cost that lets K validators share a small machine (validator/emulated_cost.py).",
    )
