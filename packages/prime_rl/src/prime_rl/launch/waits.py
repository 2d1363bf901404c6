"""The trainer's waits in a run's summary: how long it waited for data, and why.

Reads the trainer's ``wait`` and ``constant_reward`` metrics events (``trainer/waiting.py``) from
``<run_dir>/metrics/trainer*.jsonl``; ``prime-rl run`` logs the result when it ends and the local
recipe's ``summary.txt`` carries it, so a run that trained nothing says why.
"""

from __future__ import annotations

from pathlib import Path

from prime_rl.metrics import read_metrics

__all__ = ["trainer_wait_summary"]


def trainer_wait_summary(run_dir: str | Path) -> str | None:
    """One or two lines on the trainer's longest wait and its last cause; None when it never waited."""
    events: list[dict] = []
    for path in sorted(Path(run_dir, "metrics").glob("trainer*.jsonl")):
        events += [e for e in read_metrics(path) if e.get("event") in ("wait", "constant_reward")]
    waits = [e for e in events if e["event"] == "wait" and "cause" in e]
    if not waits:
        return None
    longest = max(waits, key=lambda e: float(e.get("waited_s", 0.0)))
    last = waits[-1]
    lines = [
        f"trainer waited for data: longest {float(longest.get('waited_s', 0.0)):.0f} s at step {longest['step']} "
        f"({longest['cause']}); last at step {last['step']}: {last['cause']} ({last.get('available', 0)} fresh "
        f"informative samples, {last.get('zero_advantage', 0)} in zero-advantage groups, {last.get('held', 0)} held, "
        f"{last.get('pending_batches', 0)} batches awaiting validation, {last.get('stale', 0)} stale)"
    ]
    if any(e["event"] == "constant_reward" for e in events):
        lines.append("the reward did not vary within any accepted group (constant_reward): nothing could be trained on")
    return "\n".join(lines)
