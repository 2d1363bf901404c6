"""The held-out evaluator: greedy accuracy of each policy version on a fixed seeded problem set.

``prime-rl evaluator --config run.toml`` fetches the policy versions the trainer publishes through
shardcast (trusted and read-only, with the :class:`~prime_rl.weights.store.PolicyStore` the workers
and the validator use) and, at version 0 (the initial weights at ``model.path``), every
``evaluator.every`` versions and at the final version (``trainer.total_steps``), generates one
greedy completion per held-out problem and scores it with the same ``verifiers`` reward the
workers use. One metrics record per evaluation::

    {"event": "eval", "policy_version": 4, "accuracy": 0.42, "num_correct": 27, "num_problems": 64,
     "mean_completion_tokens": 310.5, "seconds": 6.2,
     "by_type": {"verifiable_math": {"num_correct": 20, "num_problems": 48, "accuracy": 0.4167},
                 "prime_rl_code": {"num_correct": 7, "num_problems": 16, "accuracy": 0.4375}},
     "mean_length_distance": 41.2, "mean_target_length": 384.0, "examples": [...]}

``accuracy`` is the ``verifiers`` reward alone (no length term); with ``tasks.length_reward`` set,
held-out prompts carry a thinking budget exactly as training prompts do and
``mean_length_distance`` = mean over problems of |completion tokens - budget| says how well the
policy keeps to it (both length fields are null without budgets).

Held-out set: the ``[tasks]`` generator (same ops, digits, task mix and prompt template)
re-seeded with ``evaluator.seed``, the rows of a task file after the training slice, or any task
set named by ``evaluator.tasks`` (the ``[tasks]`` keys to change, e.g. ``{path = "test.parquet"}``);
any problem whose prompt also occurs in the training task set is dropped, so accuracy measures
generalisation, not memorisation of training prompts.

Dev and test (``evaluator.split``, with ``tasks.test_share > 0`` and a generated source): the
problems whose prompt falls in the test share (:func:`prime_rl.tasks.in_test_split`) never enter
training, whatever ``tasks.seed``; ``"test"`` evaluates on them alone (report this, and choose
nothing on it), ``"dev"`` on the other unseen problems (choose templates and hyperparameters on
this). The two are disjoint by construction, and the test set does not change with ``tasks.seed``.
``"all"`` (the default) takes every unseen problem, as before the split existed. Too few problems left is a warning; none
left ends the evaluator alone (exit 0, ``eval_skipped`` in its metrics), never the run. Greedy decoding
(temperature 0) makes the number a deterministic function of the weights.

Pitfall: with ``shardcast.keep_versions`` smaller than the trainer's lead, an exact version can be
gone by the time the evaluator asks; it then evaluates the oldest newer version still offered and
records that version, so plots stay truthful (they may skip a point, never mislabel one).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from prime_rl.config import GENERATED_SOURCES, EvaluatorConfig, TasksConfig

if TYPE_CHECKING:
    from prime_rl.tasks import TaskSet

__all__ = [
    "EvalResult",
    "EvaluatorConfig",
    "EvaluatorError",
    "evaluate",
    "heldout_task_set",
    "versions_to_evaluate",
]

log = logging.getLogger(__name__)


class EvaluatorError(RuntimeError):
    """The held-out set cannot be built or a policy version never appeared."""


@dataclass(frozen=True)
class EvalResult:
    """Greedy accuracy of one policy version on the held-out set.

    ``accuracy`` = mean reward over problems (the task reward without the length term; 0/1 for
    arithmetic, math and binary code rewards, so this is the fraction solved); ``num_correct``
    counts rewards == 1; ``by_type``: the same three numbers per task type
    (``{task_type: {"num_correct", "num_problems", "accuracy"}}``, "task" for tasks without one);
    ``mean_length_distance``: mean over problems of |completion tokens - thinking budget| and
    ``mean_target_length`` the mean budget (both None when the prompts carry no budget);
    ``examples`` are the first few ``(prompt tail, completion)`` pairs, for people reading the metrics.
    """

    policy_version: int
    accuracy: float
    num_correct: int
    num_problems: int
    mean_completion_tokens: float
    seconds: float
    examples: tuple[tuple[str, str], ...] = ()
    by_type: dict[str, dict[str, float]] = field(default_factory=dict)
    mean_length_distance: float | None = None
    mean_target_length: float | None = None


def versions_to_evaluate(total_steps: int, every: int) -> list[int]:
    """``[0, every, 2*every, ..., total_steps]`` (the final version always included).

    >>> versions_to_evaluate(7, 3)
    [0, 3, 6, 7]
    """
    if total_steps < 0 or every < 1:
        raise ValueError(f"need total_steps >= 0 and every >= 1, got {total_steps}, {every}")
    versions = list(range(0, total_steps + 1, every))
    if versions[-1] != total_steps:
        versions.append(total_steps)
    return versions


def _prompt_of(task: Any) -> str:
    return str(task.prompt if hasattr(task, "prompt") else task["prompt"])


def heldout_task_set(
    tasks: TasksConfig,
    num_problems: int,
    seed: int,
    *,
    training: TaskSet | None = None,
    overrides: Mapping[str, Any] | None = None,
    split: str = "all",
) -> TaskSet:
    """The fixed held-out problems, with every training prompt removed.

    Where they come from: ``overrides`` (``evaluator.tasks``) set -> the task set ``[tasks]`` with
    those keys replaced (a separate file: its first rows; a generator: re-seeded); unset -> the
    ``[tasks]`` generator (:data:`GENERATED_SOURCES`) re-seeded with ``seed``, or the rows after
    the first ``tasks.num_tasks`` (files). Fewer than ``num_problems`` left is logged and the
    smaller set used; none left raises ``EvaluatorError`` with advice for that source.

    Length budgets are set as for training (``length_reward``, ``target_lengths``) with ``seed``
    as the budget seed, so a held-out prompt ends with "Think for T tokens ..." whenever a
    training prompt does, and ``target_length(i)`` is that T.

    ``split``: "all", or "dev" / "test" (the generator's problems outside / inside the test share
    ``tasks.test_share`` that training keeps out; see the module docstring). Raises
    ``EvaluatorError`` for "dev" or "test" without a generated source and ``test_share > 0``.
    """
    from prime_rl.tasks import TaskSet, in_test_split, load_tasks

    if split not in ("all", "dev", "test"):
        raise ValueError(f"split must be 'all', 'dev' or 'test', got {split!r}")
    train = training if training is not None else load_tasks(tasks)
    seen = {_prompt_of(train.task(i)) for i in range(len(train))}
    spec = TasksConfig.model_validate({**tasks.model_dump(), **overrides}) if overrides else tasks
    if split != "all" and not (spec.source in GENERATED_SOURCES and spec.test_share > 0):
        raise EvaluatorError(
            f"evaluator.split = {split!r} needs a generated task source with tasks.test_share > 0 (got source "
            f"{spec.source!r}, test_share {spec.test_share}); use split = 'all' or set tasks.test_share"
        )
    if spec.source in GENERATED_SOURCES:
        # Draw extra candidates so that dropping training prompts still leaves num_problems.
        # (16x: a small family, e.g. the 100 one-digit sums, needs many draws to find its unseen ones.)
        # test_share 0 here: the candidates include the test problems training never sees.
        draws = {"seed": seed, "num_tasks": 16 * num_problems + 64, "test_share": 0.0}
        candidates = load_tasks(spec.model_copy(update=draws))
        pool = [candidates.task(i) for i in range(len(candidates))]
        if split != "all":
            wanted = split == "test"
            pool = [task for task in pool if in_test_split(_prompt_of(task), spec.test_share) == wanted]
    elif overrides:
        everything = load_tasks(spec.model_copy(update={"num_tasks": len(train) + num_problems}))
        pool = [everything.task(i) for i in range(len(everything))]
    else:
        everything = load_tasks(spec.model_copy(update={"num_tasks": spec.num_tasks + num_problems}))
        pool = [everything.task(i) for i in range(min(spec.num_tasks, len(everything)), len(everything))]
    chosen = _balanced(pool, seen, num_problems)
    if not chosen or len(chosen) < num_problems:
        if spec.source in GENERATED_SOURCES:
            advice = "lower evaluator.num_problems or widen tasks.digits/ops"
        else:
            advice = (
                f"{spec.path} has no rows beyond the {len(train)} training tasks: lower tasks.num_tasks, point "
                "evaluator.tasks at a separate file (e.g. {path = 'test.parquet'}) or set evaluator.enabled = false"
            )
        message = f"only {len(chosen)} held-out problems disjoint from the {len(train)} training tasks; {advice}"
        if not chosen:
            raise EvaluatorError(message)
        log.warning("%s (evaluating on %d)", message, len(chosen))
    return TaskSet(
        chosen,
        spec.prompt_template,
        length_reward=spec.length_reward,
        target_lengths=spec.target_lengths,
        seed=seed,
        chat_template=spec.chat_template,
        system_prompt=spec.system_prompt,
        prompt_templates=spec.prompt_templates,
        target_lengths_by_type=spec.target_lengths_by_type,
    )


def _balanced(pool: Sequence[Any], seen: set[str], num_problems: int) -> list[Any]:
    """Up to ``num_problems`` distinct unseen tasks of ``pool``, taken round-robin over task types.

    Each family gets an equal share (``num_problems / families``) while it has unseen problems
    left, the others fill the rest; within a family, pool order. So a mix whose math family has
    few distinct problems still gets its per-family accuracy measured on as many as exist.
    """
    from prime_rl.tasks import task_type_of

    families: dict[str, list[Any]] = {}
    prompts: set[str] = set()
    for task in pool:
        prompt = _prompt_of(task)
        if prompt in seen or prompt in prompts:
            continue
        prompts.add(prompt)
        families.setdefault(task_type_of(task), []).append(task)
    queues = [iter(tasks) for tasks in families.values()]
    chosen: list[Any] = []
    while queues and len(chosen) < num_problems:
        for queue in list(queues):
            task = next(queue, None)
            if task is None:
                queues.remove(queue)
            elif len(chosen) < num_problems:
                chosen.append(task)
    return chosen


def _verifiers_reward(task: Any, completion: str) -> float:
    import verifiers

    return float(verifiers.verify(task, completion).reward)


def evaluate(
    backend: Any,
    task_set: TaskSet,
    *,
    max_new_tokens: int,
    stop: Sequence[str] = (),
    batch_size: int = 64,
    score: Callable[[Any, str], float] = _verifiers_reward,
    num_examples: int = 4,
) -> EvalResult:
    """Greedy-decode every held-out prompt with ``backend`` and score it.

    Args:
        backend: a :class:`prime_rl.inference.backend.GenerationBackend` (its ``policy_version`` is reported).
        task_set: the held-out problems (prompts already carry the template and any length budget).
        max_new_tokens / stop: as the workers' sampling (temperature is 0 here).
        score: ``(task, completion_text) -> reward in [0, 1]``; default ``verifiers.verify``.
        num_examples: how many (prompt tail, completion) pairs to keep in the result.
    """
    from prime_rl.inference.backend import SamplingParams

    started = time.perf_counter()
    params = SamplingParams(temperature=0.0, max_new_tokens=max_new_tokens, stop=tuple(stop))
    rewards: list[float] = []
    lengths: list[int] = []
    types: list[str] = []
    examples: list[tuple[str, str]] = []
    for start in range(0, len(task_set), batch_size):
        ids = range(start, min(start + batch_size, len(task_set)))
        prompts = [task_set.encode(backend.tokenizer, task_set.prompt(i)) for i in ids]
        completions = backend.generate(prompts, [0] * len(prompts), params)
        for task_id, completion in zip(ids, completions, strict=True):
            task = task_set.task(task_id)
            rewards.append(score(task, completion.text))
            lengths.append(len(completion.completion_tokens))
            types.append(str(getattr(task, "task_type", None) or "task"))
            if len(examples) < num_examples:
                examples.append((task_set.prompt(task_id)[-40:], completion.text))
    budgets = [t for i in range(len(task_set)) if (t := task_set.target_length(i)) is not None]
    distance = mean_target = None
    if budgets:  # a TaskSet gives every prompt a budget or none
        distance = sum(abs(n - t) for n, t in zip(lengths, budgets, strict=True)) / len(lengths)
        mean_target = sum(budgets) / len(budgets)
    return EvalResult(
        policy_version=int(backend.policy_version),
        accuracy=sum(rewards) / len(rewards),
        num_correct=sum(reward >= 1.0 for reward in rewards),
        num_problems=len(rewards),
        mean_completion_tokens=sum(lengths) / len(lengths),
        seconds=time.perf_counter() - started,
        examples=tuple(examples),
        by_type=_accuracy_by_type(types, rewards),
        mean_length_distance=distance,
        mean_target_length=mean_target,
    )


def _accuracy_by_type(types: Sequence[str], rewards: Sequence[float]) -> dict[str, dict[str, float]]:
    """``{task_type: {"num_correct", "num_problems", "accuracy"}}``, types in order of first appearance."""
    grouped: dict[str, list[float]] = {}
    for task_type, reward in zip(types, rewards, strict=True):
        grouped.setdefault(task_type, []).append(reward)
    return {
        task_type: {
            "num_correct": sum(reward >= 1.0 for reward in values),
            "num_problems": len(values),
            "accuracy": sum(values) / len(values),
        }
        for task_type, values in grouped.items()
    }
