"""verify_batch: order, bounded parallelism, per-item deadlines, threads and asyncio."""

from __future__ import annotations

import asyncio
import threading
import time

import pytest

from verifiers import Score, Task, UnknownTaskTypeError, arithmetic_tasks, register_verifier, verify_batch
from verifiers.batch import verify_batch_async


def _slow(task, completion):
    time.sleep(float(completion))
    return Score(1.0)


register_verifier("test_sleep", _slow, replace=True)

_active = 0
_peak = 0
_lock = threading.Lock()


def _count(task, completion):
    global _active, _peak
    with _lock:
        _active += 1
        _peak = max(_peak, _active)
    # linger until three items overlap (or 2 s pass), so the peak is reached even under load
    end = time.monotonic() + 2.0
    while time.monotonic() < end and _peak < 3:
        time.sleep(0.005)
    time.sleep(0.02)
    with _lock:
        _active -= 1
    return Score(0.5)


register_verifier("test_count", _count, replace=True)


def test_order_and_mixed_types(warm_pool):
    tasks = [*arithmetic_tasks(3, seed=1), Task("q", "verifiable_math", {"ground_truth": "1/2"})]
    completions = [str(t.verification_info["answer"]) for t in tasks[:3]] + ["\\boxed{0.5}"]
    completions[1] = "wrong"
    scores = verify_batch(tasks, completions, max_workers=2)
    assert [s.reward for s in scores] == [1.0, 0.0, 1.0, 1.0]


def test_parallelism_is_bounded():
    global _peak
    _peak = 0
    verify_batch([Task("x", "test_count")] * 12, ["x"] * 12, max_workers=3)
    assert _peak == 3


def test_per_item_deadline():
    scores = verify_batch([Task("x", "test_sleep")] * 3, ["0", "3", "0"], max_workers=3, timeout=0.3)
    assert [s.failure for s in scores] == [None, "deadline", None]


def test_unknown_type_fails_fast_and_lengths_must_match():
    with pytest.raises(UnknownTaskTypeError):
        verify_batch([Task("x", "nope")], ["y"])
    with pytest.raises(ValueError, match="completions"):
        verify_batch([Task("x", "test_count")], [])


def test_from_thread_and_inside_asyncio(warm_pool):
    tasks = [Task("q", "verifiable_math", {"ground_truth": "x^2+2x+1"})] * 4
    completions = ["\\boxed{(x+1)^2}", "\\boxed{x^2}", "\\boxed{(1+x)^2}", "none"]
    expected = [1.0, 0.0, 1.0, 0.0]
    out: list = []
    thread = threading.Thread(target=lambda: out.append(verify_batch(tasks, completions, max_workers=2)))
    thread.start()
    thread.join(120)
    assert [s.reward for s in out[0]] == expected

    async def main():
        inline = verify_batch(tasks, completions, max_workers=2)  # blocking call on the loop thread
        awaited = await verify_batch_async(tasks, completions, max_workers=2)
        return inline, awaited

    inline, awaited = asyncio.run(main())
    assert [s.reward for s in inline] == [s.reward for s in awaited] == expected
