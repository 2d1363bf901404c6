"""A census of the garbage collector's work in a process: what each collection found, and what it freed.

``install(path)`` adds a ``gc.callbacks`` entry that, at each collection, counts the container
objects of the generations being collected (``gc.get_objects``), how many of them are frames
(a frame in a young generation is a finished call kept alive by something: an exception's
traceback, most often), the list pointers they hold (what the collection walks), then times the
collection and notes how many objects it freed (``collected``: only cyclic garbage is freed by the
collector; what reference counting frees never reaches it). One JSON line per collection.

The counting walks every object of those generations, so it costs about as much again as the
collection: a run with the census measures the collector, not the throughput.

``closed_loop.py --gc-census`` installs it in the orchestrator process (a ``sitecustomize`` on
its ``PYTHONPATH``) and reports ``summary(path)``.
"""

from __future__ import annotations

import gc
import json
import statistics
import time
from pathlib import Path
from typing import Any, TextIO

__all__ = ["install", "summary"]


class _Census:
    def __init__(self, out: TextIO) -> None:
        self._out = out
        self._row: dict[str, Any] = {}
        self._began = 0.0

    def __call__(self, phase: str, info: dict[str, int]) -> None:
        generation = info["generation"]
        if phase == "start":
            objects = [o for g in range(generation + 1) for o in gc.get_objects(g)]
            frames = sum(1 for o in objects if type(o).__name__ == "frame")
            pointers = sum(len(o) for o in objects if type(o) is list)
            self._row = {"generation": generation, "objects": len(objects), "frames": frames, "list_pointers": pointers}
            del objects
            self._began = time.perf_counter()
        elif self._row.get("generation") == generation:
            self._row.update(ms=round(1000 * (time.perf_counter() - self._began), 3), collected=info["collected"], at=time.time())
            self._out.write(json.dumps(self._row) + "\n")
            self._out.flush()
            self._row = {}


def install(path: str | Path) -> None:
    """Note every collection of this process in ``path`` (JSON lines, appended)."""
    gc.callbacks.append(_Census(Path(path).open("a")))  # noqa: SIM115 (open for the life of the process)


def summary(path: Path, since: float = 0.0, until: float = float("inf")) -> dict[str, Any]:
    """Per generation, over the collections noted from ``since`` to ``until`` (``time.time()``): how many,
    and the median and largest objects examined, frames among them, list pointers, pause (ms) and
    objects freed (with their sum)."""
    rows = [json.loads(line) for line in path.read_text().splitlines() if line.strip()] if path.exists() else []
    result: dict[str, Any] = {}
    for generation in (0, 1, 2):
        chosen = [r for r in rows if r["generation"] == generation and since <= r["at"] < until]
        if not chosen:
            continue
        figures: dict[str, Any] = {"collections": len(chosen), "collected_total": sum(r["collected"] for r in chosen)}
        for name in ("objects", "frames", "list_pointers", "ms", "collected"):
            values = [r[name] for r in chosen]
            figures[name] = {"median": statistics.median(values), "max": max(values)}
        result[f"gen{generation}"] = figures
    return result
