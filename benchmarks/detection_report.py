"""Tables of ``detection_bench.py``: noise profile, detection curves, per-sample checks, false bans."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import numpy as np

import toploc


def stream_scores(tests: toploc.EvidenceTests, stream: Sequence[Any], budgets: Sequence[int]) -> dict[int, float]:
    """Per budget n: the highest evidence (fraction of the ban threshold) of ``stream`` within its first n tokens.

    Samples are replayed in order; the sample that crosses n is cut after its n-th token (as if the
    worker had submitted that shorter sample). Budgets beyond the stream's length are left out.
    """
    total = sum(s.margins.size for s in stream)
    out: dict[int, float] = {}
    for n in budgets:
        if n > total:
            continue
        evidence = toploc.WorkerEvidence(tests)
        best, used = -np.inf, 0
        for sample in stream:
            take = min(sample.margins.size, n - used)
            observations = sample.observations()
            best = max(best, evidence.update(observations if take == sample.margins.size else observations.prefix(take)).fraction)
            used += take
            if used >= n:
                break
        out[n] = float(best)
    return out


def segments(stream: Sequence[Any], n: int) -> list[list[Any]]:
    """Disjoint runs of whole samples covering at least n tokens each (the last one is cut in scoring).

    Each run, scored from a fresh ledger, is the first n tokens of one worker (other prompts and
    seeds): honest streams and deviating streams are both split this way, so a budget n has as many
    workers of each kind as the streams hold n-token runs."""
    segments, current, tokens = [], [], 0
    for sample in stream:
        current.append(sample)
        tokens += sample.margins.size
        if tokens >= n:
            segments.append(current)
            current, tokens = [], 0
    return segments


def auc(positive: Sequence[float], negative: Sequence[float]) -> float:
    """P(score of a deviating worker > score of an honest one), ties counted one half."""
    if not positive or not negative:
        return float("nan")
    p, q = np.asarray(positive)[:, None], np.asarray(negative)[None, :]
    return float(((p > q).sum() + 0.5 * (p == q).sum()) / (p.size * q.size))


def per_sample_rejected(sample: Any, sampling_tolerance: float, logprob_atol: float = 0.05) -> bool:
    """The validator's fixed per-sample rules: toploc thresholds, max margin, mean |log-prob gap|."""
    thresholds = toploc.Thresholds()
    for e, mean, median, sign in zip(sample.exp_mismatches, sample.mant_err_mean, sample.mant_err_median, sample.sign_mismatches, strict=True):
        if not thresholds.check(toploc.VerificationResult(int(e), float(mean), float(median), int(sign))).passed:
            return True
    if sample.margins.size and sample.margins.max() > sampling_tolerance:
        return True
    return bool(np.abs(sample.claimed - sample.recomputed).mean() > logprob_atol)


RELEASE_AFTER_TOKENS = 2048
RELEASE_MAX_EVIDENCE = 0.25
"""The orchestrator's release defaults (``orchestrator.release_after_tokens`` / ``release_max_evidence``)."""


def release(
    tests: toploc.EvidenceTests,
    stream: Sequence[Any],
    accepted: Callable[[Any], bool],
    after_tokens: int = RELEASE_AFTER_TOKENS,
    max_fraction: float = RELEASE_MAX_EVIDENCE,
) -> dict[str, Any]:
    """One worker's stream judged sample by sample as the validator and orchestrator would.

    Returns its tokens; ``accepted_before_ban``: tokens of samples accepted before its ban (what a
    claim could take without release); ``released``: tokens of those samples released to claims
    (``orchestrator/release.py``: ``after_tokens`` later accepted tokens, and the worker's evidence
    below ``max_fraction`` of the threshold, both before the ban); ``unreleasable``: accepted tokens
    too close to the stream's end to be released within it; ``held_by_evidence``: accepted tokens
    whose token condition was met but that the evidence limit still holds at the stream's end
    (a ban drops everything held); ``banned_at``: tokens judged when banned (None: never); ``crossed``: tokens judged when
    its evidence first reached ``max_fraction`` (None: never).
    """
    evidence = toploc.WorkerEvidence(tests)
    waiting: list[list[int]] = []  # per held sample: [accepted tokens that release it, its tokens, held by evidence]
    total = accepted_tokens = accepted_before_ban = released = 0
    banned_at = crossed = None
    for sample in stream:
        total += sample.margins.size
        state = evidence.update(sample.observations())
        if crossed is None and state.fraction >= max_fraction:
            crossed = total
        if state.banned:  # this sample is rejected (banned_worker); everything held is dropped
            banned_at = total
            waiting = []
            break
        if accepted(sample):
            accepted_tokens += sample.margins.size
            accepted_before_ban += sample.margins.size
            waiting.append([accepted_tokens + after_tokens, sample.margins.size, 0])
        for entry in waiting:
            if accepted_tokens >= entry[0]:
                entry[2] = int(state.fraction >= max_fraction)
                released += entry[1] * (1 - entry[2])
        waiting = [entry for entry in waiting if accepted_tokens < entry[0] or entry[2]]
    return {
        "tokens": total,
        "accepted_before_ban": accepted_before_ban,
        "released": released,
        "held_by_evidence": sum(entry[1] for entry in waiting if entry[2]),
        "unreleasable": sum(entry[1] for entry in waiting if not entry[2]),
        "banned_at": banned_at,
        "crossed": crossed,
    }


def report(
    jobs: Sequence[Any],
    data: Path,
    dtype: str,
    budgets: Sequence[int],
    load: Callable[[Path], list[Any]],
    calibrate: Callable[..., toploc.NoiseProfile],
) -> dict[str, Any]:
    profile = calibrate(jobs, data, dtype)
    tests = toploc.EvidenceTests.from_profile(profile)
    streams: dict[str, list[list[Any]]] = {}
    for job in jobs:
        path = data / f"{job.name}.npz"
        if job.phase != "calibrate" and path.exists():
            streams.setdefault(job.worker, []).append(load(path))
    honest = streams.pop("honest", [])
    by_config: dict[str, list[list[Any]]] = {}  # held-out honest streams per configuration
    for job in jobs:
        path = data / f"{job.name}.npz"
        if job.phase == "honest" and path.exists():
            label = (f"{job.backend} {job.attn if job.backend == 'hf' else ''} batch {job.batch}, {job.threads} threads, "
                     f"{'GRPO groups' if job.groups else 'mixed prompts'}, {job.tokens} tokens").replace("  ", " ")  # fmt: skip
            by_config.setdefault(label, []).append(load(path))
    result: dict[str, Any] = {"dtype": dtype, "log_threshold": tests.log_threshold, "tests": len(tests)}

    print(f"\n## {dtype}: honest noise (calibration, {profile.statistic('logprob_gap').observations} tokens)\n")
    print("| statistic | observations | honest max | thresholds with their honest rate bound p0 |")
    print("|---|---|---|---|")
    for s in profile.statistics:
        bounds = ", ".join(f"{t:g}: {p:.1e}" for t, p in zip(s.thresholds, s.rate_bounds, strict=True) if p < 0.2)
        print(f"| {s.name} | {s.observations} | {s.maximum:.3g} | {bounds} |")
    tolerance = max(0.25, profile.per_sample_limit("sampling_margin"))
    atol = max(0.05, profile.per_sample_limit("logprob_gap"))
    print(f"\n{len(tests)} tests, ban at whole-history score >= {tests.history_log_threshold:.1f} or recent (CUSUM) score >= {tests.log_threshold:.1f} nats; per-sample sampling tolerance "
          f"{tolerance:.3g}, log-prob tolerance {atol:.3g} (the validator's, widened from the profile)")  # fmt: skip

    honest_tokens = sum(s.margins.size for st in honest for s in st)
    long_samples = sum(1 for st in honest for s in st if s.margins.size >= 1000)
    worst, banned = 0.0, 0
    for stream in honest:
        evidence = toploc.WorkerEvidence(tests)
        for sample in stream:
            state = evidence.update(sample.observations())
            worst = max(worst, state.fraction)
        banned += evidence.banned
    # The strictest reading: every held-out honest sample judged as the output of one single worker.
    one = toploc.WorkerEvidence(tests)
    one_worst = max((one.update(s.observations()).fraction for st in honest for s in st), default=0.0)
    old = sum(per_sample_rejected(s, 0.25) for st in honest for s in st)
    new = sum(per_sample_rejected(s, tolerance, atol) for st in honest for s in st)
    count = sum(len(st) for st in honest)
    print(f"\nhonest held-out: {len(honest)} workers, {count} samples ({long_samples} of >= 1000 tokens), "
          f"{honest_tokens} tokens: {banned} banned, largest score {worst:.3f} of the threshold; "
          f"per-sample rejections {old}/{count} with the fixed rules (0.25, 0.05), {new}/{count} with the widened ones; "
          f"all {honest_tokens} tokens as one worker: {'banned' if one.banned else 'not banned'}, "
          f"largest score {one_worst:.3f} of the threshold")  # fmt: skip
    result["honest"] = {"workers": len(honest), "samples": count, "tokens": honest_tokens, "long_samples": long_samples,
                        "banned": banned, "max_fraction": worst, "rejected_fixed": old, "rejected_new": new,
                        "one_worker_banned": bool(one.banned), "one_worker_max_fraction": one_worst}  # fmt: skip

    print("\n| honest configuration | workers | samples | tokens | banned | largest score / threshold | rejected per sample |")
    print("|---|---|---|---|---|---|---|")
    for label, config_streams in by_config.items():
        fractions, config_banned = [], 0
        for stream in config_streams:
            evidence = toploc.WorkerEvidence(tests)
            fractions += [evidence.update(s.observations()).fraction for s in stream]
            config_banned += evidence.banned
        samples = [s for st in config_streams for s in st]
        rejected = sum(per_sample_rejected(s, tolerance, atol) for s in samples)
        print(f"| {label} | {len(config_streams)} | {len(samples)} | {sum(s.margins.size for s in samples)} | "
              f"{config_banned} | {max(fractions, default=0.0):.3f} | {rejected}/{len(samples)} |")  # fmt: skip

    honest_at = {n: [stream_scores(tests, seg, [n]).get(n, -np.inf) for st in honest for seg in segments(st, n)] for n in budgets}
    header = " | ".join(f"n={n}" for n in budgets)
    print(f"\n## {dtype}: share of deviating workers banned within n tokens (workers) / AUC vs honest workers at n\n")
    print(f"| deviation | workers | per-sample rejected | AUC >= 0.999 at | all banned at | {header} |")
    print("|---|---|---|---|---|" + "---|" * len(budgets))
    print(f"| (honest workers at n) | | | | | {' | '.join(str(len(honest_at[n])) for n in budgets)} |")
    result["curves"] = {}
    for attack, attack_streams in streams.items():
        rejected = np.mean([per_sample_rejected(s, tolerance, atol) for st in attack_streams for s in st])
        cells, curve = [], {}
        for n in budgets:
            at = [stream_scores(tests, seg, [n]).get(n, -np.inf) for st in attack_streams for seg in segments(st, n)]
            at = [x for x in at if x > -np.inf]
            if not at:
                cells.append("")
                continue
            share = float(np.mean([x >= 1.0 for x in at]))
            area = auc(at, honest_at[n])
            cells.append(f"{share:.2f} ({len(at)}) / {area:.3f}")
            curve[n] = {"banned": share, "auc": area, "workers": len(at)}
        first_auc = next((str(n) for n in budgets if n in curve and curve[n]["auc"] >= 0.999), "-")
        first_all = next((str(n) for n in budgets if n in curve and curve[n]["banned"] == 1.0), "-")
        tokens = sum(s.margins.size for st in attack_streams for s in st)
        print(f"| {attack} | {len(attack_streams)} ({tokens} tokens) | {rejected:.2f} | {first_auc} | {first_all} | {' | '.join(cells)} |")
        result["curves"][attack] = {"per_sample_rejected": float(rejected), "budgets": curve}

    print(f"\n## {dtype}: what reaches training, per worker from its first token (release after "
          f"{RELEASE_AFTER_TOKENS} later accepted tokens, evidence below {RELEASE_MAX_EVIDENCE} of the threshold)\n")
    print("| worker | workers | tokens | banned | banned at (tokens) | evidence >= limit at (tokens) | "
          "accepted before the ban | released to training | held by the evidence limit | too close to the end |")
    print("|---|---|---|---|---|---|---|---|---|---|")
    result["release"] = {}
    kept = lambda sample: not per_sample_rejected(sample, tolerance, atol)  # noqa: E731
    for name, worker_streams in [("honest (held-out)", honest), *streams.items()]:
        rows = [release(tests, stream, kept) for stream in worker_streams]
        if not rows:
            continue
        sums = {key: sum(row[key] for row in rows) for key in ("tokens", "accepted_before_ban", "released", "held_by_evidence", "unreleasable")}
        banned_at = sorted(row["banned_at"] for row in rows if row["banned_at"] is not None)
        crossed = sorted(row["crossed"] for row in rows if row["crossed"] is not None)
        span = lambda values: "-" if not values else f"{values[0]}-{values[-1]}"  # noqa: E731
        print(f"| {name} | {len(rows)} | {sums['tokens']} | {len(banned_at)} | {span(banned_at)} | {span(crossed)} | "
              f"{sums['accepted_before_ban']} | {sums['released']} | {sums['held_by_evidence']} | {sums['unreleasable']} |")
        result["release"][name] = {**sums, "workers": len(rows), "banned": len(banned_at), "banned_at": banned_at, "crossed": crossed}
    return result
