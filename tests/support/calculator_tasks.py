"""The multi-turn tests' tiny task set (task ``t`` asks ``t+3t=``, ground truth ``4t+1``), the turn
template of their episodes, and where each segment of an episode starts.

``test_episodes.py``, ``test_inflight_episodes.py`` and ``test_reward_errors.py`` build their runs
from these, so the prompts a ``validator_setup.TinyRun`` hands out are the environment's tasks.
"""

from __future__ import annotations

from typing import Any

from prime_rl.tasks import TaskSet
from verifiers import Task

TEMPLATE = "\n<{role}>\n{content}\n</{role}>\n"
"""How an episode renders each turn: ``EpisodeEnv(..., turn_template=TEMPLATE)``."""


def sum_prompt(task_id: int) -> str:
    """Task ``task_id``'s prompt (a ``TinyRun``'s ``prompt_text``)."""
    return f"{task_id}+{task_id * 3}="


def sum_tasks(num_tasks: int) -> TaskSet:
    """Tasks ``0 .. num_tasks - 1``: :func:`sum_prompt`, verifiable math with ground truth ``4t+1``."""
    return TaskSet(
        [Task(sum_prompt(t), "verifiable_math", {"ground_truth": str(4 * t + 1)}) for t in range(num_tasks)]
    )


def segment_starts(sample: Any) -> list[tuple[int, Any]]:
    """``(completion index of its first token, segment)`` for each segment of an episode sample."""
    out, start = [], 0
    for g in sample.segments:
        out.append((start, g))
        start += g.length
    return out
