"""The reward check: recompute every live sample's reward, re-score a disagreement the machine may
have caused, and tell cheating (``reward_mismatch``) from a reward no run could settle
(``reward_unverifiable``).

Some rewards rest on wall-clock-limited checks: a code sandbox whose runner may fail to start, a
test or a symbolic comparison with a time limit. On a loaded machine a correct program can score 0
on the worker and 1 on the validator, or the other way round. Rejecting that as ``reward_mismatch``
costs an honest worker its lease *and* counts towards its ban. ``verifiers`` says when a score may
be the machine's (``Score.machine_limit``, collected through any run reward with
``verifiers.machine_limits()``); the rule below uses only what the validator itself observed:

1. The recomputed reward equals the claim (within ``reward_atol``): accepted, limited or not.
2. The validator's own scoring was machine-limited: re-score (a fresh sandbox run), at most
   ``RESCORES_PER_SAMPLE`` times for this sample and ``validator.reward_rescores`` times for the
   batch, until a run is not limited. A re-score equal to the claim: accepted with the re-scored
   reward. A clean re-score that differs: judged as in 3 and 4 on that clean reward. Still limited
   and still different: ``reward_unverifiable``, naming the cause.
3. A clean recomputation above the claim, on a reward that ran a wall-clock-limited check
   (``wall_clock_checks``): the claim is what a spoiled run on the worker would give. The
   validator's clean, higher result cannot be the machine's (a test cannot pass by accident), so
   it is not re-scored (a re-score could only reproduce the spoiled value, and a correct program
   would then be trained as wrong). The sample is *accepted* with the validator's reward: the
   trainer never uses a claimed reward, so a low claim harms nothing, and rejecting it would hand
   any worker a veto on the leases it does not want trained (lower one claim, lose the lease, no
   ban). The worker's advantage claims rest on its own rewards, so the group's advantage check
   compares them with the z-scores of the claims it accepted this way (``Pending.claimed_reward``);
   the verdicts carry the z-scores of the recomputed rewards.
4. Any other difference (a claim above a clean recomputation, or a reward with no timed check):
   ``reward_mismatch``, as before.

Why this gives a cheater nothing. A claim is never trusted, and no verdict ever carries a claimed
reward: an accepted sample carries the validator's own (re-)score, so claiming "my sandbox timed
out" buys nothing. ``reward_unverifiable`` rejects the sample, and with it the whole lease
(``verdicts._reject_rest``): the worker earns nothing for it. What it avoids is a failure-rate
ban count (``verdicts.ban_counts``); a worker that submits a program that loops forever and claims
it correct still pays for the lease what walking away pays (the orchestrator counts every rejected
lease as abandoned and hands its tasks to another identity: ``orchestrator.lease_rules``). Its
cost to the validator is bounded too:
at most ``reward_rescores`` extra scorings per batch, none once any sample of the batch is
already rejected (the lease is lost anyway, so the classification can no longer change the
batch's fate: a batch with any other failure counts towards the ban in full). A worker doing it on
every lease never has a sample accepted.

Pitfall: a ban that ignores ``reward_unverifiable`` also ignores a validator whose own sandbox is
broken; every code lease is then rejected without blame, which the ``verdict`` metrics lines show
(``reasons``), rather than every honest worker being banned.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import verifiers
from prime_rl.episodes import EpisodeEnv
from prime_rl.validator.checks import Checks, Pending, Reason, TaskScorer
from verifiers.envs import Message
from verifiers.errors import RewardError

RESCORES_PER_SAMPLE = 2
"""A sample whose scoring stays machine-limited is re-scored at most this often (the batch's bound
``validator.reward_rescores`` applies as well)."""

CAUSES = {
    "sandbox_start": "the code sandbox's runner never started",
    "test_timeout": "a code test hit its wall-clock limit",
    "math_timeout": "the symbolic answer comparison hit its time limit",
    "deadline": "the verifier's deadline passed",
}


@dataclass(frozen=True)
class Scoring:
    """One recomputation of a sample's reward: its value, the machine cause that may have lowered it
    (None: clean), and whether it ran any wall-clock-limited check."""

    reward: float
    machine_limit: str | None
    wall_clock_checked: bool


def score_once(tasks: TaskScorer, task_id: int, completion: str, num_tokens: int) -> Scoring:
    """``tasks.score`` inside ``verifiers.machine_limits()``: the reward and what the machine did to it."""
    with verifiers.machine_limits() as seen:
        reward = float(tasks.score(task_id, completion, num_tokens))
    return Scoring(reward, seen.causes[0] if seen.causes else None, seen.wall_clock_checks > 0)


def score_episode_once(env: EpisodeEnv, task_id: int, transcript: tuple[Message, ...]) -> Scoring:
    """An episode's reward (``EpisodeEnv.score`` over the re-derived transcript) and what the machine did to it."""
    with verifiers.machine_limits() as seen:
        reward = env.score(task_id, transcript)
    return Scoring(reward, seen.causes[0] if seen.causes else None, seen.wall_clock_checks > 0)


def reward_checks(
    pending: list[Pending],
    tasks: TaskScorer,
    decode: Callable[[Sequence[int]], str],
    checks: Checks,
) -> None:
    """Recompute every live sample's reward (``Pending.reward``) and judge its claim by the rule of
    this module; at most ``checks.validator.reward_rescores`` re-scores for the whole batch."""
    budget = [checks.validator.reward_rescores]
    for p in pending:
        if not p.alive:
            continue
        try:
            env = checks.episode_env
            if env is not None and p.transcript is not None:  # an episode: the environment's rubric
                score = functools.partial(score_episode_once, env, p.sample.task_id, p.transcript)
            else:
                score = functools.partial(
                    score_once, tasks, p.sample.task_id, decode(p.sample.completion_tokens), len(p.sample.completion_tokens)
                )
            _judge(p, score, checks, budget, lease_lost=not all(q.alive for q in pending))
        except RewardError as exc:  # the environment's bug: never trained on, and not the worker's fault
            p.reject(Reason.INTERNAL_ERROR, f"reward is not a number: {exc}"[:400])
        except Exception as exc:  # a verifier bug must not take the validator down
            p.reject(Reason.INTERNAL_ERROR, f"reward computation failed: {exc!r:.200}")


def _judge(p: Pending, score: Callable[[], Scoring], checks: Checks, budget: list[int], *, lease_lost: bool) -> None:
    claim = p.sample.reward
    atol = checks.validator.reward_atol
    scoring = score()
    p.reward = scoring.reward
    rescores = 0
    first_cause = scoring.machine_limit
    while not _agrees(claim, scoring.reward, atol) and scoring.machine_limit is not None:
        if lease_lost or rescores >= RESCORES_PER_SAMPLE or budget[0] <= 0:
            if rescores >= RESCORES_PER_SAMPLE:
                why = f"still limited after {rescores} re-scores"
            elif lease_lost:
                why = f"not re-scored ({rescores} re-scores): another sample of the batch was rejected"
            else:
                why = f"not re-scored further ({rescores} re-scores): the batch's re-scores are spent"
            p.reject(
                Reason.REWARD_UNVERIFIABLE,
                f"claimed reward {claim:.6g}, recomputed {scoring.reward:.6g} limited by the machine "
                f"({scoring.machine_limit}: {CAUSES.get(scoring.machine_limit, scoring.machine_limit)}); {why}",
            )
            return
        budget[0] -= 1
        rescores += 1
        scoring = score()
        p.reward = scoring.reward
    if _agrees(claim, scoring.reward, atol):
        return
    after = f" after {rescores} re-score(s) (first run: {first_cause})" if rescores else ""
    if claim < scoring.reward and scoring.wall_clock_checked:  # rule 3: accepted, with the validator's reward
        p.claimed_reward = claim
        return
    p.reject(Reason.REWARD_MISMATCH, f"claimed reward {claim:.6g}, recomputed {scoring.reward:.6g}{after}")


def _agrees(claim: float, recomputed: float, atol: float) -> bool:
    return math.isfinite(claim) and abs(recomputed - claim) <= atol
