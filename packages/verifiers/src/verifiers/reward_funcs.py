"""Verifiers as reward functions of a trainer: TRL's ``GRPOTrainer(reward_funcs=[...])`` convention.

>>> from trl import GRPOTrainer  # doctest: +SKIP
>>> trainer = GRPOTrainer(model, reward_funcs=[reward_func()], train_dataset=tasks)  # doctest: +SKIP

TRL calls a reward function as ``f(prompts=..., completions=..., completion_ids=..., **columns)``:
one entry per completion, with every other dataset column repeated to match. A dataset of task
rows (``prompt``, ``task_type``, ``verification_info``, as :meth:`verifiers.Task.to_row` writes
them) therefore needs no glue; plain and chat completions are both accepted.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from verifiers.batch import verify_batch
from verifiers.completions import Completion, completion_text, message_text
from verifiers.errors import TaskFormatError
from verifiers.task import Task

RewardFunc = Callable[..., list[float]]


def reward_func(
    task_type: str | None = None,
    *,
    max_workers: int = 4,
    timeout: float = 60.0,
    name: str = "verifiers",
) -> RewardFunc:
    """A reward function scoring each completion with :func:`verifiers.verify`, in [0, 1].

    Each completion's task comes from the dataset columns TRL passes: ``verification_info``
    (a dict, JSON or Python-literal string), and ``task_type`` unless the ``task_type``
    argument fixes it for the whole dataset. ``max_workers`` completions are scored at once,
    each within ``timeout`` seconds (:func:`verifiers.verify_batch`; a late one scores 0).
    ``name`` becomes the function's ``__name__``, which TRL logs the reward under. Where TRL
    offers ``log_extra``, each completion's failure reason (``no_answer``, ``mismatch``, ...)
    goes to the completions table as the column ``{name}_failure``.

    Raises :class:`verifiers.TaskFormatError` when a row lacks ``task_type`` (and none is given)
    or its ``verification_info`` cannot be decoded: a dataset problem, not a bad completion.
    """

    def score(
        prompts: Sequence[Completion],
        completions: Sequence[Completion],
        verification_info: Sequence[Any] | None = None,
        **columns: Any,
    ) -> list[float]:
        if task_type is not None:
            types = [task_type] * len(completions)
        elif "task_type" in columns:
            types = [str(t) for t in columns["task_type"]]
        else:
            raise TaskFormatError("the dataset has no task_type column; pass reward_func(task_type=...)")
        infos = list(verification_info) if verification_info is not None else [{}] * len(completions)
        tasks = [
            Task(message_text(prompt, roles=None), types[i], infos[i]) for i, prompt in enumerate(prompts)
        ]
        scores = verify_batch(tasks, [completion_text(c) for c in completions], max_workers=max_workers, timeout=timeout)
        log_extra = columns.get("log_extra")
        if callable(log_extra):
            log_extra(f"{name}_failure", [s.failure or "" for s in scores])
        return [s.reward for s in scores]

    score.__name__ = score.__qualname__ = name
    return score
