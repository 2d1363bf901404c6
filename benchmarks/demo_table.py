"""The table of benchmarks/results/demo/README.md, from the committed demo runs.

    python benchmarks/demo_table.py [benchmarks/results/demo]

Each ``<dir>/<seed>/`` holds one `make run`-equivalent run of configs/tiny-cpu.toml with ``--seed
<seed>``: its ``summary.txt``, ``report.png``, ``metrics/*.jsonl`` and ``run.json`` (command, start
and end, as the driver recorded them). Everything here is read back from those files with
:func:`prime_rl.launch.report.summarize_run`, so the table can be checked against them.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

from prime_rl.launch.report import RunSummary, summarize_run


def _ends(by_version: dict[int, float]) -> str:
    first, last = min(by_version), max(by_version)
    return f"{by_version[first]:.3f} (v{first}) -> {by_version[last]:.3f} (v{last}), {by_version[last] - by_version[first]:+.3f}"


def row(seed_dir: Path) -> list[str]:
    """One table row: seed, test accuracy v0 -> end, per family, wall time, hostile and honest counts."""
    summary: RunSummary = summarize_run(seed_dir)
    run = json.loads((seed_dir / "run.json").read_text())
    families = [
        f"{task_type} ({summary.problems_by_type.get(task_type, '?')}): {_ends(by_version)}"
        for task_type, by_version in summary.accuracy_by_type.items()
    ]
    hostile = [w for w in summary.workers if w.name.startswith("hostile")]
    honest = [w for w in summary.workers if not w.name.startswith("hostile")]
    hostile_text = "; ".join(
        f"{w.name}: {w.accepted} accepted, {w.rejected} rejected"
        + (f" ({', '.join(f'{k} {v}' for k, v in sorted(w.reasons.items()))})" if w.reasons else "")
        + (", banned" if w.banned else ", not banned")
        for w in hostile
    )
    honest_text = f"{sum(w.accepted for w in honest)} accepted, {sum(w.rejected for w in honest)} rejected"
    return [
        seed_dir.name,
        _ends(summary.accuracy_by_version),
        "<br>".join(families),
        f"{run['end_to_end_s']:.0f} s ({summary.steps_done} steps)",
        hostile_text,
        honest_text,
    ]


def table(results: Path) -> str:
    header = ["seed", "test accuracy (64 problems)", "per family (problems)", "end to end", "hostile", "honest"]
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    for seed_dir in sorted((p for p in results.iterdir() if (p / "run.json").is_file()), key=lambda p: int(p.name)):
        lines.append("| " + " | ".join(row(seed_dir)) + " |")
    return "\n".join(lines)


if __name__ == "__main__":
    print(table(Path(sys.argv[1] if len(sys.argv) > 1 else "benchmarks/results/demo")))
