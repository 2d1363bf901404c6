"""The validator's per-sample checks: what one submitted sample must pass, never trusting the worker.

The batch around them (lease and version, coverage, whole groups and leases, advantages) is
``verdicts.py``; this module holds every rule one sample is judged by, each returning why it
fails, and the :class:`Reason` each failure is reported with. A sample's verdict carries its
first failure. In order, cheapest first:

1. without a model (:func:`sample_checks`): the prompt tokens equal the tokenised task prompt
   (``wrong_prompt``); token ids are in the vocabulary and the length within ``max_new_tokens``
   (``malformed``); the temperature is the run's (``wrong_sampling_params``); the seed is
   ``assignment.sampling_seed`` of the lease (``bad_seed``); the completion ends as generation
   ends (``bad_termination``); no token repeats on more than ``max_repeated_tokens`` consecutive
   positions (:func:`repetition_problem`: ``repeated_token``); the proofs parse and are as many as the tokens need
   (``malformed_proof``);
2. one prefill of prompt + completion with the claimed policy version (:func:`model_checks`):
   toploc proofs of the final hidden states (``malformed_proof`` / ``toploc_mismatch``), the
   seeded sampler re-drawn from the recomputed logits (``inference/contract.sampling_margins``,
   ``token_rule.sampling_problem``: ``sampling_mismatch``), the inference log-probs
   (``token_rule.logprob_problem``: ``logprobs_mismatch``);
3. the reward recomputed with the run's reward (``rewards.py``: ``reward_mismatch``, or
   ``reward_unverifiable`` where the machine, not the worker, may explain the difference).

Accepted samples carry the recomputed reward and per-token log-probs (from the prefill); the
trainer uses those only. A new check is a rule here, its :class:`Reason`, and, where it has a
setting, a ``[validator]`` field (``Checks.validator`` holds the section, so nothing else changes).
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Protocol

import torch

import toploc
from prime_rl.api import assignment
from prime_rl.api.protocol import PendingBatch, RolloutSample
from prime_rl.api.spans import SpanPlan
from prime_rl.config.validator import ValidatorConfig
from prime_rl.episodes import EpisodeEnv
from prime_rl.inference.backend import GenerationBackend, GenerationError, Prefill, proof_topk
from prime_rl.inference.contract import sampling_margins as sampling_margins
from prime_rl.inference.contract import token_logprobs, verify_proofs
from prime_rl.validator import token_rule
from prime_rl.validator.backend_failures import BackendFailure as BackendFailure
from prime_rl.validator.backend_failures import RetryLater as RetryLater
from prime_rl.validator.backend_failures import backend_failure as backend_failure
from prime_rl.validator.backend_failures import in_chunks
from prime_rl.validator.episodes import MAX_ENV_TOKENS, episode_checks, episode_values, replay_episode
from prime_rl.validator.reasons import Reason as Reason
from prime_rl.validator.structure import proof_problem, repetition_problem, termination_problem
from prime_rl.validator.token_rule import TokenRule
from prime_rl.validator.token_rule import sampling_problem as sampling_problem
from toploc import Observations
from verifiers.envs import Message

if TYPE_CHECKING:
    from prime_rl.config import RunConfig

Observer = Callable[[int, Observations], None]
"""Receives (sample index, evidence statistics) of each prefilled sample; see ``validator.evidence``."""


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
    """What the checks compare a sample against: the run's settings, the model's facts and the
    ``[validator]`` section (tolerances, toploc thresholds), each with its one default in the config.

    ``assignment_key``: the run's key (``api/secrets.py``); ``hidden_size``: the model's, which
    fixes the proof size; ``vocab_size``, ``eos_token_ids``: the model's. Build with
    :meth:`from_config`.
    """

    validator: ValidatorConfig
    assignment_key: bytes
    hidden_size: int
    vocab_size: int
    eos_token_ids: frozenset[int]
    prompts_per_batch: int
    async_level: int
    group_size: int
    temperature: float
    max_new_tokens: int
    stop: tuple[str, ...]
    max_versions_per_sample: int = 4
    """``orchestrator.max_versions_per_sample``: most version spans one sample may have."""

    @classmethod
    def from_config(
        cls,
        config: RunConfig,
        *,
        vocab_size: int,
        eos_token_ids: frozenset[int],
        assignment_key: bytes,
        hidden_size: int,
    ) -> Checks:
        """The checks of the run ``config`` for a model of ``vocab_size`` and ``hidden_size``."""
        return cls(
            validator=config.validator,
            assignment_key=assignment_key,
            hidden_size=hidden_size,
            vocab_size=vocab_size,
            eos_token_ids=eos_token_ids,
            prompts_per_batch=config.orchestrator.prompts_per_batch,
            async_level=config.orchestrator.async_level,
            group_size=config.sampling.group_size,
            temperature=config.sampling.temperature,
            max_new_tokens=config.sampling.max_new_tokens,
            stop=tuple(config.sampling.stop),
            max_versions_per_sample=config.orchestrator.max_versions_per_sample,
        )

    def widened(self, **tolerances: float) -> Checks:
        """These checks with some ``[validator]`` tolerances replaced (e.g. from a noise profile)."""
        return dataclasses.replace(self, validator=self.validator.model_copy(update=tolerances))

    @property
    def thresholds(self) -> toploc.Thresholds:
        """toploc's proof thresholds, as ``[validator]`` sets them."""
        v = self.validator
        return toploc.Thresholds(
            exp_mismatches_per_128=v.exp_mismatches_per_128,
            max_mant_err_mean=v.max_mant_err_mean,
            max_mant_err_median=v.max_mant_err_median,
            sign_mismatches_per_128=v.sign_mismatches_per_128,
        )
    sampling_rule: TokenRule | None = None
    """The per-precision sampling rule (``tolerances.for_precision``); None: ``[validator]``'s
    ``sampling_tolerance`` and ``sampling_max_mismatch_fraction`` as configured."""
    logprob_rule: TokenRule | None = None
    """The per-precision per-token log-prob rule (``tolerances.for_precision``); None: every
    token's ``|claimed - recomputed|`` within ``[validator]``'s ``logprob_atol``."""
    episode_env: EpisodeEnv | None = None
    """The run's episode environment (``episodes.load_episode_env``); None: a single-turn run."""


@dataclass
class Pending:
    """One sample while it is judged: its first failure (``reason``, ``detail``) and what the checks
    recomputed for it."""

    index: int
    sample: RolloutSample
    reason: Reason = Reason.ACCEPTED
    detail: str = ""
    reward: float | None = None
    proofs: bytes = b""
    logprobs: tuple[float, ...] = ()
    transcript: tuple[Message, ...] | None = None
    """An episode's transcript (``validator.episodes``), its reward's input; None: single-turn."""
    claimed_reward: float | None = None
    """A claim below a clean recomputation that was accepted (``rewards.py``, rule 3): the reward the
    worker's advantage claims rest on. None: they rest on ``reward``."""
    beyond_tolerance: int = 0
    """Tokens whose sampling margin lies beyond the sampling tolerance (the rule allowed them): such a
    sample is accepted but never trained on (``orchestrator.release``)."""
    plan: SpanPlan | None = None
    """Its version spans as the model-free span checks read them, with their seeds (``validator/spans.py``)."""

    def reject(self, reason: Reason, detail: str) -> None:
        if self.reason is Reason.ACCEPTED:
            self.reason, self.detail = reason, detail

    @property
    def alive(self) -> bool:
        return self.reason is Reason.ACCEPTED


def sample_checks(
    batch: PendingBatch, p: Pending, tasks: TaskScorer, decode: Callable[[Sequence[int]], str], checks: Checks
) -> None:
    s = p.sample
    if tuple(tasks.prompt_tokens(s.task_id)) != tuple(s.prompt_tokens):
        p.reject(Reason.PROMPT_MISMATCH, "prompt tokens differ from the task's prompt")
    if max(s.prompt_tokens + s.completion_tokens) >= checks.vocab_size:
        p.reject(Reason.MALFORMED, f"token id >= vocabulary size {checks.vocab_size}")
    env = checks.episode_env
    if env is None and s.segments is not None:
        p.reject(Reason.MALFORMED, "episode segments in a single-turn run")
    longest = checks.max_new_tokens if env is None else checks.max_new_tokens * env.max_turns + MAX_ENV_TOKENS * (env.max_turns - 1)
    if len(s.completion_tokens) > longest or s.group_index >= checks.group_size:
        p.reject(Reason.MALFORMED, f"completion longer than {longest} or group index too large")
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
    if p.alive and env is not None:
        _episode_checks(p, env, decode, checks)
        return
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
    why = repetition_problem(s.completion_tokens, limit=checks.validator.max_repeated_tokens)
    if why is not None:
        p.reject(Reason.REPEATED_TOKEN, why)
    p.proofs = s.proofs
    why = proof_problem(p.proofs, len(s.completion_tokens), proof_topk(checks.hidden_size))
    if why is not None:
        p.reject(Reason.MALFORMED_PROOF, why)


def _episode_checks(p: Pending, env: EpisodeEnv, decode: Callable[[Sequence[int]], str], checks: Checks) -> None:
    """An episode's model-free checks (``validator/episodes.py``); no tool runs here."""
    code, detail = episode_checks(
        p.sample, env, decode, eos=checks.eos_token_ids, stop=checks.stop, max_new_tokens=checks.max_new_tokens,
        max_repeated=checks.validator.max_repeated_tokens, hidden_size=checks.hidden_size,
    )  # fmt: skip
    if code:
        p.reject(Reason(code), detail)
    p.proofs = p.sample.proofs


_TOOL_SECONDS = [0.0]


def tool_seconds() -> float:
    """Seconds this process spent re-running environment turns (tool calls), cumulative."""
    return _TOOL_SECONDS[0]


def replay_checks(
    pending: list[Pending],
    decode: Callable[[Sequence[int]], str],
    checks: Checks,
    *,
    budget_s: float = math.inf,
) -> None:
    """Re-run the environment of every episode (``validator.episodes.replay_episode``), keeping each
    transcript for the reward; after the prefill, and only while every sample of the lease is alive:
    once one has failed, the lease is lost whatever its tools print, so no tool runs at all. The
    lease's tool time is bounded by ``validator.tool_seconds_per_lease`` and by ``budget_s``, what its
    identity and address have left (``validator/tool_budget.py``); ``tool_unverifiable`` past it."""
    env = checks.episode_env
    if env is None:
        return
    left = min(checks.validator.tool_seconds_per_lease, budget_s)
    if left <= 0:
        left = -1.0  # nothing left: not even one tool run (replay_episode runs while spent <= left)
    for p in pending:
        if not all(q.alive for q in pending):
            return
        replay = replay_episode(p.sample, env, decode, seconds_left=left)
        left -= replay.tool_seconds
        _TOOL_SECONDS[0] += replay.tool_seconds
        if replay.code:
            p.reject(Reason(replay.code), replay.detail)
        p.transcript = replay.transcript


def model_checks(
    pending: list[Pending], backend: GenerationBackend, checks: Checks, observe: Observer | None
) -> None:
    """One prefill for every live sample, then the proof, sampling and log-prob checks.

    The live samples are prefilled ``backend.max_batch_size`` at a time, and each chunk is checked
    before the next is prefilled: a prefill holds fp32 logits ``[completion, V]`` per sample
    (622 MB for 1,024 tokens of Qwen's 152k vocabulary), so a whole batch of long samples at once
    would not fit on a GPU. A chunk that still runs out of memory is halved (:func:`in_chunks`); a
    backend failure is the validator's (:class:`BackendFailure`: the batch is judged again later); a
    chunk whose input the backend refuses is rejected whole.
    """
    alive = [p for p in pending if p.alive]
    chunk = max(1, int(getattr(backend, "max_batch_size", len(alive)) or len(alive)))
    in_chunks(alive, chunk, lambda part: _prefill_chunk(part, backend), lambda part, pre: _judge_chunk(part, pre, checks, observe))


def _prefill_chunk(alive: list[Pending], backend: GenerationBackend) -> list[Prefill] | str:
    try:
        return backend.prefill([p.sample.prompt_tokens for p in alive], [p.sample.completion_tokens for p in alive])
    except (GenerationError, ValueError, IndexError) as exc:  # the machine's failures pass on (in_chunks)
        return f"prefill failed: {exc}"


def _judge_chunk(alive: list[Pending], prefills: list[Prefill] | str, checks: Checks, observe: Observer | None) -> None:
    if isinstance(prefills, str):
        for p in alive:
            p.reject(Reason.MALFORMED, prefills)
        return
    for p, pre in zip(alive, prefills, strict=True):
        judge_prefill(p, pre, checks, observe)


def judge_spanned_chunk(
    chunk: list[Pending], rows: Sequence[Prefill | str], *, checks: Checks, observe: Observer | None
) -> None:
    """The per-sample model checks of mixed-version samples on the rows their spans recomputed
    (``validator/spans.py``), each with its plan's seeds and proof naming; a row that could not be
    recomputed is the sample's failure (a version unavailable: ``unknown_policy``)."""
    for p, pre in zip(chunk, rows, strict=True):
        if isinstance(pre, str):
            p.reject(Reason.UNKNOWN_POLICY if "not available" in pre else Reason.MALFORMED, pre)
            continue
        plan = p.plan
        assert plan is not None
        judge_prefill(p, pre, checks, observe, plan.proof_reason, runs=plan.runs)


ProofNamer = Callable[[list[bool]], tuple[str, str]]
"""Names a proof failure from which chunks failed: ``(reason code, detail)`` (``SpanPlan.proof_reason``)."""


def judge_prefill(
    p: Pending,
    pre: Prefill,
    checks: Checks,
    observe: Observer | None,
    name_failure: ProofNamer | None = None,
    *,
    runs: Sequence[tuple[int, int]] | None = None,
) -> None:
    """The proof, sampling and log-prob checks of one sample against its recomputed prefill.

    ``name_failure``: how a proof failure is reported (None: ``toploc_mismatch``). ``runs``: the
    seeds of a sample whose seed changes at announced switches (``SpanPlan.runs``): a single-turn
    sample's ``(first_token, seed)`` per span, an episode's per model turn; None: the sample's seed
    (an episode's turn seeds).

    Reads top-down: the proofs and the recomputed statistics (``inference/contract.py``, an
    episode's through ``validator/episodes.py``), then the rules on them (``token_rule.py``).
    """
    sample = p.sample
    thresholds = checks.thresholds
    try:
        if checks.episode_env is not None:
            turn_seeds = None if runs is None else [seed for _, seed in runs]
            episode = episode_values(
                sample, pre.hidden, pre.logits, checks.hidden_size, sampling_margins, turn_seeds
            )
            results = episode.proof_results
        else:
            results = verify_proofs(pre.hidden, p.proofs)
    except (toploc.ProofFormatError, toploc.ActivationError, ValueError) as exc:
        p.reject(Reason.MALFORMED_PROOF, f"{exc}")
        return
    verdicts = [thresholds.check(r) for r in results]
    failed = [v for v in verdicts if not v.passed]
    if failed:
        if name_failure is not None:
            code, detail = name_failure([not v.passed for v in verdicts])
            p.reject(Reason(code), f"{detail}: {failed[0].reason}")
        else:
            p.reject(Reason.PROOF_FAILED, f"{len(failed)}/{len(verdicts)} proof chunks fail: {failed[0].reason}")
        return
    if checks.episode_env is not None:  # model tokens only; env positions train with log-prob 0 (masked)
        margins, recomputed, claimed = episode.margins, episode.recomputed, episode.claimed
        trainer_logprobs = episode.trainer_logprobs
    else:
        tokens = torch.tensor(sample.completion_tokens, dtype=torch.long, device=pre.logits.device)
        margins = sampling_margins(pre.logits, tokens, sample.sampling_seed, sample.temperature, runs=runs)
        recomputed = token_logprobs(pre.logits, tokens, sample.temperature).cpu()  # compared with the claim
        claimed = sample.inference_logprobs
        trainer_logprobs = tuple(float(x) for x in recomputed.tolist())
    if observe is not None:  # evidence from every sample whose proofs pass, accepted or not
        observe(p.index, Observations.from_checks(margins, claimed, recomputed, results))
    rule = checks.sampling_rule
    v = checks.validator
    why = (
        rule.problem(margins)
        if rule is not None
        else sampling_problem(margins, tolerance=v.sampling_tolerance, max_mismatch_fraction=v.sampling_max_mismatch_fraction)
    )
    if why is not None:
        p.reject(Reason.SAMPLING_FAILED, why)
        return
    p.beyond_tolerance = int((margins > (rule.tolerance if rule is not None else v.sampling_tolerance)).sum())
    p.logprobs = trainer_logprobs  # what the trainer gets, never the claim
    why = token_rule.logprob_problem(recomputed, claimed, rule=checks.logprob_rule, atol=v.logprob_atol)
    if why is not None:
        p.reject(Reason.LOGPROBS_MISMATCH, why)


def logprob_problem(recomputed: torch.Tensor, claimed: Sequence[float], checks: Checks) -> str | None:
    """The per-token log-prob rule of ``checks`` (``token_rule.logprob_problem``): None if every
    claimed inference log-prob is close enough to the prefill's, else why not."""
    return token_rule.logprob_problem(
        recomputed, claimed, rule=checks.logprob_rule, atol=checks.validator.logprob_atol
    )
