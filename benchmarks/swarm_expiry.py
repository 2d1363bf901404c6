"""How much of a swarm rehearsal's honest work expired unjudged, what was trained, and who was banned
(issue 45, item 5), read from what the run left on disk (``benchmarks/swarm.py``'s root).

    python benchmarks/swarm_expiry.py ROOT [ROOT ...]     # one JSON object per run folder

``swarm.py`` adds these figures to every run's summary (``compute_figures``); this command reads them
from any kept run folder, also one made by an older checkout of the harness (the store's format is
the same), so two checkouts' runs are compared by one piece of code.

  honest_samples / honest_expired / honest_expired_share
                      samples submitted by identities playing honest, those given the verdict
                      ``expired`` (never judged before their version went stale), and the share
  honest_past_bound   honest samples accepted but not claimed before they went stale (judged, untrained)
  samples_trained     samples in the trainer's claims
  hostile_submitted / hostile_banned   hostile identities that submitted a batch / of them, banned
  honest_banned       identities playing honest that were banned (0 expected)
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(REPO / "benchmarks")]

from swarm_checks import RunRecords  # noqa: E402

from prime_rl.config import RunConfig, load_config  # noqa: E402
from prime_rl.orchestrator.store import RolloutStore  # noqa: E402

__all__ = ["expiry_figures"]


def expiry_figures(config: RunConfig, records: RunRecords) -> dict[str, Any]:
    """The figures of the module docstring for one run (its config and the hosts' records)."""
    identities = records.of("identity")
    honest = {r["worker_id"] for r in identities if r["behaviour"] == "honest"}
    hostile = {r["worker_id"] for r in identities if r["behaviour"] != "honest"}
    store = RolloutStore(config.orchestrator_data_dir)
    try:
        batches = store.batch_records()
        verdicts = store.all_verdicts()
        claims = store.claims()
        events = list(store.events())
        ledger = {w: json.loads(text) for w, text in store.evidence_rows()}
    finally:
        store.close()
    claimed = {(s.batch_id, s.index) for claim in claims for s in claim.sample_ids}
    bound = config.orchestrator.off_policy_bound
    samples = expired = past_bound = 0
    submitted_by: set[str] = set()
    last_step = max((c.step for c in claims), default=-1)
    for record in batches:
        worker_id, batch_id = record.meta.worker_id, record.meta.batch_id
        submitted_by.add(worker_id)
        if worker_id not in honest:
            continue
        samples += len(record.task_ids)
        judged = verdicts.get(batch_id) or []
        expired += sum(1 for v in judged if v.reason == "expired")
        if record.meta.policy_version + bound < last_step:  # stale for every later claim
            past_bound += sum(1 for v in judged if v.accepted and (batch_id, v.sample_index) not in claimed)
    banned = {e["worker_id"] for e in events if e.get("event") == "ban"}
    banned |= {w for w, row in ledger.items() if row.get("evidence_ban") or row.get("failure_ban")}
    hostile_submitted = hostile & submitted_by
    return {
        "lease_judgeable": getattr(config.orchestrator, "lease_judgeable", False),
        "honest_samples": samples,
        "honest_expired": expired,
        "honest_expired_share": round(expired / samples, 4) if samples else None,
        "honest_past_bound": past_bound,
        "samples_trained": len(claimed),
        "hostile_submitted": len(hostile_submitted),
        "hostile_banned": len(hostile_submitted & banned),
        "honest_banned": len(honest & banned),
    }


def main(argv: list[str]) -> int:
    for root in map(Path, argv):
        figures = expiry_figures(load_config(root / "run.toml"), RunRecords.read(root))
        print(json.dumps({"root": str(root), **figures}))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
