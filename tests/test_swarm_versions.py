"""The rehearsal's per-version figures (``benchmarks/swarm_figures.py``): time-to-all counts from a
version's first publish (a trainer killed after publishing publishes it again on restart, which made
time-to-all negative), and bytes per host add up every fetch of the version by that host."""

from __future__ import annotations

import json
import sys
from pathlib import Path

BENCHMARKS = Path(__file__).resolve().parents[1] / "benchmarks"
sys.path.insert(0, str(BENCHMARKS))

from swarm_checks import RunRecords  # noqa: E402
from swarm_figures import _versions  # noqa: E402

FILE = 66_760_704


def _fetched(host: int, t: float, version: int, downloaded: int, delta: bool) -> dict[str, object]:
    return {"kind": "fetched", "host": host, "t": t, "version": version, "bytes": downloaded,
            "resumed_bytes": 0, "file_bytes": FILE, "delta": delta, "s": 0.5}  # fmt: skip


def test_time_to_all_counts_from_the_first_publish_and_bytes_add_up(tmp_path: Path) -> None:
    trainer = tmp_path / "metrics" / "trainer.jsonl"
    trainer.parent.mkdir()
    published = [
        {"event": "published", "time": 100.0, "policy_version": 2, "bytes": FILE, "delta_bytes": 1_000_000},
        # the trainer was killed after publishing v2 and published it again on restart
        {"event": "published", "time": 110.0, "policy_version": 2, "bytes": FILE, "replayed": True},
    ]
    trainer.write_text("".join(json.dumps(r) + "\n" for r in published))
    records = RunRecords([
        _fetched(0, 101.5, 2, 1_000_000, True),
        _fetched(1, 103.0, 2, 400_000, False),  # killed mid-download: resumed after its restart
        _fetched(1, 104.0, 2, FILE - 400_000, False),
    ])  # fmt: skip
    (row,) = _versions(tmp_path, records, hosts=2)
    # last host's first fetch (103.0) minus the first publish (100.0); from the replay: -7.0
    assert row["time_to_all_s"] == 3.0
    assert row["bytes_per_host"] == (1_000_000 + FILE) / 2
    assert (row["hosts_fetched"], row["hosts_by_delta"], row["published_delta_bytes"]) == (2, 1, 1_000_000)
