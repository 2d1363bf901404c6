"""``python -m prime_rl.orchestrator.record_cli {list,prune} <data_dir> [--before N]``: read or prune
an orchestrator's training record (``record.py``). ``list`` opens the store read-only (a running
orchestrator may hold it); ``prune`` takes the store's lock, so it refuses while the orchestrator runs.
"""

from __future__ import annotations

import argparse
from collections.abc import Sequence

from prime_rl.orchestrator.record import prune
from prime_rl.orchestrator.store import RolloutStore

__all__ = ["main"]


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="Read or prune an orchestrator's training record.")
    parser.add_argument("action", choices=("list", "prune"))
    parser.add_argument("data_dir", help="the orchestrator's data dir (<run_dir>/orchestrator)")
    parser.add_argument("--before", type=int, help="prune: delete the record files of steps before this one")
    args = parser.parse_args(argv)
    if args.action == "list":
        store = RolloutStore(args.data_dir, reader=True)
        query = "SELECT step, file, batches, samples, bytes, logprobs FROM records ORDER BY step, file"
        for step, file, batches, samples, size, logprobs in store.db.read(query):
            kept = " (log-probs kept)" if logprobs else ""
            print(f"step {step}: {file}, {batches} batches, {samples} samples, {size} bytes{kept}")
        store.close()
        return 0
    if args.before is None:
        parser.error("prune needs --before N")
    store = RolloutStore(args.data_dir)  # the owner's lock: refuses while the orchestrator runs
    try:
        deleted = prune(store, args.before)
    finally:
        store.close()
    print(f"deleted {len(deleted)} record files of steps before {args.before}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
