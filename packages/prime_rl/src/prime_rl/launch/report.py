r"""What a person sees at the end of a run: a PNG plot plus a short text summary (the live progress
lines are :mod:`prime_rl.launch.progress`). Everything is read from the metrics JSONL files
(``<run_dir>/metrics/*.jsonl``, see :mod:`prime_rl.metrics`), so it works on a live run, a finished
one, or one that crashed.

Events read (missing ones show as ``-``; nothing here is required for a run to work):

===================  ======================  ===================================================
file                 event                   fields used
===================  ======================  ===================================================
trainer.jsonl        ``batch``               step, waited_s (trainer idle, waiting for data),
                                             token_staleness, rollout_staleness, spans_per_sample
                                             ({versions: count}, :mod:`prime_rl.api.staleness`)
orchestrator.jsonl   ``claim``               stale_drops {reason: samples} (the last claim's)
trainer.jsonl        ``train``               step, reward_mean, num_tokens
trainer.jsonl        ``commit``              step, policy_version (a step is done)
evaluator.jsonl      ``eval``                policy_version, accuracy, num_correct, num_problems,
                                             by_type {task_type: {num_correct, num_problems}},
                                             mean_length_distance
worker-\*.jsonl      ``rollouts``            completion_tokens, generate_s
worker-\*.jsonl      ``weights_wait``        waited_s (worker idle, waiting for weights)
validator\*.jsonl    ``verdict``             sandbox_runs {kind: count} (cumulative: last one counts)
run.jsonl            ``progress``            workers {id: {name, accepted, rejected, reasons, banned}}
                                             (the top and banned ones only), worker_totals
===================  ======================  ===================================================

Plot (``report.png``, :mod:`prime_rl.launch.report_plot`): reward mean vs step; held-out accuracy vs policy version (with the 95%
Wilson interval of each evaluation, and one line per task type when the held-out set mixes 2+
types); the mean distance |completion tokens - thinking budget| on the held-out set per version
(only when prompts carry budgets); accepted / rejected samples per worker (stacked bars).
Summary (``summary.txt``): the same numbers in text, plus how many code samples the validator
ran in the sandbox, with the paths of the plot, metrics and logs. Metrics of runs older than a
field simply lack that line or panel.
"""

from __future__ import annotations

import math
from collections import defaultdict
from pathlib import Path
from typing import Any

from prime_rl.api.fields import printable
from prime_rl.api.staleness import histogram, histogram_mean, histogram_quantile, merge_histograms
from prime_rl.launch.expiry import expired_summary
from prime_rl.launch.report_plot import plot_run
from prime_rl.launch.run_summary import RunSummary, WorkerTally
from prime_rl.launch.waits import trainer_wait_summary
from prime_rl.metrics import read_metrics

__all__ = [
    "RunSummary",
    "WorkerTally",
    "plot_run",
    "render_summary",
    "summarize_run",
    "write_report",
]


def wilson_interval(successes: int, trials: int, z: float = 1.96) -> tuple[float, float]:
    """The Wilson score interval of a binomial proportion (95% for ``z`` 1.96); (0, 1) without trials.

    Unlike the normal approximation it stays inside [0, 1] and is not degenerate at 0 or n successes.
    """
    if trials <= 0:
        return (0.0, 1.0)
    p = successes / trials
    denominator = 1 + z * z / trials
    centre = (p + z * z / (2 * trials)) / denominator
    half = z * math.sqrt(p * (1 - p) / trials + z * z / (4 * trials * trials)) / denominator
    return (max(0.0, centre - half), min(1.0, centre + half))


def _records(run_dir: Path, pattern: str) -> list[dict[str, Any]]:
    records: list[dict[str, Any]] = []
    for path in sorted((run_dir / "metrics").glob(pattern)):
        records.extend(read_metrics(path))
    return records


def finite_number(value: Any) -> float | None:
    """``value`` as a float if it is a finite int or float (not a bool), else None: metrics lines are untrusted."""
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    return float(value) if math.isfinite(value) else None


def worker_tallies(progress: dict[str, Any] | None) -> tuple[WorkerTally, ...]:
    """The per-worker tallies of one ``progress`` record, sorted by worker name."""
    if not progress:
        return ()
    tallies = []
    for worker_id, info in sorted((progress.get("workers") or {}).items()):
        tallies.append(
            WorkerTally(
                name=str(info.get("name") or worker_id),
                accepted=int(info.get("accepted", 0)),
                rejected=int(info.get("rejected", 0)),
                reasons={str(k): int(v) for k, v in (info.get("reasons") or {}).items()},
                banned=bool(info.get("banned", False)),
            )
        )
    return tuple(sorted(tallies, key=lambda t: t.name))


def summarize_run(run_dir: str | Path) -> RunSummary:
    """Read every metrics file of ``run_dir`` into a :class:`RunSummary` (never raises on odd lines)."""
    root = Path(run_dir)
    trainer = _records(root, "trainer*.jsonl")
    rewards: dict[int, list[float]] = defaultdict(list)
    steps_done = 0
    trainer_wait = 0.0
    staleness: dict[str, list[dict[int, int]]] = defaultdict(list)
    for record in trainer:
        event = record.get("event")
        if event == "train" and (reward := finite_number(record.get("reward_mean"))) is not None:
            rewards[int(record.get("step", 0))].append(reward)
        elif event == "batch":
            trainer_wait += finite_number(record.get("waited_s")) or 0.0
            for key in ("token_staleness", "rollout_staleness", "spans_per_sample"):
                staleness[key].append(histogram(record.get(key)))
        elif event == "commit":
            steps_done = max(steps_done, int(record.get("policy_version", 0)))
    accuracy: dict[int, float] = {}
    intervals: dict[int, tuple[float, float]] = {}
    by_type: dict[str, dict[int, float]] = defaultdict(dict)
    type_intervals: dict[str, dict[int, tuple[float, float]]] = defaultdict(dict)
    type_problems: dict[str, int] = {}
    distance: dict[int, float] = {}
    problems = 0
    for record in _records(root, "evaluator*.jsonl"):
        if record.get("event") == "eval" and (value := finite_number(record.get("accuracy"))) is not None:
            version = int(record.get("policy_version", 0))
            accuracy[version] = value
            problems = int(record.get("num_problems", problems))
            correct, total = finite_number(record.get("num_correct")), finite_number(record.get("num_problems"))
            if correct is not None and total:
                intervals[version] = wilson_interval(int(correct), int(total))
            types = record.get("by_type")
            for task_type, counts in (types.items() if isinstance(types, dict) else ()):
                if not isinstance(counts, dict):
                    continue
                solved = finite_number(counts.get("num_correct"))
                attempted = finite_number(counts.get("num_problems"))
                if solved is None or not attempted:
                    continue
                rate = finite_number(counts.get("accuracy"))
                by_type[str(task_type)][version] = solved / attempted if rate is None else rate
                type_intervals[str(task_type)][version] = wilson_interval(int(solved), int(attempted))
                type_problems[str(task_type)] = int(attempted)
            if (gap := finite_number(record.get("mean_length_distance"))) is not None:
                distance[version] = gap
    worker_wait = 0.0
    tokens = 0.0
    generate_s = 0.0
    sampled: dict[int, list[float]] = defaultdict(list)
    turns: dict[str, int] = defaultdict(int)
    for pattern in ("worker*.jsonl", "hostile*.jsonl"):
        for record in _records(root, pattern):
            if record.get("event") == "rollouts":
                for key, name in (("samples", "episodes"), ("model_turns", "model_turns"), ("env_turns", "env_turns")):
                    turns[name] += int(finite_number(record.get(key)) or 0)
                tokens += finite_number(record.get("completion_tokens")) or 0.0
                generate_s += finite_number(record.get("generate_s")) or 0.0
                reward = finite_number(record.get("reward_mean"))
                if record.get("behaviour", "honest") == "honest" and reward is not None:
                    sampled[int(record.get("policy_version", 0))].append(reward)
            elif record.get("event") == "weights_wait":
                worker_wait += finite_number(record.get("waited_s")) or 0.0
    sandbox_runs = _validator_sandbox_runs(root)
    claims = [r for r in _records(root, "orchestrator*.jsonl") if r.get("event") == "claim"]
    drops = claims[-1].get("stale_drops") if claims else None
    run_records = _records(root, "run.jsonl")
    progress = [r for r in run_records if r.get("event") == "progress"]
    times = [t for r in run_records if (t := finite_number(r.get("time"))) is not None]
    files = {"metrics": root / "metrics", "logs": root / "logs"}
    return RunSummary(
        run_dir=root,
        steps_done=steps_done,
        reward_by_step={step: sum(v) / len(v) for step, v in sorted(rewards.items())},
        accuracy_by_version=dict(sorted(accuracy.items())),
        workers=worker_tallies(progress[-1] if progress else None),
        wall_time_s=(max(times) - min(times)) if times else 0.0,
        trainer_wait_s=trainer_wait,
        worker_wait_s=worker_wait,
        tokens_per_s=tokens / generate_s if generate_s > 0 else 0.0,
        problems_evaluated=problems,
        sampled_reward_by_version={v: sum(r) / len(r) for v, r in sorted(sampled.items())},
        files=files,
        accuracy_interval_by_version=dict(sorted(intervals.items())),
        accuracy_by_type={t: dict(sorted(v.items())) for t, v in sorted(by_type.items())},
        accuracy_interval_by_type={t: dict(sorted(v.items())) for t, v in sorted(type_intervals.items())},
        problems_by_type=dict(sorted(type_problems.items())),
        length_distance_by_version=dict(sorted(distance.items())),
        sandbox_runs=sandbox_runs,
        turns=dict(turns) if turns.get("env_turns") else {},
        token_staleness=merge_histograms(staleness["token_staleness"]),
        rollout_staleness=merge_histograms(staleness["rollout_staleness"]),
        spans_per_sample=merge_histograms(staleness["spans_per_sample"]),
        stale_drops={str(k): int(v) for k, v in drops.items() if finite_number(v) is not None}
        if isinstance(drops, dict)
        else {},
    )


def _validator_sandbox_runs(root: Path) -> dict[str, int] | None:
    """Sum over validator files of each one's last ``sandbox_runs`` (a cumulative per-process count)."""
    total: dict[str, int] = {}
    seen = False
    for path in sorted((root / "metrics").glob("validator*.jsonl")):
        last = None
        for record in read_metrics(path):
            if isinstance(record.get("sandbox_runs"), dict):
                last = record["sandbox_runs"]
        if last is not None:
            seen = True
            for kind, count in last.items():
                if (number := finite_number(count)) is not None:
                    total[str(kind)] = total.get(str(kind), 0) + int(number)
    return dict(sorted(total.items())) if seen else None


def _interval(band: tuple[float, float] | None) -> str:
    """" [0.31, 0.54]" for a Wilson interval, "" without one."""
    return "" if band is None else f" [{band[0]:.2f}, {band[1]:.2f}]"


def format_or_dash(value: float | None, spec: str = ".3f") -> str:
    """``format(value, spec)``, or "-" for a missing number."""
    return "-" if value is None else format(value, spec)


def render_summary(summary: RunSummary) -> str:
    """A short human-readable summary (numbers plus where the files are)."""
    lines = [f"run {summary.run_dir}: {summary.steps_done} policy steps in {summary.wall_time_s:.0f} s"]
    acc = summary.accuracy_by_version
    if acc:
        first, last = min(acc), max(acc)
        bands = summary.accuracy_interval_by_version
        trail = "  ".join(f"v{v}: {a:.3f}{_interval(bands.get(v))}" for v, a in acc.items())
        lines.append(
            f"held-out accuracy ({summary.problems_evaluated} problems, greedy): "
            f"{acc[first]:.3f} at v{first} -> {acc[last]:.3f} at v{last} ({acc[last] - acc[first]:+.3f})"
        )
        lines.append(f"  per version (95% interval): {trail}" if bands else f"  per version: {trail}")
    if len(summary.accuracy_by_type) >= 2:
        for task_type, by_version in summary.accuracy_by_type.items():
            type_bands = summary.accuracy_interval_by_type.get(task_type, {})
            first, last = min(by_version), max(by_version)
            ends = [f"v{v} {by_version[v]:.3f}{_interval(type_bands.get(v))}" for v in (first, last)]
            problems = summary.problems_by_type.get(task_type, "?")
            lines.append(f"  {task_type} ({problems} problems): {ends[0]} -> {ends[1]}")
    distance = summary.length_distance_by_version
    if distance:
        first, last = min(distance), max(distance)
        trail = f"v{first} {distance[first]:.1f}"
        if last != first:
            trail += f" -> v{last} {distance[last]:.1f}"
        trail += " tokens"
        if last != first and distance[first] > 0:
            trail += f" ({distance[last] / distance[first]:.0%} of v{first})"
        lines.append(f"distance to length budget (held-out, greedy): {trail}")
    sampled = summary.sampled_reward_by_version
    if sampled:
        trail = "  ".join(f"v{v}: {r:.3f}" for v, r in sampled.items())
        lines.append(f"rollout reward of honest workers by policy version: {trail}")
    if summary.turns:
        accepted, rejected = sum(w.accepted for w in summary.workers), sum(w.rejected for w in summary.workers)
        lines.append(
            f"episodes: {summary.turns['episodes']} submitted with {summary.turns['model_turns']} model turns and "
            f"{summary.turns['env_turns']} tool/environment turns; {accepted} accepted, {rejected} rejected"
        )
    for worker in summary.workers:
        reasons = ", ".join(f"{k}: {v}" for k, v in sorted(worker.reasons.items()))
        lines.append(
            f"  {printable(worker.name)}: {worker.accepted} accepted, {worker.rejected} rejected"
            + (f" ({reasons})" if reasons else "")
            + (" BANNED" if worker.banned else "")
        )
    if summary.sandbox_runs is not None:
        kinds = summary.sandbox_runs
        which = ", ".join(kinds) if len(kinds) == 1 else ", ".join(f"{kind} {count}" for kind, count in kinds.items())
        lines.append(
            f"code samples run in the sandbox by the validator: {sum(kinds.values())}" + (f" ({which})" if which else "")
        )
    lines.extend(_staleness_lines(summary))
    lines.append(
        f"trainer waited {summary.trainer_wait_s:.0f} s for data; workers waited {summary.worker_wait_s:.0f} s "
        f"for weights; generation {format_or_dash(summary.tokens_per_s or None, '.1f')} tokens/s"
    )
    for label, path in summary.files.items():
        lines.append(f"{label}: {path}")
    return "\n".join(lines)


def _shares(counts: dict[int, int]) -> str:
    total = sum(counts.values())
    return " ".join(f"{k}:{v / total:.2f}" for k, v in counts.items())


def _staleness_lines(summary: RunSummary) -> list[str]:
    """Token and rollout staleness of what was trained (versions behind the step), spans, stale drops."""
    lines = []
    tokens = summary.token_staleness
    if tokens:
        lines.append(
            f"token staleness of trained tokens (versions): mean {histogram_mean(tokens):.2f}, "
            f"p50 {histogram_quantile(tokens, 0.5)}, p90 {histogram_quantile(tokens, 0.9)}, max {max(tokens)} "
            f"(shares {_shares(tokens)})"
        )
    if summary.rollout_staleness:
        spans = summary.spans_per_sample
        multi = sum(v for k, v in spans.items() if k > 1)
        lines.append(
            f"rollout staleness (oldest span, samples): {_shares(summary.rollout_staleness)}; "
            f"samples with 2+ versions: {multi} of {sum(spans.values())}"
        )
    if summary.stale_drops:
        lines.append(
            "samples dropped as stale: " + ", ".join(f"{reason} {count}" for reason, count in summary.stale_drops.items())
        )
    return lines


def write_report(run_dir: str | Path) -> tuple[RunSummary, str]:
    """Summarise ``run_dir``: write ``summary.txt`` first, then the ``report.png`` plot; return both.

    The plot is optional: without matplotlib (``pip install 'intellect2-prime-rl[plot]'``), or if plotting
    fails, the summary says why there is no plot and nothing is raised, so whatever runs after the
    report (the recipe's clean-up of ~20 GB of weight copies) still runs.
    """
    root = Path(run_dir)
    summary = summarize_run(root)
    plot_path = root / "report.png"
    files = {"plot": plot_path, "summary": root / "summary.txt", **summary.files}
    summary = RunSummary(**{**summary.__dict__, "files": files})
    text = render_summary(summary)
    if (waits := trainer_wait_summary(root)) is not None:
        text += "\n" + waits
    if (expired := expired_summary(root)) is not None:
        text += "\n" + expired
        waits = expired if waits is None else waits + "\n" + expired
    (root / "summary.txt").write_text(text + "\n", encoding="utf-8")
    try:
        plot_run(summary, plot_path)
    except ImportError as error:
        note = f"no plot: {error.name or 'matplotlib'} is not installed (pip install 'intellect2-prime-rl[plot]')"
    except Exception as error:  # a broken plotting stack must not lose the run's summary or clean-up
        note = f"no plot: plotting failed ({type(error).__name__}: {error})"
    else:
        return summary, text
    files.pop("plot")
    summary = RunSummary(**{**summary.__dict__, "files": files})
    text = render_summary(summary) + ("\n" + waits if waits is not None else "") + "\n" + note
    (root / "summary.txt").write_text(text + "\n", encoding="utf-8")
    return summary, text
