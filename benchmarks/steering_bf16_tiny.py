"""bf16 steering that spends exactly ``allowed(n)``: what reaches training, per identity count.

Real bf16 forward passes on the CPU, a tiny model built in code (``tests/support/tiny_lm.py``:
2-layer Llama, hidden 128, random weights, its output head scaled so logits spread like a trained
model's, std ~3), the character tokenizer. Workers decode with ``HFBackend`` (KV cache, toploc's
seeded sampler, streaming proofs); the validator prefills with its own ``HFBackend`` on the same
weights (``detection_workers.judge``: per-token sampling margins, claimed and recomputed log-probs,
proof results). Three pools of 256-token completions:

1. **calibrate**: honest samples -> ``toploc.NoiseProfile.calibrate`` -> the shipped bf16 rules
   (``prime_rl.validator.tolerances.for_precision``) and the evidence tests (default policy);
2. **honest**: held-out honest samples (>= 100,000 tokens), never used to calibrate;
3. **attack** (issue #34 item 9): the seeded sampler tells the worker every margin in advance, so on
   the *answer tokens* (the last ``--answer`` positions) it takes the runner-up wherever it lies
   within the tolerance (free per sample) and, beyond it, on exactly ``rule.allowed(n)`` further
   positions, as far out as the rule accepts (checked against the rule's per-threshold counts as it
   goes). The old rule (one count at the tolerance, hard limit 3x the largest honest margin, mean
   log-prob gap) is replayed beside the new one with its own attacker.

Three variants, replayed on the same random streams (``new`` and ``withheld`` share the attacker's
pool, so their rows are paired): ``old`` (the rule before issue #34), ``new`` (the per-threshold
rule, every accepted batch releasable) and ``withheld`` (the same rule, and the orchestrator never
releases a batch whose accepted sample has a token beyond the tolerance, ``Verdict.beyond_tolerance``).
4. **inside** (issue #46, ``InsideSpender``): the residual attacker, who never goes beyond the
   tolerance: the runner-up wherever its gap lies in ``(--inside-low, tolerance]``, at most
   ``--inside-swaps`` times per sample. Its variants share its pool: ``inside-token`` (the
   per-token evidence, ``EvidencePolicy(unit="token")``, and withholding beyond the tolerance),
   ``inside-sample`` (the per-sample evidence, toploc's default) and ``inside-hold`` (per-sample
   evidence, and a batch withheld if a sample has a margin beyond ``--hold-at``).
   ``--variants`` picks the rows to replay (and so the pools to decode).

Then :func:`replay_run`: the rule (a rejected sample trains nothing), the identity's evidence
(whole history and CUSUM; its ban drops what it holds) and the orchestrator's own ``ReleaseBook``
at the run's defaults (2,048 more accepted tokens, the largest evidence since the batch below 0.25
of the threshold, probation). An attacker spreads
``--samples`` samples over I fresh identities, a share r of them steered. Reported per (rule, r,
I): steered tokens per 10^6 trained (every token of a steered sample counts, as in
``steering_budget.py``), the steered samples and tokens trained (the denominators), swapped tokens
per 10^6 trained, identities banned; and honest identities' rejections, bans and trained tokens
over the held-out pool (what withholding costs them).

Run: ``OMP_WAIT_POLICY=PASSIVE .venv/bin/python benchmarks/steering_bf16_tiny.py --json
benchmarks/results/steering_bf16_tiny.json`` (decoding the pools is the long part; ``--cache``
keeps them; the replays took 501-624 s per answer window at ``--repeats 32``, three at once on the
shared 2-core machine: ``benchmarks/results/steering_bf16_tiny.md``).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import pickle
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests" / "support"))

import numpy as np
import torch
from detection_workers import SampleStats, judge, make_backend, steering
from tiny_lm import make_tiny_lm, make_tiny_tokenizer

import toploc
from prime_rl.api.protocol import Verdict
from prime_rl.config import load_config
from prime_rl.inference.backend import SAMPLER_SEED, SamplingParams
from prime_rl.orchestrator.release import ReleaseBook
from prime_rl.validator.checks import Checks, logprob_problem
from prime_rl.validator.token_rule import TokenRule
from prime_rl.validator.tolerances import for_precision

TEMPERATURE = 1.0
RATES = (1.0, 0.3, 0.1, 0.03)
IDENTITIES = (4, 16)
KEYS = ("trained", "steered_trained", "steered_samples_trained", "swaps_trained", "banned", "honest_trained", "honest_banned")
VARIANTS = ("old", "new", "withheld", "inside-token", "inside-sample", "inside-hold")
OLD_GRID = (1e-6, 1e-5, 1e-4, 1e-3, 3e-3, 1e-2, 3e-2, 0.1, 0.2, 0.3, 0.5, 1.0)
"""toploc's sampling-margin grid before issue #34 added 0.25 (the "old" rows are judged on it)."""


class AllowanceSpender:
    """A ``sample_next`` that spends exactly ``rule.allowed(n)`` swaps beyond the tolerance on the
    answer tokens: the runner-up wherever its margin lies beyond the tolerance and the sample's
    swaps so far, with it, still fit every per-threshold count of the rule (``swaps`` keeps each
    sample's count, in generation order)."""

    def __init__(self, rule: TokenRule, tokens: int, answer: int) -> None:
        self.rule, self.tokens, self.first = rule, tokens, tokens - answer
        self.budget = rule.allowed(tokens)
        self.limits = [(t, rule.allowed(tokens, above=t)) for t, _ in rule.checked]
        self.taken: dict[int, list[float]] = {}  # row of the batch being decoded -> margins taken
        self.swaps: list[int] = []

    def _fits(self, taken: list[float], gap: float) -> bool:
        if not self.rule.tolerance < gap <= self.rule.hard_limit or len(taken) >= self.budget:
            return False
        return all(sum(g > t for g in [*taken, gap]) <= limit for t, limit in self.limits)

    def __call__(self, logits: torch.Tensor, seeds: torch.Tensor, position: int, temperature: float) -> torch.Tensor:
        if position == 0:  # a new batch: close the previous one's samples
            self.swaps += [len(self.taken[row]) for row in sorted(self.taken)]
            self.taken = {row: [] for row in range(seeds.numel())}
        scores = logits.double() + temperature * toploc.gumbel_noise(
            SAMPLER_SEED, seeds, torch.full_like(seeds, position), logits.shape[-1]
        )
        top = scores.topk(2, dim=-1)
        tokens = top.indices[:, 0].clone()
        if position < self.first:
            return tokens
        for row, gap in enumerate((top.values[:, 0] - top.values[:, 1]).tolist()):
            if self._fits(self.taken[row], gap):
                tokens[row] = top.indices[row, 1]
                self.taken[row].append(gap)
        return tokens

    def finish(self) -> list[int]:
        """Swaps per sample of every batch decoded."""
        self.swaps += [len(self.taken[row]) for row in sorted(self.taken)]
        self.taken = {}
        return self.swaps


class InsideSpender:
    """A ``sample_next`` steering *inside* the tolerance: on the answer tokens it takes the runner-up
    wherever its margin lies in ``(low, tolerance]`` (free per sample: the rule accepts any number of
    such tokens), at most ``per_sample`` times per sample (``swaps`` keeps each sample's count). The
    attacker of the issue's residual: the largest swaps the rule lets through, as few per sample as
    a steered sample needs, so that its samples look like honest ones with a near-tie."""

    def __init__(self, tolerance: float, low: float, tokens: int, answer: int, per_sample: int) -> None:
        self.tolerance, self.low, self.first, self.per_sample = tolerance, low, tokens - answer, per_sample
        self.taken: dict[int, int] = {}
        self.swaps: list[int] = []

    def __call__(self, logits: torch.Tensor, seeds: torch.Tensor, position: int, temperature: float) -> torch.Tensor:
        if position == 0:
            self.swaps += [self.taken[row] for row in sorted(self.taken)]
            self.taken = dict.fromkeys(range(seeds.numel()), 0)
        scores = logits.double() + temperature * toploc.gumbel_noise(
            SAMPLER_SEED, seeds, torch.full_like(seeds, position), logits.shape[-1]
        )
        top = scores.topk(2, dim=-1)
        tokens = top.indices[:, 0].clone()
        if position < self.first:
            return tokens
        for row, gap in enumerate((top.values[:, 0] - top.values[:, 1]).tolist()):
            if self.low < gap <= self.tolerance and self.taken[row] < self.per_sample:
                tokens[row] = top.indices[row, 1]
                self.taken[row] += 1
        return tokens

    def finish(self) -> list[int]:
        self.swaps += [self.taken[row] for row in sorted(self.taken)]
        self.taken = {}
        return self.swaps


class Book:
    """The store ``ReleaseBook`` writes its events to: kept in memory, nothing replays them here."""

    def append_event(self, event: dict[str, Any]) -> None:
        pass


def replay_run(tests: toploc.EvidenceTests, identities: list[list[tuple[SampleStats, int]]],
               honest: list[SampleStats], rejected: Callable[[SampleStats], bool],
               release_max_evidence: float | None = None, tolerance: float | None = None) -> dict[str, int]:  # fmt: skip
    """One run through the orchestrator's real ``ReleaseBook`` at the run's defaults
    (``release_after_tokens``, the largest evidence since the batch below ``release_max_evidence``,
    probation and its run-wide budget), each sample one batch, judged by the rule and the identity's
    evidence (a ban drops everything the identity holds and ends it). ``release_max_evidence``
    replaces the run's default (0.25) where given. ``tolerance``: each accepted verdict carries the
    sample's tokens beyond it (``Verdict.beyond_tolerance``), so the book withholds those batches
    (None: every verdict carries 0, the book before issue #34's withholding).

    The attacker's identities come one after another (Sybil churn); one honest worker (``honest``,
    its own identity) submits a sample before each of the attacker's, so trusted work funds the
    probation budget as in a real run. ``(sample, swaps)``: swaps > 0 marks a steered sample.
    Returns the attacker's trained tokens, tokens of its steered samples trained, its steered
    samples trained, its swaps trained and identities banned, and the honest worker's trained
    tokens and ban (0/1).
    """
    orch = load_config(None, []).orchestrator
    max_evidence = orch.release_max_evidence if release_max_evidence is None else release_max_evidence
    book = ReleaseBook(Book(), after_tokens=orch.release_after_tokens, max_evidence=max_evidence,  # type: ignore[arg-type]
                       probation_tokens=orch.probation_tokens_or_default, probation_max_evidence=orch.probation_max_evidence,
                       probation_release_share=orch.probation_release_share)  # fmt: skip
    held: dict[str, tuple[str, int, int]] = {}  # batch id -> (worker, tokens, swaps)
    out = dict.fromkeys(KEYS, 0)
    evidence = {"h": toploc.WorkerEvidence(tests)}
    banned: set[str] = set()

    def judge(worker: str, batch_id: str, sample: SampleStats, swaps: int) -> None:
        state = evidence[worker].update(observations_of(sample))
        if state.banned:
            banned.add(worker)
            for batch in [b for b, h in held.items() if h[0] == worker]:
                del held[batch]
            return
        accepted = not rejected_memo(sample)
        beyond = int((sample.margins > tolerance).sum()) if tolerance is not None and accepted else 0
        verdict = Verdict(sample_index=0, accepted=accepted, reason="ok" if accepted else "sampling_mismatch",
                          reward=0.0, advantage=0.0, logprobs=[0.0] * sample.margins.size if accepted else [],
                          beyond_tolerance=beyond)  # fmt: skip
        book.judged(batch_id, worker, [verdict], state.fraction)
        if accepted and not beyond:  # (a withheld batch is never released: no need to ask)
            held[batch_id] = (worker, sample.margins.size, swaps)
        for batch, (owner, tokens, swapped) in list(held.items()):
            if book.released(batch, owner):
                del held[batch]
                if owner == "h":
                    out["honest_trained"] += tokens
                    continue
                out["trained"] += tokens
                out["steered_trained"] += tokens if swapped else 0
                out["steered_samples_trained"] += bool(swapped)
                out["swaps_trained"] += swapped

    def rejected_memo(sample: SampleStats) -> bool:
        key = (id(rejected), id(sample))
        if key not in _REJECTED:
            _REJECTED[key] = (sample, rejected(sample))
        return _REJECTED[key][1]

    step = 0
    for number, stream in enumerate(identities):
        worker = f"w{number}"
        evidence[worker] = toploc.WorkerEvidence(tests)
        for index, (sample, swaps) in enumerate(stream):
            if "h" not in banned:
                judge("h", f"h-{step}", honest[step % len(honest)], 0)
            step += 1
            judge(worker, f"{worker}-{index}", sample, swaps)
            if worker in banned:
                out["banned"] += 1
                break
    out["honest_banned"] = int("h" in banned)
    return out


_OBSERVATIONS: dict[int, tuple[SampleStats, toploc.Observations]] = {}
_REJECTED: dict[tuple[int, int], tuple[SampleStats, bool]] = {}
"""Per sample (by id, the sample kept alive beside it): its observations, and per rule (by the id of
its ``rejected``, alive for the whole run) its judgement (the replays judge the same pooled samples
thousands of times)."""


def observations_of(sample: SampleStats) -> toploc.Observations:
    if id(sample) not in _OBSERVATIONS:
        _OBSERVATIONS[id(sample)] = (sample, sample.observations())
    return _OBSERVATIONS[id(sample)][1]


def tiny_model(dtype: torch.dtype) -> torch.nn.Module:
    model = make_tiny_lm(hidden_size=128, seed=7)
    with torch.no_grad():
        model.lm_head.weight.mul_(60.0)  # random init gives logits of std ~0.05; a trained model's spread
    return model.to(dtype).eval()


def collect(worker: Any, validator: Any, prompts: list[list[int]], seeds: list[int], tokens: int,
            batch: int) -> list[SampleStats]:  # fmt: skip
    out: list[SampleStats] = []
    for start in range(0, len(prompts), batch):
        part = worker.generate(prompts[start : start + batch], seeds[start : start + batch],
                               SamplingParams(temperature=TEMPERATURE, max_new_tokens=tokens))  # fmt: skip
        out += judge(validator, part, TEMPERATURE, prefill_batch=batch)
    return out


def prompts_for(tokenizer: Any, count: int, offset: int) -> list[list[int]]:
    return [tokenizer(f"Q{i}: what is {i % 97} + {(7 * i) % 89}? Think, then answer.")["input_ids"]
            for i in range(offset, offset + count)]  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--tokens", type=int, default=256)
    parser.add_argument("--answer", type=int, default=64, help="answer tokens: the last positions the attacker steers")
    parser.add_argument("--calibrate", type=int, default=400, help="calibration samples")
    parser.add_argument("--honest", type=int, default=400, help="held-out honest samples")
    parser.add_argument("--attack", type=int, default=64, help="steered samples per rule")
    parser.add_argument("--samples", type=int, default=320, help="samples per attacker")
    parser.add_argument("--repeats", type=int, default=4)
    parser.add_argument("--batch", type=int, default=32)
    parser.add_argument("--json", type=Path)
    parser.add_argument("--release-max-evidence", type=float, help="orchestrator.release_max_evidence (default: the run's)")
    parser.add_argument("--alternatives", type=float, nargs="+", help="evidence bets (default: toploc.EvidencePolicy's)")
    parser.add_argument("--cache", type=Path, help="pickle of the decoded pools: read if present, else written")
    parser.add_argument("--variants", nargs="+", default=list(VARIANTS), choices=VARIANTS, help="which rows to replay")
    parser.add_argument("--inside-low", type=float, default=0.2, help="the inside attacker swaps where low < margin <= tolerance")
    parser.add_argument("--inside-swaps", type=int, default=1, help="the inside attacker's swaps per steered sample (at most)")
    parser.add_argument("--hold-at", type=float, default=0.2, help="inside-hold: withhold batches with a token beyond this margin")
    args = parser.parse_args()
    torch.manual_seed(0)
    started = time.perf_counter()
    tokenizer = make_tiny_tokenizer()
    model = tiny_model(torch.bfloat16)
    worker, validator = make_backend(model, tokenizer, args.batch), make_backend(model, tokenizer, args.batch)
    n = args.tokens
    if args.cache and args.cache.exists():
        calibration, honest, collected = pickle.loads(args.cache.read_bytes())
    else:
        calibration = collect(worker, validator, prompts_for(tokenizer, args.calibrate, 0), list(range(args.calibrate)), n, args.batch)
        honest = collect(worker, validator, prompts_for(tokenizer, args.honest, 10_000),
                         list(range(10_000, 10_000 + args.honest)), n, args.batch)  # fmt: skip
        collected = {}
    observations = [s.observations() for s in calibration]
    profile = toploc.NoiseProfile.calibrate(observations, description={"model": "tiny bf16"})
    # before issue #34: the grid had no 0.25, so the rate at the tolerance was 0.2's bound
    old_profile = toploc.NoiseProfile.calibrate(observations, grids={**toploc.noise.DEFAULT_GRIDS, "sampling_margin": OLD_GRID})
    policy = toploc.EvidencePolicy(alternatives=tuple(args.alternatives)) if args.alternatives else toploc.EvidencePolicy()
    token_policy = dataclasses.replace(policy, unit="token")
    tests = {"new": toploc.EvidenceTests.from_profile(profile, policy), "old": toploc.EvidenceTests.from_profile(old_profile, policy),
             "token": toploc.EvidenceTests.from_profile(profile, token_policy),
             "old-token": toploc.EvidenceTests.from_profile(old_profile, token_policy)}  # fmt: skip
    base = Checks.from_config(load_config(None, []), vocab_size=2**31, eos_token_ids=frozenset(), assignment_key=b"", hidden_size=128)
    checks = for_precision(base, "bfloat16", profile)
    new_rule = checks.sampling_rule
    assert new_rule is not None
    margin = old_profile.statistic("sampling_margin")
    tolerance = base.validator.sampling_tolerance
    old_rule = TokenRule(tolerance=tolerance, rate=min(margin.bound_at(tolerance), 0.5), hard_limit=max(tolerance, 3 * margin.maximum))
    old_atol = max(base.validator.logprob_atol, 3 * profile.statistic("logprob_gap").maximum)

    def rejected_new(sample: SampleStats) -> bool:
        return (new_rule.problem(torch.from_numpy(sample.margins)) is not None
                or logprob_problem(torch.from_numpy(sample.recomputed), sample.claimed.tolist(), checks) is not None)  # fmt: skip

    def rejected_old(sample: SampleStats) -> bool:
        gap = float(np.abs(sample.claimed - sample.recomputed).mean())
        return old_rule.problem(torch.from_numpy(sample.margins)) is not None or gap > old_atol

    result: dict[str, Any] = {
        "model": "tiny Llama (hidden 128, 2 layers, random weights, lm_head x60), bf16 on CPU, HFBackend decode vs prefill",
        "tokens_per_sample": n, "answer_tokens": args.answer, "release_max_evidence": args.release_max_evidence, "samples": args.samples, "repeats": args.repeats,
        "profile": [s.summary() for s in profile.statistics],
        "old_profile_margin": old_profile.statistic("sampling_margin").summary(),
        "rules": {}, "rows": [],
    }  # fmt: skip
    collected = collected or {}
    pools = {}
    wanted = {"old"} if "old" in args.variants else set()
    wanted |= {"new"} if {"new", "withheld"} & set(args.variants) else set()
    wanted |= {"inside"} if any(v.startswith("inside") for v in args.variants) else set()
    for name, rule in (("old", old_rule), ("new", new_rule), ("inside", new_rule)):
        if name not in wanted:
            continue
        key = f"{name}-answer{args.answer}-allowed{rule.allowed(n)}-limit{rule.hard_limit:.4g}-bands{len(rule.bands)}"
        if name == "inside":
            key = f"inside-answer{args.answer}-low{args.inside_low:g}-tol{rule.tolerance:g}-swaps{args.inside_swaps}"
        if key in collected:
            pools[name] = collected[key]
            continue
        spender: AllowanceSpender | InsideSpender = AllowanceSpender(rule, n, args.answer)
        if name == "inside":
            spender = InsideSpender(rule.tolerance, args.inside_low, n, args.answer, args.inside_swaps)
        with steering(spender):
            pool = collect(worker, validator, prompts_for(tokenizer, args.attack, 20_000),
                           list(range(20_000, 20_000 + args.attack)), n, args.batch)  # fmt: skip
        pools[name] = collected[key] = list(zip(pool, spender.finish(), strict=True))
    if args.cache:
        args.cache.write_bytes(pickle.dumps((calibration, honest, collected)))
    variants = (  # (row name, rule, pool, evidence tests, rejected, withholding tolerance)
        ("old", old_rule, "old", "old", rejected_old, None),
        ("new", new_rule, "new", "new", rejected_new, None),
        ("withheld", new_rule, "new", "new", rejected_new, new_rule.tolerance),
        ("inside-token", new_rule, "inside", "token", rejected_new, new_rule.tolerance),
        ("inside-sample", new_rule, "inside", "new", rejected_new, new_rule.tolerance),
        ("inside-hold", new_rule, "inside", "new", rejected_new, args.hold_at),
    )
    for name, rule, family, tested, rejected, withhold in variants:
        if name not in args.variants:
            continue
        rng = np.random.default_rng(0)  # the same streams for every variant: "new" and "withheld" are paired
        pool = pools[family]
        honest_rejected = sum(rejected(s) for s in honest)
        pool_rejected = sum(rejected(s) for s, _ in pool)
        swaps = float(np.mean([k for _, k in pool]))
        result["rules"][name] = {
            "tolerance": rule.tolerance, "hard_limit": rule.hard_limit, "allowed_n": rule.allowed(n),
            "bands": [list(b) for b in rule.bands], "swaps_per_steered_sample": swaps,
            "steered_samples_rejected": pool_rejected, "steered_samples": len(pool),
            "honest_samples_rejected": honest_rejected, "honest_samples": len(honest),
            "withholding": withhold, "evidence_unit": "token" if tested.endswith("token") else "sample",
            "honest_samples_beyond_tolerance": sum(int((s.margins > rule.tolerance).any()) for s in honest),
            "honest_samples_withheld": sum(int((s.margins > withhold).any()) for s in honest) if withhold is not None else 0,
            "steered_samples_with_a_swap": sum(k > 0 for _, k in pool),
            "calibration_samples_beyond_tolerance": sum(int((s.margins > rule.tolerance).any()) for s in calibration),
        }  # fmt: skip
        print(f"{name} rule: tolerance {rule.tolerance}, hard limit {rule.hard_limit:.3g}, allowed({n}) = {rule.allowed(n)}; "
              f"attacker swaps {swaps:.1f}/sample, {pool_rejected}/{len(pool)} steered and {honest_rejected}/{len(honest)} "
              "honest samples rejected")  # fmt: skip
        honest_bans = honest_workers = 0
        for rate in RATES:
            for identities in IDENTITIES:
                totals = dict.fromkeys(KEYS, 0)
                for _ in range(args.repeats):
                    flags = rng.random(args.samples) < rate
                    stream = [pool[rng.integers(len(pool))] if f else (honest[rng.integers(len(honest))], 0) for f in flags]
                    chunks = np.array_split(np.arange(args.samples), identities)
                    own = [honest[i] for i in rng.permutation(len(honest))]
                    row = replay_run(tests[tested], [[stream[i] for i in chunk] for chunk in chunks], own, rejected,
                                     args.release_max_evidence, withhold)  # fmt: skip
                    totals = {key: totals[key] + row[key] for key in totals}
                honest_bans += totals["honest_banned"]
                honest_workers += args.repeats
                trained = totals["trained"]
                per_million = 1e6 * totals["steered_trained"] / trained if trained else 0.0
                swapped = 1e6 * totals["swaps_trained"] / trained if trained else 0.0
                print(f"  {name} r={rate:g} I={identities}: {per_million:.0f} tokens of steered samples per 10^6 trained, "
                      f"{swapped:.0f} swapped; trained {trained} ({totals['steered_samples_trained']} steered samples), "
                      f"banned {totals['banned']}/{identities * args.repeats}; honest worker trained {totals['honest_trained']}")  # fmt: skip
                result["rows"].append({"rule": name, "rate": rate, "identities": identities, "steered_per_million": per_million,
                                       "swapped_per_million": swapped, "trained": trained, "banned": totals["banned"],
                                       "attackers": identities * args.repeats, "honest_trained": totals["honest_trained"],
                                       "honest_banned": totals["honest_banned"],
                                       "steered_samples_trained": totals["steered_samples_trained"]})  # fmt: skip
        bans = honest_only_trained = 0
        for identities in IDENTITIES:  # honest identities only, same churn: none may be banned
            chunks = np.array_split(rng.permutation(len(honest)), identities)
            row = replay_run(tests[tested], [[(honest[i], 0) for i in chunk] for chunk in chunks], honest, rejected,
                             args.release_max_evidence, withhold)  # fmt: skip
            bans += row["banned"] + row["honest_banned"]
            honest_only_trained += row["trained"] + row["honest_trained"]
        result["rules"][name]["honest_only_trained"] = honest_only_trained
        result["rules"][name]["honest_only_offered"] = 2 * len(IDENTITIES) * len(honest) * n
        result["rules"][name]["honest_workers_beside_attackers"] = honest_workers
        result["rules"][name]["honest_workers_banned_beside_attackers"] = honest_bans
        fractions = []
        for chunk in np.array_split(np.arange(len(honest)), 4):
            evidence = toploc.WorkerEvidence(tests[tested])
            fractions += [evidence.update(honest[i].observations()).fraction for i in chunk]
        result["rules"][name]["honest_bans"] = bans
        result["rules"][name]["honest_identities"] = sum(IDENTITIES) + len(IDENTITIES)
        result["rules"][name]["honest_max_evidence_fraction"] = max(fractions)
        print(f"  {name}: honest identities banned {bans}/{sum(IDENTITIES) + len(IDENTITIES)} (and {honest_bans}/{honest_workers} beside attackers); largest honest evidence {max(fractions):.3f} of the threshold")
    result["honest_tokens"] = len(honest) * n
    result["calibration_tokens"] = len(calibration) * n
    result["seconds"] = time.perf_counter() - started
    print(f"honest held-out tokens {len(honest) * n}, calibration tokens {len(calibration) * n}, {result['seconds']:.0f} s")
    if args.json:
        args.json.write_text(json.dumps(result, indent=1) + "\n")


if __name__ == "__main__":
    main()
