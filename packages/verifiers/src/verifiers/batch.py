"""`verify_batch`: score many completions with bounded parallelism and per-item deadlines.

Threads only orchestrate: the slow work runs in math worker processes or code sandboxes,
which enforce their own limits, so a thread left behind after its deadline finishes on its
own. Nothing here uses signals or an event loop, so it is safe from any thread and from
inside a running asyncio loop (use `verify_batch_async` there to keep the loop serving).
"""

from __future__ import annotations

import asyncio
import contextvars
import time
from collections.abc import Mapping, Sequence
from concurrent.futures import FIRST_COMPLETED, Future, ThreadPoolExecutor, wait
from typing import Any

from verifiers import machine
from verifiers.completions import Completion
from verifiers.registry import as_task, verify
from verifiers.task import Score, Task


def verify_batch(
    tasks: Sequence[Task | Mapping[str, Any]],
    completions: Sequence[Completion],
    *,
    max_workers: int = 4,
    timeout: float = 60.0,
) -> list[Score]:
    """Scores in input order. Each item gets `timeout` seconds from the moment it starts;
    a late item scores `Score(0, failure="deadline", machine_limit="deadline")`. Scores made inside a
    `verifiers.machine_limits()` block are reported to it, from every thread.

    Malformed tasks and unknown task types raise before any work starts.
    """
    if len(tasks) != len(completions):
        raise ValueError(f"{len(tasks)} tasks but {len(completions)} completions")
    if max_workers < 1:
        raise ValueError(f"max_workers must be >= 1, got {max_workers}")
    parsed = [as_task(t) for t in tasks]
    from verifiers.registry import get_verifier

    for task in parsed:
        get_verifier(task.task_type)  # unknown types fail fast
    started: dict[int, float] = {}

    def run(index: int) -> Score:
        started[index] = time.monotonic()
        return verify(parsed[index], completions[index])

    results: list[Score | None] = [None] * len(parsed)
    executor = ThreadPoolExecutor(max_workers=max_workers, thread_name_prefix="verify")
    try:
        # each item in its own copy of the caller's context, so a machine_limits() block sees it
        futures: dict[Future[Score], int] = {
            executor.submit(contextvars.copy_context().run, run, i): i for i in range(len(parsed))
        }
        pending = set(futures)
        while pending:
            done, pending = wait(pending, timeout=0.05, return_when=FIRST_COMPLETED)
            for future in done:
                index = futures[future]
                exc = future.exception()
                if exc is not None:
                    raise exc
                results[index] = future.result()
            now = time.monotonic()
            for future in list(pending):
                index = futures[future]
                if index in started and now - started[index] > timeout:
                    pending.discard(future)
                    results[index] = _late({"timeout_s": timeout})
    finally:
        executor.shutdown(wait=False, cancel_futures=True)
    return [r if r is not None else _late({}) for r in results]


def _late(details: dict[str, Any]) -> Score:
    machine.report("deadline", wall_clock=True)
    return Score(0.0, details, "deadline", machine_limit="deadline")


async def verify_batch_async(
    tasks: Sequence[Task | Mapping[str, Any]],
    completions: Sequence[Completion],
    *,
    max_workers: int = 4,
    timeout: float = 60.0,
) -> list[Score]:
    """`verify_batch` without blocking the running event loop."""
    return await asyncio.to_thread(verify_batch, tasks, completions, max_workers=max_workers, timeout=timeout)
