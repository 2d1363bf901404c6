"""The validator's checks: one verdict per submitted sample, never trusting the worker.

Input is a :class:`prime_rl.api.protocol.PendingBatch` (structurally valid: the orchestrator already
rejected bad JSON, types and base64). Checks run cheapest first; a sample's verdict carries the
first failure as its :class:`Reason`. A lease is accepted whole or not at all: once any sample
fails, every other sample of the batch is rejected too (``lease_rejected``), and when a failure is
found by steps 1-2, which need no model, the batch costs no prefill at all (``structure.py``).

1. lease and version: the batch answers a lease whose task ids, recomputed with
   ``assignment.task_ids`` under the run's assignment key, are the lease's (a mismatch on a lease
   the orchestrator issued means this validator holds another key: ``AssignmentKeyMismatch``);
   the batch answers every task of its lease with all ``group_size`` completions
   (``incomplete_lease``, ``group_incomplete``); the policy version is
   ``>= step - async_level`` of the lease (``stale_policy``) and not newer than the newest
   committed version (``future_policy``; default: the lease step)
   (``future_policy``) and available (``unknown_policy``);
2. per sample: the task belongs to the lease (``not_assigned``); prompt tokens equal the tokenised
   task prompt (``wrong_prompt``); temperature is the run's (``wrong_sampling_params``); the seed
   is ``assignment.sampling_seed`` of the lease (``bad_seed``); token ids are in the vocabulary and
   the length within ``max_new_tokens`` (``malformed``); the completion ends as generation ends
   (``bad_termination``); the proofs parse and are as many as the tokens need (``malformed_proof``);
3. one prefill of prompt + completion with the claimed policy version: toploc proofs of the final
   hidden states (``malformed_proof`` / ``toploc_mismatch``), the seeded sampler re-drawn from the
   recomputed logits (``sampling_mismatch``), the inference log-probs (``logprobs_mismatch``);
4. the reward recomputed with ``verifiers`` (``reward_mismatch`` if the claim differs);
5. groups: all ``group_size`` completions of a task present once (``group_incomplete``); a group
   with a rejected member is rejected whole (``group_rejected``), because its advantages depend on
   every member; advantages recomputed with ``grpo.group_zscore`` from the recomputed rewards
   (``advantage_mismatch``).

Accepted verdicts carry the recomputed reward, advantage and per-token log-probs (from the
prefill); the trainer uses those only.
"""

from __future__ import annotations

import enum
import math
from collections import defaultdict
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

import torch

import grpo
import toploc
from prime_rl.api import assignment
from prime_rl.api.fields import MAX_DETAIL_CHARS
from prime_rl.api.protocol import PendingBatch, RolloutSample, Verdict
from prime_rl.inference.backend import (
    GenerationBackend,
    GenerationError,
    proof_topk,
    token_logprobs,
    verify_proofs,
)
from prime_rl.validator.evidence import sampling_margins, sampling_problem
from prime_rl.validator.structure import (
    AssignmentKeyMismatch,
    coverage_problems,
    lease_problem,
    proof_problem,
    termination_problem,
)
from prime_rl.validator.tolerances import SamplingRule
from toploc import Observations

Observer = Callable[[int, Observations], None]
"""Receives (sample index, evidence statistics) of each prefilled sample; see ``validator.evidence``."""


class Reason(enum.StrEnum):
    """Why a sample was accepted or rejected (the ``reason`` of a verdict; codes as in API.md)."""

    ACCEPTED = "ok"
    MALFORMED = "malformed"
    BANNED_WORKER = "banned_worker"
    UNKNOWN_POLICY = "unknown_policy"
    STALE_POLICY = "stale_policy"
    FUTURE_POLICY = "future_policy"
    UNASSIGNED_TASK = "not_assigned"
    PROMPT_MISMATCH = "wrong_prompt"
    SAMPLING_PARAMS_MISMATCH = "wrong_sampling_params"
    SEED_MISMATCH = "bad_seed"
    BAD_TERMINATION = "bad_termination"
    MALFORMED_PROOF = "malformed_proof"
    PROOF_FAILED = "toploc_mismatch"
    SAMPLING_FAILED = "sampling_mismatch"
    LOGPROBS_MISMATCH = "logprobs_mismatch"
    REWARD_MISMATCH = "reward_mismatch"
    GROUP_INCOMPLETE = "group_incomplete"
    INCOMPLETE_LEASE = "incomplete_lease"
    GROUP_REJECTED = "group_rejected"
    LEASE_REJECTED = "lease_rejected"
    ADVANTAGE_MISMATCH = "advantage_mismatch"
    INTERNAL_ERROR = "internal_error"


class RetryLater(Exception):
    """Raised by ``backend_for`` when a version cannot be loaded *now*; ``validate_batch`` re-raises it."""


class TaskScorer(Protocol):
    """The run's task set as workers and the validator see it (identical to the orchestrator's)."""

    @property
    def num_tasks(self) -> int: ...

    def prompt_tokens(self, task_id: int) -> Sequence[int]:
        """The token ids a worker must feed for this task (template applied, tokenised)."""
        ...

    def score(self, task_id: int, completion: str, num_tokens: int) -> float:
        """The reward of ``completion`` (``num_tokens`` tokens) for this task, computed with ``verifiers``."""
        ...


@dataclass(frozen=True)
class Checks:
    """Parameters of the checks (run settings plus tolerances).

    ``logprob_atol``: max mean |claimed - recomputed| inference log-prob of a sample (drift between
    a KV-cache decode and a prefill is ~1e-6 in fp32, ~1e-2 in bf16);
    ``reward_atol``/``advantage_atol``: absolute tolerances on the claims;
    ``sampling_tolerance``: logit margin by which a claimed token may fall short of the sampler's
    choice (numeric drift; toploc's default 0.25); ``sampling_max_mismatch_fraction``: share of
    tokens allowed beyond it; ``thresholds``: toploc's proof thresholds; ``assignment_key``: the
    run's key (``api/secrets.py``); ``hidden_size``: the model's, which fixes the proof size.
    """

    assignment_key: bytes = b""
    hidden_size: int = 128
    prompts_per_batch: int = 4
    async_level: int = 2
    group_size: int = 8
    temperature: float = 1.0
    max_new_tokens: int = 16
    stop: tuple[str, ...] = ()
    vocab_size: int = 2**31
    eos_token_ids: frozenset[int] = frozenset()
    logprob_atol: float = 0.05
    reward_atol: float = 1e-6
    advantage_atol: float = 1e-4
    sampling_tolerance: float = 0.25
    sampling_max_mismatch_fraction: float = 0.0
    thresholds: Any = field(default_factory=lambda: toploc.Thresholds())
    sampling_rule: SamplingRule | None = None
    """The per-precision sampling rule (``tolerances.for_precision``); None: the two fields above."""


@dataclass
class _Pending:
    index: int
    sample: RolloutSample
    reason: Reason = Reason.ACCEPTED
    detail: str = ""
    reward: float | None = None
    proofs: bytes = b""
    logprobs: tuple[float, ...] = ()

    def reject(self, reason: Reason, detail: str) -> None:
        if self.reason is Reason.ACCEPTED:
            self.reason, self.detail = reason, detail

    @property
    def alive(self) -> bool:
        return self.reason is Reason.ACCEPTED


def validate_batch(
    batch: PendingBatch,
    *,
    tasks: TaskScorer,
    backend_for: Callable[[int], GenerationBackend | None],
    decode: Callable[[Sequence[int]], str],
    checks: Checks,
    newest_version: int | None = None,
    observe: Observer | None = None,
) -> list[Verdict]:
    """Verdicts for every sample of one batch, in submission order; never raises on hostile content.

    ``backend_for(version)`` returns a backend holding that policy version (None: unavailable);
    ``newest_version`` is the newest committed policy version (None: the lease's step). A worker may
    answer a step-``s`` lease with a newer version committed meanwhile; that is fresher, not wrong.
    ``observe(sample_index, observations)`` receives the per-worker evidence statistics of every
    sample whose proofs passed (``validator.evidence``), in submission order.
    """
    pending = [_Pending(i, s) for i, s in enumerate(batch.samples)]
    try:
        _batch_checks(batch, pending, tasks, checks, newest_version)
        for p in pending:
            if p.alive:
                _sample_checks(batch, p, tasks, decode, checks)
        _reject_rest(pending)  # a structural failure anywhere: the batch costs no prefill
        if any(p.alive for p in pending):
            backend = backend_for(batch.policy_version)
            if backend is None:
                for p in pending:
                    p.reject(Reason.UNKNOWN_POLICY, f"policy version {batch.policy_version} is not available")
            else:
                _model_checks(pending, backend, checks, observe)
        _reward_checks(pending, tasks, decode, checks)
        advantages = _group_checks(pending, checks)
        _reject_rest(pending)
    except (RetryLater, AssignmentKeyMismatch):
        raise
    except Exception as exc:  # a validator bug must reject, not crash the process
        return [_verdict(p.index, Reason.INTERNAL_ERROR, f"{exc!r:.300}") for p in pending]
    return [
        _verdict(p.index, p.reason, p.detail, p.reward, advantages.get(p.index), p.logprobs) for p in pending
    ]


def _verdict(
    index: int,
    reason: Reason,
    detail: str,
    reward: float | None = None,
    advantage: float | None = None,
    logprobs: Sequence[float] = (),
) -> Verdict:
    """The wire verdict (reward/advantage 0 where the checks stopped before computing them; the
    recomputed log-probs only when accepted: they are what the trainer learns from)."""
    accepted = reason is Reason.ACCEPTED
    return Verdict(
        sample_index=index,
        accepted=accepted,
        reason=str(reason),
        detail=detail[:MAX_DETAIL_CHARS],
        reward=float(reward) if reward is not None else 0.0,
        advantage=float(advantage) if advantage is not None else 0.0,
        logprobs=list(logprobs) if accepted else [],
    )


def _reject_rest(pending: list[_Pending]) -> None:
    """A lease is accepted whole or not at all: once one sample fails, reject the others too, so a
    worker cannot drop the groups it did badly on by answering them wrongly on purpose."""
    failed = next((p for p in pending if not p.alive), None)
    if failed is not None:
        for p in pending:
            p.reject(Reason.LEASE_REJECTED, f"sample {failed.index} of the batch was rejected: {failed.reason}")


def _batch_checks(
    batch: PendingBatch, pending: list[_Pending], tasks: TaskScorer, checks: Checks, newest_version: int | None
) -> None:
    reference = batch.step
    newest = max(batch.step, newest_version) if newest_version is not None else batch.step
    version = batch.policy_version
    if version < reference - checks.async_level:
        why = f"policy {version} < step {reference} - async_level {checks.async_level}"
        for p in pending:
            p.reject(Reason.STALE_POLICY, why)
    if version > newest:
        for p in pending:
            p.reject(Reason.FUTURE_POLICY, f"policy {version} is newer than the newest version {newest}")
    problem = lease_problem(
        batch, key=checks.assignment_key, num_tasks=tasks.num_tasks, prompts_per_batch=checks.prompts_per_batch
    )
    if problem is not None:
        for p in pending:
            p.reject(Reason.UNASSIGNED_TASK, problem)
        return
    assert batch.lease is not None
    samples = [(p.sample.task_id, p.sample.group_index) for p in pending]
    for p, found in zip(pending, coverage_problems(samples, batch.lease.task_ids, checks.group_size), strict=True):
        if found is not None:
            p.reject(Reason(found[0]), found[1])


def _sample_checks(
    batch: PendingBatch, p: _Pending, tasks: TaskScorer, decode: Callable[[Sequence[int]], str], checks: Checks
) -> None:
    s = p.sample
    if tuple(tasks.prompt_tokens(s.task_id)) != tuple(s.prompt_tokens):
        p.reject(Reason.PROMPT_MISMATCH, "prompt tokens differ from the task's prompt")
    if max(s.prompt_tokens + s.completion_tokens) >= checks.vocab_size:
        p.reject(Reason.MALFORMED, f"token id >= vocabulary size {checks.vocab_size}")
    if len(s.completion_tokens) > checks.max_new_tokens or s.group_index >= checks.group_size:
        p.reject(Reason.MALFORMED, f"completion longer than {checks.max_new_tokens} or group index too large")
    if not math.isclose(s.temperature, checks.temperature, rel_tol=0, abs_tol=1e-9):
        p.reject(Reason.SAMPLING_PARAMS_MISMATCH, f"temperature {s.temperature} != {checks.temperature}")
    expected_seed = assignment.sampling_seed(
        key=checks.assignment_key,
        worker_id=batch.worker_id,
        step=batch.step,
        batch_index=batch.batch_index,
        task_id=s.task_id,
        group_index=s.group_index,
    )
    if s.sampling_seed != expected_seed:
        p.reject(Reason.SEED_MISMATCH, f"seed {s.sampling_seed} != assigned {expected_seed}")
    if p.alive:
        why = termination_problem(
            s.completion_tokens,
            decode=decode,
            eos_token_ids=checks.eos_token_ids,
            stop=checks.stop,
            max_new_tokens=checks.max_new_tokens,
        )
        if why is not None:
            p.reject(Reason.BAD_TERMINATION, why)
    p.proofs = s.proofs
    why = proof_problem(p.proofs, len(s.completion_tokens), proof_topk(checks.hidden_size))
    if why is not None:
        p.reject(Reason.MALFORMED_PROOF, why)


def _model_checks(
    pending: list[_Pending], backend: GenerationBackend, checks: Checks, observe: Observer | None
) -> None:
    """One prefill for every live sample, then the proof, sampling and log-prob checks."""
    alive = [p for p in pending if p.alive]
    try:
        prefills = backend.prefill(
            [p.sample.prompt_tokens for p in alive], [p.sample.completion_tokens for p in alive]
        )
    except (GenerationError, ValueError, IndexError, RuntimeError) as exc:
        for p in alive:
            p.reject(Reason.MALFORMED, f"prefill failed: {exc}")
        return
    for p, pre in zip(alive, prefills, strict=True):
        sample = p.sample
        try:
            results = verify_proofs(pre.hidden, p.proofs)
        except (toploc.ProofFormatError, toploc.ActivationError, ValueError) as exc:
            p.reject(Reason.MALFORMED_PROOF, f"{exc}")
            continue
        verdicts = [checks.thresholds.check(r) for r in results]
        failed = [v for v in verdicts if not v.passed]
        if failed:
            p.reject(
                Reason.PROOF_FAILED, f"{len(failed)}/{len(verdicts)} proof chunks fail: {failed[0].reason}"
            )
            continue
        tokens = torch.tensor(sample.completion_tokens, dtype=torch.long)
        margins = sampling_margins(pre.logits, tokens, sample.sampling_seed, sample.temperature)
        recomputed = token_logprobs(pre.logits, tokens, sample.temperature)
        if observe is not None:  # evidence from every sample whose proofs pass, accepted or not
            observe(p.index, Observations.from_checks(margins, sample.inference_logprobs, recomputed, results))
        why = (
            checks.sampling_rule.problem(margins)
            if checks.sampling_rule is not None
            else sampling_problem(
                margins,
                tolerance=checks.sampling_tolerance,
                max_mismatch_fraction=checks.sampling_max_mismatch_fraction,
            )
        )
        if why is not None:
            p.reject(Reason.SAMPLING_FAILED, why)
            continue
        p.logprobs = tuple(float(x) for x in recomputed.tolist())  # what the trainer gets, never the claim
        gap = (recomputed - torch.tensor(sample.inference_logprobs)).abs().mean().item()
        if not gap <= checks.logprob_atol:
            p.reject(Reason.LOGPROBS_MISMATCH, f"mean |log-prob error| {gap:.4g} > {checks.logprob_atol}")


def _reward_checks(
    pending: list[_Pending],
    tasks: TaskScorer,
    decode: Callable[[Sequence[int]], str],
    checks: Checks,
) -> None:
    for p in pending:
        if not p.alive:
            continue
        try:
            p.reward = float(
                tasks.score(
                    p.sample.task_id, decode(p.sample.completion_tokens), len(p.sample.completion_tokens)
                )
            )
        except Exception as exc:  # a verifier bug must not take the validator down
            p.reject(Reason.INTERNAL_ERROR, f"reward computation failed: {exc!r:.200}")
            continue
        if not abs(p.reward - p.sample.reward) <= checks.reward_atol:
            p.reject(
                Reason.REWARD_MISMATCH, f"claimed reward {p.sample.reward:.6g}, recomputed {p.reward:.6g}"
            )


def _group_checks(pending: list[_Pending], checks: Checks) -> dict[int, float]:
    """Reject incomplete or contaminated groups; recomputed advantages by sample index."""
    groups: dict[int, list[_Pending]] = defaultdict(list)
    for p in pending:
        groups[p.sample.task_id].append(p)
    advantages: dict[int, float] = {}
    for task_id, members in groups.items():
        indices = sorted(m.sample.group_index for m in members)
        if indices != list(range(checks.group_size)):
            for m in members:
                m.reject(Reason.GROUP_INCOMPLETE, f"task {task_id}: group indices {indices[:16]}")
            continue
        bad = next((m for m in members if not m.alive), None)
        if bad is not None:
            for m in members:
                m.reject(Reason.GROUP_REJECTED, f"sample {bad.index} of the group was rejected: {bad.reason}")
            continue
        members.sort(key=lambda m: m.sample.group_index)
        rewards = torch.tensor([m.reward for m in members], dtype=torch.float64)
        recomputed = [float(a) for a in grpo.group_zscore(rewards, checks.group_size).tolist()]
        wrong = {
            m.index
            for m, a in zip(members, recomputed, strict=True)
            if not abs(m.sample.advantage - a) <= checks.advantage_atol
        }
        for m, a in zip(members, recomputed, strict=True):
            advantages[m.index] = a
            if wrong:
                reason = Reason.ADVANTAGE_MISMATCH if m.index in wrong else Reason.GROUP_REJECTED
                m.reject(reason, f"claimed advantage {m.sample.advantage:.6g}, recomputed {a:.6g}")
    return advantages
