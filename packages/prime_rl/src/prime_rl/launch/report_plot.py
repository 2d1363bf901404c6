"""The end-of-run plot (``report.png``) of :mod:`prime_rl.launch.report`'s summary: reward, held-out
accuracy, distance to the length budget and acceptance per worker, one panel each."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from prime_rl.api.fields import printable
from prime_rl.launch.run_summary import RunSummary

__all__ = ["plot_run"]


TYPE_COLOURS = ("tab:purple", "tab:orange", "tab:brown", "tab:pink", "tab:olive", "tab:cyan")
"""Line colours of the per-task-type accuracies (green is the overall accuracy's)."""


def plot_run(summary: RunSummary, path: str | Path) -> Path:
    """Write the PNG to ``path``: reward, held-out accuracy, distance to the length budget (only
    when the held-out prompts carry budgets) and acceptance per worker, one panel each."""
    import matplotlib

    matplotlib.use("Agg")  # no display needed; safe in subprocesses and CI
    import matplotlib.pyplot as plt
    from matplotlib.ticker import MaxNLocator

    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    panels = 4 if summary.length_distance_by_version else 3
    fig, axes = plt.subplots(1, panels, figsize=(5 * panels, 4.2))
    ax_reward, ax_acc, *ax_length, ax_workers = axes
    if summary.sampled_reward_by_version:
        versions = list(summary.sampled_reward_by_version)
        values = list(summary.sampled_reward_by_version.values())
        ax_reward.plot(versions, values, marker="o", label="all honest rollouts (by policy version)")
    if summary.reward_by_step:
        steps = list(summary.reward_by_step)
        values = list(summary.reward_by_step.values())
        ax_reward.plot(steps, values, marker="s", alpha=0.6, label="trained on (by step; informative groups)")
    if summary.sampled_reward_by_version or summary.reward_by_step:
        ax_reward.legend(fontsize=8)
    ax_reward.set(title="reward", xlabel="policy version / step", ylabel="mean reward", ylim=(-0.02, 1.02))
    if summary.accuracy_by_version:
        versions = list(summary.accuracy_by_version)
        ax_acc.plot(
            versions, list(summary.accuracy_by_version.values()), marker="o", color="tab:green", label="all problems"
        )
        bands = summary.accuracy_interval_by_version
        if bands:  # a bar per evaluated version (a band would invent values between sparse evaluations)
            points = [(v, summary.accuracy_by_version[v], lo, hi) for v, (lo, hi) in bands.items()]
            ax_acc.errorbar(
                [v for v, *_ in points], [a for _, a, _, _ in points],
                yerr=[[a - lo for _, a, lo, _ in points], [hi - a for _, a, _, hi in points]],
                fmt="none", ecolor="tab:green", alpha=0.5, capsize=4, label="95% interval (Wilson)",
            )  # fmt: skip
        if len(summary.accuracy_by_type) >= 2:
            _plot_accuracy_by_type(ax_acc, summary)
        ax_acc.legend(fontsize=8, loc="best")
        for version, value in summary.accuracy_by_version.items():
            ax_acc.annotate(
                f"{value:.2f}", (version, value), textcoords="offset points", xytext=(0, 6), ha="center"
            )
    ax_acc.set(
        title=f"held-out greedy accuracy ({summary.problems_evaluated} problems)",
        xlabel="policy version",
        ylabel="accuracy",
        ylim=(-0.02, 1.02),
    )
    if ax_length:
        distance = summary.length_distance_by_version
        ax_length[0].plot(list(distance), list(distance.values()), marker="o", color="tab:gray")
        ax_length[0].set(
            title="distance to length budget (held-out, greedy)",
            xlabel="policy version",
            ylabel="mean |completion tokens - budget|",
        )
        ax_length[0].set_ylim(bottom=0)
    if summary.workers:
        names = [printable(w.name) + (" (banned)" if w.banned else "") for w in summary.workers]
        accepted = [w.accepted for w in summary.workers]
        rejected = [w.rejected for w in summary.workers]
        ax_workers.bar(names, accepted, color="tab:blue", label="accepted")
        ax_workers.bar(names, rejected, bottom=accepted, color="tab:red", label="rejected")
        ax_workers.legend()
        ax_workers.tick_params(axis="x", rotation=20)
    ax_workers.set(title="samples per worker (validator verdicts)", ylabel="samples")
    for axis in (ax_reward, ax_acc, *ax_length):
        axis.grid(alpha=0.3)
        axis.xaxis.set_major_locator(MaxNLocator(integer=True))
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return path


def _plot_accuracy_by_type(axis: Any, summary: RunSummary) -> None:
    """One dashed line per task type with its Wilson bars; each type is shifted sideways by a few
    hundredths of a version so that bars at the same version do not hide one another."""
    count = len(summary.accuracy_by_type)
    for index, (task_type, by_version) in enumerate(summary.accuracy_by_type.items()):
        shift = 0.08 * (index - (count - 1) / 2)
        bands = summary.accuracy_interval_by_type.get(task_type, {})
        low = [a - bands.get(v, (a, a))[0] for v, a in by_version.items()]
        high = [bands.get(v, (a, a))[1] - a for v, a in by_version.items()]
        axis.errorbar(
            [v + shift for v in by_version], list(by_version.values()), yerr=[low, high],
            color=TYPE_COLOURS[index % len(TYPE_COLOURS)], marker=".", linestyle="--", alpha=0.8, capsize=3,
            label=f"{task_type} ({summary.problems_by_type.get(task_type, '?')} problems)",
        )  # fmt: skip
