"""The task set every process shares: task id -> task, task id -> prompt text -> prompt tokens.

The orchestrator, workers, the validator and the evaluator all build the same ``TaskSet`` from
the same ``[tasks]`` config, so a task id means the same prompt everywhere; the validator
recomputes ``encode_prompt(tokenizer, task_set.prompt(task_id))`` and rejects a sample whose
prompt tokens differ ("a changed prompt").

Sources (``tasks.source``):
  - ``arithmetic``: ``verifiers``' seeded arithmetic generator (``num_tasks``, ``seed``, ``ops``, ``digits``);
  - ``mix``: the same generator as math tasks scored by the math verifier (a boxed answer) plus
    ``tasks.code.share`` code tasks ("Use Python to compute ...", run in the sandbox), seeded order;
  - ``jsonl`` / ``parquet``: one file of rows; ``datasets``: a Hugging Face dataset from local files
    (``datasets.load_from_disk`` for a ``save_to_disk`` folder, else ``datasets.load_dataset`` on the
    folder or file, split ``tasks.split``). Rows follow the INTELLECT-2 schema ``{prompt, task_type,
    verification_info}`` or are mapped onto it by ``tasks.columns`` (:func:`map_row`: e.g. a
    ``question``/``answer`` pair becomes a ``verifiable_math`` task with that ground truth); then
    ``verifiers.Task.from_row``, the optional pass-rate filter (``difficulty_key``,
    ``min_pass_rate``, ``max_pass_rate``) and the first ``num_tasks``.

Test split (``tasks.test_share``, generated sources): the problems whose prompt hashes into the
first ``test_share`` of the hash range (:func:`in_test_split`) are skipped when the training set is
generated, whatever ``tasks.seed``; the evaluator's ``split = "test"`` evaluates on exactly them.

Prompt text = ``prompt_template`` with ``{prompt}`` replaced by the task's prompt (plain
replacement, so other braces in a few-shot prefix need no escaping). Prompt tokens =
:func:`encode_prompt` of that text, through the tokenizer's chat template when
``tasks.chat_template`` is on.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

from prime_rl.config import TasksConfig

__all__ = ["TaskSet", "TaskSourceError", "encode_prompt", "in_test_split", "load_tasks", "map_row", "read_rows"]


class TaskSourceError(ValueError):
    """The task source cannot be read or produced no tasks."""


def encode_prompt(tokenizer: Any, prompt: str, *, chat_template: bool = False, system_prompt: str = "") -> list[int]:
    """Token ids of ``prompt``: ``tokenizer(prompt)["input_ids"]`` (HF default special tokens), or
    with ``chat_template`` the tokenizer's chat template over ``[system?, user: prompt]`` with the
    assistant turn opened (``add_generation_prompt=True``).

    The one definition worker, validator and evaluator share; changing it invalidates every
    submission. Raises ``TaskSourceError`` when the chat template is asked for and the tokenizer has none.
    """
    if not chat_template:
        return [int(token) for token in tokenizer(prompt)["input_ids"]]
    if not getattr(tokenizer, "chat_template", None):
        raise TaskSourceError(
            "tasks.chat_template = true, but the tokenizer at model.path has no chat template; "
            "turn it off and write the format into tasks.prompt_template instead"
        )
    messages = [{"role": "system", "content": system_prompt}] if system_prompt else []
    messages.append({"role": "user", "content": prompt})
    ids = tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=True)
    if isinstance(ids, Mapping):  # some transformers versions answer with a BatchEncoding
        ids = ids["input_ids"]
    return [int(token) for token in ids]


def task_type_of(task: Any) -> str:
    """``task.task_type`` (or a mapping's "task_type") as text, "" when it has none: the key of
    ``prompt_templates``, ``target_lengths_by_type`` and the held-out set's families."""
    value = task.get("task_type") if isinstance(task, Mapping) else getattr(task, "task_type", None)
    return "" if value is None else str(value)


class TaskSet:
    """An indexable, immutable list of tasks plus the prompt template (and optional length budgets).

    With ``length_reward != "none"`` every task gets a thinking budget
    ``target_length(task_id) = verifiers.sample_target_length(seed, task_id, targets=target_lengths)``
    and its prompt ends with ``verifiers.length_instruction(T, mode)`` (INTELLECT-2's instruction
    placement, with the space after "for" that the original lacked). ``target_lengths_by_type``
    gives a task type its own list of budgets (drawn the same way).
    """

    def __init__(
        self,
        tasks: Sequence[Any],
        prompt_template: str = "{prompt}",
        *,
        length_reward: str = "none",
        target_lengths: Sequence[int] = (),
        seed: int = 0,
        chat_template: bool = False,
        system_prompt: str = "",
        prompt_templates: Mapping[str, str] | None = None,
        target_lengths_by_type: Mapping[str, Sequence[int]] | None = None,
    ) -> None:
        if not tasks:
            raise TaskSourceError("the task set is empty")
        templates = dict(prompt_templates or {})
        for name, template in {"": prompt_template, **templates}.items():
            if "{prompt}" not in template:
                raise TaskSourceError(f"prompt_template{'s.' + name if name else ''} must contain '{{prompt}}'")
        by_type = {str(name): tuple(lengths) for name, lengths in (target_lengths_by_type or {}).items()}
        if length_reward != "none" and (not target_lengths or not all(by_type.values())):
            raise TaskSourceError("a length reward needs target_lengths (and non-empty target_lengths_by_type lists)")
        self._tasks = tuple(tasks)
        self.prompt_template = prompt_template
        self.prompt_templates = templates
        self.length_reward = length_reward
        self.target_lengths = tuple(target_lengths)
        self.target_lengths_by_type = by_type
        self.seed = seed
        self.chat_template = chat_template
        self.system_prompt = system_prompt

    def target_length(self, task_id: int) -> int | None:
        """The task's thinking budget in tokens (None without a length reward)."""
        task = self.task(task_id)
        if self.length_reward == "none":
            return None
        import verifiers

        targets = self.target_lengths_by_type.get(task_type_of(task), self.target_lengths)
        return int(verifiers.sample_target_length(self.seed, task_id, targets=targets))

    def __len__(self) -> int:
        return len(self._tasks)

    def task(self, task_id: int) -> Any:
        """The task object (a ``verifiers.Task`` for real sources); IndexError if out of range."""
        if not 0 <= task_id < len(self._tasks):
            raise IndexError(f"task_id {task_id} out of range [0, {len(self._tasks)})")
        return self._tasks[task_id]

    def prompt(self, task_id: int) -> str:
        """The full prompt text sent to the model for ``task_id``."""
        task = self.task(task_id)
        raw = str(task.prompt if hasattr(task, "prompt") else task["prompt"])
        target = self.target_length(task_id)
        if target is not None:
            from verifiers.length import with_length_instruction

            raw = with_length_instruction(raw, target, self.length_reward)
        return self.template_of(task).replace("{prompt}", raw)

    def template_of(self, task: Any) -> str:
        """The prompt template of ``task``: ``prompt_templates[task_type]`` if given, else ``prompt_template``."""
        return self.prompt_templates.get(task_type_of(task), self.prompt_template)

    def encode(self, tokenizer: Any, text: str) -> list[int]:
        """Prompt ``text`` (e.g. ``self.prompt(task_id)``) as token ids: :func:`encode_prompt` with
        this task set's chat settings."""
        return encode_prompt(tokenizer, text, chat_template=self.chat_template, system_prompt=self.system_prompt)


def in_test_split(prompt: str, share: float) -> bool:
    """Whether the problem ``prompt`` (the task's own text, before any template) belongs to the test
    split that keeps ``share`` of the problem space out of training: the first 8 bytes of
    sha256("prime-rl test split:" + prompt), read as a fraction of 2**64, are below ``share``.

    A pure function of the text, so the split is the same for every ``tasks.seed`` and process, and
    a problem drawn twice lands on the same side both times.
    """
    digest = hashlib.sha256(f"prime-rl test split:{prompt}".encode()).digest()
    return int.from_bytes(digest[:8], "big") < share * 2**64


def _generate(count: int, test_share: float, **kwargs: Any) -> list[Any]:
    """The first ``count`` of ``verifiers.arithmetic_tasks(n, **kwargs)`` outside the test split.

    The generator's sequence does not depend on ``n``, so drawing more only appends problems: the
    training set is a fixed prefix of that sequence with the test problems left out. A space whose
    problems are nearly all test problems gives fewer than ``count`` (after 64x the draws).
    """
    import verifiers

    if test_share <= 0:
        return list(verifiers.arithmetic_tasks(count, **kwargs))
    draws = count
    while True:
        drawn = verifiers.arithmetic_tasks(draws, **kwargs)
        kept = [task for task in drawn if not in_test_split(task.prompt, test_share)]
        if len(kept) >= count or draws >= 64 * count + 64:
            return kept[:count]
        draws *= 2


def _arithmetic(config: TasksConfig) -> list[Any]:
    return _generate(
        config.num_tasks,
        config.test_share,
        seed=config.seed,
        ops=tuple(config.ops),
        digits=(config.min_digits, config.digits),
        terms=config.terms,
        match=config.match,
        template=config.arithmetic_template,
    )


def _mix(config: TasksConfig) -> list[Any]:
    """Math tasks (the arithmetic settings, ``verifiable_math``) and code tasks (``[tasks.code]``,
    ``prime_rl_code``) in a seeded order; ``tasks.code.share`` of them are code."""
    import random

    code = config.code
    num_code = round(config.num_tasks * code.share)
    families = (  # (count, ops, digits, template, task type)
        (config.num_tasks - num_code, config.ops, (config.min_digits, config.digits), config.arithmetic_template, "verifiable_math"),
        (num_code, code.ops, (code.min_digits, code.digits), code.template, "prime_rl_code"),
    )  # fmt: skip
    tasks = [
        task
        for count, ops, digits, template, task_type in families
        for task in _generate(
            count, config.test_share, seed=config.seed, ops=tuple(ops), digits=digits, terms=config.terms,
            template=template, task_type=task_type,
        )
    ]
    random.Random(f"mix:{config.seed}").shuffle(tasks)
    return tasks


def _dataset_rows(config: TasksConfig) -> Iterator[Mapping[str, Any]]:
    try:
        import datasets
    except ImportError as error:
        raise TaskSourceError(
            "tasks.source = 'datasets' needs the Hugging Face datasets package: pip install 'intellect2-prime-rl[datasets]'"
        ) from error
    path = Path(config.path)
    if not path.exists():
        raise FileNotFoundError(f"no such file or folder: {path}")
    if path.is_dir() and ((path / "dataset_dict.json").is_file() or (path / "state.json").is_file()):
        loaded: Any = datasets.load_from_disk(str(path))  # written by Dataset(Dict).save_to_disk
        if isinstance(loaded, datasets.DatasetDict):
            if config.split not in loaded:
                raise TaskSourceError(f"{path} has splits {sorted(loaded)}, not tasks.split = {config.split!r}")
            loaded = loaded[config.split]
    elif path.is_dir():
        loaded = datasets.load_dataset(str(path), split=config.split)
    else:
        builder = {".parquet": "parquet", ".jsonl": "json", ".json": "json", ".csv": "csv"}.get(path.suffix.lower())
        if builder is None:
            raise TaskSourceError(f"{path}: unsupported file type {path.suffix!r} (parquet, jsonl, json, csv)")
        loaded = datasets.load_dataset(builder, data_files=str(path), split="train")
    yield from loaded


def read_rows(config: TasksConfig) -> Iterator[Mapping[str, Any]]:
    """The raw rows of a file or ``datasets`` source, as dicts (before :func:`map_row`)."""
    path = Path(config.path)
    if config.source == "datasets":
        yield from _dataset_rows(config)
    elif config.source == "parquet":
        import pyarrow.parquet as pq

        for batch in pq.read_table(path).to_batches(max_chunksize=4096):
            yield from batch.to_pylist()
    else:
        with path.open(encoding="utf-8") as handle:
            for number, line in enumerate(handle, 1):
                if line.strip():
                    try:
                        yield json.loads(line)
                    except ValueError as error:
                        raise TaskSourceError(f"{path}:{number}: not a JSON line: {error}") from error


def map_row(row: Mapping[str, Any], columns: Mapping[str, str], task_type: str) -> dict[str, Any]:
    """One source row as an INTELLECT-2 row: ``columns`` renames (task field -> column), ``answer``
    becomes ``verification_info = {"ground_truth": answer}``, a missing ``task_type`` is ``task_type``.
    Other columns are kept (they land in ``Task.metadata``).

    >>> map_row({"question": "1+1?", "answer": 2}, {"prompt": "question", "answer": "answer"}, "verifiable_math")
    {'question': '1+1?', 'answer': 2, 'prompt': '1+1?', 'verification_info': {'ground_truth': 2}, 'task_type': 'verifiable_math'}
    """
    mapped = dict(row)
    for field, column in columns.items():
        if column not in row:
            raise TaskSourceError(
                f"tasks.columns.{field} = {column!r}, but the rows have no column {column!r} "
                f"(they have {sorted(row)[:12]})"
            )
        if field == "answer":
            mapped["verification_info"] = {"ground_truth": row[column]}
        elif field == "solve_rate":
            mapped["solve_rate_qwen_r1_distill_7b"] = row[column]
        else:
            mapped[field] = row[column]
    if not mapped.get("task_type"):
        mapped["task_type"] = task_type
    return mapped


def _file_tasks(config: TasksConfig) -> list[Any]:
    import verifiers

    tasks = []
    try:
        for row in read_rows(config):
            tasks.append(verifiers.Task.from_row(map_row(row, config.columns, config.task_type)))
    except (OSError, ValueError) as error:  # TaskFormatError and TaskSourceError are ValueErrors
        raise TaskSourceError(f"cannot read tasks from {config.path}: {error}") from error
    return tasks


def load_tasks(config: TasksConfig) -> TaskSet:
    """Build the run's ``TaskSet`` from ``[tasks]``; raises ``TaskSourceError`` on bad sources."""
    generators = {"arithmetic": _arithmetic, "mix": _mix}
    tasks = generators.get(config.source, _file_tasks)(config)
    if config.difficulty_key:
        tasks = [t for t in tasks if _passes_difficulty(t, config)]
    tasks = tasks[: config.num_tasks]
    return TaskSet(
        tasks,
        config.prompt_template,
        length_reward=config.length_reward,
        target_lengths=config.target_lengths,
        seed=config.seed,
        chat_template=config.chat_template,
        system_prompt=config.system_prompt,
        prompt_templates=config.prompt_templates,
        target_lengths_by_type=config.target_lengths_by_type,
    )


def _passes_difficulty(task: Any, config: TasksConfig) -> bool:
    """INTELLECT-2's offline filter: keep min_pass_rate <= rate <= max_pass_rate; tasks without a rate pass."""
    if config.difficulty_key == "solve_rate_qwen_r1_distill_7b":
        rate = getattr(task, "solve_rate", None)
    else:
        rate = (getattr(task, "metadata", None) or {}).get(config.difficulty_key)
    if rate is None:
        return True
    return config.min_pass_rate <= float(rate) <= config.max_pass_rate
