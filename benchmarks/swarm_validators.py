"""The swarm rehearsal's figures about its validators (``benchmarks/swarm.py --validators K``, issue 45).

From what a run left on disk: every validator's metrics (``metrics/validator*.jsonl``: one ``prefill``
line when a batch's prefill starts, one ``verdict`` line per batch whose verdicts were posted with a
2xx answer), the run's restarts (``metrics/run.jsonl``), the harness's kills, the orchestrator's
store (verdicts) and the hosts' records (who is honest).

  samples_judged_per_s     samples in every validator's ``verdict`` lines over the span from the first
                           to the last of them (all validators together)
  prefilled_twice          batches whose prefill started in two validator processes, split by cause:
                           ``after_validator_kill`` (the earlier process was killed with SIGKILL
                           between the two: its lease ran out and passed on, as it must),
                           ``after_orchestrator_restart`` (the orchestrator restarted between the two:
                           leases live in its memory, ``orchestrator/validator_leases.py``) and
                           ``while_lease_held`` (neither: two validators held one batch at once; must be 0)
  same_process_again       batches one validator process prefilled twice (a retry after a backend
                           failure or a refused post; not two validators)
  judged_twice             batches with posted (2xx) verdict lines from two validator processes,
                           split the same way (an identical verdict posted again answers 200 and counts
                           once in the store; ``while_lease_held`` must be 0)
  expired_share            honest samples whose verdict is ``expired`` / honest samples with a verdict
"""

from __future__ import annotations

from collections import defaultdict
from pathlib import Path
from typing import Any

from swarm_checks import RunRecords, read_jsonl

from prime_rl.config import RunConfig
from prime_rl.orchestrator.store import RolloutStore

__all__ = ["validator_figures", "validator_lines"]


def validator_lines(run_dir: Path, event: str) -> list[dict[str, Any]]:
    """Every validator's (``validator``, ``validator-1``, ...) metrics lines of ``event``, in time order."""
    lines = [
        r for path in sorted((run_dir / "metrics").glob("validator*.jsonl")) for r in read_jsonl(path)
        if r.get("event") == event
    ]  # fmt: skip
    return sorted(lines, key=lambda r: r["time"])


def _process(line: dict[str, Any]) -> tuple[str, int]:
    """One validator process: its name and pid (a restarted validator is another process)."""
    return str(line.get("name")), int(line.get("pid") or 0)


def _twice(lines: list[dict[str, Any]], kills: list[dict[str, Any]]) -> dict[str, Any]:
    """Batches that appear in ``lines`` of two validator processes, by cause (module docstring)."""
    by_batch: dict[str, list[dict[str, Any]]] = defaultdict(list)
    for line in lines:
        by_batch[line["batch_id"]].append(line)
    killed = [(k["t"], k["pid"]) for k in kills if str(k.get("target", "")).startswith("validator") and "pid" in k]
    restarts = [k["t"] for k in kills if k.get("target") == "orchestrator"]
    counts = {"after_validator_kill": 0, "after_orchestrator_restart": 0, "while_lease_held": 0}
    same_process, examples = 0, []
    for batch_id, seen in sorted(by_batch.items()):
        first = seen[0]
        others = [line for line in seen[1:] if _process(line) != _process(first)]
        if len(seen) > 1 and not others:
            same_process += 1
        if not others:
            continue
        second = others[0]
        pid, start, end = int(first.get("pid") or 0), first["time"], second["time"]
        if any(pid and pid == p and start <= t <= end for t, p in killed):
            counts["after_validator_kill"] += 1
        elif any(start <= t <= end for t in restarts):
            counts["after_orchestrator_restart"] += 1
        else:
            counts["while_lease_held"] += 1
            examples.append(f"{batch_id}: {_process(first)} at {start:.2f}, {_process(second)} at {end:.2f}")
    return {**counts, "total": sum(counts.values()), "same_process_again": same_process, "examples": examples[:10]}


def validator_figures(
    config: RunConfig, records: RunRecords, kills: list[dict[str, Any]]
) -> dict[str, Any]:
    """The validators' figures of one run (module docstring)."""
    run_dir = Path(config.run_dir)
    verdicts = validator_lines(run_dir, "verdict")
    prefills = validator_lines(run_dir, "prefill")
    judged = sum(int(v["accepted"]) + int(v["rejected"]) for v in verdicts)
    span = verdicts[-1]["time"] - verdicts[0]["time"] if len(verdicts) > 1 else 0.0
    per_validator: dict[str, int] = defaultdict(int)
    for v in verdicts:
        per_validator[str(v.get("name"))] += int(v["accepted"]) + int(v["rejected"])
    honest = records.honest_workers()
    store = RolloutStore(config.orchestrator_data_dir)
    try:
        owner = {r.meta.batch_id: r.meta.worker_id for r in store.batch_records()}
        stored = store.all_verdicts()
    finally:
        store.close()
    honest_verdicts = [v for b, vs in stored.items() if owner.get(b) in honest for v in vs]
    expired = sum(1 for v in honest_verdicts if not v.accepted and v.reason == "expired")
    # Verdict lines carry no pid: a restarted validator's lines are told apart by the prefill line
    # of the same batch in the same file (the prefill precedes its verdict).
    pid_of = {(str(p.get("name")), p["batch_id"]): p.get("pid") for p in prefills}
    for v in verdicts:
        v.setdefault("pid", pid_of.get((str(v.get("name")), v["batch_id"])))
    return {
        "validators": config.validator.count,
        "emulated_prefill_s_per_token": getattr(config.validator, "emulated_prefill_s_per_token", 0.0),
        "samples_judged": judged,
        "samples_judged_per_s": round(judged / span, 2) if span else None,
        "samples_judged_per_validator": dict(sorted(per_validator.items())),
        "batches_prefilled": len({p["batch_id"] for p in prefills}),
        "prefilled_twice": _twice(prefills, kills),
        "judged_twice": _twice(verdicts, kills),
        "honest_samples_with_verdict": len(honest_verdicts),
        "honest_expired": expired,
        "expired_share": round(expired / len(honest_verdicts), 4) if honest_verdicts else None,
    }
