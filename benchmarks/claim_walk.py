"""The trainer's claim walk over the open batches: sample ids made for every available sample
(before) against sample ids made for the chosen groups only (``orchestrator/claims.select_claim``).

Every ``POST /trainer/claim`` walks the open batches (the trainer polls it until a step is ready:
12-13 calls a second in ``closed_loop.py``), and most of the walk's groups are not taken. The open
batches here: ``--batches`` batches of 2 tasks x 4 samples, every sample accepted and unclaimed,
all fresh, so a claim of ``samples_per_step`` takes the first 16 batches and an unready claim (more
asked than available) takes none. CPU time (``time.process_time``), min and median.

Run: ``OMP_WAIT_POLICY=PASSIVE .venv/bin/python benchmarks/claim_walk.py --json
benchmarks/results/claim_walk.json`` (a few seconds).
"""

from __future__ import annotations

import argparse
import os
from collections.abc import Iterable
from dataclasses import dataclass, field
from functools import partial
from typing import Any

from payload_format import cpu_ms, emit  # benchmarks/

from prime_rl.api.protocol import SampleId, Verdict
from prime_rl.orchestrator.claims import ClaimSelection, _open_groups, select_claim

SAMPLES_PER_STEP = 128


@dataclass
class _Batch:  # a ``claims.BatchView``
    batch_id: str
    task_ids: tuple[int, ...]
    seq: int
    policy_version: int
    verdicts: list[Verdict]
    claimed: set[int] = field(default_factory=set)


def _batches(count: int) -> list[_Batch]:
    def verdicts() -> list[Verdict]:
        return [
            Verdict(sample_index=i, accepted=True, reason="ok", reward=1.0, advantage=0.5 - i % 2, logprobs=[])
            for i in range(8)
        ]

    return [_Batch(f"w{seq}-s1-b{seq}", (2 * seq,) * 4 + (2 * seq + 1,) * 4, seq, 5, verdicts()) for seq in range(count)]


def before(batches: Iterable[_Batch], *, min_policy_version: int, min_samples: int) -> ClaimSelection:
    """``select_claim`` as it was: a sample id for every available sample, then the chosen groups."""
    groups: list[list[SampleId]] = []
    pending_batches = pending_samples = stale = 0
    for batch in sorted(batches, key=lambda b: b.seq):
        for members, _ in _open_groups(batch, batch.verdicts):
            if batch.policy_version < min_policy_version:
                stale += len(members)
            else:
                groups.append([SampleId(batch.batch_id, i) for i in members])
    available = sum(len(group) for group in groups)
    chosen: list[SampleId] = []
    if available >= min_samples:
        for group in groups:
            if len(chosen) >= min_samples:
                break
            chosen.extend(group)
    return ClaimSelection(tuple(chosen), available, pending_batches, pending_samples, stale, 0)


def measure(counts: list[int], repeats: int) -> list[dict[str, Any]]:
    rows = []
    for count in counts:
        batches = _batches(count)
        for label, wanted in (("ready", SAMPLES_PER_STEP), ("not ready", 8 * count + 1)):
            old = partial(before, batches, min_policy_version=4, min_samples=wanted)
            new = partial(select_claim, batches, min_policy_version=4, min_samples=wanted, filter_zero_advantage=False)
            assert old() == new(), "the two walks must choose the same samples"
            rows.append({"open_batches": count, "claim": label, "chosen": len(new().sample_ids),
                         "before": cpu_ms(repeats, lambda _, call=old: call()),
                         "select_claim": cpu_ms(repeats, lambda _, call=new: call())})  # fmt: skip
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--batches", type=int, nargs="+", default=[128, 1024])
    parser.add_argument("--repeats", type=int, default=200)
    parser.add_argument("--json", default="", help="write the results here")
    args = parser.parse_args()
    emit({"repeats": args.repeats, "load_average": os.getloadavg(), "rows": measure(args.batches, args.repeats)}, args.json)


if __name__ == "__main__":
    main()
