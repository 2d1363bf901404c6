"""Every reason a validator accepts or rejects a sample with (a verdict's ``reason``; the codes are API.md's).

``checks.py`` (one sample's rules), ``verdicts.py`` (the batch around it), ``episodes.py`` and
``spans.py`` each report their failures with one of these; ``checks`` re-exports it.
"""

from __future__ import annotations

import enum

__all__ = ["Reason"]


class Reason(enum.StrEnum):
    """Why a sample was accepted or rejected (the ``reason`` of a verdict; codes as in API.md)."""

    ACCEPTED = "ok"
    MALFORMED = "malformed"
    BANNED_WORKER = "banned_worker"
    UNKNOWN_POLICY = "unknown_policy"
    STALE_POLICY = "stale_policy"
    FUTURE_POLICY = "future_policy"
    WRONG_POLICY_VERSION = "wrong_policy_version"  # inside the async window, but not the lease's version
    UNASSIGNED_TASK = "not_assigned"
    PROMPT_MISMATCH = "wrong_prompt"
    SAMPLING_PARAMS_MISMATCH = "wrong_sampling_params"
    SEED_MISMATCH = "bad_seed"
    BAD_TERMINATION = "bad_termination"
    REPEATED_TOKEN = "repeated_token"
    MALFORMED_PROOF = "malformed_proof"
    PROOF_FAILED = "toploc_mismatch"
    SAMPLING_FAILED = "sampling_mismatch"
    LOGPROBS_MISMATCH = "logprobs_mismatch"
    REWARD_MISMATCH = "reward_mismatch"
    REWARD_UNVERIFIABLE = "reward_unverifiable"  # not in the failure-rate ban (verdicts.ban_counts)
    GROUP_INCOMPLETE = "group_incomplete"
    INCOMPLETE_LEASE = "incomplete_lease"
    GROUP_REJECTED = "group_rejected"
    LEASE_REJECTED = "lease_rejected"
    ADVANTAGE_MISMATCH = "advantage_mismatch"
    INTERNAL_ERROR = "internal_error"
    # multi-turn episodes (validator/episodes.py)
    TOOL_OUTPUT_MISMATCH = "tool_output_mismatch"
    TURN_DROPPED = "turn_dropped"
    TURN_REORDERED = "turn_reordered"
    EPISODE_TRUNCATED = "episode_truncated"
    MODEL_TOKENS_AS_ENV = "model_tokens_as_env"
    ENV_TOKENS_AS_MODEL = "env_tokens_as_model"
    TOOL_NOT_REPLAYABLE = "tool_not_replayable"
    TOOL_UNVERIFIABLE = "tool_unverifiable"  # not in the failure-rate ban (protocol.UNVERIFIABLE_REASONS)
    # in-flight weight updates: samples of several versions (validator/spans.py)
    SPAN_MALFORMED = "span_malformed"
    SPAN_VERSION_FUTURE = "span_version_future"
    SPAN_NOT_LEASE_WIDE = "span_not_lease_wide"
    SPAN_BOUNDARY_MISMATCH = "span_boundary_mismatch"
    SPAN_VERSION_FORGED = "span_version_forged"
    SPAN_UNANNOUNCED = "span_unannounced"
    SPAN_MISSING_MANDATORY = "span_missing_mandatory"
