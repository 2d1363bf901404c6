"""The garbage collector's census (``benchmarks/gc_census.py``, ``closed_loop.py --gc-census``): it
sees the cyclic garbage an exception kept with its frames, and the summary counts a window's
collections only."""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

BENCHMARKS = Path(__file__).resolve().parents[1] / "benchmarks"
sys.path.insert(0, str(BENCHMARKS))

from gc_census import summary  # noqa: E402

# 200 calls each leave an error that holds its own traceback, whose frame holds the error: a cycle
_CYCLES = """
import gc, sys
sys.path.insert(0, {benchmarks!r})
import gc_census
gc.collect()
gc_census.install({path!r})
gc.set_threshold(100_000)  # one young collection, at the end

class Kept:
    pass

def fail(kept):
    try:
        raise ValueError("refused")
    except ValueError as error:
        kept.error = error  # kept -> error -> traceback -> this frame -> kept

for _ in range(200):
    fail(Kept())
gc.collect(0)
"""


def test_the_census_sees_frames_kept_in_cycles_and_what_the_collection_freed(tmp_path: Path) -> None:
    path = tmp_path / "census.jsonl"
    began = time.time()
    subprocess.run([sys.executable, "-c", _CYCLES.format(benchmarks=str(BENCHMARKS), path=str(path))], check=True, timeout=60)
    young = summary(path, began)["gen0"]
    assert young["frames"]["max"] >= 200  # each failed call's frame, still alive in the young generation
    assert young["collected_total"] >= 4 * 200  # error, traceback, frame, Kept (and its dict) of each call
    assert summary(path, time.time() + 1) == {}  # none after the window
