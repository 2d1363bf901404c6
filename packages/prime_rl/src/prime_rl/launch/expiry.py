"""The run's expired share in its summary: how much of the work of identities not banned was given
the verdict ``expired`` (never judged before its version went stale; issue 45, item 5).

Read from the newest ``progress`` record of ``<run_dir>/metrics/run.jsonl`` (``worker_totals``, the
orchestrator's ``GET /workers`` totals that ``prime-rl run`` records every few seconds); the local
recipe's ``summary.txt`` and ``prime-rl run``'s last log lines carry it.
"""

from __future__ import annotations

from pathlib import Path

from prime_rl.metrics import read_metrics

__all__ = ["expired_summary"]


def expired_summary(run_dir: str | Path) -> str | None:
    """One line on the samples that expired unjudged; None when no progress record has the totals."""
    path = Path(run_dir, "metrics", "run.jsonl")
    if not path.exists():
        return None
    totals = None
    for record in read_metrics(path):
        if record.get("event") == "progress" and isinstance(record.get("worker_totals"), dict):
            totals = record["worker_totals"]
    if totals is None or not isinstance(totals.get("samples_submitted"), int):
        return None
    submitted, expired = totals["samples_submitted"], int(totals.get("samples_expired") or 0)
    share = expired / submitted if submitted else 0.0
    return (
        f"samples expired unjudged: {expired} of {submitted} submitted by identities not banned ({share:.1%}; "
        "orchestrator.lease_judgeable leases only what can be judged in time)"
    )
